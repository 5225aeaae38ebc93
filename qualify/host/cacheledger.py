"""Which BuildKit cache records this checkout's builds made, and which ones the newest build of each
(target, profile, base) used: one JSON file per checkout beside its image ledger (host/ledger.py).

The build (imagebuild/buildcache.py) keeps what the newest builds use and prunes this checkout's older
records to a budget; `nox -s clean` (host/clean.py) removes every record this checkout made. Records no
toolkit build made (another user's cache on a shared engine) are in no ledger, so neither touches them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, FrozenSet, Iterator, List, Optional

from qualify.config.targets import REPO_ROOT
from qualify.core.fsutil import file_lock, write_json
from qualify.host import ledger, paths

MAX_BYTES = 4 << 20
NAME = "buildcache.json"


@dataclass
class CacheLedger:
    """owned: ids of records this checkout's builds made; latest: per build key, the ids its newest build used."""

    owned: List[str] = field(default_factory=list)
    latest: Dict[str, List[str]] = field(default_factory=dict)

    def kept(self) -> FrozenSet[str]:
        return frozenset(i for ids in self.latest.values() for i in ids)


def path(state_dir: Optional[Path] = None, checkout: Path = REPO_ROOT) -> Path:
    return ledger.path(state_dir, checkout).with_name(NAME)


def load(state_dir: Optional[Path] = None, checkout: Path = REPO_ROOT) -> CacheLedger:
    return read(path(state_dir, checkout))


def save(book: CacheLedger, state_dir: Optional[Path] = None, checkout: Path = REPO_ROOT) -> None:
    where = path(state_dir, checkout)
    ledger.mark_owner(where, checkout)
    write_json(where, {"owned": sorted(set(book.owned)),
                       "latest": {k: sorted(set(v)) for k, v in sorted(book.latest.items())}})


def locked(state_dir: Optional[Path] = None, checkout: Path = REPO_ROOT):
    """Held while a build or clean reads, changes and writes this checkout's ledger."""
    return file_lock(path(state_dir, checkout).with_suffix(".lock"))


def kept_by_others(state_dir: Optional[Path] = None, checkout: Path = REPO_ROOT) -> FrozenSet[str]:
    """Records the newest builds of other checkouts on this host use: a record two checkouts share stays.
    A checkout that is gone (a removed clone, a test's temporary one) keeps nothing: its newest builds
    will never be rebuilt, and its records would otherwise stay past every budget."""
    mine = path(state_dir, checkout)
    found: set = set()
    for other in ledgers(state_dir):
        if other != mine and not ledger.owner_gone(other):
            found |= read(other).kept()
    return frozenset(found)


def ledgers(state_dir: Optional[Path] = None) -> Iterator[Path]:
    folder = paths.checkouts(state_dir)
    if folder.is_dir():
        yield from sorted(folder.glob(f"*/{NAME}"))


def read(file: Path) -> CacheLedger:
    if not file.is_file() or file.stat().st_size > MAX_BYTES:
        return CacheLedger()
    try:
        doc = json.loads(file.read_text(encoding="utf-8"))
        return CacheLedger([str(i) for i in doc.get("owned", [])],
                           {str(k): [str(i) for i in v] for k, v in dict(doc.get("latest", {})).items()})
    except (ValueError, TypeError, AttributeError):
        return CacheLedger()  # written atomically, so only a hand edit gets here: start again
