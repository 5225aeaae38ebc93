"""Disk (issue 19): a build takes its own cache away again, and `qualify clean` removes what the toolkit made,
frees what it reports, and leaves everything else alone. Real engine, real registries, real files."""

from __future__ import annotations

import dataclasses
import datetime
import io
import json
import os
import signal
import socket
import subprocess
import sys
import tarfile
import time
import uuid
from pathlib import Path

import pytest
from conftest import REPO

from qualify.config import targets
from qualify.core import fsutil, manifest
from qualify.host import clean, ledger, paths
from qualify.host.engine import Engine
from qualify.host.registry import Registry
from qualify.imagebuild import image

pytestmark = pytest.mark.engine


def _du(path: Path) -> int:
    """Bytes on disk, as du counts them (an independent measure of what clean reports)."""
    if not path.exists():
        return 0
    out = subprocess.run(["du", "-s", "-B1", str(path)], capture_output=True, text=True, check=True).stdout
    return int(out.split()[0])


def test_a_build_removes_the_cache_records_it_made(docker_engine, loopback_registry, capfd):
    engine = Engine("docker").check()
    if engine.builder not in ("buildkit", "buildx"):
        pytest.fail(f"this host's docker builds with {engine.builder}; the test needs BuildKit's cache records")
    before = set(engine.build_cache())
    # A fresh epoch is a new build argument: every RUN step runs again and makes new cache records.
    opts = image.BuildOptions("sm120", "hermetic", "smoke", source_date_epoch=str(int(time.time())),
                              tag_suffix="disk-check")
    record = image.build(targets.load(), opts, engine, loopback_registry)
    finished = datetime.datetime.now(datetime.timezone.utc)
    try:
        err = capfd.readouterr().err
        line = next(x for x in err.splitlines() if "build-cache record(s)" in x)
        removed = int(line.split("removed ", 1)[1].split(" ", 1)[0])
        assert removed > 0, line  # the build really made cache, and it went
        # Records another checkout's build makes meanwhile are not this build's (none in CI).
        left = {i for i, created in _records_created().items() if i not in before and created <= finished}
        assert not left, f"cache records of this build remain: {sorted(left)}"
        assert engine.exists(record.image_reference)  # the image itself stays
    finally:
        engine.remove_created([record.image_id])


def _records_created():
    """id -> creation time of every BuildKit cache record, read with the docker CLI itself."""
    out = subprocess.run(["/usr/bin/docker", "system", "df", "-v", "--format", "{{json .BuildCache}}"],
                         capture_output=True, text=True, check=True).stdout
    found = {}
    for entry in json.loads(out or "[]") or []:
        stamp = entry["CreatedAt"].split(".")[0]  # '2026-11-30 11:09:25.198278687 +0000 UTC'
        found[entry["ID"].rstrip("*")] = datetime.datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S").replace(
            tzinfo=datetime.timezone.utc)
    return found


# --- clean -----------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _tiny_image(docker: str, tag: str) -> str:
    """A one-file image made with `docker import` (unique content, so a unique digest)."""
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w") as tar:
        body = f"{tag} {uuid.uuid4()}\n".encode() * 2000
        info = tarfile.TarInfo("payload.txt")
        info.size = len(body)
        tar.addfile(info, io.BytesIO(body))
    subprocess.run([docker, "import", "-", tag], input=data.getvalue(), check=True, capture_output=True)
    return tag


@pytest.fixture
def own_registry(tmp_path, docker_engine):
    """A registry and state folder of this test alone (clean stops and restarts the registry it collects)."""
    state = tmp_path / "state"
    env = {**os.environ, "QUALIFY_REGISTRY": f"127.0.0.1:{_free_port()}", "QUALIFY_STATE_DIR": str(state)}
    registry = Registry(env["QUALIFY_REGISTRY"])
    registry.ensure(state)
    yield registry, state, env
    for pid in clean._serving(state / f"registry-{registry.address.rsplit(':', 1)[1]}" / "config.yml"):
        os.kill(pid, signal.SIGTERM)


def test_clean_removes_toolkit_made_things_reports_what_it_freed_and_spares_the_rest(
        tmp_path, docker_engine, own_registry):
    registry, state, env = own_registry
    engine = Engine("docker")
    ours = _tiny_image(docker_engine, f"{registry.address}/blackwell/sm120:smoke-hermetic")
    released = _tiny_image(docker_engine, f"{registry.address}/blackwell/sm121:smoke-hermetic")
    foreign = _tiny_image(docker_engine, f"qualify-test/foreign:{uuid.uuid4().hex[:8]}")
    # Another checkout's build on this host: in the toolkit's namespace, not in this checkout's ledger.
    theirs = _tiny_image(docker_engine, f"{registry.address}/blackwell/sm100:smoke-hermetic")
    ours_digest, released_digest, theirs_digest = engine.push(ours), engine.push(released), engine.push(theirs)
    for ref, digest in ((ours, ours_digest), (released, released_digest)):  # as build() records them
        ledger.record(engine.image_id(ref), f"{ref.rsplit(':', 1)[0]}@{digest}", state_dir=state)
    releases = tmp_path / "manifests"
    fsutil.write_json(releases / "v1.0.0" / "sm121.json",
                      manifest.statement(released.rsplit(":", 1)[0], released_digest, {"target": {"name": "sm121"}}))
    for folder, size in (("contexts/sm120-smoke-hermetic-x", 1 << 20), ("wheelhouse/smoke", 3 << 20)):
        (state / folder).mkdir(parents=True)
        (state / folder / "blob").write_bytes(os.urandom(size))
    state_before = _du(state / "contexts") + _du(state / "wheelhouse")
    registry_dir = state / f"registry-{registry.address.rsplit(':', 1)[1]}"
    registry_before = _du(registry_dir)
    try:
        proc = subprocess.run([sys.executable, "-m", "qualify", "clean", "--json", "--releases", str(releases)],
                              cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr
        report = json.loads(proc.stdout)
        assert report["images"] == [ours] and any(released in k for k in report["kept_images"])
        assert report["registry_manifests"] == [f"{registry.address}/blackwell/sm120@{ours_digest}"]
        assert report["other_checkouts"] == [theirs]  # issue 30, item 6: only what this checkout made
        # Frees what it reports, measured independently with du.
        assert report["freed_state_bytes"] == state_before
        registry_freed = registry_before - _du(registry_dir)
        assert registry_freed > 0 and abs(report["freed_registry_bytes"] - registry_freed) <= 64 << 10
        assert not (state / "contexts").exists() and not (state / "wheelhouse").exists()
        # What it removed is gone; what was released or not ours is still there.
        assert not engine.exists(ours) and engine.exists(released) and engine.exists(foreign) and engine.exists(theirs)
        assert registry.manifest_digest("blackwell/sm100", theirs_digest) == theirs_digest
        assert registry.answers()  # restarted after garbage collection
        assert registry.manifest_digest("blackwell/sm120", ours_digest) is None
        assert registry.manifest_digest("blackwell/sm121", released_digest) == released_digest
    finally:
        subprocess.run([docker_engine, "image", "rm", "-f", ours, released, foreign, theirs], capture_output=True)


def test_clean_dry_run_removes_nothing(tmp_path, docker_engine, own_registry):
    registry, state, env = own_registry
    (state / "contexts" / "left-by-a-failed-build").mkdir(parents=True)
    proc = subprocess.run([sys.executable, "-m", "qualify", "clean", "--dry-run", "--releases", str(tmp_path)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and "would remove" in proc.stdout, proc.stderr
    assert (state / "contexts" / "left-by-a-failed-build").is_dir()


def test_build_options_default_to_removing_the_cache():
    assert image.BuildOptions("sm120").keep_cache is False
    assert dataclasses.replace(image.BuildOptions("sm120"), keep_cache=True).keep_cache


def test_build_cache_listing_waits_for_another_disk_usage_call(docker_engine):
    """CI at eeb6539: two smoke builds finishing together each list the build
    cache (`docker system df -v`), and the daemon refuses a second disk-usage
    operation while one runs. Six listings at once (four of six were refused
    before the fix, measured here) must all succeed."""
    from concurrent.futures import ThreadPoolExecutor

    engine = Engine("docker").check()
    if engine.builder not in ("buildkit", "buildx"):
        pytest.fail(f"this host's docker builds with {engine.builder}; the test needs BuildKit's cache records")
    with ThreadPoolExecutor(max_workers=6) as pool:
        listings = list(pool.map(lambda _: engine.build_cache(), range(6)))
    assert all(isinstance(found, dict) for found in listings)


def test_a_killed_builds_context_is_removed_by_the_next_build_of_it(tmp_path, monkeypatch, capfd):
    """Issue 30, item 11: a build killed early left its context (237 MB for smoke) in the state folder."""
    monkeypatch.setattr(paths, "STATE_DIR", tmp_path)
    contexts = tmp_path / "contexts"
    dead = contexts / "sm120-smoke-hermetic-999999-abc"  # pid 999999: no such process
    alive = contexts / f"sm120-smoke-hermetic-{os.getpid()}-def"  # a build running now keeps its own
    other = contexts / "sm121-smoke-hermetic-999999-ghi"  # another build's: not this one to judge
    for folder in (dead, alive, other):
        folder.mkdir(parents=True)
    lock = tmp_path / "lock.txt"
    lock.write_text("x==1 --hash=sha256:" + "0" * 64 + "\n")
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    ctx = image.stage_context("sm120-smoke-hermetic", lock, wheels)
    assert not dead.exists() and alive.exists() and other.exists() and ctx.is_dir()
    assert "removed sm120-smoke-hermetic-999999-abc, the context of a build that was killed" in capfd.readouterr().err


def test_a_rebuild_removes_the_image_its_tag_named_before(docker_engine, capfd):
    """Issue 30, item 11: a rebuild left the previous 1.66 GB image dangling in the engine."""
    engine = Engine("docker")
    tag = f"qualify-test/rebuilt:{uuid.uuid4().hex[:8]}"
    first = engine.image_id(_tiny_image(docker_engine, tag))
    second = engine.image_id(_tiny_image(docker_engine, tag))  # the tag moves: `first` is nameless now
    kept = engine.image_id(_tiny_image(docker_engine, f"qualify-test/kept:{uuid.uuid4().hex[:8]}"))
    try:
        image._drop_previous(engine, first, second)
        assert first not in engine.image_ids() and second in engine.image_ids()
        assert "removed the previous image of this tag" in capfd.readouterr().err
        image._drop_previous(engine, kept, second)  # still named elsewhere: not taken
        assert kept in engine.image_ids()
    finally:
        engine.remove_created([i for i in (first, second, kept) if i in engine.image_ids()])
