"""Issue 53: podman's layer cache is its intermediate images. A build keeps the ones it made or was served
from (imagebuild/buildcache.py), so an unchanged rebuild is served from cache; the previous build's that a
changed build did not use go, and `clean` removes what is kept. Before, every build removed them, and the
unchanged vLLM rebuild on podman ran every step again (350.8 s, where docker took 2.8 s)."""

from __future__ import annotations

import dataclasses
import time
import uuid
from pathlib import Path

import pytest

from qualify.config import targets
from qualify.host import cacheledger
from qualify.host.engine import Engine
from qualify.host.progress import BuildSteps
from qualify.imagebuild import buildcache, image

HIT = "a" * 64


def test_build_steps_collect_podmans_cache_hits():
    steps = BuildSteps()
    for line in ["[1/2] STEP 2/3: ARG Z", f"--> Using cache {HIT}", "--> aaaaaaaaaaa", "#4 DONE 0.1s",
                 "--> Using cache nothex"]:
        steps.feed(line)
    assert steps.cache_hits == {f"sha256:{HIT}"}


class StandInEngine:
    """A stand-in engine store (ids, layers, tags) for the bookkeeping alone; the real podman is below."""

    def __init__(self, images):
        self.images = dict(images)  # id -> (tags, layers)
        self.last_cache_hits = frozenset()
        self.removed = []

    def image_ids(self):
        return set(self.images)

    def inspect_existing(self, refs):
        return [{"Id": r, "Parent": "", "RepoTags": self.images[r][0], "RootFS": {"Layers": self.images[r][1]},
                 "History": []} for r in refs if r in self.images]

    def created_images(self, before, final_id, tag, base_id):
        return Engine.created_images(self, before, final_id, tag, base_id)

    def remove_created(self, ids):
        for i in ids:
            self.removed.append(i)
            self.images.pop(i, None)
        return ""


def sid(c):
    return "sha256:" + c * 64


def _footprint(engine, root):
    return buildcache.Footprint(frozenset(), frozenset(engine.image_ids()), root, 0, {})


def test_kept_steps_serve_the_rebuild_and_a_changed_build_drops_the_unused(tmp_path, monkeypatch):
    monkeypatch.setenv("QUALIFY_STATE_DIR", str(tmp_path / "state"))
    base = sid("b")
    eng = StandInEngine({base: (["reg/base:1"], ["L0"])})
    before = _footprint(eng, tmp_path)
    # first build: two steps and a final image
    eng.images.update({sid("1"): ([], ["L0", "A"]), sid("2"): ([], ["L0", "A", "B"]),
                       sid("f"): (["reg/x:t"], ["L0", "A", "B"])})
    kept, removed, error = buildcache._settle_images(eng, before, "k", sid("f"), "reg/x:t", base)
    assert (kept, removed, error) == (2, 0, "") and sid("1") in eng.images and sid("2") in eng.images
    # another key's build shares step 1 (served from it)
    before = _footprint(eng, tmp_path)
    eng.images.update({sid("3"): ([], ["L0", "A", "C"]), sid("g"): (["reg/y:t"], ["L0", "A", "C"])})
    eng.last_cache_hits = frozenset({sid("1")})
    assert buildcache._settle_images(eng, before, "other", sid("g"), "reg/y:t", base)[:2] == (2, 0)
    # a changed build of k: served from step 1, a new step 2
    before = _footprint(eng, tmp_path)
    eng.images.update({sid("4"): ([], ["L0", "A", "D"]), sid("h"): (["reg/x:t"], ["L0", "A", "D"])})
    eng.last_cache_hits = frozenset({sid("1")})
    kept, removed, _ = buildcache._settle_images(eng, before, "k", sid("h"), "reg/x:t", base)
    assert eng.removed == [sid("2")], "only the step no newest build uses goes"
    assert (kept, removed) == (2, 1)
    book = cacheledger.load()
    assert book.images == {"k": sorted([sid("1"), sid("4")]), "other": sorted([sid("1"), sid("3")])}
    assert base in eng.images and sid("f") in eng.images  # the base, and the final (the image ledger's)


@pytest.mark.engine
def test_podman_unchanged_rebuild_is_served_from_the_kept_steps(podman_engine, loopback_registry, capfd):
    engine = Engine("podman").check()
    tf = targets.load()
    suffix = f"cachetest-{uuid.uuid4().hex[:6]}"
    settled = []
    real_settle = buildcache.settle

    def observe(*a, **k):
        settled.append(real_settle(*a, **k))
        return settled[-1]

    def build(arch_list: str, no_cache: bool) -> image.BuildRecord:
        t = dataclasses.replace(tf.get("sm120"), torch_cuda_arch_list=arch_list)
        variant = dataclasses.replace(tf, targets={**tf.targets, "sm120": t})
        opts = image.BuildOptions("sm120", "hermetic", "smoke", no_cache=no_cache, tag_suffix=suffix)
        return image.build(variant, opts, engine, loopback_registry)

    key = f"sm120-smoke-hermetic-{suffix}"
    made = []
    mp = pytest.MonkeyPatch()
    mp.setattr(buildcache, "settle", observe)
    try:
        made.append(build("12.0", no_cache=True).image_id)
        first_steps = set(cacheledger.load().images[key])
        assert first_steps and settled[-1].kept_images == len(first_steps)
        capfd.readouterr()
        start = time.monotonic()
        again = build("12.0", no_cache=False)
        seconds = time.monotonic() - start
        log = capfd.readouterr().err
        assert again.image_id == made[0], "the unchanged rebuild made another image"
        assert "Using cache" in log and "nvcc" not in log.split("Using cache")[-1], "the rebuild ran steps"
        assert first_steps <= engine.image_ids(), "the kept steps were removed"
        made.append(build("12.0a", no_cache=False).image_id)  # another arch list: the nvcc step runs again
        now = set(cacheledger.load().images[key])
        gone = first_steps - now
        assert gone and not (gone & engine.image_ids()), "the first build's unused steps stayed"
        with capfd.disabled():
            print(f"\n[report] podman: unchanged rebuild of the smoke image {seconds:.1f} s; "
                  f"{len(first_steps)} steps kept, {len(gone)} dropped by the changed build")
    finally:
        mp.undo()
        with cacheledger.locked():
            book = cacheledger.load()
            steps = book.images.pop(key, [])
            book.latest.pop(key, None)
            cacheledger.save(book)
        engine.remove_created(sorted((set(steps) | set(made)) & engine.image_ids()))
        image.record_path("sm120", "smoke", f"hermetic-{suffix}").unlink(missing_ok=True)
        loopback_registry.delete_tag(f"{loopback_registry.ref(image.image_repository(tf.get('sm120')))}:"
                                     f"smoke-hermetic-{suffix}")


def test_clean_report_counts_the_cached_steps(tmp_path: Path):
    from qualify.host.clean import CleanReport

    r = CleanReport(dry_run=True, cache_images=[sid("1"), sid("2")])
    assert "2 cached build step image(s)" in r.lines()[0]
