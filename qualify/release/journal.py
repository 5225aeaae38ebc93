"""Journaled writes of signed files, and the locks every writer of a release folder or hosts file holds.

POSIX has no multi-file rename. A set of signed files (a manifest and its promotion record, with the record
it replaces kept; published.json; hosts.json) is staged with its signatures in a journal folder inside the
folder it goes to, each signature verified, marked COMPLETE, then renamed into place; readers verify every
file, so a half-renamed set is refused, never trusted.

A journal left by a killed writer is finished only when what it would make verifies: the caller's check
reads the folder with the journal laid over it (folder.read_release's overlay; the hosts chain for
hosts.json) against the release key, the ledger and this host's high-water marks. A COMPLETE journal that
does not verify (one planted beside the folder, or stale) is reported and left as it is, never applied; an
incomplete one never took effect and is removed.

One lock per release folder (`STATE_DIR/locks/release-folder-<sha256 of its path>.lock`, held by release,
promote and publish) and one per hosts file (`.../hosts-file-<...>.lock`, held by `hosts` and by promote
while it reads the file); inside
the lock a writer re-checks, just before it marks its journal COMPLETE, that the files it replaces are still
the bytes it read (`replaces`).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable, Iterator, List, Mapping, Optional, Sequence, Tuple

from qualify.core import killpoint
from qualify.core.errors import QualifyError, VerificationError
from qualify.core.readlimit import BUNDLE_LIMIT, MANIFEST_LIMIT, SIGNATURE_LIMIT, open_folder
from qualify.release import records as rec
from qualify.release.folder import RECORD_LIMIT, KeyAnchor, Sign, TrustedKey, read_release, sha256, verify_blob
from qualify.signing import formats

JOURNAL_PREFIX = ".signed-write-"
COMPLETE = "COMPLETE"
Check = Callable[[Path], str]  # a COMPLETE journal -> "" when it may be finished, else why not


@contextlib.contextmanager
def locked(lock_file: Path) -> Iterator[None]:
    """An exclusive flock on `lock_file` (created, never through a symlink), held for the block."""
    import fcntl

    lock_file.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(lock_file, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0),
                     0o644)
    except OSError as exc:
        raise VerificationError(f"cannot open the lock {lock_file}: {exc.strerror}",
                                hint="it must be a regular file (a symbolic link is refused)") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def _lock_of(kind: str, path: Path) -> Path:
    """In the host's lock folder, named by the path's resolved form: the work tree stays clean (a lock file
    there would make the next release refuse a dirty tree), and every spelling of one folder shares its lock."""
    from qualify.host import paths

    return paths.host_lock(f"{kind}-{sha256(str(Path(path).resolve()).encode())[:24]}")


def release_lock(folder: Path) -> contextlib.AbstractContextManager:
    """The one lock of release folder `folder` (release, promote, publish)."""
    return locked(_lock_of("release-folder", folder))


def hosts_lock(path: Path) -> contextlib.AbstractContextManager:
    """The one lock of an enrolled-hosts file (hosts add/remove; promote while it reads the file)."""
    return locked(_lock_of("hosts-file", path))


def _current(folder: Path, name: str) -> Optional[bytes]:
    with open_folder(folder, "folder", VerificationError) as f:
        return f.read(name, MANIFEST_LIMIT, "file", VerificationError) if f.exists(name) else None


def check_unchanged(folder: Path, replaces: Mapping[str, Optional[str]]) -> None:
    """Each file `replaces` names still has the sha256 it had when it was read (None: still absent)."""
    for name, expected in sorted(replaces.items()):
        data = _current(folder, name)
        found = sha256(data) if data is not None else None
        if found != expected:
            raise VerificationError(f"{folder / name} changed while this write was prepared (sha256 "
                                    f"{(found or 'none')[:12]}, read as {(expected or 'none')[:12]}): another writer; "
                                    "nothing was written", hint="run the command again: it starts from what is there now")


def write_signed_files(folder: Path, files: Sequence[Tuple[str, bytes]], sign: Sign, key: TrustedKey,
                       replaces: Mapping[str, Optional[str]] = {}) -> List[str]:
    """Write `files` and their signatures into `folder` so that they replace the old ones together. The
    caller holds the folder's lock; `replaces` (name -> the sha256 it read, None for absent) is re-checked
    before the journal is marked COMPLETE."""
    folder.mkdir(parents=True, exist_ok=True)
    journal = Path(tempfile.mkdtemp(prefix=JOURNAL_PREFIX, dir=str(folder)))
    try:
        for name, data in files:
            staged = journal / name
            staged.write_bytes(data)
            sign(staged)
            signature = (journal / (name + formats.SIGNATURE_SUFFIX)).read_bytes()
            bundle_path = journal / (name + formats.BUNDLE_SUFFIX)
            verify_blob(key, data, signature, bundle_path.read_bytes() if bundle_path.exists() else None, name)
        _fsync_folder(journal)
        killpoint.reached("signed-write:staged")
        check_unchanged(folder, replaces)
        (journal / COMPLETE).write_bytes(b"")
        _fsync_folder(journal)
        return _finish(journal, folder)
    except BaseException:
        if not (journal / COMPLETE).exists():
            shutil.rmtree(journal, ignore_errors=True)
        raise


def _finish(journal: Path, folder: Path) -> List[str]:
    moved = sorted(p.name for p in journal.iterdir() if p.name != COMPLETE)
    # Signatures first, the signed file last: a reader that races the renames refuses the pair.
    for name in sorted(moved, key=lambda n: (not n.endswith((formats.SIGNATURE_SUFFIX, formats.BUNDLE_SUFFIX)), n)):
        os.replace(journal / name, folder / name)
        killpoint.reached("signed-write:renamed-one")
    _fsync_folder(folder)
    shutil.rmtree(journal, ignore_errors=True)
    return moved


def _shape(journal: Path) -> str:
    """Why a journal is not one this toolkit could have written ("" when it could)."""
    for entry in journal.iterdir():
        if entry.name == COMPLETE:
            continue
        if entry.is_symlink() or not entry.is_file():
            return f"{entry.name} is not a regular file"
        if not rec.FILE_NAME.fullmatch(entry.name):
            return f"{entry.name!r} is not a file name a release writes"
    return ""


def recover_journals(folder: Path, check: Optional[Check]) -> List[str]:
    """Finish what a killed write staged completely, when `check` accepts it; report and leave a complete
    journal it does not accept; remove an incomplete one. Returns notes for the user."""
    notes = []
    for journal in sorted(folder.glob(JOURNAL_PREFIX + "*")) if folder.is_dir() else []:
        if journal.is_symlink() or not journal.is_dir():
            continue
        if not (journal / COMPLETE).exists():
            shutil.rmtree(journal, ignore_errors=True)
            notes.append(f"removed an interrupted write that had not completed ({journal.name})")
            continue
        problem = _shape(journal) or (check(journal) if check else "no check applies to this folder")
        if problem:
            notes.append(f"LEFT {journal}: a journal marked complete whose files do not verify, so it was not "
                         f"applied: {problem} (remove it if no promote of yours was interrupted)")
            continue
        notes.append(f"finished an interrupted write of {', '.join(_finish(journal, folder))}")
    return notes


def _fsync_folder(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# --- checks of a journal ------------------------------------------------------------------------


def _names(journal: Path) -> List[str]:
    return sorted(p.name for p in journal.iterdir() if p.name != COMPLETE)


def _release_file(name: str) -> bool:
    """What a journal in a release folder may hold: manifests, promotion records (current and kept) and the
    publication record, with their signatures; never release.json or cosign.pub (release writes those)."""
    base = name
    for suffix in (formats.SIGNATURE_SUFFIX, formats.BUNDLE_SUFFIX):
        if base.endswith(suffix):
            base = base[:-len(suffix)]
    if base in (rec.INDEX_FILE, rec.PUBLIC_KEY_FILE):
        return False
    return base == rec.PUBLICATION_FILE or base.endswith(".json")


def release_check(folder: Path, key: TrustedKey, floor: Callable[[object], str] = lambda release: "") -> Check:
    """A journal of release folder `folder` may be finished when the folder with it laid over verifies with
    `key` (signatures, the ledger, the bindings) and `floor` (the promoter's high-water marks) accepts it."""

    def check(journal: Path) -> str:
        odd = [n for n in _names(journal) if not _release_file(n)]
        if odd:
            return f"it would replace {', '.join(odd[:3])}, which only `qualify release` writes"
        try:
            release = read_release(folder, KeyAnchor(trusted=key), overlay=journal)
        except QualifyError as exc:
            return exc.message
        return floor(release)

    return check


def hosts_check(path: Path, key: TrustedKey, floor: Callable[[rec.EnrolledHosts, str], str]) -> Check:
    """A journal of the enrolled-hosts file `path` may be finished when its hosts.json is signed with `key`,
    is the successor of the file there (or is that file already) and `floor` accepts it."""
    from qualify.core.readlimit import read_small

    def check(journal: Path) -> str:
        if set(_names(journal)) - {path.name + s for s in ("", formats.SIGNATURE_SUFFIX, formats.BUNDLE_SUFFIX)}:
            return f"it holds files other than {path.name} and its signatures"
        try:
            data = read_small(journal / path.name, RECORD_LIMIT, "enrolled-hosts file", VerificationError)
            sig = read_small(journal / (path.name + formats.SIGNATURE_SUFFIX), SIGNATURE_LIMIT, "signature",
                             VerificationError)
            bundle_file = journal / (path.name + formats.BUNDLE_SUFFIX)
            bundle = read_small(bundle_file, BUNDLE_LIMIT, "bundle", VerificationError) if bundle_file.exists() else None
            verify_blob(key, data, sig, bundle, str(journal / path.name))
            new = rec.EnrolledHosts.parse(data, str(journal / path.name))
            current = _current(path.parent, path.name)
        except QualifyError as exc:
            return exc.message
        if current is not None and current != data:
            try:
                old = rec.EnrolledHosts.parse(current, str(path))
            except QualifyError as exc:
                return exc.message
            if (new.sequence, new.previous_sha256) != (old.sequence + 1, sha256(current)):
                return (f"its hosts.json (sequence {new.sequence}) is not the successor of {path} (sequence "
                        f"{old.sequence}, sha256 {sha256(current)[:12]}...)")
        return floor(new, sha256(data))

    return check
