"""Issue 42: scripts/verify-independent.sh does VERIFYING.md's recipe with openssl, jq and sha256sum only (the
toolkit's virtual environment is off its PATH), on a release the README's commands made (tests/release_chain.py:
released, two hosts enrolled one after the other, promoted three times, published). It passes on that release,
from the folder and from the registry, and fails on each tampered file, one case each, naming the step and the
file. It is shellcheck-clean (nox -s lint runs shellcheck over scripts/)."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from release_chain import SCRIPT, TAG

from qualify.core.fsutil import canonical_json
from qualify.probe.gpu import ALLREDUCE_CHECK, REQUIRED_GPU_CHECKS
from qualify.probe.servematrix import CHECK_IDS
from qualify.trust import policy

pytestmark = [pytest.mark.engine, pytest.mark.slow]
REPO = Path(__file__).resolve().parent.parent
LEGACY = REPO / "tests" / "data" / "legacy-release"


def passed(done: subprocess.CompletedProcess) -> str:
    assert done.returncode == 0, f"rc {done.returncode}\n{done.stdout[-4000:]}\n{done.stderr[-2000:]}"
    assert "verified" in done.stdout.splitlines()[-1]
    return done.stdout


def failed(done: subprocess.CompletedProcess, step: int, *words: str) -> str:
    assert done.returncode == 1, f"rc {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-2000:]}"
    said = done.stderr.strip().splitlines()[-1]
    assert said.startswith(f"verify-independent: FAILED at step {step}:"), said
    for w in words:
        assert w in said, f"{w!r} not in {said!r}"
    return said


def kept_runs(folder: Path) -> list:
    return sorted(p for p in (folder / "evidence" / "sm120").glob("*.json") if not p.name.endswith((".sig", ".sigstore.json")))


def edit_json(path: Path, change) -> None:
    """A signed record changed and written back as the toolkit writes it (canonical JSON): still valid JSON."""
    doc = json.loads(path.read_bytes())
    change(doc)
    path.write_bytes(canonical_json(doc))


def test_the_implied_rule_is_the_toolkits(tmp_path):
    """The recipe states the rule of a release signed without a policy; it is the toolkit's (release/policy.py)."""
    text = SCRIPT.read_text()
    assert int(re.search(r"^IMPLIED_PASSES=(\d+)$", text, re.M).group(1)) == policy.IMPLIED_PASSES
    assert json.loads(re.search(r"^IMPLIED_CHECKS='(.*)'$", text, re.M).group(1)) == list(REQUIRED_GPU_CHECKS)
    # the serving checks a signed level_checks may name are the matrix's (issue 39), the NCCL check issue 44's
    assert json.loads(re.search(r"^SERVE_CHECKS='(.*)'$", text, re.M).group(1)) == list(CHECK_IDS)
    assert f'"{ALLREDUCE_CHECK}"' in text
    # -x: follow the sourced registry step (nox -s lint names both files, so it needs no -x)
    lint = subprocess.run(["shellcheck", "-x", str(SCRIPT)], capture_output=True, text=True)
    assert lint.returncode == 0, lint.stdout[-3000:]


def test_a_real_release_verifies_step_by_step(release_chain):
    said = passed(release_chain.verify(None, "--key", str(release_chain.pub)))
    for step in range(1, 11):
        assert f"step {step}:" in said
    assert "promotion 3 and every record before it, back to promotion 1" in said
    assert "sequence 2 names sequence 1" in said  # the hosts chain, its first version from git's history
    assert "sm120.promotion.json: 7 run(s)" in said and "baseline, 7 of 7 consecutive passes" in said
    assert "the sha256 that counts: release.json's" in said  # release/v3: promote never rewrote the manifest
    fingerprint = re.search(r"fingerprint (sha256:[0-9a-f]{64})", said).group(1)
    assert fingerprint in release_chain.log[0]  # what `qualify sign generate-key` announced
    passed(release_chain.verify(None, "--fingerprint", fingerprint))
    # Without a pin it says it trusted the folder's key.
    assert "trust on first use" in passed(release_chain.verify())


def test_the_registry_part_verifies_with_skopeo_and_with_curl(release_chain):
    reg = release_chain.registry
    skopeo = passed(release_chain.verify(None, "--key", str(release_chain.pub), "--registry",
                                         env={"REGISTRY_AUTH_FILE": str(reg.auth_file)}))
    assert "DSSE signature over its PAE verifies with the release key" in skopeo
    assert "release statement v1.0.0 (sequence 1, promotion 3) names the qualification statement" in skopeo
    for ptype in ("qualification/v1", "release-statement/v2", "slsa.dev/provenance/v1", "cyclonedx.org/bom"):
        assert ptype in skopeo
    curl = passed(release_chain.verify(None, "--key", str(release_chain.pub), "--registry", "--fetch", "curl",
                                       "--ca", str(reg.ca), "--auth-file", str(reg.auth_file)))
    assert "and what the registry holds" in curl.splitlines()[-1]


# --- one tampered file a case -----------------------------------------------------------------------------


def _release_json(folder: Path) -> None:
    edit_json(folder / "release.json", lambda d: d.update(min_level="experimental"))


def _manifest(folder: Path) -> None:
    edit_json(folder / "sm120.json", lambda d: d["predicate"].update(support_level="optimized"))


def _promotion_record(folder: Path) -> None:
    edit_json(folder / "sm120.promotion.json", lambda d: d.update(required_consecutive_passes=1))


def _kept_record(folder: Path) -> None:
    edit_json(folder / "sm120.promotion.1.json", lambda d: d.update(level="baseline"))


def _hosts_file(folder: Path) -> None:
    edit_json(folder.parent / "hosts.json", lambda d: d["hosts"][0].update(name="intruder"))


def _evidence_file(folder: Path) -> None:
    path = kept_runs(folder)[0]
    edit_json(path, lambda d: d.update(reason="edited"))


def _published_json(folder: Path) -> None:
    edit_json(folder / "published.json", lambda d: d.update(destination="registry.example.com/other"))


@pytest.mark.parametrize("tamper, step, words", [
    (_release_json, 2, ("release.json: its signature does not verify",)),
    (_manifest, 6, ("sm120.json: sha256", "release.json names", "rewritten after release")),
    (_promotion_record, 5, ("sm120.promotion.json: its signature does not verify",)),
    (_kept_record, 5, ("sm120.promotion.1.json: its signature does not verify",)),
    (_hosts_file, 4, ("hosts.json: its signature does not verify",)),
    (_evidence_file, 7, ("not the evidence the signed record accepted",)),
    (_published_json, 10, ("published.json: its signature does not verify",)),
], ids=["release.json", "manifest", "promotion-record", "kept-promotion-record", "hosts-file", "evidence",
        "published.json"])
def test_a_tampered_file_fails_naming_it(release_chain, tmp_path, tamper, step, words):
    chain = release_chain.copy(tmp_path)
    passed(chain.verify(None, "--key", str(chain.pub)))  # the copy verifies before the edit
    tamper(chain.folder)
    failed(chain.verify(None, "--key", str(chain.pub)), step, *words)


def test_the_manifest_is_the_released_one_after_promotes_and_a_rewritten_one_fails(release_chain, tmp_path):
    """Issue 52, one hash rule: promote never rewrites the manifest, so after three promotes it is still the bytes of
    the release commit, whose sha256 release.json names. Rewritten with the current level and re-signed with the
    release key, and named by a re-signed promotion record, it is refused."""
    from release_chain import PASSWORD

    from qualify.signing import formats, signer

    chain = release_chain.copy(tmp_path)
    for name in ("sm120.json", "sm120.json.sig"):
        assert (chain.folder / name).read_text() == chain.git("show", f"{TAG}:manifests/{TAG}/{name}")
    sign = signer.key_signer("builtin", chain.repo / "cosign.key", PASSWORD.encode())
    level = json.loads((chain.folder / "sm120.promotion.json").read_text())["level"]
    edit_json(chain.folder / "sm120.json", lambda d: d["predicate"].update(support_level=level))
    for name in ("sm120.json", "sm120.promotion.json"):
        if name == "sm120.promotion.json":
            edit_json(chain.folder / name, lambda d: d.update(manifest_sha256=hashlib.sha256(
                (chain.folder / "sm120.json").read_bytes()).hexdigest()))
        path = chain.folder / name
        signer.write_signature(sign, path, formats.signature_path(path), formats.bundle_path(path))
    said = failed(chain.verify(None, "--key", str(chain.pub)), 5, "sm120.promotion.json: names manifest",
                  "from release/v3 a promote never rewrites the manifest")
    released = json.loads((chain.folder / "release.json").read_text())["targets"][0]["manifest_sha256"]
    assert released[:12] in said


def test_a_cut_or_rolled_back_ledger_fails(release_chain, tmp_path):
    cut = release_chain.copy(tmp_path / "cut")
    for suffix in ("", ".sig", ".sigstore.json"):
        (cut.folder / f"sm120.promotion.1.json{suffix}").unlink()
    failed(cut.verify(), 5, "the ledger is cut", "sm120.promotion.1.json")
    back = release_chain.copy(tmp_path / "back")  # promotion 2 copied over the current record (a demotion undone)
    for suffix in ("", ".sig", ".sigstore.json"):
        shutil.copy2(back.folder / f"sm120.promotion.2.json{suffix}", back.folder / f"sm120.promotion.json{suffix}")
    failed(back.verify(), 5, "sm120.promotion.2.json is kept as a replaced record")


def test_an_older_hosts_file_restored_fails(release_chain, tmp_path):
    """hosts.json sequence 1 (validly signed, from git) in place of sequence 2, which promotion 3 was checked against."""
    chain = release_chain.copy(tmp_path)
    for suffix in ("", ".sig", ".sigstore.json"):
        (chain.hosts_file.parent / f"hosts.json{suffix}").write_text(chain.git("show", f"HEAD~1:manifests/hosts.json{suffix}"))
    failed(chain.verify(), 8, "sequence 1, older than sequence 2")


def test_evidence_signed_by_a_host_not_enrolled_fails(release_chain, tmp_path):
    """A kept run's signature replaced by one of a key no hosts version enrolls (the release key's own)."""
    from release_chain import PASSWORD

    from qualify.signing import formats, signer

    chain = release_chain.copy(tmp_path)
    path = kept_runs(chain.folder)[0]
    s = signer.key_signer("builtin", chain.repo / "cosign.key", PASSWORD.encode())
    signer.write_signature(s, path, formats.signature_path(path), formats.bundle_path(path))
    failed(chain.verify(), 7, path.name, "its signature does not verify")


def test_another_key_fails_where_the_key_is_pinned(release_chain, tmp_path):
    chain = release_chain.copy(tmp_path)
    subprocess.run(["openssl", "ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", str(tmp_path / "k")], check=True)
    subprocess.run(["openssl", "ec", "-in", str(tmp_path / "k"), "-pubout", "-out", str(chain.folder / "cosign.pub")],
                   check=True, capture_output=True)
    failed(chain.verify(None, "--key", str(release_chain.pub)), 1, "not the key you trust")
    failed(chain.verify(), 2, "release.json: its signature does not verify")  # trusted on first use: nothing else holds


def test_a_folder_renamed_to_another_tag_fails(release_chain, tmp_path):
    chain = release_chain.copy(tmp_path)
    chain.folder.rename(chain.manifests / "v9.0.0")
    failed(chain.verify(chain.manifests / "v9.0.0"), 2, "the index of release v1.0.0, but the folder is named v9.0.0")


def test_evidence_from_qualify_gpu_evidence_is_checked_too(release_chain, tmp_path):
    """The probe-manifest form of evidence (no hashed fields of its own: the identity hashes the GPU UUID and host
    name as promote does), promoted with `qualify promote`: the fourth promotion verifies, infrastructure counted."""
    chain = release_chain.copy(tmp_path)
    out = chain.gpu_evidence("lab-a", tmp_path / "sm120.probe-evidence.json")
    assert "infrastructure" in chain.promote([out])
    said = passed(chain.verify(None, "--key", str(chain.pub)))
    assert "sm120.promotion.json: 8 run(s)" in said and "promotion 4 and every record before it" in said


def test_the_registry_must_hold_the_folders_promotion_and_a_signed_release_statement(release_chain, tmp_path,
                                                                                     monkeypatch):
    """Published again elsewhere, then promoted without publishing: the registry attests an older promotion
    (publish again); published again: publish says what it superseded, and the registry holds the current level
    only; the older level's signed statements pushed back beside the current ones: refused (which is current must
    be unambiguous to a consumer reading by type); the release statement removed: no signed release statement."""
    from qualify.core import manifest as mf
    from qualify.publish import attestation_verify, oci, publish
    from qualify.trust import records as rec

    reg = release_chain.registry
    chain = release_chain.copy(tmp_path)
    env = {"REGISTRY_AUTH_FILE": str(reg.auth_file)}
    dest = f"{reg.address}/stale"
    chain.qualify("publish", TAG, "--to", dest, "--key", "cosign.key", "--no-build-attestations", timeout=1800)
    passed(chain.verify(None, "--registry", env=env))
    monkeypatch.setenv("REGISTRY_AUTH_FILE", str(reg.auth_file))

    def layers():
        return [(d, layer.predicate_type) for layer, d in attestation_verify.fetch_layers(f"{dest}/sm120", chain.digest)]

    def push(docs):
        publish.push_document(oci.attestation_image(docs), f"{dest}/sm120:{oci.att_tag(chain.digest)}", "test",
                              lambda _m: None)

    older = [(d, t) for d, t in layers() if t in (mf.PREDICATE_TYPE, rec.RELEASE_STATEMENT_TYPE)]
    assert len(older) == 2
    chain.promote(chain.runs("lab-b", 20, 1))
    failed(chain.verify(None, "--registry", env=env), 11, "attests promotion 3", "holds promotion 4", "publish again")
    done = chain.qualify("publish", TAG, "--to", dest, "--key", "cosign.key", "--no-build-attestations", timeout=1800)
    out = done.stdout + done.stderr  # what it superseded is progress (stderr)
    assert "superseded at" in out and "release statement v1.0.0 (sequence 1, promotion 3)" in out, out[-3000:]
    said = passed(chain.verify(None, "--registry", env=env))
    assert "no superseded statement of ours is left" in said and "the current level (baseline)" in said
    current = layers()
    push(current + older)  # the promotion-3 statements back beside promotion 4's
    out = failed(chain.verify(None, "--registry", env=env), 11,
                 "also holds signed statements the current ones supersede", "release statement v1.0.0 (sequence 1, promotion 3)")
    # release/v3: promote leaves the manifest's bytes as qualification wrote them, so the older publish signed the
    # same qualification statement as this one: a copy of the current statement is not stale.
    assert "qualification statement (level" not in out, out
    push([(d, t) for d, t in current if t != rec.RELEASE_STATEMENT_TYPE])
    assert [t for _, t in layers()][0] == mf.PREDICATE_TYPE
    failed(chain.verify(None, "--registry", env=env), 11, "no signed release statement of release v1.0.0")


def test_a_release_of_the_toolkit_before_the_ledger_verifies_and_a_promote_on_top_of_it_too(tmp_path):
    """tests/data/legacy-release (made by the toolkit of d5a4b09: promotion/v2, enrolled-hosts/v1, the v2 identity
    of a run). The recipe verifies it as it is; after today's `hosts add` and `promote` on a copy (promotion/v3
    naming the v2 record, hosts v2 naming the v1 file) it verifies again, given the v1 file it replaced."""
    import datetime as dt

    from evidence_helpers import gpu_checks, sign_with
    from signing_helpers import PASSWORD

    from qualify.release import evidence as ev
    from qualify.release import promote
    from qualify.signing import formats, signer
    from qualify.trust import hosts
    from qualify.trust import records as rec
    from qualify.trust.folder import read_release
    from qualify.trust.verify import TrustedKey

    env = {"PATH": "/usr/bin:/bin"}

    def verify(folder: Path, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["bash", str(SCRIPT), str(folder), *args], capture_output=True, text=True, env=env,
                              timeout=300)

    said = passed(verify(LEGACY / "manifests" / "v1.0.0", "--key", str(LEGACY / "keys" / "cosign.pub")))
    assert "the ledger starts at sm120.promotion.json (promotion/v2, sequence 2)" in said
    assert "sm120.promotion.json: 3 run(s), each file, identity" in said  # the v2 identity function

    shutil.copytree(LEGACY, tmp_path / "legacy")
    root = tmp_path / "legacy"
    (root / "history").mkdir()
    for name in ("hosts.json", "hosts.json.sig", "hosts.json.sigstore.json"):
        shutil.copy2(root / "manifests" / name, root / "history" / name)
    folder = root / "manifests" / "v1.0.0"
    sign, key = sign_with(root / "keys" / "cosign.key")
    host = TrustedKey.read(root / "keys" / "gpu-host.pub")
    hosts.change(root / "manifests" / rec.HOSTS_FILE, sign, key,
                 add=rec.EnrolledHost("lab-b", key_pem=host.pem.decode(), fingerprint=host.fingerprint))
    manifest = read_release(folder).target("sm120").manifest
    host_signer = signer.key_signer("builtin", root / "keys" / "gpu-host.key", PASSWORD.encode())
    now = dt.datetime.now(dt.timezone.utc).replace(microsecond=0)
    runs = []
    for n in range(2):
        checks = gpu_checks(ev.Outcome.PASS)
        outcome = ev.outcome_of(checks, "12.0", "12.0")
        record = ev.Evidence(release="v1.0.0", target="sm120", capability="12.0", image_reference=manifest.subject,
                             image_digest=manifest.digest, probe_sources_digest="sha256:" + "c" * 64,
                             gpu=ev.Gpu("stand-in (no GPU here)", "12.0", ev.hashed("GPU-9"), "580.65"),
                             host_id_sha256=ev.hashed("lab-b"), time=rec.format_time(now - dt.timedelta(seconds=n)),
                             outcome=outcome.outcome, reason=outcome.reason, checks=checks, run_id=f"{900 + n:032x}")
        path = ev.write(tmp_path / f"run-{n}.json", record)
        signer.write_signature(host_signer, path, formats.signature_path(path), formats.bundle_path(path))
        runs.append(path)
    (done,) = promote.promote(folder, "v1.0.0", runs, sign, key, root / "manifests" / rec.HOSTS_FILE,
                              state=tmp_path / "trust" / "promoter-state.json")
    assert done.sequence == 3
    # `hosts add` kept the v1 file it replaced beside it (hosts.1.json, issue 49): the chain is at hand.
    passed(verify(folder, "--key", str(root / "keys" / "cosign.pub")))
    for kept in (root / "manifests").glob("hosts.1.json*"):
        kept.unlink()
    # The v1 hosts file that the v2 record was checked against is no longer the file: without it, incomplete.
    missing = verify(folder, "--key", str(root / "keys" / "cosign.pub"))
    assert missing.returncode == 3 and "not at hand" in missing.stdout, missing.stdout[-2000:]
    said = passed(verify(folder, "--key", str(root / "keys" / "cosign.pub"), "--hosts-history", str(root / "history")))
    assert "the ledger starts at sm120.promotion.2.json (promotion/v2" in said
    assert "sequence 2 names sequence 1" in said and "sm120.promotion.json: 5 run(s)" in said
    # issue 52: a release/v2 folder keeps its rule: today's promote rewrote its manifest, the record names it
    assert "the sha256 that counts: the promotion record's" in said and "rewritten by promote (release/v2" in said
    vt = read_release(folder).target("sm120")
    assert vt.manifest_sha256 == vt.promotion.manifest_sha256 != vt.entry.manifest_sha256
