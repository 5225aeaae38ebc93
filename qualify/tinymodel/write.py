"""The model folder: the committed files (files.py) copied into a temporary folder beside DIR, each checked
against the stamp's sha256, then renamed into place. Standard library only: no torch, no training.

A run killed midway leaves DIR as it was (and a `.DIR.tiny-*` folder the next run removes, and says so). A
folder that is not a tiny model (no `tiny-model.json`) is never replaced; one that already holds exactly
these files is left alone. Every file is world-readable: the server runs as uid 1000 and mounts the folder
read-only.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from qualify.core.errors import ConfigError
from qualify.tinymodel import files
from qualify.tinymodel.files import STAMP, Stamp


@dataclass(frozen=True)
class Written:
    folder: Path
    stamp: Stamp
    changed: bool  # False: the folder already held these files


def _stale_temps(out: Path) -> int:
    old = list(out.parent.glob(f".{out.name}.tiny-*"))
    for path in old:
        shutil.rmtree(path, ignore_errors=True)
    return len(old)


def _world_readable(root: Path) -> None:
    os.chmod(root, 0o755)
    for path in root.rglob("*"):
        os.chmod(path, 0o755 if path.is_dir() else 0o644)


def _check_replaceable(out: Path) -> None:
    if out.is_symlink() or (out.exists() and not out.is_dir()):
        raise ConfigError(f"{out}: exists and is not a folder; not replaced", hint="choose another --out")
    if out.is_dir() and any(out.iterdir()) and not (out / STAMP).is_file():
        raise ConfigError(f"{out}: a folder that is not a tiny model (no {STAMP}); not replaced",
                          hint="choose an empty or new folder for --out")


def _holds(out: Path, stamp: Stamp) -> bool:
    """`out` holds exactly the committed files, each with its recorded sha256, and nothing else."""
    if not out.is_dir() or sorted(p.name for p in out.iterdir()) != sorted([*stamp.digests, STAMP]):
        return False
    try:
        if files.read_stamp(out).raw != stamp.raw:
            return False
        for name, digest in stamp.files:
            files.read_checked(out, name, digest)
    except ConfigError:
        return False
    return True


def make(out: Path, say: Callable[[str], None] = print, source: Optional[Path] = None) -> Written:
    """Write the tiny model to `out` from `source` (default: the committed files)."""
    source = source or files.MODEL_DIR
    stamp = files.read_stamp(source)
    out = out.absolute()
    _check_replaceable(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    stale = _stale_temps(out)
    if stale:
        say(f"removed {stale} unfinished folder(s) an interrupted run left beside {out}")
    if _holds(out, stamp):
        say(f"{out}: already holds this tiny model (stamp sha256 {stamp.sha256[:12]}); unchanged")
        return Written(out, stamp, changed=False)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tiny-", dir=str(out.parent)))
    try:
        for name, digest in stamp.files:
            (tmp / name).write_bytes(files.read_checked(source, name, digest))
        (tmp / STAMP).write_bytes(stamp.raw)
        for name, digest in stamp.files:  # what landed on this disk, read back
            files.read_checked(tmp, name, digest)
        _world_readable(tmp)
        _swap_in(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    say(f"wrote {out}: {len(stamp.files)} files and the stamp, each matching its recorded sha256")
    return Written(out, stamp, changed=True)


def _swap_in(tmp: Path, out: Path) -> None:
    """Rename the finished folder into place; an older tiny model there goes only after the new one is in."""
    if not out.exists():
        os.rename(tmp, out)
        return
    old = out.with_name(f".{out.name}.tiny-old-{os.getpid()}")
    os.rename(out, old)
    os.rename(tmp, out)
    shutil.rmtree(old, ignore_errors=True)
