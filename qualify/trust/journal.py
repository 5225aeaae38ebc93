"""Journaled writes of signed files, and the locks every writer of a release folder or hosts file holds.

POSIX has no multi-file rename. A set of signed files (a whole release folder as `qualify release` writes it;
a manifest and its promotion record, with the record it replaces kept; published.json; hosts.json) is
staged with its signatures in a journal folder inside the folder it goes to, each signature made by the
one Signer (or kept from a verified earlier write of the same bytes) and verified, marked COMPLETE (with the
names it removes, for `release --force`), then renamed into place, signatures first and release.json
last; readers verify every file, so a half-renamed set is refused, never trusted.

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
from qualify.core.readlimit import MANIFEST_LIMIT, open_folder
from qualify.signing import formats
from qualify.signing.signer import Signer
from qualify.trust import records as rec
from qualify.trust.folder import read_release
from qualify.trust.sources import FolderSource, LayeredSource
from qualify.trust.verify import KeyAnchor, Signed, TrustedKey, sha256, verify_blob, verify_hosts

JOURNAL_PREFIX = ".signed-write-"
COMPLETE = "COMPLETE"
FINISHED = "finished an interrupted write"  # how recover_journals' notes start when it applied one
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


class SignedWrite:
    """One journaled write into `folder`: files are added (signed, or with the signatures of a verified earlier
    write of the same bytes), then `finish` marks the journal COMPLETE and renames it into place. The caller
    holds the folder's lock; `replaces` (name -> the sha256 it read, None for absent) is re-checked before the
    journal is marked COMPLETE; `remove` names files the write takes away (release --force)."""

    def __init__(self, folder: Path, signer: Signer, key: TrustedKey, replaces: Mapping[str, Optional[str]] = {},
                 remove: Sequence[str] = ()) -> None:
        self.folder, self.signer, self.key, self.replaces = Path(folder), signer, key, dict(replaces)
        self.remove = sorted(set(remove))
        bad = [n for n in self.remove if not rec.FILE_NAME.fullmatch(n)]
        if bad:
            raise VerificationError(f"refusing to remove {bad[0]!r} from {folder}: not a file name a release writes")
        self.created = not self.folder.exists()  # made for this write: taken away again if it is abandoned
        self.folder.mkdir(parents=True, exist_ok=True)
        self.journal = Path(tempfile.mkdtemp(prefix=JOURNAL_PREFIX, dir=str(self.folder)))
        self.staged: List[str] = []

    def add(self, name: str, data: bytes, keep: Optional[Signed] = None) -> str:
        """Stage `name`; `keep`: signatures read (and verified) with an earlier write of these very bytes, kept
        rather than re-signed (cosign's signatures are randomised). Returns how it was signed, for people."""
        if not rec.FILE_NAME.fullmatch(name):
            raise VerificationError(f"{name!r} is not a file name a release writes")
        how = ""
        if keep is not None and keep.data == data and keep.bundle is not None:
            try:
                verify_blob(self.key, data, keep.signature, keep.bundle, name)
                signature, bundle, how = keep.signature, keep.bundle, "kept the existing signature"
            except VerificationError:
                keep = None
        if not how:
            done = self.signer.sign_blob(data)
            signature, bundle, how = done.sig_file, done.bundle, f"signed with {done.signer or self.signer.name}"
            try:  # whatever signed it, only what our own verifier accepts is written (signature and bundle)
                verify_blob(self.key, data, signature, bundle, name)
            except VerificationError as exc:
                raise VerificationError(f"{done.signer or self.signer.name} made a signature for {name} that does not "
                                        f"verify with the key {self.key.fingerprint}: {exc.message}") from None
        for staged, content in ((name, data), (name + formats.SIGNATURE_SUFFIX, signature),
                                (name + formats.BUNDLE_SUFFIX, bundle)):
            (self.journal / staged).write_bytes(content)
        self.staged.append(name)
        return how

    def add_unsigned(self, name: str, data: bytes) -> None:
        """A file the write carries without a signature of its own (cosign.pub: release.json binds its sha256)."""
        if not rec.FILE_NAME.fullmatch(name):
            raise VerificationError(f"{name!r} is not a file name a release writes")
        (self.journal / name).write_bytes(data)

    def staged_bytes(self, name: str) -> bytes:
        return (self.journal / name).read_bytes()

    def finish(self, replaces: Optional[Mapping[str, Optional[str]]] = None,
               remove: Optional[Sequence[str]] = None) -> List[str]:
        """Mark the journal COMPLETE (after re-checking `replaces`) and rename it into place: the names moved.
        `replaces` and `remove`, when given here, are those the caller knew only after staging."""
        if replaces is not None:
            self.replaces = dict(replaces)
        if remove is not None:
            self.remove = sorted(set(remove))
            if [n for n in self.remove if not rec.FILE_NAME.fullmatch(n)]:
                raise VerificationError(f"refusing to remove {self.remove!r} from {self.folder}")
        try:
            _fsync_folder(self.journal)
            killpoint.reached("signed-write:staged")
            check_unchanged(self.folder, self.replaces)
            (self.journal / COMPLETE).write_bytes("".join(f"{n}\n" for n in self.remove).encode())
            _fsync_folder(self.journal)
        except BaseException:
            self.abandon()
            raise
        return _finish(self.journal, self.folder)

    def abandon(self) -> None:
        if self.journal.is_dir() and not (self.journal / COMPLETE).exists():
            shutil.rmtree(self.journal, ignore_errors=True)
            if self.created:
                with contextlib.suppress(OSError):
                    self.folder.rmdir()  # only when empty: nothing was written there

    def __enter__(self) -> SignedWrite:
        return self

    def __exit__(self, kind, *exc: object) -> None:
        if kind is not None:
            self.abandon()


def write_signed_files(folder: Path, files: Sequence[Tuple[str, bytes]], signer: Signer, key: TrustedKey,
                       replaces: Mapping[str, Optional[str]] = {}) -> List[str]:
    """Write `files` and their signatures into `folder` so that they replace the old ones together (the
    caller holds the folder's lock)."""
    with SignedWrite(folder, signer, key, replaces) as write:
        for name, data in files:
            write.add(name, data)
        return write.finish()


def _removals(journal: Path) -> List[str]:
    """The names a COMPLETE journal removes (its COMPLETE file, one a line); refused unless each is a file name."""
    text = (journal / COMPLETE).read_bytes()[:1 << 20].decode("utf-8", "replace")
    return [n for n in text.splitlines() if n]


def _order(name: str) -> Tuple[int, str]:
    """Signatures first, then the signed files, the release's key and index last: a reader that races the
    renames refuses the set, and a release.json that is there means the rest is too."""
    signature = name.endswith((formats.SIGNATURE_SUFFIX, formats.BUNDLE_SUFFIX))
    base = name
    for suffix in (formats.SIGNATURE_SUFFIX, formats.BUNDLE_SUFFIX):
        base = base[:-len(suffix)] if base.endswith(suffix) else base
    if base == rec.INDEX_FILE:
        return (4 if not signature else 3), name
    return (0 if signature else 1 if base != rec.PUBLIC_KEY_FILE else 2), name


def _finish(journal: Path, folder: Path) -> List[str]:
    moved = sorted((p.name for p in journal.iterdir() if p.name != COMPLETE), key=_order)
    for name in moved:
        os.replace(journal / name, folder / name)
        killpoint.reached("signed-write:renamed-one")
    for name in _removals(journal):
        if rec.FILE_NAME.fullmatch(name):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(folder / name)
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
    odd = [n for n in _removals(journal) if not rec.FILE_NAME.fullmatch(n)]
    return f"it would remove {odd[0]!r}, not a file name a release writes" if odd else ""


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
        moved = _finish(journal, folder)
        notes.append(f"{FINISHED} of {', '.join(moved)}" if moved else
                     f"{FINISHED} (its files were all in place already; its journal {journal.name} removed)")
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


def _base(name: str) -> str:
    for suffix in (formats.SIGNATURE_SUFFIX, formats.BUNDLE_SUFFIX):
        if name.endswith(suffix):
            name = name[:-len(suffix)]
    return name


def is_release_install(journal: Path) -> bool:
    """Whether the journal is `qualify release` writing its folder (it holds release.json)."""
    return rec.INDEX_FILE in _names(journal)


def _release_file(name: str) -> bool:
    """What a promote's or publish's journal may hold: manifests, promotion records (current and kept) and the
    publication record, with their signatures; never release.json or cosign.pub (release writes those)."""
    base = _base(name)
    if base in (rec.INDEX_FILE, rec.PUBLIC_KEY_FILE):
        return False
    return base == rec.PUBLICATION_FILE or base.endswith(".json")


def overlay(folder: Path, journal: Path, key: TrustedKey, through: str = "targets"):
    """The release folder `folder` as the journal would leave it, verified with `key` (VerificationError else)."""
    return read_release(folder, KeyAnchor(trusted=key), overlay=journal, hidden=_removals(journal), through=through)


def release_check(folder: Path, key: TrustedKey, floor: Callable[[object], str] = lambda release: "") -> Check:
    """A promote's or publish's journal of release folder `folder` may be finished when the folder with it laid
    over verifies with `key` (signatures, the ledger, the bindings) and `floor` (the promoter's high-water marks)
    accepts it. A release's own journal is `qualify release`'s to finish (release.py)."""

    def check(journal: Path) -> str:
        if is_release_install(journal):
            return (f"an interrupted `qualify release` of {folder.name} (it writes release.json): run the same "
                    "release command again, which finishes it")
        odd = [n for n in _names(journal) if not _release_file(n)]
        if odd:
            return f"it would replace {', '.join(odd[:3])}, which only `qualify release` writes"
        try:
            release = overlay(folder, journal, key)
        except QualifyError as exc:
            return exc.message
        return floor(release)

    return check


def hosts_check(path: Path, key: TrustedKey, floor: Callable[[rec.EnrolledHosts, str], str]) -> Check:
    """A journal of the enrolled-hosts file `path` may be finished when its hosts.json is signed with `key`,
    is the successor of the file there (or is that file already) and `floor` accepts it."""

    def check(journal: Path) -> str:
        if set(_names(journal)) - {path.name + s for s in ("", formats.SIGNATURE_SUFFIX, formats.BUNDLE_SUFFIX)}:
            return f"it holds files other than {path.name} and its signatures"
        try:
            # The journal laid over the folder, as for a release folder: a killed finish has renamed some of
            # its files (signatures first) already, and those are read where they went.
            with FolderSource.open(path.parent, "folder") as base, FolderSource.open(journal, "journal") as top:
                new = verify_hosts(LayeredSource(base, top), path.name, key)
            current = _current(path.parent, path.name)
        except QualifyError as exc:
            return exc.message
        # The file there may be half-replaced (its signature renamed already), so it is not verified on its
        # own: it must be the very bytes the signed new version names as its predecessor (or that version).
        if current is not None and sha256(current) not in (new.sha256, new.hosts.previous_sha256):
            return (f"its hosts.json (sequence {new.hosts.sequence}) is not the successor of {path} (sha256 "
                    f"{sha256(current)[:12]}..., while it names {(new.hosts.previous_sha256 or 'none')[:12]}...)")
        return floor(new.hosts, new.sha256)

    return check
