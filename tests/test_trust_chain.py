"""Issue 26: a release is read once, verified once, and cannot be rolled back.

One test (or a few) per numbered finding of the security review, each on releases the real release steps
wrote (signing_helpers.make_release) and through `./start.sh` where the finding was reached there, with the
labelled stand-in nvidia-smi (tests/standin/nvidia-smi, a TEST DOUBLE: this host has no GPU). Races are
made deterministic: a hook runs the attacker's swap at every read the reader makes, or the test shows there
is only one read of each file.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from deploy_host import REPO, SETTINGS, Host, key_fingerprint, released
from signing_helpers import DIGEST_A, DIGEST_B, make_key_pair, make_release, statement

from qualify.core import manifest as mf
from qualify.core import readlimit
from qualify.core.errors import ConfigError, QualifyError, VerificationError
from qualify.deploy import choice, state
from qualify.trust import folder, records, verify
from qualify.trust.folder import read_release
from qualify.trust.verify import KeyAnchor, TrustedKey, sha256

TAG = "v1.0.0"


@pytest.fixture()
def keys(tmp_path):
    (tmp_path / "keys").mkdir()
    return make_key_pair(tmp_path / "keys"), make_key_pair(tmp_path / "keys", prefix="attacker")


def two_releases(tmp_path, keys):
    """The genuine release (sm100 + sm120, key A) and the attacker's (same names, key B)."""
    (a, _), (b, _) = keys
    genuine = make_release(tmp_path / "genuine", TAG, [statement("sm100", DIGEST_A), statement("sm120", DIGEST_A)], a)
    forged = make_release(tmp_path / "forged", TAG, [statement("sm100", DIGEST_B), statement("sm120", DIGEST_B)], b)
    return genuine, forged


# --- finding 1: the gate reads its inputs twice ---------------------------------------------------------


def test_each_file_of_a_release_is_read_once(tmp_path, keys, monkeypatch):
    genuine, _ = two_releases(tmp_path, keys)
    reads = []
    real = readlimit.Folder.read

    def counting(self, name, *a, **kw):
        reads.append(name)
        return real(self, name, *a, **kw)

    monkeypatch.setattr(readlimit.Folder, "read", counting)
    read_release(genuine)
    assert len(reads) == len(set(reads)), f"read twice: {[n for n in reads if reads.count(n) > 1]}"
    assert reads[0] == "cosign.pub"  # the key is read first, and only then used for every signature


@pytest.mark.parametrize("after", ["cosign.pub", "release.json", "release.json.sig", "sm120.json"])
def test_a_swap_between_reads_never_mixes_two_keys_or_two_releases(tmp_path, keys, monkeypatch, after):
    """The attacker replaces the whole folder with a release signed by their key right after the reader read
    `after`. With the genuine key pinned, the result is refused or is the genuine release: never the forged one."""
    genuine, forged = two_releases(tmp_path, keys)
    pinned = TrustedKey.read(keys[0][1]).fingerprint
    real = readlimit.Folder.read
    swapped = []

    def racing(self, name, *a, **kw):
        data = real(self, name, *a, **kw)
        if name == after and not swapped:
            for f in forged.iterdir():
                shutil.copyfile(f, genuine / f.name)
            swapped.append(name)
        return data

    monkeypatch.setattr(readlimit.Folder, "read", racing)
    try:
        release = choice.choose_release(genuine.parent, "sm120", "", KeyAnchor(pinned=pinned))
    except QualifyError as exc:
        assert "signature check failed" in exc.message and swapped
        return
    assert swapped and release.key.fingerprint == pinned and release.target("sm120").manifest.digest == DIGEST_A


def test_a_genuine_manifest_of_another_target_swapped_in_is_refused(tmp_path, keys):
    """A genuine signed sm100 (B200) manifest and its signature copied over sm120's: refused, not deployed
    on an sm120 GPU."""
    genuine, _ = two_releases(tmp_path, keys)
    for suffix in ("", ".sig", ".sigstore.json"):
        shutil.copyfile(genuine / f"sm100.json{suffix}", genuine / f"sm120.json{suffix}")
    with pytest.raises(VerificationError, match="not the manifest release.json names"):
        read_release(genuine)


def test_start_sh_compares_the_verified_target_capability_and_platform_with_the_gpu(host, docker_engine):
    """A release whose sm120 entry is (genuinely signed, but) an image qualified for 12.1: refused on a 12.0 GPU."""
    host.settings()
    stmt = statement("sm120", DIGEST_A)
    stmt["predicate"]["target"]["capability"] = "12.1"
    host.release(stmt)
    done = host.run("start.sh", "--dry-run", "--allow-no-gpu-runtime", "--allow-unqualified")
    assert done.returncode == 4, done.stderr
    assert "the verified manifest is for sm120 (capability 12.1, linux/amd64), not this GPU's sm120 (capability " \
           "12.0, linux/amd64)" in done.stderr and done.stdout == ""


# --- finding 2: rollback and downgrade -------------------------------------------------------------------


def test_an_old_signed_folder_under_a_greater_name_does_not_verify_and_stops_the_deploy(host, docker_engine):
    released(host)
    for name in ("v1.1.0.1", "x", "v9.0.0"):
        shutil.copytree(host.manifests / TAG, host.manifests / name)
    done = host.run("start.sh", "--dry-run", "--allow-no-gpu-runtime", "--allow-unqualified")
    assert done.returncode == 4, done.stderr
    assert "does not verify" in done.stderr and "is the index of release v1.0.0, but the folder is named" in done.stderr
    with pytest.raises(VerificationError, match="a signed release is valid only under its own tag"):
        read_release(host.manifests / "v9.0.0")


def _deploy(h: Host, *args: str) -> subprocess.CompletedProcess:
    """A real start.sh run: the gate accepts and the host remembers, then the pull of the fake digest fails (5)."""
    return h.run("start.sh", "--allow-no-gpu-runtime", *args, timeout=120)


def test_the_host_refuses_an_older_release_than_it_accepted(host, docker_engine):
    host.settings()
    released(host)
    host.release(statement("sm120", DIGEST_A), tag="v1.1.0")
    first = _deploy(host)
    assert first.returncode == 5 and "cannot pull" in first.stderr, first.stderr[-2000:]
    assert "the first release this host accepts (v1.1.0 (sequence 2))" in first.stderr
    shutil.rmtree(host.manifests / "v1.1.0")  # the newer release vanishes: v1.0.0 is the newest left
    back = _deploy(host)
    assert back.returncode == 4 and "refusing a rollback: v1.0.0 (sequence 1, promotion 1) is older than v1.1.0 " \
        "(sequence 2)" in back.stderr and "set RELEASE_TAG=v1.0.0 and pass --allow-downgrade" in back.stderr
    host.settings(RELEASE_TAG="v1.0.0")
    assert _deploy(host).returncode == 4
    on_purpose = _deploy(host, "--allow-downgrade")
    assert on_purpose.returncode == 5 and "DOWNGRADE on purpose (--allow-downgrade)" in on_purpose.stderr
    remembered = state.load(host.root / "deploy")["sm120"]
    assert (remembered.tag, remembered.sequence) == ("v1.1.0", 2)  # still knows the newer one


def test_restoring_the_files_from_before_a_demotion_does_not_bring_baseline_back(host, docker_engine, tmp_path):
    """Promotion 1 (baseline), accepted by the host; promotion 2 (demoted). The manifest is the released one
    throughout (issue 52); restoring promotion 1's record is refused by the ledger kept beside it; with the kept
    record removed as well the folder verifies as promotion 1, which a host that accepted promotion 2 refuses,
    --allow-downgrade or not (issue 37: it goes back to releases, not promotions)."""
    from evidence_helpers import gpu_check

    from qualify.probe.gpu import REQUIRED_GPU_CHECKS
    from qualify.release import evidence as ev
    from qualify.release import promote

    host.settings()
    path = host.release(statement("sm120", DIGEST_A, level="unverified"))
    release_dir = path.parent
    from deploy_host import PASSWORD
    from evidence_helpers import sign_with
    sign, key = sign_with(Path(f"{host.key}.key"), PASSWORD)
    t0 = records.parse_time(read_release(release_dir).index.time, "t0")

    def run(n, fail=False):
        checks = tuple(gpu_check(c, "fail" if fail and c == "gpu.bf16-matmul" else "pass") for c in REQUIRED_GPU_CHECKS)
        out = ev.outcome_of(checks, "12.0", "12.0")
        r = ev.Evidence(TAG, "sm120", "12.0", f"r@{DIGEST_A}", DIGEST_A, "sha256:" + "c" * 64,
                        ev.Gpu("RTX 5090", "12.0", ev.hashed("g"), "580"), ev.hashed("h"),
                        records.format_time(t0 + __import__("datetime").timedelta(seconds=n)), out.outcome,
                        out.reason, checks, {}, f"{n:032x}")
        return ev.write(tmp_path / f"e{n}.json", r)

    stmt = json.loads(path.read_text())
    probe = stmt["predicate"].get("toolkit", {}).get("probe_sha256")
    assert probe is None  # the statement helper names no probe: the binding accepts any
    promote.promote(release_dir, TAG, with_matrix(release_dir, [run(i) for i in range(1, 8)]), sign, key, None,
                    allow_unsigned=True)
    assert read_release(release_dir).target("sm120").current.level == "baseline"
    saved = tmp_path / "promotion-1"
    shutil.copytree(release_dir, saved)
    assert _deploy(host).returncode == 5  # accepted: promotion 1
    promote.promote(release_dir, TAG, [run(8, fail=True)], sign, key, None, allow_unsigned=True)
    assert _deploy(host).returncode == 5  # accepted (experimental: the GPU checks would run after the pull)
    assert state.load(host.root / "deploy")["sm120"].promotion == 2
    for name in ("sm120.json", "sm120.json.sig", "sm120.json.sigstore.json"):  # issue 52: never rewritten
        assert (saved / name).read_bytes() == (release_dir / name).read_bytes()
    for name in ("sm120.promotion.json", "sm120.promotion.json.sig", "sm120.promotion.json.sigstore.json"):
        shutil.copyfile(saved / name, release_dir / name)
    with pytest.raises(VerificationError, match="the current record was restored from an older state"):
        read_release(release_dir)
    for p in release_dir.glob("sm120.promotion.1.json*"):
        p.unlink()
    assert read_release(release_dir).target("sm120").current.level == "baseline"  # verifies as promotion 1
    done = _deploy(host)
    said = "refusing a rollback: the newest promotion record of sm120 of release v1.0.0 here is promotion 1, but " \
        "promotion 2 was seen before"
    assert done.returncode == 4 and said in done.stderr, done.stderr[-2000:]
    host.settings(RELEASE_TAG=TAG)
    again = _deploy(host, "--allow-downgrade")
    assert again.returncode == 4 and said in again.stderr and "never to an older promotion" in again.stderr


def test_a_new_key_for_a_target_is_refused_unless_pinned(host, docker_engine, tmp_path):
    host.settings()
    released(host)
    assert _deploy(host).returncode == 5
    other, other_pub = make_key_pair(tmp_path, prefix="rotated", password="start.sh test key")
    shutil.rmtree(host.manifests / TAG)
    make_release(host.repo, "v2.0.0", [statement("sm120", DIGEST_A)], other, "start.sh test key")
    done = _deploy(host)
    assert done.returncode == 4 and "but this host accepted v1.0.0 (sequence 1, promotion 1) signed by" in done.stderr
    host.settings(RELEASE_KEY_FINGERPRINT=key_fingerprint(other_pub))
    assert _deploy(host).returncode == 5


def test_the_deploy_state_judges_in_release_order():
    a = state.Accepted("sm120", "v1.1.0", 2, 0, "a" * 64, "b" * 64, "sha256:k")
    assert "newer than" in state.judge(a, state.Accepted("sm120", "v1.1.0", 2, 1, "a" * 64, "c" * 64, "sha256:k"),
                                       False, False, False)
    for older in (state.Accepted("sm120", "v1.1.0-rc.1", 3, 0, "a" * 64, "b" * 64, "sha256:k"),
                  state.Accepted("sm120", "v1.0.9", 9, 5, "a" * 64, "b" * 64, "sha256:k")):
        with pytest.raises(state.StateError, match="refusing a rollback"):
            state.judge(a, older, False, False, False)
    with pytest.raises(state.StateError, match="has other content"):
        state.judge(a, state.Accepted("sm120", "v1.1.0", 2, 0, "d" * 64, "b" * 64, "sha256:k"), False, False, False)


# --- finding 3: --allow-unqualified and a RELEASE_TAG typo ---------------------------------------------


def test_a_release_tag_typo_never_deploys_another_digest(host, docker_engine):
    released(host, settings={"RELEASE_TAG": "v1.0.1", "IMAGE": f"127.0.0.1:5000/own/sm120@{DIGEST_B}"})
    done = host.run("start.sh", "--dry-run", "--allow-no-gpu-runtime", "--allow-unqualified")
    assert done.returncode == 4, done.stderr
    assert "RELEASE_TAG=v1.0.1: there is no release folder" in done.stderr and "releases here: v1.0.0" in done.stderr
    assert DIGEST_B not in done.stdout and done.stdout == ""


# --- finding 4: bad input reaches Python's errors ----------------------------------------------------------


def _no_traceback(done: subprocess.CompletedProcess) -> None:
    assert "Traceback" not in done.stderr and "RecursionError" not in done.stderr, done.stderr[-2000:]


def test_a_huge_integer_in_a_manifest_is_a_clear_refusal_everywhere(host, docker_engine, tmp_path):
    """An unsigned edit never reaches the parser of a verifying reader (the bytes are checked first); where
    bytes are parsed before any signature is known (show, diff, a manifest on its own), the refusal is clear."""
    path = released(host)
    stmt = json.loads(path.read_text())
    stmt["predicate"]["huge"] = 1
    path.write_text(json.dumps(stmt).replace('"huge": 1', '"huge": ' + "9" * 5000))
    done = host.run("start.sh", "--dry-run", "--allow-no-gpu-runtime", "--allow-unqualified")
    assert done.returncode == 4 and "signature check failed" in done.stderr
    _no_traceback(done)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parent.parent)}
    alone = tmp_path / "alone.json"
    shutil.copyfile(path, alone)
    for args, code, said in ((["verify", str(path), "--key", str(path.parent / "cosign.pub")], 9, "signature check"),
                             (["show", str(alone)], 9, "an integer of 5000 digits"),
                             (["diff", str(alone), str(alone)], 9, "an integer of 5000 digits")):
        out = subprocess.run([sys.executable, "-m", "qualify", *args], capture_output=True, text=True, timeout=60,
                             env=env)
        assert out.returncode == code and said in out.stderr, (args, out.stderr)
        _no_traceback(out)


def test_deep_nesting_and_huge_integers_in_evidence_are_clear_refusals(tmp_path):
    from signing_helpers import run_qualify

    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100000 + "]" * 100000)
    huge = tmp_path / "huge.json"
    huge.write_text('{"schema": "https://blackwell-qualify.dev/gpu-evidence/v1", "n": ' + "1" * 5000 + "}")
    for path, said in ((deep, "nested deeper than"), (huge, "an integer of 5000 digits")):
        merged = run_qualify(["merge", str(path), "--out", str(tmp_path / "out")], tmp_path)
        assert merged.returncode == ConfigError.exit_code and said in merged.stderr, merged.stderr
        _no_traceback(merged)
        from qualify.release import evidence as ev
        with pytest.raises(ev.EvidenceError, match=said):
            ev.load_any(path, TAG)


@pytest.mark.parametrize("kind", ["/dev/zero", "fifo", "300 MB", "directory"])
def test_a_release_public_key_that_is_no_file_is_refused_at_once(host, docker_engine, tmp_path, kind):
    key = {"/dev/zero": Path("/dev/zero"), "fifo": tmp_path / "fifo", "300 MB": tmp_path / "big.pub",
           "directory": tmp_path}[kind]
    if kind == "fifo":
        os.mkfifo(key)
    if kind == "300 MB":
        with open(key, "wb") as fh:
            fh.truncate(300 << 20)  # sparse: costs no disk, and must cost no memory either
    host.settings(MANIFESTS_DIR=tmp_path / "none", IMAGE=f"127.0.0.1:5000/x/sm120@{DIGEST_A}", RELEASE_PUBLIC_KEY=key)
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    done = host.run("start.sh", "--dry-run", "--allow-no-gpu-runtime", timeout=30)
    peak_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    assert done.returncode == 4, done.stderr
    # issue 52: the registry's attestation alone signs no deploy facts, so it is refused before the key is read
    assert any(w in done.stderr for w in ("not a regular file", "more than the", "is a directory",
                                          "the registry's attestation alone")), done.stderr
    _no_traceback(done)
    assert peak_kib < 200 * 1024 or peak_kib == before, f"{peak_kib} KiB peak: the key was read into memory"


@pytest.mark.parametrize("setting,value,said", [
    ("RELEASE_TAG", "v" * 300, "a tag name of 300 characters"),
    ("RELEASE_TAG", "../x", "is not a usable tag name"),
    ("RELEASE_TAG", "/etc", "is not a usable tag name"),
    ("MANIFESTS_DIR", "/tmp/" + "m" * 5000, "a path of 5005 characters"),
    ("MANIFESTS_DIR", "/tmp/\x1b[31mred", "a path with control characters"),
    ("RELEASE_KEY_FINGERPRINT", "abc", "is not sha256:<64 hex>"),
    ("GPU_RUNTIME", "nvidai", "'nvidai': one of auto | nvidia | cdi | none"),  # issue 28: typed settings
    ("CONTAINER_ENGINE", "dokcer", "'dokcer': one of auto | docker | podman"),
    ("GPU_MEMORY_UTILIZATION", "85%", "'85%': a fraction such as 0.85"),
    ("API_PORT", "80a", "'80a' is not a whole number"),
])
def test_settings_that_become_paths_are_validated(host, setting, value, said):
    host.settings(**{setting: value})
    done = host.run("start.sh", "--dry-run", "--allow-no-gpu-runtime")
    assert done.returncode == 2 and said in done.stderr, done.stderr
    assert "\x1b" not in done.stderr  # escape codes never reach the terminal
    _no_traceback(done)


def test_a_symlinked_release_folder_is_refused(host, docker_engine, tmp_path):
    released(host)
    elsewhere = tmp_path / "elsewhere"
    shutil.move(str(host.manifests / TAG), elsewhere)
    (host.manifests / TAG).symlink_to(elsewhere)
    host.settings(RELEASE_TAG=TAG)
    done = host.run("start.sh", "--dry-run", "--allow-no-gpu-runtime", "--allow-unqualified")
    assert done.returncode == 4 and "is a symbolic link; refused" in done.stderr, done.stderr


# --- finding 5: smaller holes ---------------------------------------------------------------------------


def test_a_bundle_is_checked_even_beside_a_valid_signature(tmp_path, keys):
    genuine, _ = two_releases(tmp_path, keys)
    shutil.copyfile(genuine / "sm100.json.sigstore.json", genuine / "sm120.json.sigstore.json")
    with pytest.raises(VerificationError, match="the bundle of other bytes"):
        read_release(genuine)
    bundle = json.loads((genuine / "sm100.json.sigstore.json").read_text())
    bundle["messageSignature"]["messageDigest"]["algorithm"] = "SHA2_384"
    (genuine / "sm100.json.sigstore.json").write_text(json.dumps(bundle))
    with pytest.raises(VerificationError, match="not SHA2_256"):
        verify.check_bundle(TrustedKey.read(keys[0][1]), (genuine / "sm100.json").read_bytes(),
                            (genuine / "sm100.json.sigstore.json").read_bytes(), "bundle")


def test_a_bundle_naming_another_key_is_refused(tmp_path, keys):
    genuine, forged = two_releases(tmp_path, keys)
    bundle = json.loads((genuine / "sm120.json.sigstore.json").read_text())
    bundle["verificationMaterial"]["publicKey"]["hint"] = \
        json.loads((forged / "sm120.json.sigstore.json").read_text())["verificationMaterial"]["publicKey"]["hint"]
    (genuine / "sm120.json.sigstore.json").write_text(json.dumps(bundle))
    with pytest.raises(VerificationError, match="names another key"):
        read_release(genuine)


def test_duplicate_keys_in_a_signed_dsse_payload_are_refused():
    from qualify.publish import attestation_verify

    payload = b'{"_type": "https://in-toto.io/Statement/v1", "predicateType": "x", "predicateType": "y"}'
    with pytest.raises(VerificationError, match="duplicate JSON key 'predicateType'"):
        attestation_verify._statement(payload, "attestation", "y")


def test_nan_and_infinity_are_refused_in_signed_json():
    for text in ('{"a": NaN}', '{"a": Infinity}', '{"a": -Infinity}', '{"a": 1e999}'):
        with pytest.raises(VerificationError, match="refused"):
            mf.parse(text.encode(), "manifest")
    with pytest.raises(ValueError):
        mf.dumps({"x": float("nan")})  # and never written


def test_names_with_newlines_and_escape_codes_cannot_forge_lines(host, docker_engine):
    released(host)
    (host.manifests / "v2.0.0\n[start] trust gate: passed").mkdir()
    (host.manifests / "v3.0.0\x1b[2J").mkdir()
    done = host.run("start.sh", "--dry-run", "--allow-no-gpu-runtime")
    assert done.returncode == 0, done.stderr
    assert "\x1b" not in done.stderr and "[start] trust gate: passed" not in done.stderr.splitlines()


def test_every_line_the_deploy_prints_has_its_control_characters_escaped(capsys):
    from qualify.deploy.ui import Stop, Ui

    ui = Ui("start")
    ui.say("release v1\n[start] trust gate: passed\x1b[2J")
    ui.error(Stop(4, "bad\rname", "fix\x07"))
    err = capsys.readouterr().err
    assert err.splitlines() == ["[start] release v1\\n[start] trust gate: passed\\x1b[2J",
                                "[start] ERROR: bad\\rname", "  fix: fix\\x07"]


# --- the release writes what the reader reads ---------------------------------------------------------------


def test_release_json_is_signed_bound_to_its_tag_and_ordered(tmp_path, keys):
    (a, _), _ = keys
    first = make_release(tmp_path / "repo", "v1.0.0", [statement("sm120", DIGEST_A)], a)
    second = make_release(tmp_path / "repo", "v1.1.0-rc.1", [statement("sm120", DIGEST_A)], a)
    third = make_release(tmp_path / "repo", "v1.1.0", [statement("sm120", DIGEST_A)], a)
    indexes = [read_release(f).index for f in (first, second, third)]
    assert [i.sequence for i in indexes] == [1, 2, 3]
    assert indexes[0].predecessor is None and indexes[1].predecessor.tag == "v1.0.0"
    assert indexes[2].predecessor.tag == "v1.1.0-rc.1"  # the release order, not creation time
    assert all(records.TIME.fullmatch(i.time) for i in indexes)
    assert dict(indexes[0].files)["cosign.pub"] == sha256((first / "cosign.pub").read_bytes())
    assert (first / "release.json.sig").is_file() and (first / "release.json.sigstore.json").is_file()
    listing = folder.list_releases(tmp_path / "repo" / "manifests")
    assert listing.tags() == ["v1.0.0", "v1.1.0-rc.1", "v1.1.0"]


def test_release_force_removes_only_what_a_verified_index_lists(tmp_path, keys):
    """Issue 27, finding 6: `release --force` deleted whatever the (unsigned) release.json listed, such as saved
    GPU evidence. Now an index that does not verify makes --force refuse and remove nothing."""
    from qualify.core.errors import ReleaseError

    (a, _), _ = keys
    release_dir = make_release(tmp_path / "repo", TAG, [statement("sm120", DIGEST_A)], a)
    keep = release_dir / "sm120.gpu-evidence.20261201T000000Z.abc.json"
    keep.write_text("{}")
    index = json.loads((release_dir / "release.json").read_text())
    index["files"][keep.name] = "0" * 64
    (release_dir / "release.json").write_text(json.dumps(index))  # the signature no longer holds
    with pytest.raises(ReleaseError, match="does not verify with the release key, so nothing it lists is removed"):
        make_release(tmp_path / "repo", TAG, [statement("sm120", DIGEST_B)], a, force=True)
    assert keep.is_file()


def test_a_killed_release_leaves_no_staging_in_the_work_tree(tmp_path, keys):
    """Issue 30, item 7 (staging outside the work tree): a later release is not refused as a dirty tree."""
    (a, _), _ = keys
    make_release(tmp_path / "repo", TAG, [statement("sm120", DIGEST_A)], a)
    status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=tmp_path / "repo",
                            capture_output=True, text=True).stdout
    assert "staging" not in status
    assert not list((tmp_path / "repo").glob(".release-*"))


def test_verify_reports_the_release_it_verified_as_part_of(tmp_path, keys):
    from qualify.release import verify

    (a, pub), (b, other_pub) = keys
    release_dir = make_release(tmp_path / "repo", TAG, [statement("sm120", DIGEST_A)], a)
    result = verify.verify(verify.VerifyOptions(release_dir / "sm120.json", key=pub))
    assert (result.release, result.release_sequence) == (TAG, 1) and "release v1.0.0 (sequence 1)" in result.signature
    with pytest.raises(VerificationError, match="not the key you trust"):
        verify.verify(verify.VerifyOptions(release_dir / "sm120.json", key=other_pub))


# --- issue 37: evidence bound to the probe that ran; policy and settings fail closed ------------------------


def test_a_probe_planted_in_the_state_folder_is_never_mounted_and_the_run_records_what_was(tmp_path, monkeypatch):
    """High 1: a stage in the state folder's probe/<digest16>/ that reports every GPU check passing. Each run
    mounts a private copy of this checkout's probe, and records the digest of that copy; the shared stage is
    re-hashed before any use and staged again when it differs."""
    from qualify.host import paths
    from qualify.probe import identity
    from qualify.qualification import container, staging

    monkeypatch.setattr(paths, "STATE_DIR", tmp_path / "state")
    digest = container.probe_sources_digest()
    planted = paths.probe_stage(digest)
    staging.copy_probe(planted)
    (planted / "qualify" / "probe" / "gpu.py").write_text("REQUIRED_GPU_CHECKS = ()  # every check passes\n")
    assert "its image side is sha256:" in staging.stage_problem(planted, digest)
    seen = {}

    class Recorder:
        def run_container(self, image, command, **options):
            if not any(inside == "/out" for _, inside, _ in options["mounts"]):
                return subprocess.CompletedProcess(command, 0, "cpython-311-x86_64 3.11\n", "")
            mount = next(Path(host) for host, inside, _ in options["mounts"] if inside == container.CONTAINER_ROOT)
            seen["mount"], seen["digest"] = mount, identity.sources_digest(mount / "qualify")
            seen["private"] = oct(mount.parent.stat().st_mode & 0o777)
            out = next(Path(host) for host, inside, _ in options["mounts"] if inside == "/out")
            (out / "predicate.json").write_text(json.dumps({"toolkit": {"probe_sha256": seen["digest"]}}))
            return subprocess.CompletedProcess(command, 0, "", "")

    from qualify.config import targets
    monkeypatch.setattr(staging, "decoders_into", lambda tag, into: None)  # the wheels are another test's
    run = container.run_probe(Recorder(), "image", container.probe_target(targets.load().get("sm120"), "vllm"),
                              scope="gpu")
    assert run.probe_sha256 == seen["digest"] == digest and not str(seen["mount"]).startswith(str(planted))
    assert seen["private"] == "0o700" and not seen["mount"].exists()  # private, and gone afterwards
    assert container.stage_probe(digest) == planted and not staging.stage_problem(planted, digest)  # staged again


def test_a_probe_that_reports_another_digest_than_was_mounted_is_refused(tmp_path, monkeypatch):
    from qualify.config import targets
    from qualify.core.errors import EngineError
    from qualify.host import paths
    from qualify.qualification import container, staging

    monkeypatch.setattr(paths, "STATE_DIR", tmp_path / "state")
    monkeypatch.setattr(staging, "decoders_into", lambda tag, into: None)

    class Liar:
        def run_container(self, image, command, **options):
            if not any(inside == "/out" for _, inside, _ in options["mounts"]):
                return subprocess.CompletedProcess(command, 0, "cpython-311-x86_64 3.11\n", "")
            out = next(Path(host) for host, inside, _ in options["mounts"] if inside == "/out")
            (out / "predicate.json").write_text(json.dumps({"toolkit": {"probe_sha256": "sha256:" + "0" * 64}}))
            return subprocess.CompletedProcess(command, 0, "", "")

    with pytest.raises(EngineError, match="reports its sources as sha256:0000.*but the host mounted"):
        container.run_probe(Liar(), "image", container.probe_target(targets.load().get("sm120"), "vllm"))


def test_a_probe_stage_writable_by_others_is_refused(tmp_path, monkeypatch):
    from qualify.core.errors import EngineError
    from qualify.host import paths
    from qualify.qualification import staging

    monkeypatch.setattr(paths, "STATE_DIR", tmp_path / "state")
    runs = paths.probe_runs()
    runs.mkdir(parents=True)
    runs.chmod(0o777)
    with pytest.raises(EngineError, match="probe-runs is writable by its group or by others"):
        with staging.private_run():
            pass
    stage = tmp_path / "stage"
    digest = staging.copy_probe(stage)
    (stage / "qualify" / "probe" / "gpu.py").chmod(0o666)
    assert "is writable by its group or by others" in staging.stage_problem(stage, digest)


def test_clean_never_removes_the_promoters_marks_not_even_with_all(tmp_path):
    from qualify.host import clean, paths

    state_dir = tmp_path / "state"
    removable = paths.STATE_SHARED + paths.STATE_SLOW
    for name in removable + paths.STATE_NEVER_REMOVED:
        (state_dir / name).mkdir(parents=True)
    (state_dir / "trust" / "promoter-state.json").write_text("{}")
    report = clean.CleanReport(dry_run=False)
    clean._clean_state(state_dir, True, report, tmp_path / "checkout")
    assert (state_dir / "trust" / "promoter-state.json").is_file()
    assert not any((state_dir / n).exists() for n in removable)


@pytest.mark.parametrize("kind", ["missing", "fifo", "directory", "unreadable"])
def test_a_named_settings_file_that_cannot_be_read_is_an_error(host, tmp_path, kind):
    """Medium: --env-file a FIFO, a mistyped path or an unreadable file used to mean 'the defaults', and the
    key pin with it."""
    env = {"missing": tmp_path / "tpyo.env", "fifo": tmp_path / "fifo.env", "directory": tmp_path,
           "unreadable": tmp_path / "secret.env"}[kind]
    if kind == "fifo":
        os.mkfifo(env)
    if kind == "unreadable":
        if os.geteuid() == 0:
            pytest.skip("root reads a mode-000 file; the other kinds cover the refusal")
        env.write_text("RELEASE_KEY_FINGERPRINT=sha256:" + "a" * 64 + "\n")
        env.chmod(0)
    started = time.monotonic()
    done = subprocess.run([str(REPO / "start.sh"), "--dry-run", "--env-file", str(env)],
                          capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL,
                          env={k: v for k, v in os.environ.items() if k not in SETTINGS})
    assert done.returncode == 2, done.stderr
    said = {"missing": "no such settings file", "fifo": "not a regular file", "directory": "not a regular file",
            "unreadable": "cannot be opened"}[kind]
    assert said in done.stderr and time.monotonic() - started < 20
    assert not (kind == "missing" and env.exists())  # a named file is never made from .env.example


def test_an_empty_exported_pin_never_unpins_the_settings_file(host, docker_engine):
    released(host, settings={"RELEASE_KEY_FINGERPRINT": key_fingerprint(Path(f"{host.key}.pub"))})
    done = host.run("start.sh", "--dry-run", "--allow-no-gpu-runtime", RELEASE_KEY_FINGERPRINT="")
    assert done.returncode == 2 and "RELEASE_KEY_FINGERPRINT is exported empty" in done.stderr, done.stderr


@pytest.mark.parametrize("name", ["CONTAINER_ENV_LD_LIBRARY_PATH", "CONTAINER_ENV_NVIDIA_VISIBLE_DEVICES"])
def test_container_variables_cannot_override_what_the_gate_checked(host, name):
    host.settings(**{name: "/usr/local/cuda/compat"})
    done = host.run("start.sh", "--dry-run", "--allow-no-gpu-runtime")
    assert done.returncode == 2 and "is what the trust gate checked" in done.stderr, done.stderr


def test_a_release_folder_whose_index_was_removed_is_broken_and_stops_the_deploy(host, docker_engine):
    """Medium: the newest release's release.json deleted; a pinned-key host used to deploy the older one."""
    released(host)
    host.release(statement("sm120", DIGEST_A, level="baseline"), tag="v1.1.0")
    host.settings(RELEASE_KEY_FINGERPRINT=key_fingerprint(Path(f"{host.key}.pub")))
    (host.manifests / "v1.1.0" / "release.json").unlink()
    done = host.run("start.sh", "--dry-run", "--allow-no-gpu-runtime")
    assert done.returncode == 4 and "v1.1.0 does not verify" in done.stderr and "but no release.json" in done.stderr


def test_with_the_only_index_gone_allow_unqualified_never_deploys_another_digest(host, docker_engine):
    released(host, settings={"IMAGE": f"127.0.0.1:5000/own/sm120@{DIGEST_B}"})
    (host.manifests / TAG / "release.json").unlink()
    done = host.run("start.sh", "--dry-run", "--allow-no-gpu-runtime", "--allow-unqualified")
    assert done.returncode == 4 and "but no release.json" in done.stderr and DIGEST_B not in done.stdout


def test_verify_of_a_file_in_a_release_folder_always_verifies_it_as_part_of_the_release(tmp_path, keys):
    """Medium: --signature/--bundle, or a deleted release.json, verified a restored manifest on its own."""
    from qualify.release import verify

    (a, pub), _ = keys
    release_dir = make_release(tmp_path / "repo", TAG, [statement("sm120", DIGEST_A)], a)
    manifest = release_dir / "sm120.json"
    outside = tmp_path / "out.sig"
    shutil.copyfile(release_dir / "sm120.json.sig", outside)
    with pytest.raises(VerificationError, match="is verified as part of that release with the folder's own "
                                                "signatures, not --signature"):
        verify.verify(verify.VerifyOptions(manifest, key=pub, signature=outside))
    (release_dir / "release.json").unlink()
    with pytest.raises(VerificationError, match="release index not found"):
        verify.verify(verify.VerifyOptions(manifest, key=pub))
    for p in release_dir.iterdir():
        if not p.name.startswith("sm120.json"):
            p.unlink()  # even with every other file gone, a folder named as a version is a release folder
    with pytest.raises(VerificationError, match="release key not found"):
        verify.verify(verify.VerifyOptions(manifest, key=pub))


def test_a_compat_libcuda_of_unknown_version_is_refused_not_skipped(host, docker_engine):
    """Medium: RuntimeFacts turned a null version into "", and the gate skipped the library."""
    from signing_helpers import runtime_with

    runtime = runtime_with(compat="580.65.06")
    runtime["libcuda"]["first"]["version"] = None
    released(host, runtime=runtime)
    done = host.run("start.sh", "--dry-run", "--allow-no-gpu-runtime")
    assert done.returncode == 3 and "cannot be compared with this host's driver" in done.stderr, done.stderr


def test_a_rewritten_ledger_is_a_fork_and_a_new_target_under_another_key_is_refused():
    from qualify.trust import highwater

    mark = highwater.ReleaseMark(1, "a" * 64, {"sm120": highwater.TargetMark(2, "b" * 64, "c" * 64)})
    fork = highwater.Seen(TAG, 1, "a" * 64, "sm120", 3, "d" * 64, "e" * 64, chain={2: "f" * 64, 3: "d" * 64}.get)
    assert "its ledger was rewritten (a fork)" in highwater.problem(mark, fork)
    same = highwater.Seen(TAG, 1, "a" * 64, "sm120", 2, "9" * 64, "c" * 64)
    assert "another record, same sequence" in highwater.problem(mark, same)
    forced_older = highwater.Seen(TAG, 0 + 1, "a" * 64, "sm120", 2, "b" * 64, "c" * 64)
    assert highwater.problem(highwater.ReleaseMark(2, "0" * 64, {}), forced_older).startswith("release v1.0.0 is "
                                                                                             "sequence 1 here")
    known = state.Known({"sm100": state.Accepted("sm100", TAG, 1, 0, "a" * 64, "b" * 64, "sha256:k")})
    with pytest.raises(state.StateError, match="every release this host accepted is signed by sha256:k"):
        state.judge(None, state.Accepted("sm120", TAG, 1, 0, "a" * 64, "b" * 64, "sha256:other"), False, False,
                    False, known)


def test_a_pre_release_is_never_chosen_as_the_newest(tmp_path, keys):
    from qualify.deploy.errors import DeployError

    (a, _), _ = keys
    make_release(tmp_path / "repo", "v1.0.0", [statement("sm120", DIGEST_A)], a)
    make_release(tmp_path / "repo", "v1.1.0-rc.1", [statement("sm120", DIGEST_B)], a)
    said = []
    chosen = choice.choose_release(tmp_path / "repo" / "manifests", "sm120", "", KeyAnchor(), warn=said.append)
    assert chosen.tag == "v1.0.0" and "v1.1.0-rc.1 is a pre-release" in said[0]
    shutil.rmtree(tmp_path / "repo" / "manifests" / "v1.0.0")
    with pytest.raises(DeployError, match="pre-releases only"):
        choice.choose_release(tmp_path / "repo" / "manifests", "sm120", "", KeyAnchor())
    assert choice.choose_release(tmp_path / "repo" / "manifests", "sm120", "v1.1.0-rc.1", KeyAnchor()).tag == \
        "v1.1.0-rc.1"


def test_a_seeded_host_refuses_a_rollback_on_its_first_deploy(host, docker_engine):
    """docs/trust.md, first use: seed the anti-rollback state from a known release before the first deploy."""
    released(host)
    host.release(statement("sm120", DIGEST_A), tag="v1.1.0")
    host.settings(RELEASE_TAG="v1.1.0", RELEASE_KEY_FINGERPRINT=key_fingerprint(Path(f"{host.key}.pub")))
    seeded = subprocess.run([sys.executable, "-m", "qualify", "deploy", "seed", "--env-file", str(host.env_file)],
                            capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert seeded.returncode == 0 and "now holds release v1.1.0 (sequence 2)" in seeded.stderr, seeded.stderr
    shutil.rmtree(host.manifests / "v1.1.0")
    host.settings(RELEASE_KEY_FINGERPRINT=key_fingerprint(Path(f"{host.key}.pub")))
    done = host.run("start.sh", "--dry-run", "--allow-no-gpu-runtime")
    assert done.returncode == 4 and "refusing a rollback: v1.0.0 (sequence 1, promotion 1) is older than v1.1.0" \
        in done.stderr, done.stderr[-2000:]


def test_the_deploy_says_when_a_baseline_rests_on_unsigned_evidence(host, docker_engine, tmp_path):
    from qualify.release import promote

    path = host.release(statement("sm120", DIGEST_A))
    from deploy_host import PASSWORD
    from evidence_helpers import gpu_checks, sign_with
    sign, key = sign_with(Path(f"{host.key}.key"), PASSWORD)
    from qualify.release import evidence as ev
    t0 = records.parse_time(read_release(path.parent).index.time, "t0")
    runs = []
    for n in range(1, 8):
        checks = gpu_checks(ev.Outcome.PASS)
        runs.append(ev.write(tmp_path / f"e{n}.json", ev.Evidence(
            TAG, "sm120", "12.0", f"r@{DIGEST_A}", DIGEST_A, "sha256:" + "c" * 64,
            ev.Gpu("RTX 5090", "12.0", ev.hashed("g"), "580"), ev.hashed("h"),
            records.format_time(t0 + __import__("datetime").timedelta(seconds=n)), ev.Outcome.PASS, "", checks, {},
            f"{n:032x}")))
    promote.promote(path.parent, TAG, with_matrix(path.parent, runs), sign, key, None, allow_unsigned=True)
    host.settings()
    done = host.run("start.sh", "--dry-run", "--allow-no-gpu-runtime")
    assert done.returncode == 0, done.stderr
    assert "its level baseline rests on evidence no enrolled host signed" in done.stderr


def test_a_duplicate_key_in_a_signed_registry_payload_is_named_as_the_cause(monkeypatch, keys):
    """Medium: it was reported as 'no signed qualification statement ... publish again'."""
    import hashlib

    from qualify.core.fsutil import canonical_json
    from qualify.publish import attestation_verify as av
    from qualify.publish import dsse, oci
    from qualify.signing import keys as cosign_keys
    from qualify.signing.signer import BuiltinSigner

    (a, pub), _ = keys
    from signing_helpers import PASSWORD
    private = cosign_keys.load_private_key(a.read_bytes(), PASSWORD)
    qualification = canonical_json(statement("sm120", DIGEST_A)).replace(b'"predicateType"', b'"predicateType": '
                                                                         b'"x", "predicateType"', 1)
    sha = hashlib.sha256(qualification).hexdigest()
    rs = records.ReleaseStatement(TAG, 1, 0, "2026-12-01T00:00:00Z", "a" * 64, "sm120", sha, sha,
                                  "127.0.0.1:5000/qualify/sm120")
    release_stmt = canonical_json(rs.statement("127.0.0.1:5000/qualify/sm120", DIGEST_A))
    layers = []
    for payload, ptype in ((release_stmt, records.RELEASE_STATEMENT_TYPE), (qualification, mf.PREDICATE_TYPE)):
        data = dsse.sign(BuiltinSigner(private), payload).to_json()
        layers.append((oci.AttLayer("sha256:" + hashlib.sha256(data).hexdigest(), len(data), "application/vnd.dsse",
                                    ptype), data))
    monkeypatch.setattr(av, "resolve", lambda ref: DIGEST_A)
    monkeypatch.setattr(av, "fetch_layers", lambda name, digest: layers)
    with pytest.raises(VerificationError, match="duplicate JSON key 'predicateType'"):
        av.verify_image(f"127.0.0.1:5000/qualify/sm120@{DIGEST_A}", TrustedKey.read(pub))


def test_verify_and_hosts_list_escape_control_characters(capsys, tmp_path, keys):
    """Low: raw control characters from `verify` and `hosts list`."""
    from signing_helpers import PASSWORD

    from qualify.cli import hosts_cmd, verify_cmd
    from qualify.release import verify
    from qualify.trust import hosts

    verify_cmd._print_human(verify.VerifyResult("m\x1b[2J.json", "sm120\r", DIGEST_A, "key", None, None, "pass",
                                                "baseline"))
    (a, pub), _ = keys
    from qualify.signing import signer
    s = signer.key_signer("builtin", a, PASSWORD.encode())
    key = TrustedKey.read(pub)
    hosts_file = tmp_path / "hosts.json"
    hosts.change(hosts_file, s, key,
                 add=records.EnrolledHost("ci", identity="repo\x1b[31m", issuer="https://issuer"))

    class Args:
        action, file, key, json = "list", hosts_file, pub, False

    hosts_cmd.execute(Args())
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\r" not in out and "m\\x1b[2J.json" in out and "repo\\x1b[31m" in out


def with_matrix(release_dir, paths):
    """Each GPU run with the serve-check record of its deployment (a vllm image's baseline needs both: the
    release's signed level_checks), written as serve-check writes it."""
    from signing_helpers import serve_record

    from qualify.release import evidence as ev
    from qualify.release import serving

    m = read_release(release_dir).target("sm120").manifest
    out = list(paths)
    for p in paths:
        gpu = ev.from_bytes(p.read_bytes(), TAG, str(p))
        out.append(serving.write(p.with_name(p.stem + ".serve-check.json"), serve_record(gpu, m)))
    return out
