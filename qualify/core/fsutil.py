"""Atomic file writes and canonical JSON. Standard library only (used in images too)."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Dict, Iterable, Iterator, Union

PathLike = Union[str, "os.PathLike[str]"]


def canonical_json(obj: Any) -> bytes:
    """Sorted keys, UTF-8, two-space indent, newline at end: the same bytes every time.
    NaN and infinities are refused (ValueError): they are not JSON, and no reader of ours takes them."""
    return (json.dumps(obj, sort_keys=True, ensure_ascii=False, indent=2, allow_nan=False) + "\n").encode("utf-8")


def canonical_problem(data: bytes, doc: Any) -> str:
    """Why `data` is not the canonical JSON of `doc` ("" when it is): the one accepted form of every signed
    record, which scripts/verify-independent.sh checks too (VERIFYING.md, Signatures): sorted keys,
    two-space indent, one key a line, no escape canonical JSON does not write, a newline at the end."""
    want = canonical_json(doc)
    if want == data:
        return ""
    got_lines, want_lines = data.split(b"\n"), want.split(b"\n")
    for n, (g, w) in enumerate(zip(got_lines, want_lines), 1):
        if g != w:
            got, wanted = g[:80].decode("utf-8", "replace"), w[:80].decode("utf-8", "replace")
            return f"line {n} is {got!r}, canonical JSON writes {wanted!r}"
    return f"{len(got_lines)} lines, canonical JSON writes {len(want_lines)}"


def write_atomic(path: PathLike, data: Union[bytes, str], mode: int = 0o644) -> Path:
    """Write to a temporary file beside `path`, fsync, then rename over it.

    A reader sees the old file or the new one, never half of either.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(data, str):
        data = data.encode("utf-8")
    if os.path.lexists(path) and not os.path.isfile(path) or os.path.islink(path):
        # Renaming over it would replace a device (/dev/full), a FIFO or a link with a plain file.
        raise IsADirectoryError(errno.EEXIST, "exists and is not a regular file; not replaced", str(path))
    _remove_stale_temps(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.{os.getpid()}.", suffix=".tmp", dir=str(path.parent))
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException as exc:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        if isinstance(exc, OSError) and not exc.filename:
            # ENOSPC from write() or fsync() names no file: name the one being written.
            raise OSError(exc.errno, exc.strerror, str(path)) from None
        raise
    return path


def _remove_stale_temps(path: Path) -> None:
    """Temp files of earlier writes to `path` whose writer died (killed before its rename): the pid is in
    the name, so a live writer's file stays."""
    prefix = f".{path.name}."
    try:
        names = [n for n in os.listdir(path.parent) if n.startswith(prefix) and n.endswith(".tmp")]
    except OSError:
        return
    for name in names:
        pid = name[len(prefix):].split(".", 1)[0]
        if pid.isdigit() and not _alive(int(pid)):
            try:
                os.unlink(path.parent / name)
            except OSError:
                pass


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid exists (a folder named by a dead writer's pid is stale)."""
    return _alive(pid)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def create_exclusive(path: PathLike, data: bytes, mode: int = 0o644) -> Path:
    """Create `path` only if it does not exist (O_EXCL: of two racing writers exactly one wins)."""
    path = Path(path)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
    except BaseException:
        path.unlink(missing_ok=True)
        raise
    return path


def write_json(path: PathLike, obj: Any) -> Path:
    return write_atomic(path, canonical_json(obj))


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    """Hex sha256 of a file, read in chunks (the one file-hash helper)."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(chunk), b""):
            h.update(block)
    return h.hexdigest()


def sha256_files(paths: Iterable[Path]) -> Dict[Path, str]:
    """sha256_file of each path, on one thread per core: hashlib drops the GIL while it hashes, so a
    wheelhouse of gigabytes hashes in about 1/cores of the time (measured in docs/performance.md)."""
    import concurrent.futures  # here, not at the top: the census imports this module and counts its start-up

    todo = list(paths)
    if len(todo) < 2:
        return {p: sha256_file(p) for p in todo}
    with concurrent.futures.ThreadPoolExecutor(max_workers=min(len(todo), os.cpu_count() or 1)) as pool:
        return dict(zip(todo, pool.map(sha256_file, todo)))


@contextlib.contextmanager
def file_lock(path: PathLike) -> Iterator[None]:
    """An exclusive advisory lock (flock) held for the block: checkouts on one host share build state
    (wheelhouses, the registry, the hermetic base) and take turns at it. Released when the process dies."""
    import fcntl  # POSIX only; imported here so the image side still loads anywhere

    lock_path = Path(path)
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "a") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def readable_by_all(root: Path) -> Path:
    """`chmod -R a+rX root`: what is mounted into an image must be readable by its non-root user
    (mkdtemp makes 0700 folders)."""
    for path in [root, *root.rglob("*")]:
        if path.is_symlink():
            continue
        mode = path.stat().st_mode
        wanted = mode | 0o444 | (0o111 if path.is_dir() or mode & 0o100 else 0)
        if wanted != mode:
            path.chmod(wanted & 0o7777)
    return root


def others_can_read(root: Path) -> bool:
    return root.stat().st_mode & 0o005 == 0o005
