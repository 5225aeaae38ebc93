"""Steps 6 and 7, sign and write: the release folder through the one writer (trust/journal.py: SignedWrite).

Under the release folder's lock:

1. A journal an earlier, killed run of this release left COMPLETE is finished first, when the folder with it
   laid over verifies with the release key and is this very release (its tag, sequence and manifests);
   an incomplete one is removed, another release's is reported and left (`LEFT ...`).
2. What the folder holds is verified (trust/verify.py: verify_release): its signatures are kept for files
   whose bytes are the same (cosign's are randomised; a re-run writes what the first run wrote), its
   publication record is kept when it is bound to the very release.json this run writes (a `publish` since,
   or `release --publish-to` killed after the registry step), and, with --force, what it may remove is what
   its verified index lists.
3. The release's files are staged and signed in a journal inside the folder; what is already there and
   identical is left, anything else there (another release's files) is refused without --force.
4. The journal is renamed into place, signatures first, release.json last (a kill midway leaves a COMPLETE
   journal, which step 1 of the next run finishes).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Set

from qualify.core.errors import QualifyError, ReleaseError, VerificationError
from qualify.core.readlimit import MANIFEST_LIMIT, open_folder
from qualify.signing.signer import Signer
from qualify.trust import journal
from qualify.trust import records as rec
from qualify.trust.folder import read_release, signed_names
from qualify.trust.verify import (
    INDEX,
    KeyAnchor,
    Signed,
    TrustedKey,
    VerifiedRelease,
    removable_by_force,
    sha256,
)

PUBLICATION_FILES = signed_names(rec.PUBLICATION_FILE)


@dataclass(frozen=True)
class Before:
    """The release folder as this run found it: verified in full (`release`), else as far as its index
    (`index`, for what --force may remove), and why it does not verify (`problem`)."""

    release: Optional[VerifiedRelease] = None
    index: Optional[VerifiedRelease] = None
    problem: str = ""

    def keep(self, name: str) -> Optional[Signed]:
        return self.release.signatures.get(name) if self.release is not None else None


def recover(dest: Path, key: TrustedKey, mine: Callable[[VerifiedRelease], bool]) -> List[str]:
    """Finish a COMPLETE journal of this release's own install (step 1); notes for the user."""

    def check(j: Path) -> str:
        if not journal.is_release_install(j):
            return journal.release_check(dest, key)(j)
        try:
            view = journal.overlay(dest, j, key)
        except QualifyError as exc:
            return exc.message
        if not mine(view):
            return (f"it is release {view.tag} sequence {view.index.sequence} with other manifests, not the release "
                    "this run makes")
        return ""

    return journal.recover_journals(dest, check)


def before(dest: Path, key: TrustedKey) -> Before:
    if not (dest / rec.INDEX_FILE).exists() and not (dest / rec.INDEX_FILE).is_symlink():
        return Before()
    try:
        return Before(release=read_release(dest, KeyAnchor(trusted=key)))
    except QualifyError as exc:
        problem = exc.message
    try:
        return Before(index=read_release(dest, KeyAnchor(trusted=key), through=INDEX), problem=problem)
    except QualifyError as exc:
        return Before(problem=exc.message)


@dataclass
class Plan:
    new: List[str] = field(default_factory=list)
    same: List[str] = field(default_factory=list)
    differ: List[str] = field(default_factory=list)
    extra: List[str] = field(default_factory=list)  # in the release folder, not in this release
    removable: List[str] = field(default_factory=list)  # extras an earlier release recorded as its own
    kept: List[str] = field(default_factory=list)  # extras that are part of this release: its publication record

    @property
    def untouchable(self) -> List[str]:
        return [n for n in self.extra if n not in self.removable and n not in self.kept]


def _present(dest: Path) -> Dict[str, Optional[bytes]]:
    """Every entry of the folder but dot-named ones (journals): a regular file's bytes, None for anything else."""
    if not dest.is_dir():
        return {}
    out: Dict[str, Optional[bytes]] = {}
    with open_folder(dest, "release folder", ReleaseError) as f:
        for name in f.names(ReleaseError):
            if name.startswith("."):
                continue
            try:
                out[name] = f.read(name, MANIFEST_LIMIT, "release file", VerificationError)
            except VerificationError:
                out[name] = None  # a folder, a link, a device: never one of the release's files
    return out


def plan(write: journal.SignedWrite, dest: Path, found: Before, index_sha: str, force: bool) -> Plan:
    staged = sorted(p.name for p in write.journal.iterdir())
    present = _present(dest)
    p = Plan()
    for name in staged:
        if name not in present:
            p.new.append(name)
        elif present[name] == write.staged_bytes(name):
            p.same.append(name)
        else:
            p.differ.append(name)
    p.extra = sorted(n for n in present if n not in staged)
    bound = found.release is not None and found.release.publication is not None and found.release.index_sha256 == index_sha
    p.kept = [n for n in p.extra if bound and n in PUBLICATION_FILES]
    if force and (p.differ or [n for n in p.extra if n not in p.kept]):
        recorded: Set[str] = set(removable_by_force(found.release or found.index))
        if found.release is None and found.index is None and (dest / rec.INDEX_FILE).exists():
            raise ReleaseError(f"{dest / rec.INDEX_FILE} does not verify with the release key, so nothing it lists is "
                               f"removed: {found.problem}",
                               hint=f"look at {dest} and remove it by hand if it is not a release you made")
        p.removable = [n for n in p.extra if n in recorded and n not in p.kept and present[n] is not None]
    return p


def install(write: journal.SignedWrite, dest: Path, p: Plan, force: bool) -> List[str]:
    """Rename the staged files that are not already there, identical; remove (--force) what `p` says."""
    refused = [n for n in p.extra if n not in p.kept]
    if (p.differ or refused) and not force:
        write.abandon()
        raise ReleaseError(
            f"{dest} already holds other files: "
            + "; ".join(filter(None, [p.differ and f"differ: {', '.join(p.differ)}",
                                      refused and f"not in this release: {', '.join(refused)}"])),
            hint="pass --force to overwrite the release's own files (files no release wrote are left alone)",
        )
    for name in p.same:
        (write.journal / name).unlink()
    if not p.new and not p.differ and not p.removable:
        write.abandon()
        return []
    present = _present(dest)
    replaces = {n: (sha256(present[n]) if present.get(n) is not None else None) for n in p.new + p.differ + p.removable}
    moved = write.finish(replaces=replaces, remove=p.removable if force else ())
    return moved


def stage(write: journal.SignedWrite, files: Sequence[tuple], found: Before, force: bool,
          say: Callable[[str], None]) -> Mapping[str, bytes]:
    """Sign and stage (name, bytes, signed?) into the journal; a verified earlier signature of the same bytes is
    kept unless --force (re-sign). Returns every staged file's bytes (signatures too), for release.json."""
    out: Dict[str, bytes] = {}
    for name, data, signed, label in files:
        if not signed:
            write.add_unsigned(name, data)
            out[name] = data
            continue
        how = write.add(name, data, keep=None if force else found.keep(name))
        say(f"  {label}: {how}")
        for staged in signed_names(name):
            out[staged] = write.staged_bytes(staged)
    return out


def identity(release: VerifiedRelease) -> tuple:
    """What makes two release folders the same release: tag, sequence, and each target's manifest."""
    return release.tag, release.index.sequence, tuple(sorted((e.target, e.manifest_sha256) for e in release.index.targets))


def open_write(dest: Path, signer: Signer, key: TrustedKey) -> journal.SignedWrite:
    return journal.SignedWrite(dest, signer, key)
