"""What this checkout made on this host: the images its builds tagged (recorded as soon as the build gives
the image, again with its digest once pushed) and the build contexts it staged in the state folder, one JSON
line each.

Several checkouts may share one host, one engine and one loopback registry (QUALIFY_STATE_DIR and
QUALIFY_REGISTRY keep them apart only when set). `nox -s clean` removes what *this* checkout made and
nothing else, so each build appends its image id and digest here, and each context its name. The ledger
lives in the state folder, one file per checkout (named by a hash of the checkout's path), so a checkout's
own `build/` folder can be removed without losing it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional

from qualify.config.targets import REPO_ROOT
from qualify.core.errors import HostError
from qualify.core.fsutil import file_lock
from qualify.core.readlimit import strict_json
from qualify.host import paths

MAX_BYTES = 16 << 20


@dataclass(frozen=True)
class Made:
    image_id: str
    reference: str  # name@sha256:... as pushed


def path(state_dir: Optional[Path] = None, checkout: Path = REPO_ROOT) -> Path:
    return paths.ledger(checkout, state_dir)


OWNER = "checkout"  # beside a checkout's ledgers: the checkout's path, so a ledger of a gone one is told


def mark_owner(ledger: Path, checkout: Path) -> None:
    """The ledger's folder, made, with the path of the checkout it belongs to beside it (`owner_gone`)."""
    ledger.parent.mkdir(parents=True, exist_ok=True)
    (ledger.parent / OWNER).write_text(str(Path(checkout).resolve()) + "\n")


def owner_gone(ledger: Path) -> bool:
    """The checkout a ledger belongs to, as `mark_owner` wrote it, no longer exists (unknown: not gone)."""
    try:
        where = (ledger.parent / OWNER).read_text(encoding="utf-8", errors="replace")[:4096].strip()
    except OSError:
        return False
    return bool(where) and not Path(where).is_dir()


def record(image_id: str, reference: str, state_dir: Optional[Path] = None, checkout: Path = REPO_ROOT) -> None:
    """An image this checkout's build made: `reference` is its tag before the push, name@digest after."""
    _append({"image_id": image_id, "reference": reference}, state_dir, checkout)


def record_context(name: str, state_dir: Optional[Path] = None, checkout: Path = REPO_ROOT) -> None:
    """A build context this checkout staged in `<state>/contexts/` (by name), once."""
    if name not in contexts(state_dir, checkout):
        _append({"context": name}, state_dir, checkout)


def _append(doc: dict, state_dir: Optional[Path], checkout: Path) -> None:
    ledger = path(state_dir, checkout)
    mark_owner(ledger, checkout)
    with file_lock(ledger.with_suffix(".lock")):
        with open(ledger, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(doc, sort_keys=True) + "\n")


def _lines(state_dir: Optional[Path], checkout: Path) -> List[dict]:
    ledger = path(state_dir, checkout)
    if not ledger.is_file() or ledger.stat().st_size > MAX_BYTES:
        return []
    out = []
    for line in ledger.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            doc = strict_json(line, f"{ledger}: a line", HostError)
        except HostError:
            continue  # a line a killed write cut short
        if isinstance(doc, dict):
            out.append(doc)
    return out


def made(state_dir: Optional[Path] = None, checkout: Path = REPO_ROOT) -> List[Made]:
    return [Made(str(d["image_id"]), str(d["reference"])) for d in _lines(state_dir, checkout)
            if isinstance(d.get("image_id"), str) and isinstance(d.get("reference"), str)]


def contexts(state_dir: Optional[Path] = None, checkout: Path = REPO_ROOT) -> List[str]:
    """Names of the build contexts this checkout staged (a name is one path component: never a way out)."""
    names = [d["context"] for d in _lines(state_dir, checkout) if isinstance(d.get("context"), str)]
    return sorted({n for n in names if n and "/" not in n and n not in (".", "..")})


def key(state_dir: Optional[Path] = None, checkout: Path = REPO_ROOT) -> str:
    """The checkout's name in the state folder (its ledger folder): a context named for it ends with it."""
    return path(state_dir, checkout).parent.name
