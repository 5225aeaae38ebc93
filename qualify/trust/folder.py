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
from qualify.trust.hostchain import check_accepted_signatures, hosts_descend, hosts_lineage
from qualify.trust.order import SEMVER, tag_problem
from qualify.trust.sources import FolderSource, LayeredSource
from qualify.trust.verify import (
    TARGETS,
    TOFU,
    HostsVersion,
    KeyAnchor,
    TrustedKey,
    VerifiedHosts,
    VerifiedRelease,
    sha256,
    verify_hosts,
    verify_hosts_version,
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


def kept_hosts_name(name: str, sequence: int) -> str:
    """Where `qualify hosts` keeps the version it replaced, beside the file: hosts.json -> hosts.<sequence>.json."""
    stem = name[:-len(".json")] if name.endswith(".json") else name
    return f"{stem}.{sequence}.json"


def _version_from(folder: FolderSource, name: str) -> Optional[HostsVersion]:
    from qualify.core.readlimit import BUNDLE_LIMIT, SIGNATURE_LIMIT
    from qualify.trust.verify import RECORD_LIMIT

    try:
        sig_name, bundle_name = name + formats.SIGNATURE_SUFFIX, name + formats.BUNDLE_SUFFIX
        return HostsVersion(f"{folder.where}/{name}", folder.read(name, RECORD_LIMIT, "earlier enrolled-hosts version"),
                            folder.read(sig_name, SIGNATURE_LIMIT, "signature") if folder.exists(sig_name) else None,
                            folder.read(bundle_name, BUNDLE_LIMIT, "bundle") if folder.exists(bundle_name) else None)
    except VerificationError:
        return None  # not a regular file, too large: not a version at hand


def _git_versions(path: Path) -> List[HostsVersion]:
    """Every version git's history holds of the file at `path` (`git log -- FILE`), read through one
    `git cat-file --batch` (sources.GitObjects: bounded, never a working-tree file)."""
    from qualify.core.readlimit import BUNDLE_LIMIT, SIGNATURE_LIMIT
    from qualify.host import cmd
    from qualify.trust.sources import GitObjects
    from qualify.trust.verify import RECORD_LIMIT

    where = str(path.parent)
    if not path.parent.is_dir():
        return []
    done = cmd.ask(["git", "log", "--format=%H", "--", path.name], cwd=where, timeout=120)
    prefix = cmd.ask(["git", "rev-parse", "--show-prefix"], cwd=where, timeout=60)
    if done.returncode != 0 or prefix.returncode != 0:
        return []  # no git, no repository: nothing there
    out = []
    with GitObjects(path.parent) as objects:
        for rev in done.stdout.split()[:1000]:
            parts = []
            for name, limit in ((path.name, RECORD_LIMIT), (path.name + formats.SIGNATURE_SUFFIX, SIGNATURE_LIMIT),
                                (path.name + formats.BUNDLE_SUFFIX, BUNDLE_LIMIT)):
                try:
                    got = objects.get(f"{rev}:{prefix.stdout.strip()}{name}", limit, f"git's {name}")
                except VerificationError:
                    got = None
                parts.append(got[1] if got is not None and got[0] == "blob" else None)
            if parts[0] is not None:
                out.append(HostsVersion(f"{path} at git revision {rev[:12]}", parts[0], parts[1], parts[2]))
    return out


def hosts_versions(path: Path, history: Optional[Path] = None) -> List[HostsVersion]:
    """The earlier versions of the enrolled-hosts file at hand, unverified: kept beside it (hosts.<n>.json),
    in `history` (--hosts-history DIR: each file with its .sig), and in git's history of the file."""
    path = Path(path)
    out: List[HostsVersion] = []
    stem = path.name[:-len(".json")] if path.name.endswith(".json") else path.name
    for where, pick in ((path.parent, lambda n: n.startswith(stem + ".") and n.endswith(".json")
                         and n[len(stem) + 1:-len(".json")].isdigit()),
                        (history, lambda n: n.endswith(".json") and not n.endswith(formats.BUNDLE_SUFFIX))):
        if where is None or not Path(where).is_dir():
            continue
        with FolderSource.open(Path(where), "folder of enrolled-hosts versions") as folder:
            for name in folder.names():
                if pick(name):
                    v = _version_from(folder, name)
                    if v is not None:
                        out.append(v)
    return out + _git_versions(path)


def lineage(vh: VerifiedHosts, key: TrustedKey, path: Path, history: Optional[Path] = None):
    """`down_to -> {sequence: sha256}`: the chain behind the verified hosts file at `path`, link by link, from
    the versions at hand (hosts_versions); for highwater.PromoterState.observe_hosts."""
    found: List[HostsVersion] = []

    def versions() -> List[HostsVersion]:
        if not found:
            found.extend(hosts_versions(path, history))
        return found

    def chain(down_to: int) -> Dict[int, str]:
        return hosts_lineage(vh, key, down_to, versions)

    return chain


def hosts_chain_check(vh: VerifiedHosts, key: TrustedKey, path: Path, seen: Iterable[Tuple[int, str, str]],
                      history: Optional[Path] = None) -> Dict[int, str]:
    """The hosts file `vh` (read from `path`) checked to descend, link by link, from every (sequence, sha256,
    who) in `seen` (the versions promotion records were checked against); every version on the way."""
    found: List[HostsVersion] = []

    def versions() -> List[HostsVersion]:
        if not found:
            found.extend(hosts_versions(path, history))
        return found

    return hosts_descend(vh, key, list(seen), versions)


class HostsAtHand:
    """The enrolled-hosts file at `path` and its earlier versions at hand (hosts_versions, read once when first
    needed): `at(sha256, sequence)` is the version of that sha256, verified with the release key, or None."""

    def __init__(self, current: Optional[VerifiedHosts], key: TrustedKey, path: Path,
                 history: Optional[Path] = None) -> None:
        self.current, self.key, self.path, self.history = current, key, Path(path), history
        self._found: Optional[List[HostsVersion]] = None
        self._verified: Dict[str, VerifiedHosts] = {}

    def versions(self) -> List[HostsVersion]:
        if self._found is None:
            self._found = hosts_versions(self.path, self.history)
        return self._found

    def at(self, sha: str, sequence: int) -> Optional[VerifiedHosts]:
        if self.current is not None and self.current.sha256 == sha:
            found: Optional[VerifiedHosts] = self.current
        elif sha in self._verified:
            found = self._verified[sha]
        else:
            v = next((v for v in self.versions() if sha256(v.data) == sha), None)
            if v is None:
                return None
            found = self._verified[sha] = verify_hosts_version(v, self.key)
        if sequence and found.hosts.sequence != sequence:
            raise VerificationError(f"signature check failed: {found.path}: hosts.json sha256 {sha[:12]}... is "
                                    f"sequence {found.hosts.sequence}, not {sequence}")
        return found


def check_release_hosts(release: VerifiedRelease, hosts_file: Path, history: Optional[Path] = None) -> List[str]:
    """VERIFYING.md steps 4, 7 and 8 for a release read through its evidence: the enrolled-hosts file verified,
    descending link by link from the version each current promotion record was checked against, never older;
    each accepted run (and the serve-check record it counted with) signed by the host its record names, as
    enrolled then. Returns what could not be checked here (keyless hosts); raises on the rest."""
    promoted = [t for t in release.targets if t.promotion]
    needs = [t for t in promoted if t.promotion.hosts_sequence > 0 or t.promotion.hosts_sha256]
    vh = None
    if hosts_file.exists() or hosts_file.is_symlink():
        vh = read_hosts_file(hosts_file, release.key)
    elif needs:
        t = needs[0]
        raise VerificationError(f"signature check failed: {hosts_file} is missing, but promotion "
                                f"{t.promotion.sequence} of {t.target} was checked against sequence "
                                f"{t.promotion.hosts_sequence} of it", hint="restore manifests/hosts.json, or pass --hosts")
    at = HostsAtHand(vh, release.key, hosts_file, history)
    if vh is not None:
        for t in needs:
            p = t.promotion
            if p.hosts_sequence > vh.hosts.sequence or (p.hosts_sequence == vh.hosts.sequence
                                                        and p.hosts_sha256 != vh.sha256):
                raise VerificationError(
                    f"signature check failed: {hosts_file}: sequence {vh.hosts.sequence}, older than (or another "
                    f"version than) sequence {p.hosts_sequence}, which promotion {p.sequence} of {t.target} was "
                    "checked against (an older file restored)", hint="restore the newest manifests/hosts.json")
        hosts_descend(vh, release.key, [(t.promotion.hosts_sequence, t.promotion.hosts_sha256 or "",
                                         f"promotion {t.promotion.sequence} of {t.target}") for t in needs],
                      at.versions)
    unchecked: List[str] = []
    for t in promoted:
        unchecked += check_accepted_signatures(str(release.path), t, at.at)
    return unchecked
