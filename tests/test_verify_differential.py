"""Issue 49: both verifiers read the same bytes. A corpus of mutated release folders, generated from one real
release (made by the real release steps, promoted twice under two enrolled-hosts versions, evidence signed by
the GPU hosts' real keys), each run through the Python verifier (`qualify verify`'s code: release/verify.py)
and scripts/verify-independent.sh (openssl, jq, sha256sum). They must agree on every input, and agree with
what each mutation should give: re-encoded JSON (duplicate keys, integers written as 7.0 or 7e0, versions 1.0,
gpus 2.0, `"policy": null`, other layouts and escapes), signatures with trailing bytes, an empty bundle key hint,
a re-encoded cosign.pub, accepted evidence whose host signature was removed or re-signed by another key, and
hosts chains forked, cut or restarted. Every signed record mutated is re-signed with the release key (the red
team's move: a key holder's mistake or a stolen key's edit that the recipe must still catch)."""

from __future__ import annotations

import base64
import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Callable, Dict, List, Tuple

import pytest
from evidence_helpers import Lab
from signing_helpers import PASSWORD, make_key_pair

from qualify.core import manifest as mf
from qualify.core.errors import QualifyError
from qualify.core.fsutil import canonical_json
from qualify.release import verify as pyverify
from qualify.signing import formats, signer
from qualify.trust import hosts as chain
from qualify.trust import records as rec
from qualify.trust.verify import TrustedKey, sha256

pytestmark = pytest.mark.slow  # 70-odd folders through both verifiers: minutes
REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "scripts" / "verify-independent.sh"
SIGNED = ("release.json", "sm120.promotion.json", "sm120.promotion.1.json", "../hosts.json")


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Lab:
    """sm120 released, hosts 1 (lab-5090) and 2 (lab-b), promoted twice: the folder every mutation starts from."""
    root = tmp_path_factory.mktemp("differential")
    lab = Lab(root)
    _, b_pub = make_key_pair(root / "keys", prefix="lab-b")
    lab.run([lab.record(1), lab.record(2)])
    lab.enroll(("lab-b", b_pub))
    lab.run([lab.record(3), lab.record(4)])
    return lab


@pytest.fixture(scope="module")
def base_v2(tmp_path_factory) -> Lab:
    """A release/v2 folder, promoted twice: its manifest rewritten by each promote, as before issue 52."""
    lab = Lab(tmp_path_factory.mktemp("differential-v2"))
    lab.as_release_v2()
    lab.run([lab.record(1), lab.record(2)])
    lab.run([lab.record(3)])
    return lab


def shell(folder: Path) -> Tuple[bool, str]:
    done = subprocess.run(["bash", str(SCRIPT), str(folder)], capture_output=True, text=True, timeout=600,
                          stdin=subprocess.DEVNULL)
    return done.returncode == 0, (done.stderr.strip().splitlines() or [""])[-1] if done.returncode else "verified"


def python(folder: Path) -> Tuple[bool, str]:
    try:
        pyverify.verify(pyverify.VerifyOptions(manifest=folder / "sm120.json", key=folder / "cosign.pub"))
    except QualifyError as exc:
        return False, exc.message
    return True, "verified"


def resign(lab: Lab, path: Path) -> None:
    signer.write_signature(lab.sign, path, formats.signature_path(path), formats.bundle_path(path))


def rewrite(lab: Lab, path: Path, text: str) -> None:
    path.write_bytes(text.encode("utf-8"))
    resign(lab, path)


# --- the JSON forms -------------------------------------------------------------------------------------------

TextEdit = Callable[[str], str]
INTEGER = re.compile(r'^( *)"(sequence|consecutive_passes|required_consecutive_passes|hosts_sequence|policy_version|'
                     r'gpus|version|runs|tensor_parallel_size)": (-?[0-9]+)(,?)$', re.M)


def _first_integer(text: str, fmt: str) -> str:
    return INTEGER.sub(lambda m: f'{m.group(1)}"{m.group(2)}": {fmt.format(m.group(3))}{m.group(4)}', text, count=1)


def _duplicate_same_line(text: str) -> str:
    """The first integer key given twice on one line: jq keeps the last value, the toolkit refused it."""
    return INTEGER.sub(lambda m: f'{m.group(1)}"{m.group(2)}": 99, "{m.group(2)}": {m.group(3)}{m.group(4)}', text,
                       count=1)


def _duplicate_own_line(text: str) -> str:
    return INTEGER.sub(lambda m: f'{m.group(1)}"{m.group(2)}": 99,\n{m.group(0)}', text, count=1)


def _escape_a_letter(text: str) -> str:
    return re.sub(r'"schema": "h', r'"schema": "\\u0068', text, count=1)


FORMS: Dict[str, Tuple[TextEdit, bool]] = {  # name -> (edit of the canonical text, whether it still verifies)
    "canonical-again": (lambda t: t, True),
    "duplicate-key-one-line": (_duplicate_same_line, False),
    "duplicate-key-own-line": (_duplicate_own_line, False),
    "integer-as-7.0": (lambda t: _first_integer(t, "{}.0"), False),
    "integer-as-7e0": (lambda t: _first_integer(t, "{}e0"), False),
    "integer-as-7E+00": (lambda t: _first_integer(t, "{}E+00"), False),
    "compact": (lambda t: json.dumps(json.loads(t), sort_keys=True, separators=(",", ":")) + "\n", False),
    "keys-unsorted": (lambda t: json.dumps(dict(reversed(list(json.loads(t).items()))), indent=2,
                                           ensure_ascii=False) + "\n", False),
    "four-space-indent": (lambda t: json.dumps(json.loads(t), sort_keys=True, indent=4, ensure_ascii=False) + "\n",
                          False),
    "no-final-newline": (lambda t: t.rstrip("\n"), False),
    "escaped-letter": (_escape_a_letter, False),
    "ascii-escaped": (lambda t: json.dumps(json.loads(t), sort_keys=True, indent=2, ensure_ascii=True) + "\n", True),
}


def _release_edit(change: Callable[[dict], None]) -> TextEdit:
    def edit(text: str) -> str:
        doc = json.loads(text)
        change(doc)
        return json.dumps(doc, sort_keys=True, indent=2, ensure_ascii=False) + "\n"
    return edit


def _policy_version_float(text: str) -> str:
    return text.replace('    "version": 1\n', '    "version": 1.0\n', 1)


def _gpus_float(text: str) -> str:
    return re.sub(r'("gpus": )2(,?\n)', r"\g<1>2.0\2", text, count=1)


RELEASE_ONLY: Dict[str, Tuple[TextEdit, bool]] = {
    "policy-null": (_release_edit(lambda d: d.__setitem__("policy", None)), False),
    "policy-version-1.0": (_policy_version_float, False),
    "floor-gpus-2.0": (_gpus_float, False),
}


# --- signatures and keys ---------------------------------------------------------------------------------------


def _sig_trailing_base64(folder: Path) -> None:
    sig = folder / "release.json.sig"
    sig.write_bytes(sig.read_bytes().strip() + b"AAAA")


def _sig_trailing_der(folder: Path) -> None:
    sig = folder / "release.json.sig"
    sig.write_bytes(base64.b64encode(base64.b64decode(sig.read_bytes()) + b"\x00"))


def _sig_garbage_after_padding(folder: Path) -> None:
    sig = folder / "release.json.sig"
    text = sig.read_bytes().strip()
    sig.write_bytes(text + (b"" if text.endswith(b"=") else b"=") + b"junk")


def _bundle(folder: Path, change: Callable[[dict], None]) -> None:
    path = folder / "release.json.sigstore.json"
    doc = json.loads(path.read_bytes())
    change(doc)
    path.write_text(json.dumps(doc))


def _reencoded_key(folder: Path) -> None:
    """The same key, other bytes: PEM lines wrapped at 32 columns."""
    pem = (folder / "cosign.pub").read_text().splitlines()
    body = "".join(pem[1:-1])
    (folder / "cosign.pub").write_text("\n".join([pem[0], *[body[i:i + 32] for i in range(0, len(body), 32)],
                                                  pem[-1]]) + "\n")


# --- accepted evidence -------------------------------------------------------------------------------------------


def _runs(folder: Path) -> List[Path]:
    return sorted(p for p in (folder / "evidence" / "sm120").glob("*.json")
                  if not p.name.endswith((".sig", ".sigstore.json")))


def _drop(folder: Path, suffixes) -> None:
    for s in suffixes:
        Path(str(_runs(folder)[0]) + s).unlink()


def _resign_run(lab: Lab, folder: Path, key: Path) -> None:
    path = _runs(folder)[0]
    signer.write_signature(signer.key_signer("builtin", key, PASSWORD.encode()), path, formats.signature_path(path),
                           formats.bundle_path(path))


# --- the hosts chain --------------------------------------------------------------------------------------------


def _host(pub: Path, name: str) -> rec.EnrolledHost:
    key = TrustedKey.read(pub)
    return rec.EnrolledHost(name, key_pem=key.pem.decode(), fingerprint=key.fingerprint)


def _fork(lab: Lab, work: Path, ahead: int, keep: bool) -> None:
    """A second admin from sequence 1 (lab-b not enrolled) makes 2b.. (`ahead` versions); their newest file and,
    with `keep`, their kept versions land in manifests/."""
    manifests = work / "repo" / "manifests"
    other = work / "admin-2"
    other.mkdir()
    for s in ("", ".sig", ".sigstore.json"):
        shutil.copyfile(manifests / f"hosts.1.json{s}", other / f"hosts.json{s}")
    for n in range(ahead):
        _, pub = make_key_pair(work, prefix=f"x{n}")
        chain.change(other / "hosts.json", lab.sign, lab.key, add=_host(pub, f"x{n}"), state=work / "marks-2")
    names = ["hosts.json"] + ([f"hosts.{s}.json" for s in range(2, 1 + ahead)] if keep else [])
    for name in names:
        for s in ("", ".sig", ".sigstore.json"):
            if (other / f"{name}{s}").exists():
                shutil.copyfile(other / f"{name}{s}", manifests / f"{name}{s}")


def _restart(lab: Lab, work: Path, sequence: int) -> None:
    path = work / "repo" / "manifests" / "hosts.json"
    hosts = rec.EnrolledHosts.parse(path.read_bytes(), "hosts")
    rewrite(lab, path, rec.EnrolledHosts(sequence, hosts.hosts, previous_sha256=None).to_bytes().decode())


def _extend(lab: Lab, work: Path) -> None:
    _, pub = make_key_pair(work, prefix="honest")
    chain.change(work / "repo" / "manifests" / "hosts.json", lab.sign, lab.key, add=_host(pub, "honest"),
                 state=work / "marks-3")


# --- the manifest's hash (issue 52: one rule per release format) ---------------------------------------------------


def _rewrite_manifest(lab: Lab, folder: Path, record_too: bool) -> None:
    """The manifest rewritten with the promoted level and re-signed, as a release/v2 promote wrote it; with
    `record_too` the current promotion record names the new bytes (re-signed): still refused from release/v3."""
    path = folder / "sm120.json"
    stmt = json.loads(path.read_text())
    record = json.loads((folder / "sm120.promotion.json").read_text())
    stmt["predicate"]["support_level"] = record["level"]
    rewrite(lab, path, mf.dumps(stmt).decode())
    if record_too:
        record["manifest_sha256"] = sha256(path.read_bytes())
        rewrite(lab, folder / "sm120.promotion.json", canonical_json(record).decode())


def _restore_released_manifest(lab: Lab, folder: Path) -> None:
    """A release/v2 folder's manifest put back as released (its own valid signature): the promotion record names
    the rewritten one, so it is refused."""
    stmt = json.loads((folder / "sm120.json").read_text())
    stmt["predicate"]["support_level"] = json.loads((folder / "sm120.promotion.json").read_text())["released_level"]
    stmt["predicate"].pop("promotion", None)
    rewrite(lab, folder / "sm120.json", mf.dumps(stmt).decode())


def hash_rule_cases(lab: Lab, v2: bool) -> List[Tuple[str, Callable[[Path, Path], None], bool]]:
    if v2:
        return [("v2:unchanged", lambda w, f: None, True),
                ("v2:released-manifest-restored", lambda w, f: _restore_released_manifest(lab, f), False),
                ("v2:release.json-as-v3", lambda w, f: rewrite(lab, f / rec.INDEX_FILE, (f / rec.INDEX_FILE).read_text()
                                                               .replace(rec.RELEASE_SCHEMA_V2, rec.RELEASE_SCHEMA)),
                 False)]
    return [("v3:manifest-rewritten-with-the-level", lambda w, f: _rewrite_manifest(lab, f, False), False),
            ("v3:manifest-rewritten-and-named-by-the-record", lambda w, f: _rewrite_manifest(lab, f, True), False),
            ("v3:release.json-as-v2", lambda w, f: rewrite(lab, f / rec.INDEX_FILE, (f / rec.INDEX_FILE).read_text()
                                                           .replace(rec.RELEASE_SCHEMA, rec.RELEASE_SCHEMA_V2)), False)]


# --- the corpus --------------------------------------------------------------------------------------------------


def corpus(lab: Lab) -> List[Tuple[str, Callable[[Path, Path], None], bool]]:
    """(name, mutation of (work folder, release folder), whether it verifies), generated."""
    out: List[Tuple[str, Callable[[Path, Path], None], bool]] = [("unchanged", lambda w, f: None, True)]

    def text_case(name: str, edit: TextEdit):
        def apply(work: Path, folder: Path) -> None:
            path = (folder / name).resolve()
            rewrite(lab, path, edit(path.read_text(encoding="utf-8")))
        return apply

    for name in SIGNED:
        for form, (edit, ok) in FORMS.items():
            if form == "ascii-escaped":
                ok = True  # our records are ASCII: the same bytes
            out.append((f"{name}:{form}", text_case(name, edit), ok))
    for form, (edit, ok) in RELEASE_ONLY.items():
        out.append((f"release.json:{form}", text_case("release.json", edit), ok))
    out += [
        ("sig:trailing-base64", lambda w, f: _sig_trailing_base64(f), False),
        ("sig:trailing-der-byte", lambda w, f: _sig_trailing_der(f), False),
        ("sig:garbage-after-padding", lambda w, f: _sig_garbage_after_padding(f), False),
        ("sig:with-newlines", lambda w, f: (f / "release.json.sig").write_bytes(
            b"\n".join(re.findall(b".{1,20}", (f / "release.json.sig").read_bytes().strip())) + b"\n"), True),
        ("bundle:empty-hint", lambda w, f: _bundle(f, lambda d: d["verificationMaterial"]["publicKey"].__setitem__(
            "hint", "")), False),
        ("bundle:no-hint", lambda w, f: _bundle(f, lambda d: d["verificationMaterial"]["publicKey"].pop("hint")),
         True),
        ("bundle:numeric-hint", lambda w, f: _bundle(f, lambda d: d["verificationMaterial"]["publicKey"].__setitem__(
            "hint", 7)), False),
        ("cosign.pub:re-encoded", lambda w, f: _reencoded_key(f), False),
        ("evidence:host-sig-removed-bundle-kept", lambda w, f: _drop(f, [".sig"]), True),
        ("evidence:host-bundle-removed-sig-kept", lambda w, f: _drop(f, [".sigstore.json"]), True),
        ("evidence:host-signatures-removed", lambda w, f: _drop(f, [".sig", ".sigstore.json"]), False),
        ("evidence:re-signed-by-another-key", lambda w, f: _resign_run(lab, f, make_key_pair(w, "stranger")[0]),
         False),
        ("evidence:re-signed-by-the-release-key", lambda w, f: _resign_run(lab, f, lab.release_key), False),
        ("hosts:honest-extension", lambda w, f: _extend(lab, w), True),
        ("hosts:fork-1-ahead", lambda w, f: _fork(lab, w, 1, True), False),
        ("hosts:fork-2-ahead", lambda w, f: _fork(lab, w, 2, True), False),
        ("hosts:fork-3-ahead", lambda w, f: _fork(lab, w, 3, True), False),
        ("hosts:fork-3-ahead-gap", lambda w, f: _fork(lab, w, 3, False), False),
        ("hosts:restarted-at-3", lambda w, f: _restart(lab, w, 3), False),
        ("hosts:restarted-at-5", lambda w, f: _restart(lab, w, 5), False),
        # the version promotion 1 was checked against gone (not kept, not in git): who vouched for its runs cannot
        # be checked, which is never a pass (the recipe's exit 3, the Python verifier's refusal naming what to fetch)
        ("hosts:kept-version-removed", lambda w, f: [p.unlink() for p in (w / "repo" / "manifests").glob("hosts.1.*")]
         and _extend(lab, w), False),
    ]
    return out + hash_rule_cases(lab, v2=False)


def test_the_shell_recipe_names_the_schemas_integer_keys():
    """The integer-valued keys the recipe holds to integer literals are the signed schemas' own."""
    names = set()

    def walk(node, key):
        if isinstance(node, dict):
            t = node.get("type")
            if t == "integer" or (isinstance(t, list) and "integer" in t) or (key == "version" and node.get("const") == 1):
                names.add(key)
            for k, v in node.items():
                if k == "properties" and isinstance(v, dict):
                    for pk, pv in v.items():
                        walk(pv, pk)
                else:
                    walk(v, key)
        elif isinstance(node, list):
            for x in node:
                walk(x, key)

    for schema in ("release", "release-v2", "promotion", "promotion-v2", "enrolled-hosts", "enrolled-hosts-v1", "publication",
                   "release-statement"):
        walk(json.loads((REPO / "manifests" / f"{schema}.schema.json").read_text()), "")
    listed = re.search(r"^INTEGER_KEYS='([^']*)'$", SCRIPT.read_text(), re.M).group(1).split("|")
    assert sorted(listed) == sorted(names - {""})


def test_both_verifiers_agree_on_every_mutated_folder(base, tmp_path):
    cases = corpus(base)
    _agree(base, cases, tmp_path)
    assert len(cases) >= 60


def test_both_verifiers_agree_on_a_release_v2_folder_whose_promotes_rewrote_the_manifest(base_v2, tmp_path):
    """Issue 52: a folder made before keeps verifying by its own rule (the current promotion record names the
    rewritten manifest); the released manifest put back, or the format changed, is refused by both."""
    assert json.loads((base_v2.folder / rec.INDEX_FILE).read_text())["schema"] == rec.RELEASE_SCHEMA_V2
    assert "promotion" in json.loads((base_v2.folder / "sm120.json").read_text())["predicate"]  # rewritten
    _agree(base_v2, hash_rule_cases(base_v2, v2=True), tmp_path)


def _agree(base: Lab, cases, tmp_path: Path) -> None:
    results, disagree, wrong = [], [], []
    for i, (name, mutate, ok) in enumerate(cases):
        work = tmp_path / f"case-{i}"
        shutil.copytree(base.root / "repo", work / "repo", symlinks=True)
        folder = work / "repo" / "manifests" / "v1.0.0"
        mutate(work, folder)
        py, py_said = python(folder)
        sh, sh_said = shell(folder)
        results.append((name, py, sh))
        if py != sh:
            disagree.append(f"{name}: python {'accepts' if py else 'refuses'} ({py_said[:300]}); shell "
                            f"{'accepts' if sh else 'refuses'} ({sh_said[:300]})")
        elif py != ok:
            wrong.append(f"{name}: both {'accept' if py else 'refuse'}, expected {'accept' if ok else 'refuse'} "
                         f"(python: {py_said[:200]}; shell: {sh_said[:200]})")
    print(f"differential corpus: {len(cases)} inputs, {len(cases) - len(disagree)} agreed, "
          f"{sum(1 for _, p, _ in results if not p)} refused by both")
    assert not disagree, "\n".join(disagree)
    assert not wrong, "\n".join(wrong)
