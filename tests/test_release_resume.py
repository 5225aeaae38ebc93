"""Issue 41, items 1 and 2: `release --publish-to` resumes, `release` after `publish` converges, and a
`release --force` killed while writing its folder finishes from its own journal (trust/journal.py, the one
writer). Each is the real CLI, killed with SIGKILL at a named point (QUALIFY_KILL_AT, core/killpoint.py),
then the identical command again: exit 0, the same tag object and signatures, and it says what it found.

The images are real: a small OCI image made here and pushed with skopeo into the loopback registry (Debian's
docker-registry; no container engine is needed), published by the real publish stage into another
namespace of that registry.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import shutil
import tarfile
import uuid
from pathlib import Path

import pytest
from conftest import require
from signing_helpers import PASSWORD, init_git_repo, make_key_pair, predicate, run_qualify

from qualify.core import manifest as mf
from qualify.host import skopeo
from qualify.host.registry import Registry
from qualify.publish import oci
from qualify.trust import folder

TAG = "v1.0.0"
TARGET = "sm100"


@pytest.fixture(scope="module")
def registry():
    """The loopback registry (a real docker-registry on 127.0.0.1), started when nobody has yet."""
    require(shutil.which("docker-registry") is not None or Path("/usr/bin/docker-registry").exists(),
            "Debian's docker-registry is not installed (scripts/setup-host.sh)")
    return Registry.from_env().ensure()


def _image(registry: Registry, tmp: Path) -> tuple:
    """(repository, digest) of a one-file linux/amd64 OCI image pushed into the registry."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        data = f"release-resume {uuid.uuid4().hex}\n".encode()
        info = tarfile.TarInfo("etc/qualify-test")
        info.size, info.mtime = len(data), 0
        tar.addfile(info, io.BytesIO(data))
    layer = gzip.compress(raw.getvalue(), mtime=0)
    config = oci.dumps({"architecture": "amd64", "os": "linux", "config": {},
                        "rootfs": {"type": "layers", "diff_ids": [oci.digest_of(raw.getvalue())]}})
    manifest = oci.dumps({"schemaVersion": 2, "mediaType": oci.OCI_MANIFEST,
                          "config": oci.Descriptor("application/vnd.oci.image.config.v1+json", oci.digest_of(config),
                                                   len(config)).as_json(),
                          "layers": [oci.Descriptor("application/vnd.oci.image.layer.v1.tar+gzip", oci.digest_of(layer),
                                                    len(layer)).as_json()]})
    doc = oci.Document(manifest, oci.OCI_MANIFEST, ((oci.digest_of(config), config), (oci.digest_of(layer), layer)))
    repository = f"{registry.address}/qualify-test-resume/{uuid.uuid4().hex[:12]}/{TARGET}"
    oci.write_layout(tmp / "layout", doc, "push")
    skopeo.copy(f"oci:{tmp / 'layout'}:push", f"docker://{repository}:built", label=TARGET, progress=lambda m: None,
                insecure_hosts=(registry.address,))
    return repository, doc.digest


@pytest.fixture
def project(tmp_path, registry):
    """A repository with the release key committed and one qualified target whose image the registry serves."""
    root = init_git_repo(tmp_path / "repo")
    (tmp_path / "keys").mkdir()
    key, pub = make_key_pair(tmp_path / "keys")
    shutil.copy(pub, root / "cosign.pub")
    _git(root, "add", "cosign.pub")
    _git(root, "commit", "-q", "-m", "release key")
    repository, digest = _image(registry, tmp_path)
    revision = _git(root, "rev-parse", "HEAD")
    stmt = mf.statement(repository, digest, predicate(TARGET, digest, reference=f"{repository}@{digest}",
                                                      revision=revision, capability="10.0"))
    mf.write(root / "build" / "manifests" / f"{TARGET}.json", stmt)
    dest = f"{registry.address}/qualify-test-published/{uuid.uuid4().hex[:12]}"
    return root, key, dest


def _release(root: Path, key: Path, *extra: str, kill: str = ""):
    env = {"COSIGN_PASSWORD": PASSWORD, **({"QUALIFY_KILL_AT": kill} if kill else {})}
    return run_qualify(["release", TAG, "--key", str(key), "--signer", "builtin", "--no-upload", *extra], root,
                       env, unset=("QUALIFY_KILL_AT",))


def _git(root: Path, *args: str) -> str:
    import subprocess

    return subprocess.run(["git", *args], cwd=root, check=True, capture_output=True, text=True).stdout.strip()


def _state(root: Path) -> dict:
    """What a release made: the folder's files (signatures too), the tag object and the tag's tree."""
    files = {p.name: p.read_bytes() for p in (root / "manifests" / TAG).iterdir() if p.is_file()}
    tag = _git(root, "rev-parse", "-q", "--verify", f"refs/tags/{TAG}") if _git(root, "tag", "-l", TAG) else ""
    tree = _git(root, "rev-parse", f"{TAG}^{{tree}}") if tag else ""
    return {"files": files, "tag": tag, "tree": tree}


def _verifies(root: Path) -> bool:
    try:
        folder.read_release(root / "manifests" / TAG)
    except Exception:  # noqa: BLE001 - any refusal
        return False
    return True


def test_release_publish_to_run_again_after_success_changes_nothing(project):
    root, key, dest = project
    first = _release(root, key, "--publish-to", dest)
    assert first.returncode == 0, first.stderr[-3000:]
    before = _state(root)
    assert "published.json" in before["files"] and before["tag"]
    again = _release(root, key, "--publish-to", dest)
    assert again.returncode == 0, again.stderr[-3000:]
    assert _state(root) == before  # the same tag object, files and signatures
    assert "was already made by an earlier run" in again.stdout and "already written, identical" in again.stdout


@pytest.mark.parametrize("kill", ["release:published", "release:pushing"])
def test_release_publish_to_killed_then_run_again_converges(project, tmp_path, kill):
    """Killed past "done: registry" (before the commit and tag), or during --push (after the tag): the same
    command finishes, with the files and tree an uninterrupted run makes, and the tag made before the kill."""
    root, key, dest = project
    remote = tmp_path / "remote.git"
    _git(tmp_path, "init", "-q", "--bare", str(remote))
    _git(root, "remote", "add", "origin", str(remote))
    killed = _release(root, key, "--publish-to", dest, "--push", kill=kill)
    assert killed.returncode == -9, killed.stderr[-3000:]
    tag_before = _state(root)["tag"]
    assert bool(tag_before) == (kill == "release:pushing")
    again = _release(root, key, "--publish-to", dest, "--push")
    assert again.returncode == 0, again.stderr[-3000:]
    after = _state(root)
    assert _verifies(root) and "published.json" in after["files"]
    if tag_before:
        assert after["tag"] == tag_before and "was already made by an earlier run" in again.stdout
    assert _git(remote, "rev-parse", f"refs/tags/{TAG}") == after["tag"]  # pushed, once
    assert f"{dest}/{TARGET}@" in _git(root, "cat-file", "-p", after["tag"])  # the tag names the published image
    assert "already written, identical" in again.stdout or "bound to this release" in again.stdout
    clean = tmp_path / "uninterrupted"
    shutil.copytree(root, clean)
    shutil.rmtree(clean / "manifests")
    _git(clean, "tag", "-d", TAG)
    _git(clean, "remote", "remove", "origin")
    assert _release(clean, key, "--publish-to", dest).returncode == 0
    assert _state(clean)["files"] == after["files"] and _state(clean)["tree"] == after["tree"]


def test_publish_then_release_again_converges(project):
    """`nox -s publish -- TAG --to ...` after the release, then `nox -s release -- TAG` again: the release
    finds published.json bound to it and keeps it; the tag (made before the publish) stays."""
    root, key, dest = project
    assert _release(root, key).returncode == 0
    released = _state(root)
    published = run_qualify(["publish", TAG, "--to", dest, "--key", str(key), "--signer", "builtin"], root,
                            {"COSIGN_PASSWORD": PASSWORD})
    assert published.returncode == 0, published.stderr[-3000:]
    assert (root / "manifests" / TAG / "published.json").is_file()
    again = _release(root, key)
    assert again.returncode == 0, again.stderr[-3000:]
    after = _state(root)
    assert after["tag"] == released["tag"] and after["tree"] == released["tree"]
    assert {n: d for n, d in after["files"].items() if not n.startswith("published.json")} == released["files"]
    assert "published.json (bound to this release) was published after tag" in again.stdout
    assert _verifies(root) and folder.read_release(root / "manifests" / TAG).publication is not None


def test_release_force_killed_while_writing_its_folder_resumes_from_its_journal(project, tmp_path):
    """Item 2: `release --force` killed after the first rename of its journal (a signature replaced, the rest
    not) leaves a folder that does not verify; the same `release --force` finishes the journal and ends where
    an uninterrupted `release --force` ends."""
    root, key, _ = project
    assert _release(root, key).returncode == 0
    clean = tmp_path / "uninterrupted"
    shutil.copytree(root, clean)
    killed = _release(root, key, "--force", kill="signed-write:renamed-one")
    assert killed.returncode == -9, killed.stderr[-3000:]
    assert not _verifies(root)  # half renamed: refused by every reader, never trusted
    assert list((root / "manifests" / TAG).glob(".signed-write-*"))
    again = _release(root, key, "--force")
    assert again.returncode == 0, again.stderr[-3000:]
    assert "finished an interrupted write" in again.stdout + again.stderr
    assert not list((root / "manifests" / TAG).glob(".signed-write-*"))
    assert _release(clean, key, "--force").returncode == 0
    assert _state(root)["files"] == _state(clean)["files"] and _state(root)["tree"] == _state(clean)["tree"]
    index = json.loads((root / "manifests" / TAG / "release.json").read_bytes())
    assert index["sequence"] == 2 and _verifies(root)
    assert hashlib.sha256((root / "manifests" / TAG / "release.json").read_bytes()).hexdigest() == \
        folder.read_release(root / "manifests" / TAG).index_sha256
