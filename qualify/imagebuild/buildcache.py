"""What one build made, and taking it away again: BuildKit's cache records and the intermediate images of
podman or the classic builder. A vLLM build leaves ~28 GB of cache behind otherwise, enough to make the
next `./start.sh` on the same host refuse for lack of disk.

Only what appeared during this build and is not in use goes: another checkout's concurrent build keeps
what it is using (a record it shares with us may still go, which costs it cache, never correctness).
"""

from __future__ import annotations

import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import FrozenSet

from qualify.host.engine import Engine


@dataclass(frozen=True)
class Footprint:
    """The engine's state before a build."""

    cache_ids: FrozenSet[str]
    image_ids: FrozenSet[str]
    root: Path
    free_bytes: int


@dataclass(frozen=True)
class CleanupReport:
    cache_records: int
    images: int
    reclaimed_bytes: int  # as the engine reports it (build cache only; images are counted by free space)
    free_before: int
    free_after: int
    root: Path
    error: str = ""

    def line(self) -> str:
        gb = 1e9
        text = (f"disk under {self.root}: {self.free_before / gb:.1f} GB free before the build, "
                f"{self.free_after / gb:.1f} GB after; removed {self.cache_records} build-cache record(s) "
                f"({self.reclaimed_bytes / gb:.2f} GB) and {self.images} intermediate image(s) this build made "
                "(--keep-cache keeps them)")
        return text + (f"; some stay: {self.error}" if self.error else "")


def footprint(engine: Engine) -> Footprint:
    root = engine.storage_root()
    return Footprint(frozenset(engine.build_cache()), frozenset(engine.image_ids()), root, _free(root))


def remove_what_the_build_made(engine: Engine, before: Footprint, final_id: str, tag: str, base_id: str) -> CleanupReport:
    """Everything the build added except its final image."""
    cache = engine.build_cache()
    ours = [c.id for c in cache.values() if c.id not in before.cache_ids and not c.in_use]
    reclaimed = engine.remove_build_cache(ours)
    images = [i for i in engine.created_images(set(before.image_ids), final_id, tag, base_id) if i != final_id]
    error = engine.remove_created(images)
    return CleanupReport(cache_records=len(ours), images=len(images), reclaimed_bytes=reclaimed,
                         free_before=before.free_bytes, free_after=_free(before.root), root=before.root, error=error)


def report(cleanup: CleanupReport) -> None:
    print(f"[build] {cleanup.line()}", file=sys.stderr, flush=True)


def _free(root: Path) -> int:
    try:
        return shutil.disk_usage(root).free
    except OSError:  # podman rootless paths, or an engine on another host
        return 0
