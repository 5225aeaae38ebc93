"""A ref lock a killed git left behind (`refs/tags/<tag>.lock`), told apart from one a running git holds.

git takes a ref's lock by creating `<ref>.lock` (O_EXCL), writes the new object id into it and renames it
over the ref; a git killed in between (a release killed while `git tag` ran) leaves the lock, and every later
`git tag` of that name fails ("Unable to create '...lock': File exists") until it is removed. git itself never
removes a lock it did not take: it cannot tell a crashed holder from a live one. We can, on this host:

- the lock is at least `MIN_AGE_S` old (git holds a ref lock for milliseconds: a younger one is waited for);
- no process has the lock file open (`/proc/<pid>/fd`);
- no running git process works in this repository: none whose executable is `git` or `git-*` has its working
  folder in one of the repository's work trees or its git folder, names one of them in its command line, or
  points `GIT_DIR`/`GIT_COMMON_DIR` there; a git process whose folder or environment we may not read counts
  as a holder.

A new lock cannot appear while the old one exists (O_EXCL), so once no holder is found the lock is stale; it is
moved aside and checked to be the same file (inode) before it is removed. Without /proc (not Linux) nothing is
decided: the error names the lock and says how to check by hand. A git in another PID namespace (a container
sharing the repository) is not seen; the age rule covers its milliseconds.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional, Sequence

from qualify.core.errors import ReleaseError
from qualify.release.gitops import git

MIN_AGE_S = 5.0
_PROC = Path("/proc")


@dataclass(frozen=True)
class StaleLock:
    """A stale lock that was removed: where it was, and the object id the killed git had written into it."""

    path: Path
    object_id: str  # '' when the lock held no object id (killed before writing it)


def lock_of(repo: Path, ref: str) -> Path:
    """`<common git folder>/<ref>.lock`: where git locks a loose ref (tags live in the common folder)."""
    common = git(repo, "rev-parse", "--path-format=absolute", "--git-common-dir").stdout.strip()
    return Path(common) / f"{ref}.lock"


def clear_stale(repo: Path, ref: str, say=lambda _m: None) -> Optional[StaleLock]:
    """Remove `ref`'s lock when a killed git left it; None when there is no lock. Raises, naming the lock and
    the processes, when a running git may hold it, or when this host cannot tell."""
    lock = lock_of(repo, ref)
    if not os.path.lexists(lock):
        return None
    age = _age(lock)
    if age is not None and age < MIN_AGE_S:
        say(f"  {lock} exists ({age:.1f} s old): waiting for the git that holds it")
        time.sleep(MIN_AGE_S - age)
        if not os.path.lexists(lock):
            return None
    if not _PROC.is_dir():
        raise ReleaseError(f"{lock} exists and this host has no /proc to tell whether a git process holds it",
                           hint="if no git runs in this repository, remove that file and run the release again")
    found = holders(lock, repository_roots(repo))
    if found:
        raise ReleaseError(f"{lock} is held: {'; '.join(found[:3])}; a release never removes a lock a running "
                           "git holds", hint="let that git finish (or stop it), then run the release again")
    before = os.lstat(lock)
    held = _read_small(lock)
    aside = lock.with_name(f"{lock.name}.stale-{os.getpid()}")
    os.rename(lock, aside)
    if os.lstat(aside).st_ino != before.st_ino:  # replaced between the look and the move: not ours to take
        os.rename(aside, lock)
        raise ReleaseError(f"{lock} changed while it was checked", hint="run the release again")
    os.unlink(aside)
    oid = held.strip()
    return StaleLock(lock, oid if len(oid) in (40, 64) and all(c in "0123456789abcdef" for c in oid) else "")


def repository_roots(repo: Path) -> List[str]:
    """Every work tree of the repository and its common git folder, resolved."""
    out = git(repo, "worktree", "list", "--porcelain", check=False).stdout
    roots = {os.path.realpath(line[len("worktree "):]) for line in out.splitlines() if line.startswith("worktree ")}
    common = git(repo, "rev-parse", "--path-format=absolute", "--git-common-dir").stdout.strip()
    roots |= {os.path.realpath(repo), os.path.realpath(common)}
    return sorted(roots)


def holders(lock: Path, roots: Sequence[str]) -> List[str]:
    """Processes that have `lock` open or are git working in one of `roots`, each described for people."""
    target = os.path.realpath(lock)
    found = []
    for proc in _PROC.iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        why = _holds(proc, target, roots)
        if why:
            found.append(f"pid {proc.name} ({why})")
    return found


def _holds(proc: Path, lock: str, roots: Sequence[str]) -> str:
    try:
        for fd in (proc / "fd").iterdir():
            if os.readlink(fd) == lock:
                return "has the lock open"
    except OSError:
        pass  # gone, or not ours to read: its executable decides below
    try:
        exe = os.path.basename(os.readlink(proc / "exe"))
    except OSError:
        try:
            exe = (proc / "comm").read_text().strip()
        except OSError:
            return ""  # gone
    if exe.removesuffix(" (deleted)") != "git" and not exe.startswith("git-"):
        return ""
    if _state(proc) == "Z":
        return ""  # killed, not yet reaped: holds nothing
    try:
        cwd = os.readlink(proc / "cwd")
        argv = (proc / "cmdline").read_bytes().decode("utf-8", "replace").split("\0")
        env = (proc / "environ").read_bytes().decode("utf-8", "replace").split("\0")
    except OSError:
        return f"{exe}, whose folder this user may not read"
    places = [cwd, *(e.split("=", 1)[1] for e in env if e.startswith(("GIT_DIR=", "GIT_COMMON_DIR=")))]
    command = " ".join(argv).strip()
    for root in roots:
        if any(_inside(os.path.realpath(p), root) for p in places if p) or root in command:
            return f"{command[:120]}, in {cwd}"
    return ""


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _state(proc: Path) -> str:
    try:
        return (proc / "stat").read_text().rpartition(")")[2].split()[0]
    except (OSError, IndexError):
        return ""


def _age(path: Path) -> Optional[float]:
    try:
        return max(0.0, time.time() - os.lstat(path).st_mtime)
    except OSError:
        return None


def _read_small(path: Path) -> str:
    try:
        with open(path, "rb") as fh:
            return fh.read(256).decode("ascii", "replace")
    except OSError:
        return ""
