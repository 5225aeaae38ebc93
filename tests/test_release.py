"""`qualify release TAG` in a temporary git repository, then `qualify verify` of what it wrote."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from signing_helpers import (
    DIGEST_A,
    DIGEST_B,
    DIGEST_C,
    PASSWORD,
    REGISTRY,
    assert_no_secrets,
    init_git_repo,
    make_key_pair,
    path_with,
    push_real_image,
    run_qualify,
    secrets_of,
    tree_texts,
    write_manifest,
    write_script,
)

from qualify.core.errors import ReleaseError, VerificationError
from qualify.release import release, verify
from qualify.signing import formats, signer

TAG = "v2026.11.0"
DIGESTS = {"sm100": DIGEST_A, "sm120": DIGEST_B, "sm121": DIGEST_C}


def ref(target: str) -> str:
    return f"{REGISTRY}/qualify/{target}@{DIGESTS[target]}"


@pytest.fixture
def repo(tmp_path):
    """A git repository with three qualified manifests in build/manifests.

    sm100 passes (experimental: one run on its GPU, the most a release ships); sm120 was qualified statically
    (incomplete, unverified); sm121 has a failing required check.
    """
    root = init_git_repo(tmp_path / "repo")
    qualify_all(root)
    return root


def head(root: Path) -> str:
    return git(root, "rev-parse", "HEAD").strip()


def qualify_all(root: Path) -> None:
    """The three manifests, qualified from the repository's HEAD (their source revision)."""
    out, rev = root / "build" / "manifests", head(root)
    write_manifest(out / "sm100.json", "sm100", DIGEST_A, level="experimental", revision=rev)
    write_manifest(out / "sm120.json", "sm120", DIGEST_B, level="unverified", revision=rev,
                   statuses={"fatbin-arch": "pass", "triton-compile": "pass", "gpu-smoke": "not-run"})
    write_manifest(out / "sm121.json", "sm121", DIGEST_C, level="unsupported", revision=rev,
                   statuses={"fatbin-arch": "pass", "triton-compile": "fail"})


@pytest.fixture
def keys(tmp_path):
    (tmp_path / "keys").mkdir()
    return make_key_pair(tmp_path / "keys")


def built_images(reference: str) -> str:
    """Injected resolver: every image was built with the digest its manifest records."""
    name, _, digest = reference.partition("@")
    return digest


def options(root: Path, **kw) -> release.ReleaseOptions:
    # sm121 fails a check in the fixture: these tests release the other two (--allow-partial).
    defaults = dict(tag=TAG, repo=root, source=root / "build" / "manifests", out_root=root / "manifests",
                    upload=False, allow_partial=True)
    return release.ReleaseOptions(**{**defaults, **kw})


def builtin_factory(key_file: Path):
    return lambda: signer.key_signer("builtin", key_file, PASSWORD.encode())


def do_release(root, key_file, resolve=built_images, **kw) -> release.ReleaseResult:
    return release.run_release(options(root, **kw), builtin_factory(key_file), resolve, progress=lambda m: None)


def git(root: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=root, check=True, capture_output=True, text=True).stdout


def snapshot(root: Path) -> dict:
    """Every work-tree file's content and every ref, to prove a refusal changed nothing."""
    files = {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
             for p in root.rglob("*") if p.is_file() and ".git" not in p.relative_to(root).parts}
    return {"files": files, "refs": git(root, "for-each-ref", "--format=%(refname) %(objectname)")}


def test_release_then_verify_and_every_tampering_is_named(repo, keys, tmp_path):
    key_file, _ = keys
    outcome = do_release(repo, key_file)
    rel = repo / "manifests" / TAG
    assert [e.target for e in outcome.released] == ["sm100", "sm120"]
    assert sorted(p.name for p in rel.iterdir()) == sorted(
        ["cosign.pub"] + [f"{name}{s}" for name in ("release.json", "sm100.json", "sm120.json")
                          for s in ("", ".sig", ".sigstore.json")])
    for target in ("sm100", "sm120"):  # the exact manifest bytes
        assert (rel / f"{target}.json").read_bytes() == (repo / "build/manifests" / f"{target}.json").read_bytes()

    pub = rel / "cosign.pub"
    for target in ("sm100", "sm120"):
        result = verify.verify(verify.VerifyOptions(rel / f"{target}.json", key=pub, image=ref(target),
                                                    require_pass=True))
        assert result.support_level == {"sm100": "experimental", "sm120": "unverified"}[target]

    # Swapping in another key.
    _, other_pub = make_key_pair(tmp_path, prefix="other")
    with pytest.raises(VerificationError, match="^signature check failed"):
        verify.verify(verify.VerifyOptions(rel / "sm100.json", key=other_pub))
    # Pointing --image at another digest (CLI, to see the message a user sees).
    cli = run_qualify(["verify", str(rel / "sm100.json"), "--key", str(pub), "--image",
                       f"{REGISTRY}/qualify/sm100@{DIGEST_B}"], repo)
    assert cli.returncode == VerificationError.exit_code and "image digest check failed" in cli.stderr
    # Editing one byte of the manifest.
    data = bytearray((rel / "sm100.json").read_bytes())
    data[-3] ^= 0x01
    (rel / "sm100.json").write_bytes(bytes(data))
    cli = run_qualify(["verify", str(rel / "sm100.json"), "--key", str(pub)], repo)
    assert cli.returncode == VerificationError.exit_code and "signature check failed" in cli.stderr


def test_release_index_and_tag_message(repo, keys):
    key_file, _ = keys
    do_release(repo, key_file)
    rel = repo / "manifests" / TAG
    index = json.loads((rel / "release.json").read_text())
    assert index["tag"] == TAG and index["source_revision"] == git(repo, "rev-parse", "HEAD").strip()
    by_target = {t["target"]: t for t in index["targets"]}
    assert by_target["sm100"]["image"] == {"reference": ref("sm100"), "digest": DIGEST_A}
    assert by_target["sm120"]["support_level"] == "unverified"  # ships as such
    assert by_target["sm100"]["manifest_sha256"] == hashlib.sha256((rel / "sm100.json").read_bytes()).hexdigest()
    assert index["withheld"] == [{"target": "sm121", "reason": "failing checks: triton-compile"}]

    assert git(repo, "cat-file", "-t", TAG).strip() == "tag"  # annotated
    message = git(repo, "tag", "-l", "--format=%(contents)", TAG)
    for target in ("sm100", "sm120"):
        assert f"{DIGESTS[target]}  manifest sha256:{by_target[target]['manifest_sha256']}" in message
    assert "sm121: failing checks: triton-compile" in message
    assert f"sha256:{hashlib.sha256((rel / 'release.json').read_bytes()).hexdigest()}" in message


def test_min_level_raises_the_bar(repo, keys):
    key_file, _ = keys
    outcome = do_release(repo, key_file, min_level="experimental")
    assert [e.target for e in outcome.released] == ["sm100"]
    assert {w.target: w.reason for w in outcome.withheld}["sm120"] == (
        "support level unverified is below --min-level experimental")
    with pytest.raises(ReleaseError, match="--min-level baseline: a release ships targets at experimental at most"):
        do_release(repo, key_file, min_level="baseline")  # baseline comes only from promote (issue 37)


def test_image_digest_mismatch_withholds_the_target(repo, keys):
    key_file, _ = keys

    def rebuilt(reference: str) -> str:
        return DIGEST_C if "/sm100" in reference else built_images(reference)

    outcome = do_release(repo, key_file, resolve=rebuilt)
    reason = {w.target: w.reason for w in outcome.withheld}["sm100"]
    assert reason.startswith("image digest check failed") and DIGEST_C in reason
    assert not (repo / "manifests" / TAG / "sm100.json").exists()


def test_nothing_to_release_is_refused_and_writes_nothing(repo, keys):
    key_file, _ = keys
    before = snapshot(repo)
    with pytest.raises(ReleaseError, match="nothing to release"):
        do_release(repo, key_file, min_level="experimental", resolve=lambda reference: None)  # none served
    assert snapshot(repo) == before


def test_second_release_without_force_is_refused_and_changes_nothing(repo, keys):
    key_file, _ = keys
    do_release(repo, key_file)
    before = snapshot(repo)
    tag_before = git(repo, "cat-file", "-p", TAG)
    asked = []

    def factory():
        asked.append("password")
        return builtin_factory(key_file)()

    # Another release under the same tag: refused before the key's password is asked for, nothing changed.
    write_manifest(repo / "build" / "manifests" / "sm100.json", "sm100", DIGEST_A, level="unverified",
                   revision=head(repo))
    changed = snapshot(repo)
    with pytest.raises(ReleaseError, match=f"tag {TAG} already exists .* and holds another release .other manifests "
                                           "for sm100."):
        release.run_release(options(repo), factory, built_images, progress=lambda m: None)
    assert snapshot(repo) == changed and git(repo, "cat-file", "-p", TAG) == tag_before
    assert asked == []  # refused before asking for the key's password
    cli = run_qualify(["release", TAG, "--key", str(key_file), "--no-upload"], repo,
                      {"COSIGN_PASSWORD": PASSWORD})
    assert cli.returncode == ReleaseError.exit_code and "already exists" in cli.stderr
    assert snapshot(repo) == changed and git(repo, "cat-file", "-p", TAG) == tag_before
    assert before != changed


def test_force_moves_the_tag_and_rewrites(repo, keys):
    key_file, _ = keys
    do_release(repo, key_file)
    first = git(repo, "rev-parse", f"{TAG}^{{commit}}^").strip()
    (repo / "NOTES").write_text("a later commit\n")
    git(repo, "add", "NOTES")
    git(repo, "commit", "-q", "-m", "later")
    qualify_all(repo)  # re-qualified at the later commit: the manifests name it as their source
    outcome = do_release(repo, key_file, force=True)
    # The tag points at the release commit, whose parent is the source the manifests name.
    assert git(repo, "rev-parse", f"{TAG}^{{commit}}^").strip() == git(repo, "rev-parse", "HEAD").strip() != first
    assert "release.json" in outcome.written  # the index (its source revision) changed


def test_interrupted_release_resumes(repo, keys, monkeypatch):
    key_file, _ = keys
    real_create_tag = release.create_tag

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(release, "create_tag", interrupted)
    with pytest.raises(KeyboardInterrupt):
        do_release(repo, key_file)
    files = {p.name: p.read_bytes() for p in (repo / "manifests" / TAG).iterdir()}
    assert "release.json" in files and git(repo, "tag", "-l").strip() == ""

    monkeypatch.setattr(release, "create_tag", real_create_tag)
    outcome = do_release(repo, key_file)  # no --force needed: identical files, no tag
    assert outcome.written == [] and sorted(outcome.unchanged) == sorted(files)
    assert {p.name: p.read_bytes() for p in (repo / "manifests" / TAG).iterdir()} == files
    assert git(repo, "tag", "-l").strip() == TAG
    assert not list(repo.glob(".*staging*")) and not list((repo / "manifests").glob(".*"))


class RandomisedSigner:
    """Signs like cosign does: ECDSA with a random nonce, so every signature differs."""

    name = "randomised"

    def __init__(self, inner: signer.BuiltinSigner):
        self.inner = inner

    def sign_file(self, blob, signature_out, bundle_out):
        data = blob.read_bytes()
        sig = self.inner.private_key.sign(data, ec.ECDSA(hashes.SHA256()))
        signature_out.write_bytes(formats.encode_signature(sig))
        bundle_out.write_bytes(formats.bundle_bytes(formats.make_bundle(data, sig, self.inner.public_key)))
        return formats.SignedFiles(blob, signature_out, bundle_out, self.name)


def test_rerun_keeps_signatures_a_randomised_signer_made(repo, keys, monkeypatch):
    key_file, _ = keys
    inner, public_key = signer.key_signer("builtin", key_file, PASSWORD.encode())
    monkeypatch.setattr(release, "create_tag", lambda *a, **k: (_ for _ in ()).throw(KeyboardInterrupt))
    with pytest.raises(KeyboardInterrupt):
        release.run_release(options(repo), lambda: (RandomisedSigner(inner), public_key), built_images,
                            progress=lambda m: None)
    sig = (repo / "manifests" / TAG / "sm100.json.sig").read_bytes()
    monkeypatch.undo()
    outcome = release.run_release(options(repo), lambda: (RandomisedSigner(inner), public_key), built_images,
                                  progress=lambda m: None)
    assert outcome.written == [] and (repo / "manifests" / TAG / "sm100.json.sig").read_bytes() == sig


def test_other_files_in_the_release_folder_need_force(repo, keys):
    key_file, _ = keys
    rel = repo / "manifests" / TAG
    rel.mkdir(parents=True)
    (rel / "sm100.json").write_text('{"not": "the qualified manifest"}\n')
    before = snapshot(repo)
    with pytest.raises(ReleaseError, match="differ: sm100.json"):
        do_release(repo, key_file)
    assert snapshot(repo) == before and git(repo, "tag", "-l").strip() == ""
    do_release(repo, key_file, force=True)
    assert (rel / "sm100.json").read_bytes() == (repo / "build/manifests/sm100.json").read_bytes()


def test_another_key_on_rerun_is_a_conflict(repo, keys, tmp_path, monkeypatch):
    key_file, _ = keys
    monkeypatch.setattr(release, "create_tag", lambda *a, **k: (_ for _ in ()).throw(KeyboardInterrupt))
    with pytest.raises(KeyboardInterrupt):
        do_release(repo, key_file)
    monkeypatch.undo()
    other_key, _ = make_key_pair(tmp_path, prefix="other")
    with pytest.raises(ReleaseError, match="cosign.pub"):
        do_release(repo, other_key)


def test_upload_prints_the_command_without_gh_and_runs_it_with_gh(repo, keys, tmp_path, monkeypatch):
    key_file, _ = keys
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    messages = []
    outcome = release.run_release(options(repo, upload=True), builtin_factory(key_file), built_images,
                                  progress=messages.append)
    assert outcome.upload == "not uploaded: gh unavailable"
    assert outcome.upload_command[:4] == ["gh", "release", "upload", TAG]
    assert f"manifests/{TAG}/sm100.json.sig" in outcome.upload_command
    assert any("not uploaded" in m for m in messages)

    # A TEST DOUBLE for gh (not installed here): logged in, records its argv.
    log = tmp_path / "gh.log"
    (tmp_path / "bin").mkdir()
    write_script(tmp_path / "bin" / "gh", f"#!/bin/sh\necho \"$@\" >> {log}\nexit 0\n")
    monkeypatch.setenv("PATH", path_with(tmp_path / "bin"))
    outcome = release.run_release(options(repo, upload=True, force=True), builtin_factory(key_file), built_images,
                                  progress=lambda m: None)
    assert outcome.upload == "uploaded"
    calls = log.read_text().splitlines()
    assert calls[0] == "auth status"
    assert calls[1].startswith(f"release upload {TAG} manifests/{TAG}/cosign.pub") and calls[1].endswith("--clobber")


@pytest.mark.engine
def test_cli_release_json_and_no_secret_anywhere(keys, tmp_path, docker_engine, debian_python_image, loopback_registry):
    """The CLI end to end against real images in the loopback registry (no resolver injected)."""
    key_file, _ = keys
    root = init_git_repo(tmp_path / "cli-repo")
    out = root / "build" / "manifests"
    real = {t: push_real_image(docker_engine, debian_python_image, loopback_registry.address, f"release-{t}", tmp_path)
            for t in ("sm100", "sm120", "sm121")}
    statuses = {"sm100": None, "sm120": {"triton-compile": "pass", "gpu-smoke": "not-run"},
                "sm121": {"fatbin-arch": "pass", "triton-compile": "fail"}}
    for t, (repository, digest) in real.items():
        write_manifest(out / f"{t}.json", t, digest, statuses=statuses[t], reference=f"{repository}@{digest}",
                       revision=head(root))
    env = {"COSIGN_PASSWORD": PASSWORD}
    result = run_qualify(["release", TAG, "--key", str(key_file), "--json", "--allow-partial"], root, env)
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert [e["target"] for e in summary["released"]] == ["sm100", "sm120"]
    assert summary["withheld"] == [{"target": "sm121", "reason": "failing checks: triton-compile"}]
    assert summary["upload"].startswith("not uploaded")
    image = "{}@{}".format(*real["sm100"])
    verified = run_qualify(["verify", f"manifests/{TAG}/sm100.json", "--key", f"manifests/{TAG}/cosign.pub",
                            "--image", image, "--require-pass"], root, env)
    assert verified.returncode == 0, verified.stderr
    other = "{}@{}".format(*real["sm120"])
    wrong = run_qualify(["verify", f"manifests/{TAG}/sm100.json", "--key", f"manifests/{TAG}/cosign.pub",
                         "--image", other], root, env)
    assert wrong.returncode != 0 and "image digest" in wrong.stderr

    texts = [result.stdout, result.stderr, verified.stdout, verified.stderr, *tree_texts(root),
             git(root, "cat-file", "-p", TAG), git(root, "log", "--all", "-p")]
    assert_no_secrets(texts, secrets_of(key_file))


# --- interruptions: a real run killed (SIGKILL) at a named step, then the same command again -----------------


_KILLED_RUN = """
import sys
from pathlib import Path
from qualify.release import release
from qualify.signing import signer
repo, key, password = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3].encode()
opts = release.ReleaseOptions(tag=sys.argv[4], repo=repo, source=repo / "build" / "manifests",
                              out_root=repo / "manifests", upload=False, allow_partial=True)
out = release.run_release(opts, lambda: signer.key_signer("builtin", key, password),
                          lambda reference: reference.partition("@")[2], progress=lambda m: None)
print("RECOVERED:", " | ".join(out.recovered))
"""


def _run_killable(repo: Path, key_file: Path, kill_at: str = "") -> subprocess.CompletedProcess:
    import os
    import sys

    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    if kill_at:
        env["QUALIFY_KILL_AT"] = kill_at
    return subprocess.run([sys.executable, "-c", _KILLED_RUN, str(repo), str(key_file), PASSWORD, TAG], env=env,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("step", ["release:written", "release:committed", "release:tagged"])
def test_a_release_killed_at_any_step_is_finished_by_running_it_again(repo, keys, tmp_path, step):
    """Issue 30, item 8: killed after tagging, the re-run used to refuse 'tag already exists'. Now the same
    release at the same source finishes what is left, gives the same bytes, tag and commit, and says what it
    found done."""
    key_file, _ = keys
    clean = tmp_path / "clean"
    shutil.copytree(repo, clean)
    assert _run_killable(clean, key_file).returncode == 0  # an uninterrupted run, for comparison
    killed = _run_killable(repo, key_file, step)
    assert killed.returncode == -9, killed.stderr
    again = _run_killable(repo, key_file)
    assert again.returncode == 0, again.stderr
    files = lambda root: {p.name: p.read_bytes() for p in (root / "manifests" / TAG).iterdir()}  # noqa: E731
    assert files(repo) == files(clean)
    tree = lambda root: git(root, "rev-parse", f"{TAG}^{{tree}}").strip()  # noqa: E731
    assert tree(repo) == tree(clean) and git(repo, "tag", "-l").split() == [TAG]
    assert "already written, identical" in again.stdout
    if step == "release:tagged":
        assert "was already made by an earlier run" in again.stdout
    status = git(repo, "status", "--porcelain", "--untracked-files=all")
    assert "staging" not in status and not list((repo / ".git" / "qualify-staging").glob("*"))


def test_a_kill_in_the_write_step_leaves_nothing_that_blocks_the_next_release(repo, keys):
    """Issue 30, item 7: the killed run's staging folder used to stay in the work tree and make every later
    release a dirty tree. It is in the git folder now, and removed by the next run before the tree check."""
    key_file, _ = keys
    stale = repo / ".git" / "qualify-staging" / f"release-{TAG}.staging-killed"
    stale.mkdir(parents=True)
    (stale / "sm100.json").write_text("half")
    outcome = do_release(repo, key_file)
    assert not stale.exists() and outcome.dirty == []
    index = json.loads((repo / "manifests" / TAG / "release.json").read_text())
    assert index["dirty"] == {"allowed": False, "paths": []}
