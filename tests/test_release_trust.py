"""Issue 20: a release a release engineer can trust.

Real git repositories, clones and a bare remote in tmp dirs; real images in the
loopback registry for the digest checks; signatures checked with our verifier
and with openssl.
"""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
import urllib.request
from pathlib import Path

import pytest
from signing_helpers import (
    DIGEST_A,
    DIGEST_B,
    DIGEST_C,
    PASSWORD,
    init_git_repo,
    make_key_pair,
    push_real_image,
    run_qualify,
    write_manifest,
)

from qualify.core.errors import ConfigError, ReleaseError
from qualify.release import checks, release, verify
from qualify.signing import formats, signer

TAG = "v1.0.0"
ENV = {"COSIGN_PASSWORD": PASSWORD}


def git(root: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=root, check=True, capture_output=True, text=True).stdout


def head(root: Path) -> str:
    return git(root, "rev-parse", "HEAD").strip()


def tags(root: Path) -> list:
    return git(root, "tag", "-l").split()


def served_as_recorded(reference: str) -> str:
    """Injected registry: serves every digest a manifest records."""
    return reference.partition("@")[2]


@pytest.fixture
def keys(tmp_path):
    (tmp_path / "keys").mkdir()
    return make_key_pair(tmp_path / "keys")


@pytest.fixture
def repo(tmp_path):
    """Two passing targets, qualified from HEAD."""
    root = init_git_repo(tmp_path / "repo")
    out, rev = root / "build" / "manifests", head(root)
    write_manifest(out / "sm100.json", "sm100", DIGEST_A, revision=rev)
    write_manifest(out / "sm120.json", "sm120", DIGEST_B, revision=rev)
    return root


def options(root: Path, **kw) -> release.ReleaseOptions:
    base = dict(tag=TAG, repo=root, source=root / "build" / "manifests", out_root=root / "manifests", upload=False)
    return release.ReleaseOptions(**{**base, **kw})


def factory(key_file: Path, calls=None):
    def make():
        if calls is not None:
            calls.append("key")
        return signer.key_signer("builtin", key_file, PASSWORD.encode())
    return make


def do_release(root: Path, key_file: Path, resolve=served_as_recorded, **kw) -> release.ReleaseResult:
    return release.run_release(options(root, **kw), factory(key_file), resolve, progress=lambda m: None)


def tree_state(root: Path) -> dict:
    files = {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*")
             if p.is_file() and ".git" not in p.relative_to(root).parts}
    return {"files": files, "refs": git(root, "for-each-ref", "--format=%(refname) %(objectname)")}


# --- bug 1: partial releases, digests by digest -------------------------------------------


@pytest.mark.engine
def test_a_moved_tag_does_not_matter_and_a_vanished_digest_fails_the_release(
        keys, tmp_path, docker_engine, debian_python_image, loopback_registry):
    """The reproducer: another checkout rebuilt the tag. The release checks each image by the digest
    its manifest records; only when the registry no longer serves that digest is the target withheld,
    and then the release fails with no tag and nothing written."""
    key_file, _ = keys
    root = init_git_repo(tmp_path / "repo")
    out, rev = root / "build" / "manifests", head(root)
    registry = loopback_registry.address
    repo_a, digest_a = push_real_image(docker_engine, debian_python_image, registry, "trust-a", tmp_path)
    repo_b, digest_b = push_real_image(docker_engine, debian_python_image, registry, "trust-b", tmp_path)
    for target, repository, digest in (("sm100", repo_a, digest_a), ("sm120", repo_b, digest_b)):
        write_manifest(out / f"{target}.json", target, digest, reference=f"{repository}@{digest}", revision=rev)
    # Another checkout rebuilds the tag trust-b:test: the tag moves to another image.
    ctx = tmp_path / "rebuilt"
    ctx.mkdir()
    (ctx / "Dockerfile").write_text(f"FROM {debian_python_image}\nLABEL qualify-test=rebuilt-by-another-checkout\n")
    subprocess.run([docker_engine, "build", "-q", "-t", f"{repo_b}:test", str(ctx)], check=True, capture_output=True,
                   env={"PATH": "/usr/bin:/bin", "DOCKER_BUILDKIT": "0"})
    pushed = subprocess.run([docker_engine, "push", f"{repo_b}:test"], check=True, capture_output=True, text=True)
    assert digest_b not in pushed.stdout  # the tag really moved
    ok = run_qualify(["release", "v0.1.0", "--key", str(key_file), "--no-upload", "--json"], root, ENV)
    assert ok.returncode == 0, ok.stderr
    assert [e["target"] for e in json.loads(ok.stdout)["released"]] == ["sm100", "sm120"]

    # The registry stops serving sm120's digest (deleted by digest).
    name = repo_b.split("/", 1)[1]
    req = urllib.request.Request(f"http://{registry}/v2/{name}/manifests/{digest_b}", method="DELETE")
    urllib.request.urlopen(req, timeout=10).close()
    before = tree_state(root)
    failed = run_qualify(["release", "v0.2.0", "--key", str(key_file), "--no-upload"], root, ENV)
    assert failed.returncode == ReleaseError.exit_code, failed.stderr
    assert "1 of 2 target(s) withheld" in failed.stderr and "no longer serves" in failed.stderr
    assert "v0.2.0" not in tags(root) and tree_state(root) == before
    assert not (root / "manifests" / "v0.2.0").exists()

    partial = run_qualify(["release", "v0.2.0", "--key", str(key_file), "--no-upload", "--allow-partial"], root, ENV)
    assert partial.returncode == 0, partial.stderr
    assert "v0.2.0" in tags(root) and "WITHHELD" in partial.stdout
    index = json.loads(git(root, "show", "v0.2.0:manifests/v0.2.0/release.json"))
    assert [t["target"] for t in index["targets"]] == ["sm100"] and index["allow_partial"] is True


def test_a_manifest_the_build_record_contradicts_is_withheld_and_fails_the_release(repo, keys):
    """This checkout's build record says the target was rebuilt since it was qualified."""
    key_file, _ = keys
    manifest = json.loads((repo / "build/manifests/sm120.json").read_text())
    manifest["predicate"]["target"]["profile"] = "smoke"
    manifest["predicate"]["base"]["kind"] = "hermetic"
    from qualify.core import manifest as mf
    from qualify.imagebuild.image import BuildRecord
    mf.write(repo / "build/manifests/sm120.json", manifest)
    record = repo / "build" / "images" / "sm120-smoke-hermetic.json"
    record.parent.mkdir(parents=True)
    record.write_text(json.dumps(BuildRecord(
        "sm120", "smoke", "hermetic", "linux/amd64", "base@" + DIGEST_A, f"127.0.0.1:5000/qualify/sm120@{DIGEST_C}",
        "127.0.0.1:5000/qualify/sm120:smoke-hermetic", DIGEST_C, "docker", "default", {}, 1.0).to_json()))
    before = tree_state(repo)
    with pytest.raises(ReleaseError, match="withheld") as err:
        do_release(repo, key_file)
    assert f"the build recorded {DIGEST_C}" in str(err.value)
    assert tags(repo) == [] and tree_state(repo) == before


# --- bug 2: the release travels with its tag ----------------------------------------------


def test_clone_of_the_tag_holds_the_signed_release_and_it_verifies(repo, keys, tmp_path):
    key_file, _ = keys
    remote = tmp_path / "remote.git"
    subprocess.run(["git", "init", "-q", "--bare", str(remote)], check=True)
    git(repo, "remote", "add", "origin", str(remote))
    git(repo, "push", "-q", "origin", "main")
    branch_before = head(repo)
    outcome = do_release(repo, key_file, push=True)
    assert outcome.push == "pushed"
    assert head(repo) == branch_before  # the branch does not move; the tag carries the release commit
    assert git(repo, "cat-file", "-t", TAG).strip() == "tag"
    assert git(repo, "rev-parse", f"{TAG}^{{commit}}^").strip() == branch_before
    assert git(repo, "show", f"{TAG}:manifests/{TAG}/release.json") == (repo / f"manifests/{TAG}/release.json").read_text()

    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", "--branch", TAG, str(remote), str(clone)], check=True,
                   capture_output=True)
    rel = clone / "manifests" / TAG
    assert sorted(p.name for p in rel.iterdir()) == outcome.files
    for target, digest in (("sm100", DIGEST_A), ("sm120", DIGEST_B)):
        result = verify.verify(verify.VerifyOptions(rel / f"{target}.json", key=rel / "cosign.pub",
                                                    image=f"127.0.0.1:5000/qualify/{target}@{digest}",
                                                    require_pass=True))
        assert result.verdict == "pass"
    # Independently of our verifier: openssl checks the signature in the clone.
    openssl = shutil.which("openssl")
    if openssl:
        sig = tmp_path / "sig.der"
        sig.write_bytes(base64.b64decode((rel / "sm100.json.sig").read_bytes()))
        done = subprocess.run([openssl, "dgst", "-sha256", "-verify", str(rel / "cosign.pub"), "-signature", str(sig),
                               str(rel / "sm100.json")], capture_output=True, text=True)
        assert done.returncode == 0 and "Verified OK" in done.stdout
    cli = run_qualify(["verify", f"manifests/{TAG}/sm120.json", "--key", f"manifests/{TAG}/cosign.pub",
                       "--require-pass"], clone)
    assert cli.returncode == 0, cli.stderr


def test_without_push_the_commands_are_printed(repo, keys, capsys):
    from qualify.cli import release_cmd

    key_file, _ = keys
    release_cmd._print_human(do_release(repo, key_file))
    printed = capsys.readouterr().out
    assert f"git push origin refs/tags/{TAG}" in printed
    assert f"gh release upload {TAG} manifests/{TAG}/cosign.pub" in printed
    assert f"gh release create {TAG} --verify-tag" in printed


# --- bug 3: --force removes only what a release wrote ---------------------------------------


def test_force_leaves_every_file_it_did_not_write_untouched(repo, keys):
    key_file, _ = keys
    do_release(repo, key_file)
    rel = repo / "manifests" / TAG
    (rel / "NOTES.md").write_text("the release engineer's notes\n")
    # The next run releases only sm100: sm120's files were written by the first release.
    (repo / "build/manifests/sm120.json").unlink()
    with pytest.raises(ReleaseError, match="already exists .* holds another release"):
        do_release(repo, key_file)
    outcome = do_release(repo, key_file, force=True)
    assert (rel / "NOTES.md").read_text() == "the release engineer's notes\n"
    assert outcome.left_untouched == ["NOTES.md"]
    assert sorted(outcome.removed) == ["sm120.json", "sm120.json.sig", "sm120.json.sigstore.json"]
    assert not (rel / "sm120.json").exists()
    # The release commit holds the release's files only.
    listed = git(repo, "ls-tree", "--name-only", f"{TAG}:manifests/{TAG}").split()
    assert "NOTES.md" not in listed and sorted(listed) == outcome.files


def test_a_tag_colliding_with_a_committed_folder_is_refused(repo, keys):
    """The reproducer: `release evidence --force` deleted the committed manifests/evidence/README.md."""
    key_file, _ = keys
    evidence = repo / "manifests" / "evidence"
    (evidence / "h200").mkdir(parents=True)
    (evidence / "README.md").write_text("committed evidence\n")
    (evidence / "h200" / "probe.json").write_text("{}\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "evidence")
    out, rev = repo / "build" / "manifests", head(repo)
    write_manifest(out / "sm100.json", "sm100", DIGEST_A, revision=rev)
    write_manifest(out / "sm120.json", "sm120", DIGEST_B, revision=rev)
    before = tree_state(repo)
    cli = run_qualify(["release", "evidence", "--force", "--any-tag", "--no-upload", "--key", str(key_file)], repo, ENV)
    assert cli.returncode == ReleaseError.exit_code, cli.stderr
    assert "collides with an existing folder" in cli.stderr and "Traceback" not in cli.stderr
    assert tree_state(repo) == before and tags(repo) == []
    # An untracked folder holding a directory is refused the same way (no IsADirectoryError).
    (repo / "manifests" / "v2.0.0" / "sub").mkdir(parents=True)
    with pytest.raises(ReleaseError, match="holds folders or links"):
        do_release(repo, key_file, tag="v2.0.0", force=True)


# --- safety rails ----------------------------------------------------------------------------


def test_a_dirty_tree_is_refused_unless_allowed_and_then_recorded(repo, keys):
    key_file, _ = keys
    (repo / "README.md").write_text("edited, not committed\n")
    calls = []
    with pytest.raises(ReleaseError, match="work tree is not clean: README.md"):
        release.run_release(options(repo), factory(key_file, calls), served_as_recorded, progress=lambda m: None)
    assert calls == [] and tags(repo) == []
    outcome = do_release(repo, key_file, allow_dirty=True)
    assert outcome.dirty == ["README.md"]
    index = json.loads((repo / "manifests" / TAG / "release.json").read_text())
    assert index["dirty"] == {"allowed": True, "paths": ["README.md"]}


@pytest.mark.parametrize("tag,ok", [("v1.2.3", True), ("1.2.3-rc.1", True), ("v1.2.3-beta.2", True),
                                    ("v2026.11.0", True), ("latest", False), ("v1.2", False), ("v01.2.3", False),
                                    ("v1.2.3+build.5", False)])
def test_the_tag_must_be_a_version_unless_any_tag(tag, ok):
    if ok:
        checks.check_tag_name(tag, any_tag=False)
    else:
        with pytest.raises(ReleaseError, match="not a version tag"):
            checks.check_tag_name(tag, any_tag=False)
        if "+" not in tag:
            checks.check_tag_name(tag, any_tag=True)


def test_the_key_and_its_password_are_checked_before_any_image_work(repo, keys):
    key_file, _ = keys
    asked = []

    def resolve(reference):
        asked.append(reference)
        return served_as_recorded(reference)

    cli = run_qualify(["release", TAG, "--key", str(key_file), "--no-upload"], repo,
                      {"COSIGN_PASSWORD": "wrong password", "QUALIFY_REGISTRY": "127.0.0.1:1"})
    assert cli.returncode == ConfigError.exit_code and "wrong password" in cli.stderr
    with pytest.raises(ConfigError, match="wrong password"):
        release.run_release(options(repo), lambda: signer.key_signer("builtin", key_file, b"wrong"), resolve,
                            progress=lambda m: None)
    assert asked == [] and tags(repo) == []


def test_dry_run_prints_everything_and_changes_nothing(repo, keys):
    key_file, _ = keys
    before = tree_state(repo)
    calls = []
    outcome = release.run_release(options(repo, dry_run=True), factory(key_file, calls), served_as_recorded,
                                  progress=lambda m: None)
    # Issue 30, item 14: the key and its password are checked, as the dry run promises; nothing else changes.
    assert calls == ["key"] and tree_state(repo) == before and tags(repo) == []
    text = "\n".join(release.dry_run_lines(outcome, options(repo)))
    for word in (f"manifests/{TAG}/sm100.json", "release.json", f"tag it {TAG}", "git push origin",
                 "gh release upload", DIGEST_A, "Changes: first release"):
        assert word in text, word
    assert [s.status for s in outcome.steps if s.name in ("sign", "write", "commit", "push", "publish")] == \
        ["skipped"] * 5


def test_the_tag_message_has_a_changelog_since_the_previous_release(repo, keys):
    key_file, _ = keys
    do_release(repo, key_file, tag="v1.0.0")
    out, rev = repo / "build" / "manifests", head(repo)
    write_manifest(out / "sm120.json", "sm120", DIGEST_C, revision=rev, level="unverified",
                   statuses={"fatbin-arch": "pass", "gpu-smoke": "not-run"})
    write_manifest(out / "sm121.json", "sm121", DIGEST_A, revision=rev)
    outcome = do_release(repo, key_file, tag="v1.1.0")
    message = git(repo, "tag", "-l", "--format=%(contents)", "v1.1.0")
    assert "Changes since v1.0.0:" in message
    assert "= sm100: unchanged" in message
    assert f"~ sm120: digest {DIGEST_B} -> {DIGEST_C}; level experimental -> unverified; verdict pass -> incomplete" in message
    assert "check gpu-smoke: absent -> not-run" in message  # qualify diff underneath
    assert "+ sm121: new" in message
    assert outcome.tag_message == message.rstrip("\n") + "\n"  # git adds a blank line


def test_steps_are_ordered_and_each_is_reported(repo, keys):
    key_file, _ = keys
    outcome = do_release(repo, key_file)
    assert [s.name for s in outcome.steps] == ["tag", "tree", "key", "manifests", "source", "sign", "write",
                                               "registry", "commit", "tag", "push", "publish"]
    assert all(s.status == "done" for s in outcome.steps if s.name != "registry")
    assert [s.status for s in outcome.steps if s.name == "registry"] == ["skipped"]  # no --publish-to
    assert formats.signature_path(repo / "manifests" / TAG / "sm100.json").is_file()


def test_force_re_signs_as_its_help_says(repo, keys):
    """A randomised signer (as cosign's ECDSA is): a re-run keeps the signature, --force makes a new one."""
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec

    key_file, _ = keys
    inner = signer.key_signer("builtin", key_file, PASSWORD.encode())

    class Randomised:
        name = "randomised"

        def public_key(self):
            return inner.public_key()

        def sign_blob(self, data: bytes) -> formats.BlobSignature:
            sig = inner.private_key.sign(data, ec.ECDSA(hashes.SHA256()))
            return formats.BlobSignature(sig, formats.bundle_bytes(formats.make_bundle(data, sig, inner.public_key())),
                                         self.name)

        def sign_dsse(self, pae: bytes) -> bytes:
            return inner.private_key.sign(pae, ec.ECDSA(hashes.SHA256()))

    def run(**kw):
        return release.run_release(options(repo, **kw), lambda: Randomised(), served_as_recorded,
                                   progress=lambda m: None)

    run()
    sig_file = repo / "manifests" / TAG / "sm100.json.sig"
    first = sig_file.read_bytes()
    outcome = run(force=True)
    assert sig_file.read_bytes() != first and "sm100.json.sig" in outcome.written
    assert verify.verify(verify.VerifyOptions(repo / "manifests" / TAG / "sm100.json",
                                              key=repo / "manifests" / TAG / "cosign.pub")).verdict == "pass"



def test_publishing_is_composed_between_writing_and_tagging_and_the_tag_names_the_published_images(repo, keys):
    """The CLI composes qualify/publish in (tested against real TLS registries in test_publish.py); here a
    STAND-IN for it writes the publication record as publish does (signed by the release's own signer, which
    the release hands it: one password), so the composition alone is checked."""
    from qualify.trust import folder as trust_folder
    from qualify.trust import journal
    from qualify.trust import records as trust_records

    key_file, _ = keys
    published = f"registry.example/acme/sm100@{DIGEST_A}"
    handed = []

    def stand_in_publish(release_signer):
        handed.append(release_signer)
        verified = trust_folder.read_release(repo / "manifests" / TAG)
        image = trust_records.PublishedImage("sm100", published, f"registry.example/acme/sm100:{TAG}", DIGEST_A,
                                             verified.target("sm100").manifest.subject,
                                             f"registry.example/acme/sm100:sha256-{DIGEST_A[7:]}.att",
                                             ("https://in-toto.io/attestation/release",), "not pushed")
        record = trust_records.Publication(TAG, verified.index_sha256, "registry.example/acme",
                                           verified.key.fingerprint, (image,))
        journal.write_signed_files(repo / "manifests" / TAG, [("published.json", record.to_bytes())],
                                   release_signer, verified.key)
        return ["Published to registry.example/acme:", f"  sm100  {published}"], \
            ["published.json", "published.json.sig", "published.json.sigstore.json"]

    outcome = release.run_release(options(repo), factory(key_file), served_as_recorded, progress=lambda m: None,
                                  registry_publish=stand_in_publish)
    names = [s.name for s in outcome.steps]
    assert names.index("write") < names.index("registry") < names.index("commit")
    message = git(repo, "cat-file", "-p", TAG)
    assert f"  sm100  {published}" in message and "Published to registry.example/acme:" in message
    assert published in git(repo, "show", f"{TAG}:manifests/{TAG}/published.json")
    from qualify.trust import verify as trust_verify
    verified = trust_folder.read_release(repo / "manifests" / TAG)
    assert verified.publication is not None and len(handed) == 1 and handed[0].public_key() is not None
    assert "published.json" not in dict(verified.index.files)  # written after the index, bound to it by its sha256
    assert "published.json" in trust_verify.removable_by_force(verified)  # a later --force may replace it


def test_generate_key_says_what_to_commit_and_the_release_then_checks_its_key(repo, tmp_path):
    """Issue 30, item 2: generate-key left cosign.pub in the root and the next `release` refused a dirty tree."""
    (repo / ".gitignore").write_text("build/\n/cosign.key\n")  # as this repository ignores its private key
    git(repo, "commit", "-q", "-am", "ignore the private key")
    made = run_qualify(["sign", "generate-key"], repo, ENV)
    assert made.returncode == 0, made.stderr
    fingerprint = made.stdout.split("RELEASE_KEY_FINGERPRINT=", 1)[1].split()[0]
    assert "git add cosign.pub && git commit" in made.stdout and fingerprint.startswith("sha256:")
    refused = run_qualify(["release", TAG, "--key", "cosign.key", "--no-upload", "--dry-run"], repo, ENV)
    assert refused.returncode == ReleaseError.exit_code and "commit the release's public key first" in refused.stderr
    git(repo, "add", "cosign.pub")
    git(repo, "commit", "-q", "-m", "release key")
    out, rev = repo / "build" / "manifests", head(repo)
    write_manifest(out / "sm100.json", "sm100", DIGEST_A, revision=rev)
    write_manifest(out / "sm120.json", "sm120", DIGEST_B, revision=rev)
    assert do_release(repo, repo / "cosign.key").released
    other_key, _ = make_key_pair(tmp_path, prefix="other")
    with pytest.raises(ReleaseError, match="but the repository's cosign.pub is " + fingerprint):
        do_release(repo, other_key, tag="v1.1.0")
