"""A release folder, `manifests/<tag>/`: the one reader, which reads each file once and verifies it, and
the writer of its signed files. Every stage that takes a release (the deploy's trust gate, `qualify
verify`, publish, promote) takes the `VerifiedRelease` this module returns and never opens the files again.

Reading, in this order, with every file opened relative to the folder's own descriptor, never through
a symlink, only as a regular file and within its size limit (core/readlimit):

1. `cosign.pub`: its bytes are the key that is fingerprinted, compared with the pin (or with the key
   the caller trusts), and used for every signature below.
2. `release.json` (+ `.sig`, and its Sigstore bundle when present: digest, algorithm and key hint
   checked too), parsed strictly into a ReleaseIndex whose tag must be the folder's name.
3. per target it lists: `<target>.promotion.json` when present (a promotion of this release: its
   release sha256 and target must be this one's) and the ledger behind it: every record it replaced,
   kept as `<target>.promotion.<sequence>.json`, each signed, each the one its successor names by
   sha256, exactly sequences 1 to n-1 (a kept record at or above the current one means the current
   record was restored from an older state; a missing one, that the ledger was cut); then
   `<target>.json`, whose sha256 must be the one the promotion record (else release.json) names, whose
   signature must verify, and whose target, digest, capability and platform must be what release.json says.
4. `published.json` when present: signed, bound to this release.json by its sha256, naming the
   released digests only.

A journal of a killed write (release/journal.py) is checked by reading the folder with the journal's
files laid over it (`overlay`): it is finished only when that view verifies.
"""

from __future__ import annotations

import base64
import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Type

from qualify.core import manifest as mf
from qualify.core.errors import ConfigError, QualifyError, VerificationError
from qualify.core.readlimit import BUNDLE_LIMIT, KEY_LIMIT, MANIFEST_LIMIT, SIGNATURE_LIMIT, Folder, open_folder, read_small
from qualify.release import policy as pol
from qualify.release import records as rec
from qualify.release.order import SEMVER, ReleaseOrder, tag_problem
from qualify.signing import formats
from qualify.signing import keys as cosign_keys

RECORD_LIMIT = 16 * 1024 * 1024  # release.json, promotion and publication records are kilobytes


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# --- the key ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class TrustedKey:
    """A release public key as it was read: the bytes, the key they hold, its fingerprint, where from."""

    pem: bytes = field(repr=False)
    key: object = field(repr=False)
    fingerprint: str
    source: str

    @classmethod
    def from_bytes(cls, pem: bytes, source: str) -> TrustedKey:
        try:
            key = cosign_keys.load_public_key(pem, what=source)
        except ConfigError as exc:
            raise VerificationError(f"signature check failed: {exc.message}") from None
        formats._require_p256(key, source)
        return cls(pem, key, cosign_keys.fingerprint(key), source)

    @classmethod
    def read(cls, path: Path, error: Type[QualifyError] = ConfigError) -> TrustedKey:
        pem = read_small(path, KEY_LIMIT, "public key", error,
                         missing_hint="the release's cosign.pub, as announced with the release")
        return cls.from_bytes(pem, str(path))


@dataclass(frozen=True)
class KeyAnchor:
    """Whose signature a release must carry: a key the caller read itself (`--key`), else the key in the
    folder when its fingerprint is the pinned one, else (trust on first use) the key in the folder."""

    trusted: Optional[TrustedKey] = None
    pinned: str = ""

    def accept(self, pem: bytes, where: str) -> TrustedKey:
        key = TrustedKey.from_bytes(pem, where)
        if self.trusted is not None and key.fingerprint != self.trusted.fingerprint:
            raise VerificationError(
                f"signature check failed: the release key {where} is {key.fingerprint}, not the key you trust "
                f"({self.trusted.source}, {self.trusted.fingerprint})",
                hint="the release folder holds another key: restore it from the release tag, or trust that key")
        if self.pinned and key.fingerprint != self.pinned:
            raise VerificationError(
                f"signature check failed: the release key {where} is {key.fingerprint}, not the pinned "
                f"RELEASE_KEY_FINGERPRINT {self.pinned}",
                hint="the release folder holds a key you did not pin: restore it from the release tag, "
                "or pin the key of the release you mean to trust")
        return self.trusted or key


# --- one signed blob -----------------------------------------------------------------------------


def verify_blob(key: TrustedKey, data: bytes, signature: bytes, bundle: Optional[bytes], what: str) -> None:
    """`signature` (a `.sig` file's bytes) verifies `data` with `key`; a bundle, when given, must agree:
    its message digest is SHA2_256 of `data`, its key hint is the key's, its signature verifies too."""
    sig = formats.decode_signature(signature, f"{what}.sig")
    if not formats.verify_bytes(key.key, data, sig):
        raise VerificationError(f"signature check failed: {what} does not match its signature under key "
                                f"{key.fingerprint}",
                                hint="the file was changed after signing, or it was signed with another key")
    if bundle is not None:
        check_bundle(key, data, bundle, f"{what}{formats.BUNDLE_SUFFIX}")


def check_bundle(key: TrustedKey, data: bytes, raw: bytes, what: str) -> bytes:
    """The signature in a Sigstore bundle of `data`, after checking everything the bundle asserts."""
    bundle = formats.load_bundle(raw, what)
    sig = formats.bundle_signature(bundle, what)
    digest = bundle["messageSignature"].get("messageDigest")
    if not isinstance(digest, dict) or digest.get("algorithm") != "SHA2_256":
        raise VerificationError(f"signature check failed: {what}: the message digest is not SHA2_256 "
                                f"({str(digest)[:80]})")
    if digest.get("digest") != base64.b64encode(hashlib.sha256(data).digest()).decode("ascii"):
        raise VerificationError(f"signature check failed: {what} is the bundle of other bytes (its message digest "
                                "is not the file's sha256): a stale or swapped bundle",
                                hint="restore the release folder from the release tag")
    material = bundle.get("verificationMaterial")
    hint = ((material or {}).get("publicKey") or {}).get("hint") if isinstance(material, dict) else None
    if hint is not None and hint != cosign_keys.key_hint(key.key):
        raise VerificationError(f"signature check failed: {what} names another key (hint {str(hint)[:60]!r}), "
                                f"not {key.fingerprint}")
    if not formats.verify_bytes(key.key, data, sig):
        raise VerificationError(f"signature check failed: {what}: its signature does not verify with {key.fingerprint}")
    return sig


def _read_signed(folder: Folder, name: str, limit: int, key: TrustedKey, what: str,
                 bundle_required: bool = False) -> bytes:
    data = folder.read(name, limit, what, VerificationError)
    signature = folder.read(name + formats.SIGNATURE_SUFFIX, SIGNATURE_LIMIT, f"signature of {what}",
                            VerificationError, missing_hint="restore the release folder from the release tag")
    bundle_name = name + formats.BUNDLE_SUFFIX
    bundle = folder.read(bundle_name, BUNDLE_LIMIT, f"bundle of {what}", VerificationError) \
        if bundle_required or folder.exists(bundle_name) else None
    verify_blob(key, data, signature, bundle, str(folder.path / name))
    return data


# --- the verified value ------------------------------------------------------------------------


@dataclass(frozen=True)
class VerifiedTarget:
    entry: rec.ReleasedEntry
    manifest: mf.Manifest
    manifest_bytes: bytes = field(repr=False)
    promotion: Optional[rec.PromotionRecord] = None
    promotion_sha256: Optional[str] = None
    promotion_bytes: bytes = field(default=b"", repr=False)  # the current record as read (promote keeps it)
    # The promotion ledger as far as it is known, oldest first: (sequence, sha256) of every kept record and
    # the current one (a ledger that began with a promotion/v2 record starts at that record).
    chain: Tuple[Tuple[int, str], ...] = ()

    @property
    def target(self) -> str:
        return self.entry.target

    def chain_sha256(self, sequence: int) -> Optional[str]:
        """The sha256 of promotion `sequence` in this ledger; None where the ledger does not reach back that far."""
        return dict(self.chain).get(sequence)

    @property
    def manifest_sha256(self) -> str:
        return sha256(self.manifest_bytes)

    @property
    def promotion_sequence(self) -> int:
        return self.promotion.sequence if self.promotion else 0


@dataclass(frozen=True)
class VerifiedRelease:
    """A release as its signatures vouch for it. Built only by `read_release`."""

    path: Path  # where it was read, for messages
    index: rec.ReleaseIndex
    index_sha256: str
    key: TrustedKey
    targets: Tuple[VerifiedTarget, ...]
    publication: Optional[rec.Publication] = None

    @property
    def tag(self) -> str:
        return self.index.tag

    def has(self, target: str) -> bool:
        return any(t.target == target for t in self.targets)

    def target(self, name: str) -> VerifiedTarget:
        for t in self.targets:
            if t.target == name:
                return t
        raise VerificationError(f"release {self.tag} has no manifest for target {name} "
                                f"(it has: {', '.join(t.target for t in self.targets) or 'none'})")

    def order(self, target: Optional[str] = None) -> ReleaseOrder:
        promotion = self.target(target).promotion_sequence if target else 0
        return ReleaseOrder.of(self.tag, self.index.sequence, promotion)

    def rule(self, target: str) -> pol.TargetRule:
        """The promotion rule for `target`, from signed data only: release.json's policy (else the implied
        rule of an older release), the entry's capability and platform."""
        t = self.target(target)
        return pol.rule(self.index.policy, target, t.entry.capability, t.entry.platform, t.manifest.predicate)

    def published_reference(self, target: str) -> Optional[str]:
        image = self.publication.image(target) if self.publication else None
        return image.reference if image else None


def _fail(where: str, what: str, hint: str = "restore the release folder from the release tag") -> VerificationError:
    """What the signed files say does not hold together: as much a signature failure as an edited byte."""
    return VerificationError(f"signature check failed: {where}: {what}", hint=hint)


def _read_chain(folder: Folder, key: TrustedKey, kept: Dict[int, str], promotion: rec.PromotionRecord,
                promotion_sha: str, where: str) -> Tuple[Tuple[int, str], ...]:
    """The ledger behind the current record: each kept record read once, signed, named by its successor."""
    chain, successor = [(promotion.sequence, promotion_sha)], promotion
    while not successor.legacy and successor.sequence > 1:
        sequence = successor.sequence - 1
        name = kept.pop(sequence, None)
        if name is None:
            raise _fail(where, f"the promotion ledger is cut: {rec.history_file(promotion.target, sequence)}, the "
                        f"record promotion {successor.sequence} replaced, is missing",
                        hint="restore the release folder (every <target>.promotion.<n>.json) from where it was promoted")
        data = _read_signed(folder, name, RECORD_LIMIT, key, "kept promotion record")
        record = rec.PromotionRecord.parse(data, str(folder.path / name))
        if sha256(data) != successor.previous_sha256 or record.sequence != sequence or \
                (record.release, record.release_sha256, record.target) != \
                (promotion.release, promotion.release_sha256, promotion.target):
            raise _fail(str(folder.path / name), f"not the promotion {sequence} that promotion {successor.sequence} "
                        "names (sha256, sequence, release or target differ): the ledger was rewritten",
                        hint="restore the release folder from where it was promoted")
        chain.append((sequence, sha256(data)))
        successor = record
    if kept:
        newest = max(kept)
        raise _fail(where, f"{kept[newest]} is kept as a replaced record, but the current record is promotion "
                    f"{promotion.sequence}: " + ("the current record was restored from an older state (a demotion "
                                                  "undone?)" if newest >= promotion.sequence else
                                                  "a kept record the ledger does not lead to"),
                    hint="restore the release folder from where it was promoted; never copy old promotion files back")
    return tuple(sorted(chain))


def _read_target(folder: Folder, names: Sequence[str], entry: rec.ReleasedEntry, index: rec.ReleaseIndex,
                 index_sha: str, key: TrustedKey) -> VerifiedTarget:
    where = str(folder.path / entry.manifest_file)
    promotion, promotion_sha, chain, data = None, None, (), b""
    promotion_name = rec.promotion_file(entry.target)
    kept = {int(m.group(2)): n for n in names if (m := rec.HISTORY.fullmatch(n)) and m.group(1) == entry.target}
    if folder.exists(promotion_name):
        data = _read_signed(folder, promotion_name, RECORD_LIMIT, key, "promotion record")
        promotion, promotion_sha = rec.PromotionRecord.parse(data, str(folder.path / promotion_name)), sha256(data)
        if (promotion.release, promotion.release_sha256, promotion.target) != (index.tag, index_sha, entry.target):
            raise _fail(str(folder.path / promotion_name),
                        f"a promotion of {promotion.target} in release {promotion.release}, not of {entry.target} in "
                        f"this release {index.tag} (release.json sha256 {index_sha[:12]}...)")
        chain = _read_chain(folder, key, kept, promotion, promotion_sha, str(folder.path / promotion_name))
    elif kept:
        raise _fail(str(folder.path / promotion_name), f"missing, but {len(kept)} replaced promotion record(s) of "
                    f"{entry.target} are kept ({kept[max(kept)]}...): the current record was removed",
                    hint="restore the release folder from where it was promoted")
    promotion_bytes = data
    data = folder.read(entry.manifest_file, MANIFEST_LIMIT, "manifest", VerificationError)
    expected = promotion.manifest_sha256 if promotion else entry.manifest_sha256
    if sha256(data) != expected:
        named = f"its promotion record (sequence {promotion.sequence})" if promotion else "release.json"
        raise _fail(where, f"not the manifest {named} names (sha256 {sha256(data)[:12]}..., expected {expected[:12]}...):"
                    " a manifest from another release or an older promotion, or an interrupted promote",
                    hint="restore the release folder from the release tag, or re-run the promote that was interrupted")
    sig = folder.read(entry.manifest_file + formats.SIGNATURE_SUFFIX, SIGNATURE_LIMIT, "signature", VerificationError,
                      missing_hint="restore the release folder from the release tag")
    bundle_name = entry.manifest_file + formats.BUNDLE_SUFFIX
    bundle = folder.read(bundle_name, BUNDLE_LIMIT, "bundle", VerificationError) if folder.exists(bundle_name) else None
    verify_blob(key, data, sig, bundle, where)
    manifest = mf.Manifest.parse(data, where)
    said = (manifest.target, manifest.digest, manifest.capability, manifest.platform)
    if said != (entry.target, entry.digest, entry.capability, entry.platform):
        raise _fail(where, f"describes target {manifest.target} {manifest.digest} ({manifest.capability}, "
                    f"{manifest.platform}), but release.json names {entry.target} {entry.digest} ({entry.capability}, "
                    f"{entry.platform})")
    if promotion and manifest.support_level != promotion.level:
        raise _fail(where, f"says level {manifest.support_level}, its promotion record {promotion.level}")
    return VerifiedTarget(entry, manifest, data, promotion, promotion_sha, promotion_bytes, chain)


def _read_publication(folder: Folder, release: rec.ReleaseIndex, index_sha: str, key: TrustedKey,
                      targets: Mapping[str, VerifiedTarget]) -> Optional[rec.Publication]:
    if not folder.exists(rec.PUBLICATION_FILE):
        return None
    where = str(folder.path / rec.PUBLICATION_FILE)
    publication = rec.Publication.parse(_read_signed(folder, rec.PUBLICATION_FILE, RECORD_LIMIT, key,
                                                     "publication record"), where)
    if (publication.tag, publication.release_sha256) != (release.tag, index_sha):
        raise _fail(where, f"the publication of release {publication.tag} (release.json sha256 "
                    f"{publication.release_sha256[:12]}...), not of this one",
                    hint="publish this release again (nox -s publish -- TAG --to ...), or restore the folder")
    for image in publication.images:
        target = targets.get(image.target)
        if target is None or image.digest != target.manifest.digest or not image.reference.endswith("@" + image.digest):
            raise _fail(where, f"names {image.reference} for {image.target}, not the released image "
                        f"{target.manifest.digest if target else '(no such target)'}",
                        hint="the publication and the manifests disagree: restore the release folder")
    return publication


class _Layered:
    """A folder with a journal's files laid over it: what the folder will hold once the journal is finished."""

    def __init__(self, base: Folder, top: Folder) -> None:
        self.base, self.top, self.path = base, top, base.path

    def names(self, error) -> list:
        return sorted(set(self.base.names(error)) | set(self.top.names(error)))

    def exists(self, name: str) -> bool:
        return self.top.exists(name) or self.base.exists(name)

    def read(self, name: str, *a, **kw) -> bytes:
        return (self.top if self.top.exists(name) else self.base).read(name, *a, **kw)


def read_release(path: Path, anchor: KeyAnchor = KeyAnchor(), overlay: Optional[Path] = None) -> VerifiedRelease:
    """Read and verify the release folder at `path`, once. VerificationError says what does not verify.
    `overlay`: a journal folder whose files are read instead of the folder's (journal.recover_journals)."""
    path = Path(path)
    problem = tag_problem(path.name)
    if problem:
        raise VerificationError(f"{path}: its name is {problem}, so it is no release folder")
    with open_folder(path, "release folder", VerificationError,
                     missing_hint="check the release out (git checkout TAG) or fetch its files") as base:
        if overlay is None:
            return _read_open(path, base, anchor)
        with open_folder(overlay, "journal", VerificationError) as top:
            return _read_open(path, _Layered(base, top), anchor)


def _read_open(path: Path, folder, anchor: KeyAnchor) -> VerifiedRelease:
    key = anchor.accept(folder.read(rec.PUBLIC_KEY_FILE, KEY_LIMIT, "release key", VerificationError,
                                    missing_hint="restore the release folder from the release tag"),
                        str(path / rec.PUBLIC_KEY_FILE))
    data = _read_signed(folder, rec.INDEX_FILE, RECORD_LIMIT, key, "release index")
    where = str(path / rec.INDEX_FILE)
    index = rec.ReleaseIndex.parse(data, where)
    if index.tag != path.name:
        raise _fail(where, f"is the index of release {index.tag}, but the folder is named {path.name!r}: a signed "
                    "release is valid only under its own tag", hint=f"use manifests/{index.tag}/, or restore it")
    if index.key_fingerprint != key.fingerprint or index.file_sha256(rec.PUBLIC_KEY_FILE) != sha256(key.pem):
        raise _fail(where, f"names release key {index.key_fingerprint}, not the folder's {key.fingerprint}")
    index_sha = sha256(data)
    names = folder.names(VerificationError)
    targets = tuple(_read_target(folder, names, e, index, index_sha, key) for e in index.targets)
    publication = _read_publication(folder, index, index_sha, key, {t.target: t for t in targets})
    return VerifiedRelease(path, index, index_sha, key, targets, publication)


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


def list_releases(root: Path, anchor: KeyAnchor = KeyAnchor(), target: Optional[str] = None) -> Listing:
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


Sign = Callable[[Path], None]  # signs the file at a path: writes PATH.sig and PATH.sigstore.json beside it


def signed_names(name: str) -> Tuple[str, str, str]:
    return name, name + formats.SIGNATURE_SUFFIX, name + formats.BUNDLE_SUFFIX


def released_files(files: Mapping[str, bytes]) -> Tuple[Tuple[str, str], ...]:
    """(name, sha256) of what a release writes, for release.json."""
    return tuple(sorted((name, sha256(data)) for name, data in files.items()))


def removable_by_force(index: Optional[rec.ReleaseIndex]) -> List[str]:
    """What a `release --force` may remove: only what the *verified* earlier release says it wrote, and the
    publication record bound to it."""
    if index is None:
        return []
    return sorted({name for name, _ in index.files} | {rec.INDEX_FILE, *signed_names(rec.INDEX_FILE)}
                  | set(signed_names(rec.PUBLICATION_FILE)))


def describe(listing: Listing) -> Dict[str, object]:
    return {"releases": listing.tags(), "broken": dict(listing.broken), "ignored": dict(listing.ignored)}


# --- the enrolled hosts file --------------------------------------------------------------------


@dataclass(frozen=True)
class VerifiedHosts:
    """manifests/hosts.json as its signature vouches for it, and the sha256 of the bytes read."""

    hosts: rec.EnrolledHosts
    sha256: str
    path: Path


def read_hosts_file(path: Path, key: TrustedKey) -> VerifiedHosts:
    """manifests/hosts.json, read once and verified with the release key (refused otherwise)."""
    path = Path(path)
    with open_folder(path.parent, "folder of the enrolled-hosts file", VerificationError) as folder:
        data = _read_signed(folder, path.name, RECORD_LIMIT, key, "enrolled-hosts file")
    return VerifiedHosts(rec.EnrolledHosts.parse(data, str(path)), sha256(data), path)


def read_hosts(path: Path, key: TrustedKey) -> rec.EnrolledHosts:
    return read_hosts_file(path, key).hosts
