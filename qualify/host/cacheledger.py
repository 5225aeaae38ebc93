"""Which BuildKit cache records this checkout's builds made, and which ones the newest build of each
(target, profile, base) used: one JSON file per checkout beside its image ledger (host/ledger.py). For
podman (and docker's classic builder), whose layer cache is intermediate images, not records: the
intermediate images the newest build of each key made or was served from (`images`).

The build (imagebuild/buildcache.py) keeps what the newest builds use and prunes this checkout's older
records to a budget; `nox -s clean` (host/clean.py) removes every record this checkout made. Records no
toolkit build made (another user's cache on a shared engine) are in no ledger, so neither touches them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, FrozenSet, Iterator, List, Optional

from qualify.config.targets import REPO_ROOT
from qualify.core.errors import HostError
from qualify.core.fsutil import file_lock, write_json
from qualify.core.readlimit import read_json
from qualify.host import ledger, paths

MAX_BYTES = 4 << 20
NAME = "buildcache.json"


@dataclass
class CacheLedger:
    """owned: ids of records this checkout's builds made; latest: per build key, the ids its newest build used;
    images: per build key, the intermediate images (podman's cache) its newest build made or used."""

    owned: List[str] = field(default_factory=list)
    latest: Dict[str, List[str]] = field(default_factory=dict)
    images: Dict[str, List[str]] = field(default_factory=dict)

    def kept(self) -> FrozenSet[str]:
        return frozenset(i for ids in self.latest.values() for i in ids)

    def kept_images(self, but: str = "") -> FrozenSet[str]:
        """Intermediate images the newest builds of every key (except `but`) use."""
        return frozenset(i for key, ids in self.images.items() if key != but for i in ids)


def path(state_dir: Optional[Path] = None, checkout: Path = REPO_ROOT) -> Path:
    return ledger.path(state_dir, checkout).with_name(NAME)


def load(state_dir: Optional[Path] = None, checkout: Path = REPO_ROOT) -> CacheLedger:
    return read(path(state_dir, checkout))


def save(book: CacheLedger, state_dir: Optional[Path] = None, checkout: Path = REPO_ROOT) -> None:
    where = path(state_dir, checkout)
    ledger.mark_owner(where, checkout)
    write_json(where, {"owned": sorted(set(book.owned)),
                       "latest": {k: sorted(set(v)) for k, v in sorted(book.latest.items())},
                       "images": {k: sorted(set(v)) for k, v in sorted(book.images.items()) if v}})


def locked(state_dir: Optional[Path] = None, checkout: Path = REPO_ROOT):
    """Held while a build or clean reads, changes and writes this checkout's ledger."""
    return file_lock(path(state_dir, checkout).with_suffix(".lock"))


def kept_by_others(state_dir: Optional[Path] = None, checkout: Path = REPO_ROOT) -> FrozenSet[str]:
    """Records the newest builds of other checkouts on this host use: a record two checkouts share stays.
    A checkout that is gone (a removed clone, a test's temporary one) keeps nothing: its newest builds
    will never be rebuilt, and its records would otherwise stay past every budget."""
    return frozenset(i for book in _others(state_dir, checkout) for i in book.kept())


def images_kept_by_others(state_dir: Optional[Path] = None, checkout: Path = REPO_ROOT) -> FrozenSet[str]:
    """Intermediate images the newest builds of other live checkouts use (an image two checkouts share stays)."""
    return frozenset(i for book in _others(state_dir, checkout) for i in book.kept_images())


def _others(state_dir: Optional[Path], checkout: Path) -> Iterator[CacheLedger]:
    mine = path(state_dir, checkout)
    for other in ledgers(state_dir):
        if other != mine and not ledger.owner_gone(other):
            yield read(other)


def ledgers(state_dir: Optional[Path] = None) -> Iterator[Path]:
    folder = paths.checkouts(state_dir)
    if folder.is_dir():
        yield from sorted(folder.glob(f"*/{NAME}"))


def read(file: Path) -> CacheLedger:
    if not file.is_file() or file.stat().st_size > MAX_BYTES:
        return CacheLedger()
    try:
        doc = read_json(file, MAX_BYTES, "cache ledger", HostError)
        return CacheLedger([str(i) for i in doc.get("owned", [])],
                           {str(k): [str(i) for i in v] for k, v in dict(doc.get("latest", {})).items()},
                           {str(k): [str(i) for i in v] for k, v in dict(doc.get("images", {})).items()})
    except (HostError, TypeError, AttributeError):
        return CacheLedger()  # written atomically, so only a hand edit gets here: start again
