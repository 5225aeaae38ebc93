"""What `nox -s clean` takes from the state folder (QUALIFY_STATE_DIR), part by part as host/paths.py sorts
them; every checkout on the host shares the folder, so clean takes only what is this checkout's or nobody's:

- build contexts (`contexts/`): those this checkout's ledger names (or that carry its name), and those of a
  checkout that no longer exists; never one a running build holds, never another checkout's (--all: all);
- work folders (`work/`, `repro/`): those whose process is gone, whoever ran it (host/workdirs.py);
- shared content-addressed caches (wheelhouses, staged probes): listed and kept; --all removes them;
- the debootstrap cache: --all;
- never, even with --all: STATE_NEVER_REMOVED and every registry's storage (garbage-collected instead);
- anything else found there is listed and kept; --all removes folders of it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, List, Optional, Set, Tuple

from qualify.config.targets import REPO_ROOT
from qualify.host import ledger, paths, workdirs


@dataclass(frozen=True)
class Entry:
    path: Path
    size: int
    why: str  # why it goes, or why it stays


@dataclass
class StatePlan:
    removed: List[Entry]
    kept: List[Entry]


def plan(state_dir: Path, everything: bool, checkout: Path = REPO_ROOT) -> StatePlan:
    seen: Set[Tuple[int, int]] = set()  # contexts hard-link into wheelhouses: count each file once
    out = StatePlan([], [])

    def take(path: Path, why: str) -> None:
        out.removed.append(Entry(path, workdirs.disk_bytes(path, seen), why))

    def keep(path: Path, why: str) -> None:
        out.kept.append(Entry(path, workdirs.disk_bytes(path, set(seen)), why))

    _contexts(state_dir, everything, checkout, take, keep)
    for name in paths.STATE_WORK:
        folder = state_dir / name
        for work in sorted(folder.iterdir()) if folder.is_dir() else []:
            if not work.is_dir() or work.is_symlink():
                continue
            if workdirs.abandoned(work):
                take(work, "work folder of a run that is over")
            else:
                keep(work, f"in use by a running command (pid {workdirs.owner(work)})")
    for name in paths.STATE_SHARED + paths.STATE_SLOW:
        folder = state_dir / name
        if not folder.is_dir():
            continue
        if everything:
            take(folder, "--all")
        elif name in paths.STATE_SHARED:
            keep(folder, "shared by every checkout on this host (content-addressed); --all removes it")
        else:
            keep(folder, "the debootstrap cache, slow to make again; --all removes it")
    known = set(paths.STATE_PER_CHECKOUT + paths.STATE_WORK + paths.STATE_SHARED + paths.STATE_SLOW)
    never = {p.name for p in paths.never_removed(state_dir)}
    for entry in sorted(state_dir.iterdir()) if state_dir.is_dir() else []:
        if entry.name in known or entry.name in never or not entry.is_dir() or entry.is_symlink():
            continue  # files at the top are locks and lease files of the registries: never removed
        if everything:
            take(entry, "--all: not a part of the state folder clean knows (an older version's work folder?)")
        else:
            keep(entry, "not a part of the state folder clean knows; --all removes it")
    return out


def apply(p: StatePlan, state_dir: Path) -> Tuple[int, List[Entry]]:
    """Remove what the plan takes (never anything under STATE_NEVER_REMOVED or a registry's storage): the
    bytes freed, and the entries that could not be removed (something still mounted below them)."""
    guarded = [Path(os.path.realpath(g)) for g in paths.never_removed(state_dir)]
    freed, failed = 0, []
    for entry in p.removed:
        real = Path(os.path.realpath(entry.path))
        if any(real == g or g in real.parents or real in g.parents for g in guarded):
            raise AssertionError(f"clean would remove {entry.path}, which is never removed")  # a bug, not a case
        try:
            with _context_lock(entry.path):
                workdirs.remove(entry.path)
        except OSError as exc:
            failed.append(Entry(entry.path, 0, str(exc)))
            continue
        freed += entry.size
    return freed, failed


@contextlib.contextmanager
def _context_lock(path: Path) -> Iterator[None]:
    """A build context's lock (the folder kept per lock and checkout), held while it is removed, then removed
    too: a build that starts meanwhile waits, or stages a folder of its own. Other folders have none."""
    lock = path.with_name(path.name + ".lock")
    if path.parent.name != "contexts" or not lock.is_file():
        yield
        return
    with open(lock, "a") as fh:
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise OSError(f"{path}: a build started using it meanwhile; kept") from None
        yield
        lock.unlink(missing_ok=True)


def _contexts(state_dir: Path, everything: bool, checkout: Path, take, keep) -> None:
    folder = paths.build_contexts(state_dir)
    if not folder.is_dir():
        return
    mine = set(ledger.contexts(state_dir, checkout))
    my_key = ledger.key(state_dir, checkout)
    gone = _gone_checkouts(state_dir)
    for ctx in sorted(folder.iterdir()):
        if not ctx.is_dir() or ctx.is_symlink():
            continue
        if ctx.name in mine or ctx.name.endswith(f"-{my_key}"):
            owner = "this checkout's"
        elif ctx.name in gone[0] or any(ctx.name.endswith(f"-{k}") for k in gone[1]):
            owner = "of a checkout that no longer exists"
        elif everything:
            owner = "another checkout's (--all)"
        else:
            keep(ctx, "not this checkout's build context (another checkout's ledger names it, or none does); "
                      "--all removes it")
            continue
        busy = _in_use(ctx)
        if busy:
            keep(ctx, f"{owner}, {busy}")
        else:
            take(ctx, f"build context, {owner}")


def _gone_checkouts(state_dir: Path) -> Tuple[Set[str], Set[str]]:
    """(contexts named in the ledgers of checkouts that are gone, those checkouts' keys)."""
    names: Set[str] = set()
    keys: Set[str] = set()
    folder = paths.checkouts(state_dir)
    for made in sorted(folder.glob("*/made.jsonl")) if folder.is_dir() else []:
        if ledger.owner_gone(made):
            keys.add(made.parent.name)
            try:
                where = Path((made.parent / ledger.OWNER).read_text(encoding="utf-8", errors="replace")[:4096].strip())
            except OSError:
                continue
            names |= set(ledger.contexts(state_dir, where))
    return names, keys


def _in_use(ctx: Path) -> Optional[str]:
    """Why a context must stay: a running build holds its lock (the folder kept per lock and checkout), or the
    build whose pid its name carries (a folder of one build's own) is running."""
    lock = ctx.with_name(ctx.name + ".lock")
    if lock.is_file():
        try:
            with open(lock, "a") as fh:
                try:
                    fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    return "in use by a running build"
                fcntl.flock(fh.fileno(), fcntl.LOCK_UN)
        except OSError:
            pass
    parts = ctx.name.rsplit("-", 2)
    if len(parts) == 3 and parts[1].isdigit() and workdirs.running(int(parts[1])):
        return f"in use by a running build (pid {parts[1]})"
    return None

