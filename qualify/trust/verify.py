"""The one verifier of what the release key signs: `verify_release(source, anchor)` for a release (its key,
release.json, every target's promotion ledger and manifest, the publication record and, when asked, the
accepted evidence) and `verify_hosts` for the enrolled-hosts file. Both take bytes from a source
(sources.py: a folder, a journal laid over one, a git tag) and never open a file themselves; every
release-key signature is checked by `signed_bytes` here, so no other module parses a signed record
(tests/test_house_rules.py lists the call sites).

The order (python-tuf's `TrustedMetadataSet`: each step trusts only what the one before verified):

1. `cosign.pub`: its bytes are the key that is fingerprinted, compared with the pin (or with the key the
   caller trusts), and used for every signature below.
2. `release.json` (+ `.sig`, and its Sigstore bundle when present: digest, algorithm and key hint checked
   too), parsed strictly into a ReleaseIndex whose tag must be the source's name and whose key must be
   the folder's. `through=INDEX` stops here (what `release --force` needs to know what it may remove).
3. per target it lists: `<target>.promotion.json` when present (its release sha256 and target must be this
   one's) and the ledger behind it: every record it replaced, kept as `<target>.promotion.<sequence>.json`,
   each signed, each the one its successor names by sha256, exactly sequences 1 to n-1; then `<target>.json`,
   whose sha256 must be the one release.json names (release/v3: promote never rewrites it; in a release/v2
   folder a promote did, and the current promotion record names it), whose signature must verify, and whose
   target, digest, capability and platform must be what release.json says.
4. `published.json` when present: signed, bound to this release.json by its sha256, naming the released
   digests only.
5. with `through=EVIDENCE` (promote): the accepted evidence each promotion record lists, read from
   `evidence/<target>/<sha256>.json` and sha-checked, and the names there no record lists.
"""

from __future__ import annotations

import base64
import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Sequence, Tuple, Type

from qualify.core import manifest as mf
from qualify.core.errors import ConfigError, QualifyError, VerificationError
from qualify.core.fsutil import canonical_problem
from qualify.core.readlimit import BUNDLE_LIMIT, KEY_LIMIT, MANIFEST_LIMIT, SIGNATURE_LIMIT, read_small, strict_json
from qualify.signing import formats
from qualify.signing import keys as cosign_keys
from qualify.trust import policy as pol
from qualify.trust import records as rec
from qualify.trust.order import ReleaseOrder
from qualify.trust.sources import Source, join

RECORD_LIMIT = 16 * 1024 * 1024  # release.json, promotion and publication records are kilobytes
EVIDENCE_LIMIT = 4 << 20  # an evidence record is a few kB (release/evidence.py: MAX_BYTES)
EVIDENCE_DIR = "evidence"
INDEX, TARGETS, EVIDENCE = "index", "targets", "evidence"  # how far verify_release goes


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class AcceptedEvidenceError(ConfigError):
    """The evidence a signed promotion record accepted is not what `evidence/<target>/` holds (exit 2, as any
    evidence that cannot be used)."""


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
        formats.require_p256(key, source)
        return cls(pem, key, cosign_keys.fingerprint(key), source)

    @classmethod
    def read(cls, path: Path, error: Type[QualifyError] = ConfigError) -> TrustedKey:
        pem = read_small(path, KEY_LIMIT, "public key", error,
                         missing_hint="the release's cosign.pub, as announced with the release")
        return cls.from_bytes(pem, str(path))

    @classmethod
    def of_signer(cls, signer, where: str) -> TrustedKey:
        """The public half of a signer (signing/signer.py), as the key its signatures must verify with."""
        from qualify.signing.signer import public_pem

        return cls.from_bytes(public_pem(signer), where)


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


TOFU = KeyAnchor()  # no pin, no key of the caller's: the key in the folder (trust on first use)


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


@dataclass(frozen=True)
class Signed:
    """A file's bytes as its signature vouches for them, with the signature files read beside it (a re-run
    keeps them rather than re-sign the same bytes)."""

    data: bytes = field(repr=False)
    signature: bytes = field(repr=False)
    bundle: Optional[bytes] = field(repr=False)


def signed_bytes(source: Source, name: str, limit: int, key: TrustedKey, what: str) -> Signed:
    """The bytes of `name` and its signatures, each read once from `source`, after they verify with `key`:
    the one check of a release-key signature."""
    data = source.read(name, limit, what)
    signature = source.read(name + formats.SIGNATURE_SUFFIX, SIGNATURE_LIMIT, f"signature of {what}",
                            missing_hint="restore the release folder from the release tag")
    bundle_name = name + formats.BUNDLE_SUFFIX
    bundle = source.read(bundle_name, BUNDLE_LIMIT, f"bundle of {what}") if source.exists(bundle_name) else None
    verify_blob(key, data, signature, bundle, join(source, name))
    return Signed(data, signature, bundle)


# --- the verified value ------------------------------------------------------------------------


@dataclass(frozen=True)
class AcceptedFile:
    """One evidence record a signed promotion record accepted, as `evidence/<target>/` holds it, sha-checked."""

    sha256: str
    host: str  # who vouched, as the promotion record says ("unsigned" for --allow-unsigned-evidence)
    data: bytes = field(repr=False)
    identity: str = ""  # the run's identity, as the promotion record says
    # The serve-check record the run counted with (issue 39), kept beside it and sha-checked the same way.
    serving_sha256: Optional[str] = None
    serving_data: Optional[bytes] = field(default=None, repr=False)
    # Issue 49: the host's signature files kept beside each (None where absent), and the record that first
    # accepted it (oldest first): the hosts version it was checked against and whether unsigned was allowed.
    signature: Optional[bytes] = field(default=None, repr=False)
    bundle: Optional[bytes] = field(default=None, repr=False)
    serving_signature: Optional[bytes] = field(default=None, repr=False)
    serving_bundle: Optional[bytes] = field(default=None, repr=False)
    first: Optional[rec.PromotionRecord] = field(default=None, repr=False)


@dataclass(frozen=True)
class CurrentLevel:
    """A target's level now, from signed data only: the current promotion record's where one exists (from
    release/v3 the only place a promoted level is written), else release.json's, the level it was released at."""

    level: str
    promotion: int = 0  # the current promotion record's sequence; 0: never promoted

    @property
    def promoted(self) -> bool:
        """Reached by the promotion rule (a signed promotion record), not signed at release time."""
        return self.promotion > 0


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
    # through=EVIDENCE only: the accepted evidence the current record lists, and the files in the evidence
    # folder it does not list (dropped in by hand, or kept by a promote killed before it signed).
    accepted: Tuple[AcceptedFile, ...] = ()
    unlisted: Tuple[str, ...] = ()
    ledger: Tuple[rec.PromotionRecord, ...] = field(default=(), repr=False)  # every record read, oldest first

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

    @property
    def current(self) -> CurrentLevel:
        """The level every reader shows and the deploy gates on (never the manifest's own `support_level`,
        which from release/v3 stays the released level)."""
        if self.promotion is not None:
            return CurrentLevel(self.promotion.level, self.promotion.sequence)
        return CurrentLevel(self.entry.support_level)


@dataclass(frozen=True)
class VerifiedRelease:
    """A release as its signatures vouch for it. Made only by `verify_release`; `through` says how far it
    went (INDEX: the key and release.json only, `targets` empty)."""

    path: Path  # where it was read, for messages (a folder, or `tag T:manifests/T` for a git tag)
    index: rec.ReleaseIndex
    index_sha256: str
    key: TrustedKey
    targets: Tuple[VerifiedTarget, ...]
    publication: Optional[rec.Publication] = None
    through: str = TARGETS
    signatures: Mapping[str, Signed] = field(default_factory=dict, repr=False)  # every signed file verified

    @property
    def tag(self) -> str:
        return self.index.tag

    def has(self, target: str) -> bool:
        return any(t.target == target for t in self.targets)

    def target(self, name: str) -> VerifiedTarget:
        if self.through == INDEX:
            raise VerificationError(f"release {self.tag}: only its index was verified, not target {name}")
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


class _Reader:
    """One verification: the source, the key, and every signed file it verified (handed on for re-use)."""

    def __init__(self, source: Source, key: TrustedKey) -> None:
        self.source, self.key = source, key
        self.signed: Dict[str, Signed] = {}


def _chain(r: _Reader, kept: Dict[int, str], promotion: rec.PromotionRecord, promotion_sha: str, where: str,
           records: Optional[List[rec.PromotionRecord]] = None) -> Tuple[Tuple[int, str], ...]:
    """The ledger behind the current record: each kept record read once, signed, named by its successor (each
    added to `records`, newest first)."""
    chain, successor = [(promotion.sequence, promotion_sha)], promotion
    records = records if records is not None else []
    records.append(promotion)
    while not successor.legacy and successor.sequence > 1:
        sequence = successor.sequence - 1
        name = kept.pop(sequence, None)
        if name is None:
            raise _fail(where, f"the promotion ledger is cut: {rec.history_file(promotion.target, sequence)}, the "
                        f"record promotion {successor.sequence} replaced, is missing",
                        hint="restore the release folder (every <target>.promotion.<n>.json) from where it was promoted")
        data = _signed(r, name, RECORD_LIMIT, "kept promotion record")
        record = rec.PromotionRecord.parse(data, join(r.source, name))
        if sha256(data) != successor.previous_sha256 or record.sequence != sequence or \
                (record.release, record.release_sha256, record.target) != \
                (promotion.release, promotion.release_sha256, promotion.target):
            raise _fail(join(r.source, name), f"not the promotion {sequence} that promotion {successor.sequence} "
                        "names (sha256, sequence, release or target differ): the ledger was rewritten",
                        hint="restore the release folder from where it was promoted")
        chain.append((sequence, sha256(data)))
        records.append(record)
        successor = record
    if kept:
        newest = max(kept)
        raise _fail(where, f"{kept[newest]} is kept as a replaced record, but the current record is promotion "
                    f"{promotion.sequence}: " + ("the current record was restored from an older state (a demotion "
                                                  "undone?)" if newest >= promotion.sequence else
                                                  "a kept record the ledger does not lead to"),
                    hint="restore the release folder from where it was promoted; never copy old promotion files back")
    return tuple(sorted(chain))


def _signed(r: _Reader, name: str, limit: int, what: str) -> bytes:
    done = signed_bytes(r.source, name, limit, r.key, what)
    r.signed[name] = done
    return done.data


def _target(r: _Reader, names: Sequence[str], entry: rec.ReleasedEntry, index: rec.ReleaseIndex,
            index_sha: str) -> VerifiedTarget:
    source = r.source
    where = join(source, entry.manifest_file)
    promotion, promotion_sha, chain, promotion_bytes = None, None, (), b""
    ledger: List[rec.PromotionRecord] = []
    promotion_name = rec.promotion_file(entry.target)
    kept = {int(m.group(2)): n for n in names if (m := rec.HISTORY.fullmatch(n)) and m.group(1) == entry.target}
    if source.exists(promotion_name):
        promotion_bytes = _signed(r, promotion_name, RECORD_LIMIT, "promotion record")
        promotion = rec.PromotionRecord.parse(promotion_bytes, join(source, promotion_name))
        promotion_sha = sha256(promotion_bytes)
        if (promotion.release, promotion.release_sha256, promotion.target) != (index.tag, index_sha, entry.target):
            raise _fail(join(source, promotion_name),
                        f"a promotion of {promotion.target} in release {promotion.release}, not of {entry.target} in "
                        f"this release {index.tag} (release.json sha256 {index_sha[:12]}...)")
        chain = _chain(r, kept, promotion, promotion_sha, join(source, promotion_name), ledger)
    elif kept:
        raise _fail(join(source, promotion_name), f"missing, but {len(kept)} replaced promotion record(s) of "
                    f"{entry.target} are kept ({kept[max(kept)]}...): the current record was removed",
                    hint="restore the release folder from where it was promoted")
    data = source.read(entry.manifest_file, MANIFEST_LIMIT, "manifest")
    # One hash rule per format: from release/v3 the manifest is always the bytes release.json names (promote
    # never rewrites it); in a release/v2 folder a promote rewrote it, and the current promotion record names it.
    rewritten = promotion is not None and index.manifest_rewritten_by_promote
    expected = promotion.manifest_sha256 if rewritten else entry.manifest_sha256
    if sha256(data) != expected:
        named = f"its promotion record (sequence {promotion.sequence})" if rewritten else "release.json"
        raise _fail(where, f"not the manifest {named} names (sha256 {sha256(data)[:12]}..., expected {expected[:12]}...):"
                    " a manifest from another release or an older promotion, " + (
                        "or an interrupted promote" if rewritten else "or one rewritten after release (from release/v3 "
                        "promote never rewrites it: the level is the promotion record's)"),
                    hint="restore the release folder from the release tag, or re-run the promote that was interrupted")
    if promotion is not None and not rewritten and promotion.manifest_sha256 != expected:
        raise _fail(join(source, promotion_name), f"names manifest sha256 {promotion.manifest_sha256[:12]}..., not the "
                    f"released manifest release.json names ({expected[:12]}...): from release/v3 a promotion never "
                    "rewrites the manifest")
    sig = source.read(entry.manifest_file + formats.SIGNATURE_SUFFIX, SIGNATURE_LIMIT, "signature",
                      missing_hint="restore the release folder from the release tag")
    bundle_name = entry.manifest_file + formats.BUNDLE_SUFFIX
    bundle = source.read(bundle_name, BUNDLE_LIMIT, "bundle") if source.exists(bundle_name) else None
    verify_blob(r.key, data, sig, bundle, where)
    r.signed[entry.manifest_file] = Signed(data, sig, bundle)
    manifest = mf.Manifest.parse(data, where)
    why = canonical_problem(data, strict_json(data, where, VerificationError))
    if why:
        raise _fail(where, f"not in the canonical form signed records are written in: {why}")
    said = (manifest.target, manifest.digest, manifest.capability, manifest.platform)
    if said != (entry.target, entry.digest, entry.capability, entry.platform):
        raise _fail(where, f"describes target {manifest.target} {manifest.digest} ({manifest.capability}, "
                    f"{manifest.platform}), but release.json names {entry.target} {entry.digest} ({entry.capability}, "
                    f"{entry.platform})")
    if rewritten and manifest.support_level != promotion.level:
        raise _fail(where, f"says level {manifest.support_level}, its promotion record {promotion.level}")
    if not rewritten and manifest.support_level != entry.support_level:
        raise _fail(where, f"says level {manifest.support_level}, release.json {entry.support_level} (the level it "
                    "was released at)")
    return VerifiedTarget(entry, manifest, data, promotion, promotion_sha, promotion_bytes, chain,
                          ledger=tuple(reversed(ledger)))


def _publication(r: _Reader, release: rec.ReleaseIndex, index_sha: str,
                 targets: Mapping[str, VerifiedTarget]) -> Optional[rec.Publication]:
    from qualify.config.imageref import ImageRef, ImageRefError

    if not r.source.exists(rec.PUBLICATION_FILE):
        return None
    where = join(r.source, rec.PUBLICATION_FILE)
    publication = rec.Publication.parse(_signed(r, rec.PUBLICATION_FILE, RECORD_LIMIT, "publication record"), where)
    if (publication.tag, publication.release_sha256) != (release.tag, index_sha):
        raise _fail(where, f"the publication of release {publication.tag} (release.json sha256 "
                    f"{publication.release_sha256[:12]}...), not of this one",
                    hint="publish this release again (nox -s publish -- TAG --to ...), or restore the folder")
    for image in publication.images:
        target = targets.get(image.target)
        try:
            named = ImageRef.parse(image.reference).digest
        except ImageRefError:
            named = None
        if target is None or image.digest != target.manifest.digest or named != image.digest:
            raise _fail(where, f"names {image.reference} for {image.target}, not the released image "
                        f"{target.manifest.digest if target else '(no such target)'}",
                        hint="the publication and the manifests disagree: restore the release folder")
    return publication


def _evidence(source: Source, vt: VerifiedTarget) -> VerifiedTarget:
    """The accepted evidence of `vt`'s promotion record, each file sha-checked, and what else the folder holds."""
    hint = "restore the release folder's evidence/ from where it was promoted"
    listed = vt.promotion.evidence if vt.promotion else ()
    try:
        top = source.sub(EVIDENCE_DIR, "evidence folder")
        store = top.sub(vt.target, "evidence folder") if top is not None else None
    except VerificationError as exc:
        raise AcceptedEvidenceError(exc.message, hint=exc.hint) from None
    if store is None:
        if listed:
            raise AcceptedEvidenceError(f"evidence folder not found: {join(source, EVIDENCE_DIR)}/{vt.target}", hint=hint)
        return vt
    try:
        accepted = []
        def kept(sha: str) -> bytes:
            name = f"{sha}.json"
            try:
                data = store.read(name, EVIDENCE_LIMIT, "accepted evidence", missing_hint=hint)
            except VerificationError as exc:
                raise AcceptedEvidenceError(exc.message, hint=exc.hint) from None
            if sha256(data) != sha:
                raise AcceptedEvidenceError(f"{join(store, name)}: not the evidence the signed promotion record "
                                            "accepted (sha256 differs)", hint=hint)
            return data

        def beside(sha: Optional[str], suffix: str, limit: int) -> Optional[bytes]:
            name = f"{sha}.json{suffix}"
            if not sha or not store.exists(name):
                return None
            try:
                return store.read(name, limit, "signature of accepted evidence")
            except VerificationError as exc:
                raise AcceptedEvidenceError(exc.message, hint=exc.hint) from None

        for e in listed:
            first = next((p for p in vt.ledger if any(x.sha256 == e.sha256 for x in p.evidence)), vt.promotion)
            accepted.append(AcceptedFile(
                e.sha256, e.host, kept(e.sha256), e.identity, e.serving_sha256,
                kept(e.serving_sha256) if e.serving_sha256 else None,
                beside(e.sha256, formats.SIGNATURE_SUFFIX, SIGNATURE_LIMIT), beside(e.sha256, formats.BUNDLE_SUFFIX,
                                                                                    BUNDLE_LIMIT),
                beside(e.serving_sha256, formats.SIGNATURE_SUFFIX, SIGNATURE_LIMIT),
                beside(e.serving_sha256, formats.BUNDLE_SUFFIX, BUNDLE_LIMIT), first))
        names = {f"{e.sha256}.json" for e in listed} | {f"{e.serving_sha256}.json" for e in listed if e.serving_sha256}
        unlisted = tuple(n for n in store.names() if n.endswith(".json") and not n.endswith(formats.BUNDLE_SUFFIX)
                         and n not in names)
    finally:
        for opened in (store, top):
            if hasattr(opened, "close"):
                opened.close()
    return VerifiedTarget(vt.entry, vt.manifest, vt.manifest_bytes, vt.promotion, vt.promotion_sha256,
                          vt.promotion_bytes, vt.chain, tuple(accepted), unlisted, vt.ledger)


def verify_release(source: Source, anchor: KeyAnchor = TOFU, through: str = TARGETS) -> VerifiedRelease:
    """The release `source` holds, verified in the order above as far as `through` (INDEX, TARGETS or
    EVIDENCE); VerificationError says what does not verify."""
    if through not in (INDEX, TARGETS, EVIDENCE):
        raise ValueError(f"through={through!r}")
    pem = source.read(rec.PUBLIC_KEY_FILE, KEY_LIMIT, "release key",
                      missing_hint="restore the release folder from the release tag")
    key = anchor.accept(pem, join(source, rec.PUBLIC_KEY_FILE))
    r = _Reader(source, key)
    data = _signed(r, rec.INDEX_FILE, RECORD_LIMIT, "release index")
    where = join(source, rec.INDEX_FILE)
    index = rec.ReleaseIndex.parse(data, where)
    if index.tag != source.name:
        raise _fail(where, f"is the index of release {index.tag}, but the folder is named {source.name!r}: a signed "
                    "release is valid only under its own tag", hint=f"use manifests/{index.tag}/, or restore it")
    if index.key_fingerprint != key.fingerprint:
        raise _fail(where, f"names release key {index.key_fingerprint}, not the folder's {key.fingerprint}")
    if index.file_sha256(rec.PUBLIC_KEY_FILE) != sha256(pem):  # the folder's own bytes, never the caller's copy
        raise _fail(where, f"files[cosign.pub] is {str(index.file_sha256(rec.PUBLIC_KEY_FILE))[:12]}..., but the "
                    f"folder's {rec.PUBLIC_KEY_FILE} has sha256 {sha256(pem)[:12]}... (the same key re-encoded, or "
                    "another file)")
    index_sha = sha256(data)
    if through == INDEX:
        return VerifiedRelease(Path(source.where), index, index_sha, key, (), None, INDEX, dict(r.signed))
    names = source.names()
    targets = tuple(_target(r, names, e, index, index_sha) for e in index.targets)
    publication = _publication(r, index, index_sha, {t.target: t for t in targets})
    if through == EVIDENCE:
        targets = tuple(_evidence(source, t) for t in targets)
    return VerifiedRelease(Path(source.where), index, index_sha, key, targets, publication, through, dict(r.signed))


# --- the enrolled hosts file --------------------------------------------------------------------


@dataclass(frozen=True)
class VerifiedHosts:
    """manifests/hosts.json as its signature vouches for it, and the sha256 of the bytes read."""

    hosts: rec.EnrolledHosts
    sha256: str
    path: Path
    signed: Optional[Signed] = field(default=None, repr=False, compare=False)  # the bytes verified (kept as read)


def verify_hosts(source: Source, name: str, key: TrustedKey) -> VerifiedHosts:
    """The enrolled-hosts file `name` of `source`, read once and verified with the release key."""
    done = signed_bytes(source, name, RECORD_LIMIT, key, "enrolled-hosts file")
    return VerifiedHosts(rec.EnrolledHosts.parse(done.data, join(source, name)), sha256(done.data),
                         Path(join(source, name)), done)


@dataclass(frozen=True)
class HostsVersion:
    """An earlier version of the enrolled-hosts file as found (kept beside it, in --hosts-history DIR, or in
    git's history), not yet verified: `verify_hosts_version` decides what it is worth."""

    where: str
    data: bytes = field(repr=False)
    signature: Optional[bytes] = field(repr=False)
    bundle: Optional[bytes] = field(default=None, repr=False)


def verify_hosts_version(version: HostsVersion, key: TrustedKey) -> VerifiedHosts:
    """An earlier hosts version, verified with the release key as the current file is."""
    if version.signature is None:
        raise VerificationError(f"signature check failed: {version.where}: an earlier enrolled-hosts version "
                                "without its .sig", hint="fetch it with its signature (git show REV:manifests/"
                                "hosts.json.sig)")
    verify_blob(key, version.data, version.signature, version.bundle, version.where)
    return VerifiedHosts(rec.EnrolledHosts.parse(version.data, version.where), sha256(version.data),
                         Path(version.where), Signed(version.data, version.signature, version.bundle))


def removable_by_force(release: Optional[VerifiedRelease]) -> List[str]:
    """What a `release --force` may remove: only what the *verified* earlier release says it wrote, and the
    publication record bound to it."""
    if release is None:
        return []
    names = lambda n: (n, n + formats.SIGNATURE_SUFFIX, n + formats.BUNDLE_SUFFIX)  # noqa: E731
    return sorted({name for name, _ in release.index.files} | set(names(rec.INDEX_FILE))
                  | set(names(rec.PUBLICATION_FILE)))
