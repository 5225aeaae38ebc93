"""BuildKit's build-cache records as `docker system df -v` lists them, and the engine's human sizes: the
parsing half of Engine.build_cache (host/engine.py), which asks the engine; nothing here does."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict

from qualify.core.errors import EngineError
from qualify.core.readlimit import strict_json


@dataclass(frozen=True)
class CacheEntry:
    """One BuildKit build-cache record (what `docker system df -v` lists)."""

    id: str
    size: int
    in_use: bool
    description: str
    last_used: str = ""  # as `system df` prints it ('2026-12-01 10:48:19.43 +0000 UTC'); sorts by time
    shared: bool = False  # its snapshot is also an image layer: removing it frees less than its size
    parent: str = ""  # the record it builds on ('' for none); a parent cannot go before its children


def parse_listing(text: str) -> Dict[str, CacheEntry]:
    """Records by id from `system df -v --format '{{json .BuildCache}}'` ('' or 'null' when there are none)."""
    raw = strict_json(text or "[]", "the engine's build-cache listing (system df -v)", EngineError) or []
    entries = [CacheEntry(id=e["ID"].rstrip("*"), size=parse_size(e.get("Size", "0B")),
                          in_use=str(e.get("InUse")).lower() == "true", description=e.get("Description", ""),
                          last_used=str(e.get("LastUsedAt") or e.get("CreatedAt") or ""),
                          shared=str(e.get("Shared")).lower() == "true",
                          parent=str(e.get("Parent") or "").rstrip("*"))
               for e in raw]
    return {e.id: e for e in entries}


_UNITS = {"B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30}


def parse_size(text: str) -> int:
    """Bytes from the engine's human sizes ('17B', '226MB', '1.2GB'); 0 when unreadable."""
    text = text.strip().upper().replace(" ", "")
    for unit in sorted(_UNITS, key=len, reverse=True):
        if text.endswith(unit):
            try:
                return int(float(text[: -len(unit)]) * _UNITS[unit])
            except ValueError:
                return 0
    return 0
