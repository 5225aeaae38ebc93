"""Work folders of running commands: in the state folder (`<state>/work/`), never in /tmp, each named
`<kind>.<pid>.<random>` by the process that owns it.

A command that needs scratch space (a hermetic base's build context, debootstrap's root, a probe staged before
it is renamed into place, attest-interop's npm install) takes a folder here and removes it when it ends. A
kill -9 cannot, so the pid in the name says whether the owner is gone: the next run of the command and
`nox -s clean` remove such folders, after unmounting what is mounted below them (debootstrap's second stage
mounts proc in its root), and say what they removed. A folder with something still mounted below it after
that is left alone: removing files through a live mount would reach into the file system mounted there.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, List, Optional, Set, Tuple

from qualify.core.fsutil import pid_alive
from qualify.core.report import Reporter
from qualify.host import cmd, paths

REPORT = Reporter("state")


def make(kind: str, root: Optional[Path] = None) -> Path:
    """A new work folder of this process (`<state>/work/<kind>.<pid>.<random>`)."""
    where = paths.work_dirs(root)
    where.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f"{kind}.{os.getpid()}.", dir=where))


@contextlib.contextmanager
def scratch(kind: str, root: Optional[Path] = None) -> Iterator[Path]:
    """A work folder for the block, removed when it ends (a kill leaves it to `sweep`)."""
    folder = make(kind, root)
    try:
        yield folder
    finally:
        remove(folder)


def owner(folder: Path) -> Optional[int]:
    """The pid in a work folder's name (`<kind>.<pid>.<random>`), None when it has none."""
    parts = folder.name.split(".")
    return int(parts[1]) if len(parts) >= 3 and parts[1].isdigit() else None


def abandoned(folder: Path) -> bool:
    """No live process owns it: its pid is gone (or a zombie: killed, not yet reaped), or it has none (a name
    no run of ours gives)."""
    pid = owner(folder)
    return pid is None or not running(pid)


def running(pid: int) -> bool:
    if not pid_alive(pid):
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(encoding="ascii", errors="replace")
    except OSError:
        return True  # no /proc to ask: alive, as far as we can tell
    return stat.rpartition(")")[2].split()[:1] != ["Z"]


def mounts_under(folder: Path) -> List[str]:
    """Mount points at or below `folder`, deepest first (from /proc/self/mountinfo)."""
    top = os.path.realpath(folder)
    found = []
    try:
        lines = Path("/proc/self/mountinfo").read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return []
    for line in lines:
        fields = line.split()
        if len(fields) < 5:
            continue
        point = _unescape(fields[4])
        if point == top or point.startswith(top + "/"):
            found.append(point)
    return sorted(found, key=lambda p: p.count("/"), reverse=True)


def _unescape(text: str) -> str:
    """mountinfo writes space, tab, newline and backslash as octal escapes (\\040 ...)."""
    out, i = [], 0
    while i < len(text):
        if text[i] == "\\" and i + 3 < len(text) and text[i + 1:i + 4].isdigit():
            out.append(chr(int(text[i + 1:i + 4], 8)))
            i += 4
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def unmount_below(folder: Path) -> Tuple[List[str], List[str]]:
    """Unmount what is mounted below `folder`: (unmounted, still mounted)."""
    done = []
    for point in mounts_under(folder):
        for argv in (["umount", point], ["umount", "--lazy", point]):
            if cmd.ask(argv, timeout=60).returncode == 0:
                done.append(point)
                break
    return done, mounts_under(folder)


def remove(folder: Path) -> List[str]:
    """Remove a work folder, unmounting what is mounted below it first; the mount points it unmounted.
    Refused (OSError) when something stays mounted below it."""
    if not os.path.lexists(folder):
        return []
    unmounted, left = unmount_below(folder)
    if left:
        raise OSError(f"{folder}: {len(left)} file system(s) stay mounted below it ({left[0]}); not removed")
    shutil.rmtree(folder, ignore_errors=True)
    return unmounted


@dataclass(frozen=True)
class Swept:
    folder: Path
    size: int
    unmounted: Tuple[str, ...] = ()
    error: str = ""  # why it stays

    def line(self) -> str:
        mounts = f"; unmounted {', '.join(self.unmounted)}" if self.unmounted else ""
        if self.error:
            return f"kept {self.folder}: {self.error}"
        pid = owner(self.folder)
        whose = f" (pid {pid}, no longer running)" if pid is not None else ""
        return f"removed {self.folder} ({self.size / 1e6:.0f} MB), the work folder of a run that was killed{whose}{mounts}"


def abandoned_in(where: Path, kinds: Optional[Tuple[str, ...]] = None) -> List[Path]:
    """Folders in `where` that no live process owns (of these kinds only, when given)."""
    if not where.is_dir():
        return []
    return [f for f in sorted(where.iterdir())
            if f.is_dir() and not f.is_symlink() and (kinds is None or f.name.split(".", 1)[0] in kinds)
            and abandoned(f)]


def sweep(kinds: Optional[Tuple[str, ...]] = None, root: Optional[Path] = None, dry_run: bool = False,
          say=REPORT.say) -> List[Swept]:
    """Remove the work folders killed runs left (of these kinds: a command sweeps what it makes itself;
    clean sweeps every kind), saying what it removed."""
    out = []
    for folder in abandoned_in(paths.work_dirs(root), kinds):
        out.append(_take(folder, dry_run))
        if not dry_run and say is not None:
            say(out[-1].line())
    return out


def _take(folder: Path, dry_run: bool) -> Swept:
    size = disk_bytes(folder)
    if dry_run:
        return Swept(folder, size, tuple(mounts_under(folder)))
    try:
        return Swept(folder, size, tuple(remove(folder)))
    except OSError as exc:
        return Swept(folder, 0, (), str(exc))


def disk_bytes(path: Path, seen: Optional[Set[Tuple[int, int]]] = None) -> int:
    """Bytes on disk under `path` (folders included, as du counts them), each inode once, never crossing into
    another file system (a proc mount left in a root)."""
    seen = set() if seen is None else seen
    total = 0
    try:
        device = os.lstat(path).st_dev
    except OSError:
        return 0
    for top, dirs, files in os.walk(path):
        for name in [top, *(os.path.join(top, f) for f in files)]:
            try:
                st = os.lstat(name)
            except OSError:
                continue
            if st.st_dev == device and (st.st_dev, st.st_ino) not in seen:
                seen.add((st.st_dev, st.st_ino))
                total += st.st_blocks * 512
        dirs[:] = [d for d in dirs if _same_device(os.path.join(top, d), device)]
    return total


def _same_device(path: str, device: int) -> bool:
    try:
        return os.lstat(path).st_dev == device
    except OSError:
        return False
