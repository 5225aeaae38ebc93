"""Disk (issue 19): a build takes its own cache away again, and `qualify clean` removes what the toolkit made,
frees what it reports, and leaves everything else alone. Real engine, real registries, real files."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from clean_helpers import du as _du
from clean_helpers import tiny_image as _tiny_image
from conftest import REPO

from qualify.config import targets
from qualify.config.imageref import ImageRef
from qualify.core import fsutil, manifest
from qualify.host import cacheledger, ledger, paths
from qualify.host.engine import Engine
from qualify.host.registry import Registry
from qualify.imagebuild import buildcache, hermetic, image

pytestmark = pytest.mark.engine


def _listing():
    """id -> entry of every BuildKit cache record, read with the docker CLI itself (not the toolkit's parser)."""
    out = subprocess.run(["/usr/bin/docker", "system", "df", "-v", "--format", "{{json .BuildCache}}"],
                         capture_output=True, text=True, check=True).stdout
    return {e["ID"].rstrip("*"): e for e in json.loads(out or "[]") or []}


def _foreign_cache_record(docker: str, base: str, tmp_path: Path) -> str:
    """A BuildKit cache record no toolkit build made: someone else's build on the same engine."""
    marker = uuid.uuid4().hex
    ctx = tmp_path / "foreign"
    ctx.mkdir(parents=True)
    (ctx / "Dockerfile").write_text(f"FROM {base}\nRUN echo {marker} > /foreign\n")
    made = subprocess.run([docker, "build", "-q", str(ctx)], check=True, capture_output=True, text=True,
                          timeout=300, env={"DOCKER_BUILDKIT": "1", "PATH": "/usr/bin:/bin"}).stdout.strip()
    record = next(i for i, e in _listing().items() if marker in e.get("Description", ""))
    subprocess.run([docker, "rmi", made], capture_output=True)  # its cache record stays: that is the point
    return record


def _base_of_its_own(engine: Engine, tf, registry: Registry, tmp_path: Path) -> ImageRef:
    """The hermetic base plus one ENV line nobody else's image has: every build step on it (python, payload,
    the nvcc step) has a cache key of its own, so no other checkout on this shared engine has made, uses or
    prunes this test's records. An ENV adds no layer and makes no cache record; pushed for a repo digest."""
    real = hermetic.ensure_base(engine, tf, tf.get("sm120"), registry)
    marker = uuid.uuid4().hex
    ctx = tmp_path / "base"
    ctx.mkdir(parents=True)
    (ctx / "Dockerfile").write_text(f"FROM {real.by_digest}\nENV QUALIFY_CACHETEST={marker}\n")
    tag = f"{registry.ref('qualify-test/cachetest-base')}:{marker[:12]}"
    subprocess.run(["/usr/bin/docker", "build", "-q", "-t", tag, str(ctx)], check=True, capture_output=True,
                   timeout=300, env={"DOCKER_BUILDKIT": "1", "PATH": "/usr/bin:/bin"})
    return ImageRef.parse(tag).with_digest(engine.push(tag))


def test_a_build_keeps_what_its_newest_build_uses_and_prunes_older_cache_to_the_budget(
        docker_engine, loopback_registry, debian_python_image, tmp_path, capfd, monkeypatch):
    """Issue 33: an unchanged rebuild is served from cache, this checkout's older records are pruned to the
    budget (0 here), and a cache record no toolkit build made survives. Measured with `docker system df`."""
    engine = Engine("docker").check()
    if engine.builder not in ("buildkit", "buildx"):
        pytest.fail(f"this host's docker builds with {engine.builder}; the test needs BuildKit's cache records")
    tf = targets.load()
    name = f"cachetest-{uuid.uuid4().hex[:6]}"
    key = f"{name}-smoke-hermetic"
    base = _base_of_its_own(engine, tf, loopback_registry, tmp_path)
    monkeypatch.setattr(hermetic, "ensure_base", lambda *_: base)
    settled = []  # each build's own cache report (the real settle, observed)
    real_settle = buildcache.settle
    monkeypatch.setattr(buildcache, "settle", lambda *a, **k: settled.append(real_settle(*a, **k)) or settled[-1])

    def build(arch_list: str) -> image.BuildRecord:
        t = dataclasses.replace(tf.get("sm120"), name=name, torch_cuda_arch_list=arch_list)
        variant = dataclasses.replace(tf, targets={**tf.targets, name: t})
        opts = image.BuildOptions(name, "hermetic", "smoke", cache_budget_gb=0)
        return image.build(variant, opts, engine, loopback_registry)

    def ran(log: str) -> list:
        """Numbers of the RUN steps BuildKit ran (not served from cache) in one build's log."""
        return [n for n in re.findall(r"\| (#\d+) \[([^\]]+)\] RUN ", log) if f"| {n[0]} DONE" in log]

    made = []
    try:
        capfd.readouterr()
        made.append(build("12.0").image_id)  # ext-builder's nvcc step for -gencode ...sm_120 only
        assert "ext-builder 2/2" in [stage for _, stage in ran(capfd.readouterr().err)], "the first build ran no nvcc"
        foreign = _foreign_cache_record(docker_engine, debian_python_image, tmp_path)
        second = build("12.0a")  # another arch list: a step of its own; the payload is shared
        made.append(second.image_id)
        assert [stage for _, stage in ran(capfd.readouterr().err)] == ["ext-builder 2/2"]
        listing = _listing()
        assert foreign in listing, "a cache record no toolkit build made was removed"
        # What is left of this checkout's cache beyond what the newest builds use fits the budget (0). Under
        # concurrent suites on this engine a record over the budget may be in use by another checkout's running
        # build at the prune: BuildKit never removes one in use, and the build says which it left (busy); only
        # those are excused, and the assertion is read under the ledger's lock, as the prune was.
        with cacheledger.locked():
            book = cacheledger.load()
            keep = buildcache.with_ancestors(book.kept() | cacheledger.kept_by_others(), engine.build_cache())
        older = [i for i in book.owned if i in listing and i not in keep and i not in settled[-1].busy]
        assert sum(engine_size(listing[i]) for i in older) <= 0, older
        start = time.monotonic()
        again = build("12.0a")
        seconds = time.monotonic() - start
        assert again.image_id == second.image_id and not ran(capfd.readouterr().err), "the unchanged rebuild ran steps"
        # The first build's own nvcc step is older than the budget allows: building it again runs it again.
        made.append(build("12.0").image_id)
        assert [stage for _, stage in ran(capfd.readouterr().err)] == ["ext-builder 2/2"]
        with capfd.disabled():
            print(f"\n[report] unchanged rebuild of the smoke variant: {seconds:.1f} s")
    finally:
        with cacheledger.locked():
            book = cacheledger.load()
            book.latest.pop(key, None)  # its records are older now: the next build prunes them to the budget
            cacheledger.save(book)
        engine.remove_created([i for i in made if i in engine.image_ids()])
        subprocess.run(["/usr/bin/docker", "rmi", str(ImageRef(base.name, base.tag))], capture_output=True)
        # Nothing of this variant stays behind on the shared host: its record, its tags in the registry.
        image.record_path(name, "smoke", "hermetic").unlink(missing_ok=True)
        own_tag = loopback_registry.ref(image.image_repository(dataclasses.replace(tf.get("sm120"), name=name)))
        for ref in (f"{own_tag}:smoke-hermetic", str(ImageRef(base.name, base.tag))):
            loopback_registry.delete_tag(ref)


def engine_size(entry: dict) -> int:
    from qualify.host.buildkit import parse_size

    return parse_size(entry.get("Size", "0B"))


def test_over_budget_takes_the_least_recently_used_first_and_keeps_ancestors():
    from qualify.host.buildkit import CacheEntry

    cache = {c.id: c for c in [
        CacheEntry("a", 5, False, "", last_used="2026-12-01 10:00:00 +0000 UTC"),
        CacheEntry("b", 3, False, "", last_used="2026-12-01 11:00:00 +0000 UTC", parent="a"),
        CacheEntry("c", 4, False, "", last_used="2026-12-01 09:00:00 +0000 UTC"),
        CacheEntry("d", 2, False, "", last_used="2026-12-01 12:00:00 +0000 UTC"),
    ]}
    assert buildcache.with_ancestors(frozenset({"b"}), cache) == {"a", "b"}
    older = sorted((cache[i] for i in ("c", "d")), key=lambda c: c.last_used)
    assert [c.id for c in buildcache.over_budget(older, 2)] == ["c"]
    assert [c.id for c in buildcache.over_budget(older, 0)] == ["c", "d"]
    assert buildcache.over_budget(older, 6) == []


# --- clean -----------------------------------------------------------------------------


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
    # This checkout's build context (its ledger names it), a work folder of a killed run (pid 999999 is no
    # process), and a wheelhouse: shared by every checkout, so it stays (issue 41).
    ledger.record_context("smoke-linux-amd64-py3.11-x", state_dir=state)
    for folder, size in (("contexts/smoke-linux-amd64-py3.11-x", 1 << 20), ("work/hermetic.999999.abc", 2 << 20),
                         ("wheelhouse/smoke", 3 << 20)):
        (state / folder).mkdir(parents=True)
        (state / folder / "blob").write_bytes(os.urandom(size))
    state_before = _du(state / "contexts" / "smoke-linux-amd64-py3.11-x") + _du(state / "work" / "hermetic.999999.abc")
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
        assert not (state / "contexts" / "smoke-linux-amd64-py3.11-x").exists()
        assert not (state / "work" / "hermetic.999999.abc").exists()
        assert (state / "wheelhouse" / "smoke" / "blob").is_file()
        assert any("wheelhouse" in k and "--all removes it" in k for k in report["kept_state"])
        # What it removed is gone; what was released or not ours is still there.
        assert not engine.exists(ours) and engine.exists(released) and engine.exists(foreign) and engine.exists(theirs)
        assert registry.manifest_digest("blackwell/sm100", theirs_digest) == theirs_digest
        assert registry.answers()  # restarted after garbage collection
        assert registry.manifest_digest("blackwell/sm120", ours_digest) is None
        assert registry.manifest_digest("blackwell/sm121", released_digest) == released_digest
    finally:
        subprocess.run([docker_engine, "image", "rm", "-f", ours, released, foreign, theirs], capture_output=True)


def test_clean_removes_the_build_cache_this_checkout_made_and_no_other(
        tmp_path, docker_engine, own_registry, debian_python_image):
    registry, state, env = own_registry
    ours = _foreign_cache_record(docker_engine, debian_python_image, tmp_path / "ours")
    theirs = _foreign_cache_record(docker_engine, debian_python_image, tmp_path / "theirs")
    cacheledger.save(cacheledger.CacheLedger(owned=[ours], latest={"sm120-smoke-hermetic": [ours]}), state_dir=state)
    proc = subprocess.run([sys.executable, "-m", "qualify", "clean", "--json", "--releases", str(tmp_path)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["cache_records"] == [ours]
    listing = _listing()
    assert ours not in listing and theirs in listing
    assert cacheledger.load(state_dir=state).owned == []


def test_clean_dry_run_removes_nothing(tmp_path, docker_engine, own_registry):
    registry, state, env = own_registry
    ledger.record_context("left-by-a-failed-build", state_dir=state)
    (state / "contexts" / "left-by-a-failed-build").mkdir(parents=True)
    proc = subprocess.run([sys.executable, "-m", "qualify", "clean", "--dry-run", "--releases", str(tmp_path)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and "would remove" in proc.stdout, proc.stderr
    assert f"folder {state / 'contexts' / 'left-by-a-failed-build'}" in proc.stdout
    assert (state / "contexts" / "left-by-a-failed-build").is_dir()


def test_build_options_default_to_the_targets_files_budget():
    assert image.BuildOptions("sm120").keep_cache is False and image.BuildOptions("sm120").cache_budget_gb is None
    assert targets.load().build.cache_budget_bytes > 0


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


def test_a_rebuild_removes_the_image_its_tag_named_before(docker_engine, capfd, tmp_path, monkeypatch):
    """Issue 30, item 11: a rebuild left the previous 1.66 GB image dangling in the engine. Only an image this
    checkout made (its ledger) is taken: another checkout that built the same tag keeps its image (two
    checkouts testing at once on one host lost their sm120 image this way)."""
    monkeypatch.setattr(paths, "STATE_DIR", tmp_path)
    engine = Engine("docker")
    tag = f"qualify-test/rebuilt:{uuid.uuid4().hex[:8]}"
    first = engine.image_id(_tiny_image(docker_engine, tag))
    ledger.record(first, f"{tag}@sha256:{'1' * 64}")
    second = engine.image_id(_tiny_image(docker_engine, tag))  # the tag moves: `first` is nameless now
    kept = engine.image_id(_tiny_image(docker_engine, f"qualify-test/kept:{uuid.uuid4().hex[:8]}"))
    ledger.record(kept, f"qualify-test/kept@sha256:{'2' * 64}")
    theirs_tag = f"qualify-test/theirs:{uuid.uuid4().hex[:8]}"
    theirs = engine.image_id(_tiny_image(docker_engine, theirs_tag))  # another checkout's build of a tag ...
    their_second = engine.image_id(_tiny_image(docker_engine, theirs_tag))  # ... rebuilt: nameless, not ours
    try:
        image._drop_previous(engine, first, second)
        assert first not in engine.image_ids() and second in engine.image_ids()
        assert "removed the previous image of this tag" in capfd.readouterr().err
        image._drop_previous(engine, kept, second)  # still named elsewhere: not taken
        assert kept in engine.image_ids()
        image._drop_previous(engine, theirs, second)  # another checkout's: not taken
        assert theirs in engine.image_ids() and "not in this checkout's ledger (another checkout built it): kept" \
            in capfd.readouterr().err
    finally:
        engine.remove_created([i for i in (first, second, kept, theirs, their_second) if i in engine.image_ids()])


def test_a_checkout_that_is_gone_keeps_no_build_cache(tmp_path):
    """A removed clone's newest builds are never rebuilt: its ledger must not keep cache records past every
    budget (the clean-clone suite found its own records kept by the ledgers of deleted test clones)."""
    state = tmp_path / "state"
    here, alive, removed = tmp_path / "here", tmp_path / "alive", tmp_path / "removed"
    for checkout in (here, alive, removed):
        checkout.mkdir()
    cacheledger.save(cacheledger.CacheLedger(["a"], {"k": ["a"]}), state, alive)
    cacheledger.save(cacheledger.CacheLedger(["b"], {"k": ["b"]}), state, removed)
    assert cacheledger.kept_by_others(state, here) == {"a", "b"}
    removed.rmdir()
    assert cacheledger.kept_by_others(state, here) == {"a"}
