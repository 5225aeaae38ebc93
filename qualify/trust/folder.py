"""A release folder, `manifests/<tag>/`, on this host's disk: `read_release` reads it through a
`FolderSource` (sources.py) and verifies it with the one verifier (verify.py: `verify_release`), and
`list_releases` does so for every release folder under `manifests/`. Every stage that takes a release (the
deploy's trust gate, `qualify verify`, publish, promote) takes the `VerifiedRelease` these return and never
opens the files again.

A journal of a killed write (journal.py) is checked by reading the folder with the journal's files laid
over it (`overlay`, the names it removes `hidden`): it is finished only when that view verifies.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterable, List, Mapping, Optional, Tuple

from qualify.core import manifest as mf
from qualify.core.errors import QualifyError, VerificationError
from qualify.core.readlimit import open_folder
from qualify.signing import formats
from qualify.trust import records as rec
from qualify.trust.order import SEMVER, tag_problem
from qualify.trust.sources import FolderSource, LayeredSource
from qualify.trust.verify import (
    TARGETS,
    TOFU,
    KeyAnchor,
    TrustedKey,
    VerifiedHosts,
    VerifiedRelease,
    sha256,
    verify_hosts,
    verify_release,
)


def read_release(path: Path, anchor: KeyAnchor = TOFU, overlay: Optional[Path] = None,
                 hidden: Iterable[str] = (), through: str = TARGETS) -> VerifiedRelease:
    """Read and verify the release folder at `path`, once. VerificationError says what does not verify.
    `overlay`: a journal folder whose files are read instead of the folder's, `hidden` the names it removes."""
    path = Path(path)
    problem = tag_problem(path.name)
    if problem:
        raise VerificationError(f"{path}: its name is {problem}, so it is no release folder")
    with FolderSource.open(path, "release folder",
                           missing_hint="check the release out (git checkout TAG) or fetch its files") as base:
        if overlay is None:
            return verify_release(base, anchor, through)
        with FolderSource.open(overlay, "journal") as top:
            return verify_release(LayeredSource(base, top, hidden), anchor, through)


def is_release_folder(path: Path) -> bool:
    """Whether `path` looks like a release folder (it has a release.json); reading it decides the rest."""
    return not tag_problem(path.name) and (path / rec.INDEX_FILE).exists()


def release_files_in(path: Path, manifests: bool = False) -> List[str]:
    """The files in `path` that only a release (or its promotion, publication or evidence) writes: a folder
    holding any of them is a release folder, whether or not its release.json is still there. `manifests`: signed
    target manifests and cosign.pub count too (for tag-named folders under the releases folder, where nothing
    else puts them)."""
    try:
        with open_folder(path, "folder", VerificationError) as f:
            names = f.names(VerificationError)
    except VerificationError:
        return []
    marks = {rec.INDEX_FILE, *signed_names(rec.INDEX_FILE), *signed_names(rec.PUBLICATION_FILE), "evidence"}
    if manifests:
        marks.add(rec.PUBLIC_KEY_FILE)
    return [n for n in names if n in marks or n.endswith(rec.PROMOTION_SUFFIX) or rec.HISTORY.fullmatch(n)
            or (manifests and n.endswith(".json" + formats.SIGNATURE_SUFFIX)
                and mf.TARGET_NAME.fullmatch(n.split(".", 1)[0]))]


def in_release_folder(path: Path) -> bool:
    """Whether a file lies in a release folder: one named as a version tag, or holding release files."""
    folder = Path(path).parent
    return bool(SEMVER.fullmatch(folder.name) or release_files_in(folder))


# --- choosing among releases -------------------------------------------------------------------


@dataclass(frozen=True)
class Listing:
    releases: Tuple[VerifiedRelease, ...]  # oldest first (ReleaseOrder)
    broken: Tuple[Tuple[str, str], ...]  # (folder name, why it does not verify)
    ignored: Tuple[Tuple[str, str], ...]  # (name, why it is not a release folder)

    def tags(self) -> List[str]:
        return [r.tag for r in self.releases]


def list_releases(root: Path, anchor: KeyAnchor = TOFU, target: Optional[str] = None) -> Listing:
    """Every release folder under `root` (for `target`, when given), each read and verified once. A tag-named
    folder that holds a release's files but no release.json is broken (its index was removed), not ignored."""
    root = Path(root)
    found, broken, ignored = [], [], []
    if not root.is_dir():
        return Listing((), (), ())
    with open_folder(root, "releases folder", VerificationError) as top:
        names = top.names(VerificationError)
    for name in names:
        if tag_problem(name):
            ignored.append((name, "not a tag name"))
            continue
        if not is_release_folder(root / name):
            left = release_files_in(root / name, manifests=True) if not (root / name).is_symlink() else []
            if not left:
                ignored.append((name, "no release.json"))
                continue
            broken.append((name, f"it holds a release's files ({', '.join(left[:3])}) but no {rec.INDEX_FILE}: "
                           "its index was removed, so nothing in it can be verified"))
            continue
        try:
            release = read_release(root / name, anchor)
        except QualifyError as exc:
            broken.append((name, exc.message))
            continue
        if target is None or release.has(target):
            found.append(release)
    found.sort(key=lambda r: r.order(target if target and r.has(target) else None))
    return Listing(tuple(found), tuple(broken), tuple(ignored))


# --- what a release writes -------------------------------------------------------------------


def signed_names(name: str) -> Tuple[str, str, str]:
    return name, name + formats.SIGNATURE_SUFFIX, name + formats.BUNDLE_SUFFIX


def released_files(files: Mapping[str, bytes]) -> Tuple[Tuple[str, str], ...]:
    """(name, sha256) of what a release writes, for release.json."""
    return tuple(sorted((name, sha256(data)) for name, data in files.items()))


def describe(listing: Listing) -> Dict[str, object]:
    return {"releases": listing.tags(), "broken": dict(listing.broken), "ignored": dict(listing.ignored)}


# --- the enrolled hosts file --------------------------------------------------------------------


def read_hosts_file(path: Path, key: TrustedKey) -> VerifiedHosts:
    """manifests/hosts.json, read once and verified with the release key (refused otherwise)."""
    path = Path(path)
    with FolderSource.open(path.parent, "folder of the enrolled-hosts file") as folder:
        return verify_hosts(folder, path.name, key)


def read_hosts(path: Path, key: TrustedKey) -> rec.EnrolledHosts:
    return read_hosts_file(path, key).hosts
