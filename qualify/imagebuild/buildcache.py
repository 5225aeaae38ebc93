"""The build cache a build leaves: what the newest build of each (target, profile, base) used stays, so an
unchanged rebuild is served from cache (0.5 s for smoke, where removing everything made it 65 s); this
checkout's older BuildKit records are pruned, by id and least recently used first, until what is left of
them fits the budget ([build] cache_budget_gb in images/targets.toml, or --cache-budget). A vLLM build
left ~28 GB of cache when nothing was pruned.

BuildKit's own keep-storage (`builder prune --keep-storage`) is not used: it prunes every user's cache on
the engine, and this one prunes only records a toolkit build of this checkout made (host/cacheledger.py).
A record that the newest build of another checkout uses stays too.

Podman's (and the classic builder's) cache is intermediate images, not records. The images the newest build
of each key made or was served from stay (`images` in the ledger); the previous build's that it did not use
go, unless another key's or another checkout's newest build uses them. Removing every intermediate image
after each build made podman's unchanged vLLM rebuild run every step again: 350.8 s, where docker's took
2.8 s (nox -s bench-build, 2026-12-04). They cost little disk: most are the final image's own layers.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, FrozenSet, List, Optional, Tuple

from qualify.core.report import Reporter
from qualify.host import cacheledger
from qualify.host.buildkit import CacheEntry
from qualify.host.engine import Engine

REPORT = Reporter("build")


@dataclass(frozen=True)
class Footprint:
    """The engine's state before a build."""

    cache_ids: FrozenSet[str]
    image_ids: FrozenSet[str]
    root: Path
    free_bytes: int
    cache: Dict[str, CacheEntry]


@dataclass(frozen=True)
class CacheReport:
    kept_records: int  # what the newest builds use
    kept_bytes: int
    older_records: int  # this checkout's other records, left within the budget
    older_bytes: int
    pruned_records: int
    pruned_bytes: int  # as the engine reports it
    budget: Optional[int]  # None: nothing pruned (--keep-cache)
    images: int  # intermediate images removed: the previous build's that this one did not use (podman, classic)
    free_before: int
    free_after: int
    root: Path
    error: str = ""
    # Over the budget but not pruned: a build running now (another checkout's, on the shared engine) uses them,
    # and BuildKit never removes a record in use. The next build prunes them.
    busy: Tuple[str, ...] = ()
    kept_images: int = 0  # intermediate images kept as this key's cache (podman, classic builder)

    def line(self) -> str:
        gb = 1e9
        budget = "no budget: --keep-cache" if self.budget is None else f"budget {self.budget / gb:.1f} GB"
        text = (f"disk under {self.root}: {self.free_before / gb:.1f} GB free before the build, "
                f"{self.free_after / gb:.1f} GB after; build cache: kept {self.kept_records} record(s) "
                f"({self.kept_bytes / gb:.2f} GB) the newest builds use and {self.older_records} older one(s) "
                f"({self.older_bytes / gb:.2f} GB, {budget}); pruned {self.pruned_records} "
                f"({self.pruned_bytes / gb:.2f} GB)")
        if self.busy:
            text += f"; {len(self.busy)} older record(s) left: a running build uses them (the next build prunes them)"
        if self.kept_images or self.images:
            text += (f"; kept {self.kept_images} intermediate image(s) this build made or used (the layer cache), "
                     f"removed {self.images} of an earlier build")
        return text + (f"; some stay: {self.error}" if self.error else "")


def footprint(engine: Engine) -> Footprint:
    root = engine.storage_root()
    cache = engine.build_cache()
    return Footprint(frozenset(cache), frozenset(engine.image_ids()), root, _free(root), cache)


def settle(engine: Engine, before: Footprint, key: str, final_id: str, tag: str, base_id: str,
           budget: Optional[int]) -> CacheReport:
    """After a successful build: record what it made and used, keep what the newest builds use, prune this
    checkout's older records to `budget` bytes (None: prune nothing)."""
    with cacheledger.locked():
        book = cacheledger.load()
        cache = engine.build_cache()
        used = used_by_build(before.cache, cache)
        book.owned = sorted((set(book.owned) | (set(cache) - set(before.cache_ids))) & set(cache))
        book.latest = {k: [i for i in v if i in cache] for k, v in book.latest.items()}
        book.latest[key] = sorted(used)
        keep = with_ancestors(book.kept() | cacheledger.kept_by_others(), cache)
        older = sorted((cache[i] for i in book.owned if i not in keep), key=lambda c: (c.last_used, c.id))
        doomed = [] if budget is None else over_budget(older, budget)
        pruned = engine.remove_build_cache([c.id for c in doomed if not c.in_use]) if doomed else 0
        after = engine.build_cache() if doomed else cache
        book.owned = [i for i in book.owned if i in after]
        cacheledger.save(book)
    kept_images, removed, error = _settle_images(engine, before, key, final_id, tag, base_id)
    kept = [after[i] for i in sorted(with_ancestors(book.kept(), after)) if i in after]
    left = [after[i] for i in book.owned if i in after and i not in keep]
    return CacheReport(kept_records=len(kept), kept_bytes=sum(c.size for c in kept),
                       older_records=len(left), older_bytes=sum(c.size for c in left),
                       pruned_records=len([c for c in doomed if c.id not in after]), pruned_bytes=pruned,
                       budget=budget, images=removed, free_before=before.free_bytes,
                       free_after=_free(before.root), root=before.root, error=error,
                       busy=tuple(sorted(c.id for c in doomed if c.in_use)), kept_images=kept_images)


def _settle_images(engine: Engine, before: Footprint, key: str, final_id: str, tag: str,
                   base_id: str) -> Tuple[int, int, str]:
    """The intermediate images this build made or was served from become `key`'s cache; the previous build's
    of `key` that no newest build uses are removed. (kept, removed, the engine's error or '')."""
    made = [i for i in engine.created_images(set(before.image_ids), final_id, tag, base_id) if i != final_id]
    with cacheledger.locked():
        book = cacheledger.load()
        present = engine.image_ids()
        # The final image is the image ledger's (host/ledger.py), and goes with the build it belongs to.
        used = (set(made) | (set(engine.last_cache_hits) & present)) - {final_id}
        previous = [i for i in book.images.get(key, []) if i in present]
        spared = used | book.kept_images(but=key) | cacheledger.images_kept_by_others() | {final_id}
        doomed = [i for i in previous if i not in spared]
        error = engine.remove_created(doomed)
        book.images[key] = sorted(used & engine.image_ids())
        cacheledger.save(book)
    return len(book.images[key]), len(doomed), error


def used_by_build(before: Dict[str, CacheEntry], after: Dict[str, CacheEntry]) -> FrozenSet[str]:
    """Records the build made or used: new ones, and those BuildKit marked used since (a cache hit moves a
    record's last-used time). A concurrent build's records may be among them: kept a while longer, no harm."""
    return frozenset(i for i, c in after.items() if i not in before or c.last_used != before[i].last_used)


def with_ancestors(ids: FrozenSet[str], cache: Dict[str, CacheEntry]) -> FrozenSet[str]:
    """`ids` and the records they build on: a kept record's parents cannot be removed, nor should they count
    against the budget."""
    out, todo = set(), [i for i in ids if i in cache]
    while todo:
        record = todo.pop()
        if record not in out:
            out.add(record)
            if cache[record].parent in cache:
                todo.append(cache[record].parent)
    return frozenset(out)


def over_budget(older: List[CacheEntry], budget: int) -> List[CacheEntry]:
    """The least recently used records to remove so that what remains fits `budget` bytes."""
    total = sum(c.size for c in older)
    doomed = []
    for entry in older:  # oldest first
        if total <= budget:
            break
        doomed.append(entry)
        total -= entry.size
    return doomed


def report(cache: CacheReport) -> None:
    REPORT.say(f"{cache.line()}")


def _free(root: Path) -> int:
    try:
        return shutil.disk_usage(root).free
    except OSError:  # podman rootless paths, or an engine on another host
        return 0
