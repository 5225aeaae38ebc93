"""The signed records of a release folder, as typed values: what their JSON holds and how it is parsed.

Each record is canonical JSON, signed with the release key in cosign's blob formats; bytes in any other form
are refused (issue 49: both verifiers read one form). Parsing is strict: unknown keys, wrong types, names that
are not file or target names, times not RFC 3339 UTC are refused, naming the file and the key.

- `release.json` (ReleaseIndex): the tag, its version, the release's sequence number and predecessor,
  a deterministic time (the source commit's), the targets with their manifest sha256, and the sha256 of
  every file the release wrote.
- `release.json`'s `policy` (policy.ReleasePolicy): the promotion rule the release is promoted under.
- `<target>.promotion.json` (PromotionRecord): the newest promotion or demotion of one target, with a
  sequence one higher than the record before it, whose sha256 it names; every record it replaced is kept
  beside it as `<target>.promotion.<sequence>.json` (the ledger: a hash chain, never overwritten).
- `published.json` (Publication): where `nox -s publish` put the images, bound to `release.json`'s sha256.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple, Type

from qualify.core import manifest as mf
from qualify.core.errors import QualifyError, VerificationError
from qualify.core.fsutil import canonical_json
from qualify.trust.fields import FILE_NAME, HEX, TIME, Fields, format_time, load, parse_time  # noqa: F401 (callers' names)
from qualify.trust.order import ReleaseOrder, Version, tag_problem
from qualify.trust.policy import ReleasePolicy
from qualify.trust.promotionrecord import (  # noqa: F401 (re-exported: callers name them rec.X)
    HISTORY,
    PROMOTION_SCHEMA,
    PROMOTION_SCHEMA_V2,
    PROMOTION_SUFFIX,
    CountedEvidence,
    PromotionRecord,
    history_file,
    promotion_file,
)

# release/v3 (issue 52): promote never rewrites a manifest, the level lives in the promotion record only.
# release/v2 folders (promote rewrote the manifest) are read and still promoted their own way, never written.
RELEASE_SCHEMA = "https://blackwell-qualify.dev/release/v3"
RELEASE_SCHEMA_V2 = "https://blackwell-qualify.dev/release/v2"
RELEASE_FORMATS = {RELEASE_SCHEMA: 3, RELEASE_SCHEMA_V2: 2}
PUBLICATION_SCHEMA = "https://blackwell-qualify.dev/publication/v2"
INDEX_FILE = "release.json"
PUBLIC_KEY_FILE = "cosign.pub"
PUBLICATION_FILE = "published.json"


# --- release.json ----------------------------------------------------------------------------


@dataclass(frozen=True)
class ReleasedEntry:
    """One target of a release, as release.json names it."""

    target: str
    capability: str
    platform: str
    profile: str
    reference: str
    digest: str
    manifest_sha256: str
    support_level: str
    verdict: str

    @property
    def manifest_file(self) -> str:
        return f"{self.target}.json"

    def as_json(self) -> Dict[str, Any]:
        return {"target": self.target, "capability": self.capability, "platform": self.platform,
                "profile": self.profile, "image": {"reference": self.reference, "digest": self.digest},
                "manifest_sha256": self.manifest_sha256, "support_level": self.support_level, "verdict": self.verdict}

    @classmethod
    def parse(cls, f: Fields) -> ReleasedEntry:
        f.only("target", "capability", "platform", "profile", "image", "manifest_sha256", "support_level", "verdict")
        image = f.obj("image").only("reference", "digest")
        return cls(f.text("target", mf.TARGET_NAME), f.text("capability"), f.text("platform"),
                   f.text("profile", empty=True), image.text("reference"), image.text("digest", mf.DIGEST),
                   f.text("manifest_sha256", HEX), f.text("support_level"), f.text("verdict"))


@dataclass(frozen=True)
class Predecessor:
    tag: str
    sequence: int
    release_sha256: str

    def as_json(self) -> Dict[str, Any]:
        return {"tag": self.tag, "sequence": self.sequence, "release_sha256": self.release_sha256}


@dataclass(frozen=True)
class ReleaseIndex:
    """release.json: what the release is, where it stands among releases, and every file it wrote."""

    tag: str
    sequence: int
    time: str
    source_revision: str
    min_level: str
    key_fingerprint: str
    key_hint: str
    targets: Tuple[ReleasedEntry, ...]
    files: Tuple[Tuple[str, str], ...]  # (name, sha256 hex), every file the release wrote but release.json's own
    predecessor: Optional[Predecessor] = None
    withheld: Tuple[Tuple[str, str], ...] = ()
    dirty_paths: Tuple[str, ...] = ()
    dirty_allowed: bool = False
    policy: Optional[ReleasePolicy] = None  # None: signed before releases held one (policy.rule: the implied rule)
    format: int = 3  # release/v3; 2: a release/v2 folder, whose promotes rewrote the manifest (read, and promoted so)

    @property
    def manifest_rewritten_by_promote(self) -> bool:
        """release/v2: promote rewrote and re-signed the manifest, so the current promotion record names its
        sha256. From release/v3 the manifest is always the bytes release.json names (issue 52)."""
        return self.format < 3

    @property
    def version(self) -> Optional[str]:
        v = Version.parse(self.tag)
        return v.text if v else None

    @property
    def order(self) -> ReleaseOrder:
        return ReleaseOrder.of(self.tag, self.sequence)

    def entry(self, target: str) -> Optional[ReleasedEntry]:
        return next((e for e in self.targets if e.target == target), None)

    def file_sha256(self, name: str) -> Optional[str]:
        return dict(self.files).get(name)

    def as_json(self) -> Dict[str, Any]:
        return {
            "schema": RELEASE_SCHEMA if self.format >= 3 else RELEASE_SCHEMA_V2, "tag": self.tag,
            "version": self.version, "sequence": self.sequence,
            "predecessor": self.predecessor.as_json() if self.predecessor else None, "time": self.time,
            "source_revision": self.source_revision, "min_level": self.min_level,
            "public_key": {"file": PUBLIC_KEY_FILE, "fingerprint": self.key_fingerprint, "hint": self.key_hint},
            "targets": [e.as_json() for e in self.targets],
            "withheld": [{"target": t, "reason": r} for t, r in self.withheld],
            "allow_partial": bool(self.withheld),
            "dirty": {"allowed": self.dirty_allowed, "paths": list(self.dirty_paths)},
            "files": dict(self.files),
            **({"policy": self.policy.as_json()} if self.policy else {}),
        }

    def to_bytes(self) -> bytes:
        return canonical_json(self.as_json())

    @classmethod
    def parse(cls, data: bytes, where: str, error: Type[QualifyError] = VerificationError) -> ReleaseIndex:
        f = load(data, where, RELEASE_SCHEMA, error, legacy=RELEASE_SCHEMA_V2).only(
            "schema", "tag", "version", "sequence", "predecessor", "time", "source_revision", "min_level",
            "public_key", "targets", "withheld", "allow_partial", "dirty", "files", "policy")
        tag = f.text("tag")
        if tag_problem(tag):
            raise error(f"{where}: 'tag' is {tag_problem(tag)}")
        version = f.optional_text("version")
        expected = Version.parse(tag)
        if version != (expected.text if expected else None):
            raise error(f"{where}: 'version' {version!r} is not what tag {tag!r} says")
        parse_time(f.text("time"), f"{where}: time", error)
        key = f.obj("public_key").only("file", "fingerprint", "hint")
        if key.text("file") != PUBLIC_KEY_FILE:
            raise error(f"{where}: public_key.file must be {PUBLIC_KEY_FILE}")
        pred = f.optional_obj("predecessor")
        files_obj = f.obj("files")
        files = []
        for name, sha in sorted(files_obj.doc.items()):
            if not FILE_NAME.fullmatch(name) or name.startswith(INDEX_FILE) or not isinstance(sha, str) \
                    or not HEX.fullmatch(sha):
                raise error(f"{where}: files: {name[:80]!r} is not a file name with a sha256")
            files.append((name, sha))
        dirty = f.obj("dirty").only("allowed", "paths")
        targets = tuple(ReleasedEntry.parse(t) for t in f.items("targets"))
        if len({t.target for t in targets}) != len(targets):
            raise error(f"{where}: a target is listed twice")
        withheld = tuple((w.only("target", "reason").text("target"), w.text("reason", empty=True))
                         for w in f.items("withheld"))
        if f.flag("allow_partial") != bool(withheld):
            raise error(f"{where}: allow_partial does not match the withheld targets")
        policy = f.obj("policy") if "policy" in f.doc else None  # null is refused: absent is the implied rule
        return cls(
            policy=ReleasePolicy.parse(policy, [t.target for t in targets]) if policy else None,
            tag=tag, sequence=f.integer("sequence", 1), time=f.text("time"),
            source_revision=f.text("source_revision"), min_level=f.text("min_level"),
            key_fingerprint=key.text("fingerprint"), key_hint=key.text("hint", empty=True), targets=targets,
            files=tuple(files), withheld=withheld, dirty_paths=dirty.texts("paths"),
            dirty_allowed=dirty.flag("allowed"), format=RELEASE_FORMATS[f.doc["schema"]],
            predecessor=Predecessor(pred.only("tag", "sequence", "release_sha256").text("tag"),
                                    pred.integer("sequence", 1), pred.text("release_sha256", HEX)) if pred else None)


# --- published.json ---------------------------------------------------------------------------


@dataclass(frozen=True)
class PublishedImage:
    target: str
    reference: str  # destination name@sha256:...
    tag: str  # destination name:TAG
    digest: str
    source: str
    attestations: str  # name:sha256-<hex>.att
    predicate_types: Tuple[str, ...]
    referrers: str  # "pushed", or why not

    def as_json(self) -> Dict[str, Any]:
        return {"target": self.target, "reference": self.reference, "tag": self.tag, "digest": self.digest,
                "source": self.source, "attestations": self.attestations,
                "predicate_types": list(self.predicate_types), "referrers": self.referrers}


@dataclass(frozen=True)
class PublishedIndex:
    capability: str
    tag: str
    reference: str
    targets: Tuple[str, ...]

    def as_json(self) -> Dict[str, Any]:
        return {"capability": self.capability, "tag": self.tag, "reference": self.reference,
                "targets": list(self.targets)}


@dataclass(frozen=True)
class Publication:
    """published.json: where a release's images were published. No per-run facts (seconds, blob counts),
    so publishing the same release again gives the same bytes and signature."""

    tag: str
    release_sha256: str
    destination: str
    key_fingerprint: str
    images: Tuple[PublishedImage, ...] = ()
    indexes: Tuple[PublishedIndex, ...] = field(default_factory=tuple)

    def image(self, target: str) -> Optional[PublishedImage]:
        return next((i for i in self.images if i.target == target), None)

    def as_json(self) -> Dict[str, Any]:
        return {"schema": PUBLICATION_SCHEMA, "tag": self.tag, "release_sha256": self.release_sha256,
                "destination": self.destination, "key_fingerprint": self.key_fingerprint,
                "images": [i.as_json() for i in self.images], "indexes": [x.as_json() for x in self.indexes]}

    def to_bytes(self) -> bytes:
        return canonical_json(self.as_json())

    @classmethod
    def parse(cls, data: bytes, where: str, error: Type[QualifyError] = VerificationError) -> Publication:
        f = load(data, where, PUBLICATION_SCHEMA, error).only(
            "schema", "tag", "release_sha256", "destination", "key_fingerprint", "images", "indexes")
        images = []
        for i in f.items("images"):
            i.only("target", "reference", "tag", "digest", "source", "attestations", "predicate_types", "referrers")
            images.append(PublishedImage(i.text("target", mf.TARGET_NAME), i.text("reference"), i.text("tag"),
                                         i.text("digest", mf.DIGEST), i.text("source"), i.text("attestations"),
                                         i.texts("predicate_types"), i.text("referrers", empty=True)))
        indexes = [PublishedIndex(x.only("capability", "tag", "reference", "targets").text("capability"),
                                  x.text("tag"), x.text("reference"), x.texts("targets")) for x in f.items("indexes")]
        return cls(f.text("tag"), f.text("release_sha256", HEX), f.text("destination"), f.text("key_fingerprint"),
                   tuple(images), tuple(indexes))


def entries_by_target(entries: Sequence[ReleasedEntry]) -> Mapping[str, ReleasedEntry]:
    return {e.target: e for e in entries}


# --- the release statement (an attestation beside each published image) ---------------------------


RELEASE_STATEMENT_TYPE = "https://blackwell-qualify.dev/release-statement/v2"


@dataclass(frozen=True)
class ReleaseStatement:
    """What `nox -s publish` attests beside each image: which release (and promotion) the qualification
    statement next to it belongs to. `verify --image` chooses among attestations by this signed order.

    The qualification statement in the registry is the released manifest with its subject named for the
    published repository (`mf.with_subject_name`), signed at publish: `statement_sha256` is its payload's
    sha256; renamed back to `manifest_subject` it is the released manifest, `manifest_sha256` (release.json's,
    or the promotion record's after a promote). v1 had no statement_sha256 or manifest_subject: the released
    manifest itself was attested."""

    tag: str
    sequence: int
    promotion: int
    time: str
    release_sha256: str
    target: str
    manifest_sha256: str  # the released manifest file's sha256
    statement_sha256: str  # the published qualification statement's payload sha256
    manifest_subject: str  # the released manifest's subject name (the build host's repository)

    @property
    def order(self) -> ReleaseOrder:
        return ReleaseOrder.of(self.tag, self.sequence, self.promotion)

    def describe(self) -> str:
        return f"{self.tag} (sequence {self.sequence}, promotion {self.promotion})"

    def statement(self, name: str, digest: str) -> Dict[str, Any]:
        return mf.statement(name, digest, {
            "tag": self.tag, "sequence": self.sequence, "promotion": self.promotion, "time": self.time,
            "release_sha256": self.release_sha256, "target": self.target, "manifest_sha256": self.manifest_sha256,
            "statement_sha256": self.statement_sha256, "manifest_subject": self.manifest_subject,
        }) | {"predicateType": RELEASE_STATEMENT_TYPE}

    @classmethod
    def from_predicate(cls, predicate: Any, where: str) -> ReleaseStatement:
        f = Fields(predicate, where).only("tag", "sequence", "promotion", "time", "release_sha256", "target",
                                          "manifest_sha256", "statement_sha256", "manifest_subject")
        parse_time(f.text("time"), f"{where}: time")
        tag = f.text("tag")
        if tag_problem(tag):
            raise VerificationError(f"{where}: 'tag' is {tag_problem(tag)}")
        return cls(tag, f.integer("sequence", 1), f.integer("promotion"), f.text("time"),
                   f.text("release_sha256", HEX), f.text("target", mf.TARGET_NAME), f.text("manifest_sha256", HEX),
                   f.text("statement_sha256", HEX), f.text("manifest_subject"))


# --- the enrolled hosts (whose GPU evidence counts) -------------------------------------------------


HOSTS_SCHEMA = "https://blackwell-qualify.dev/enrolled-hosts/v2"
HOSTS_SCHEMA_V1 = "https://blackwell-qualify.dev/enrolled-hosts/v1"  # before the chain: read, never written
HOSTS_FILE = "hosts.json"  # manifests/hosts.json, committed: every release commit carries it
HOST_NAME = re.compile(r"[a-z0-9][a-z0-9._-]{0,62}")


@dataclass(frozen=True)
class EnrolledHost:
    """A host (or a CI job) whose signed GPU evidence `promote` counts: a public key, or a keyless identity
    (the certificate identity and OIDC issuer cosign checks, e.g. the release workflow's GPU job)."""

    name: str
    key_pem: str = ""  # PEM of the host's public key ("" for a keyless identity)
    fingerprint: str = ""
    identity: str = ""
    issuer: str = ""

    @property
    def keyless(self) -> bool:
        return not self.key_pem

    def same_signer(self, other: EnrolledHost) -> bool:
        return (self.fingerprint, self.identity, self.issuer) == (other.fingerprint, other.identity, other.issuer)

    def as_json(self) -> Dict[str, Any]:
        if self.keyless:
            return {"name": self.name, "keyless": {"identity": self.identity, "issuer": self.issuer}}
        return {"name": self.name, "key": {"pem": self.key_pem, "fingerprint": self.fingerprint}}


@dataclass(frozen=True)
class EnrolledHosts:
    """manifests/hosts.json, signed with the release key: whoever can write a release folder cannot enroll
    themselves. A chain: each version has a sequence one higher and names its predecessor's sha256 (None for
    the first of a chain, e.g. `hosts add --new-chain` after the file was lost)."""

    sequence: int
    hosts: Tuple[EnrolledHost, ...] = ()
    previous_sha256: Optional[str] = None
    legacy: bool = False  # an enrolled-hosts/v1 file (before the chain: no predecessor named)

    def host(self, name: str) -> Optional[EnrolledHost]:
        return next((h for h in self.hosts if h.name == name), None)

    def as_json(self) -> Dict[str, Any]:
        return {"schema": HOSTS_SCHEMA, "sequence": self.sequence, "previous_sha256": self.previous_sha256,
                "hosts": [h.as_json() for h in sorted(self.hosts, key=lambda h: h.name)]}

    def to_bytes(self) -> bytes:
        return canonical_json(self.as_json())

    @classmethod
    def parse(cls, data: bytes, where: str, error: Type[QualifyError] = VerificationError) -> EnrolledHosts:
        f = load(data, where, HOSTS_SCHEMA, error, legacy=HOSTS_SCHEMA_V1)
        legacy = f.doc.get("schema") == HOSTS_SCHEMA_V1
        f.only("schema", "sequence", "hosts", *(() if legacy else ("previous_sha256",)))
        previous = None if legacy else f.optional_text("previous_sha256")
        if previous is not None and not HEX.fullmatch(previous):
            raise error(f"{where}: 'previous_sha256' is not a sha256")
        hosts = []
        for h in f.items("hosts"):
            name = h.text("name", HOST_NAME)
            if "key" in h.doc:
                key = h.only("name", "key").obj("key").only("pem", "fingerprint")
                hosts.append(EnrolledHost(name, key_pem=key.text("pem"), fingerprint=key.text("fingerprint")))
            else:
                kl = h.only("name", "keyless").obj("keyless").only("identity", "issuer")
                hosts.append(EnrolledHost(name, identity=kl.text("identity"), issuer=kl.text("issuer")))
        if len({h.name for h in hosts}) != len(hosts):
            raise error(f"{where}: a host name is enrolled twice")
        return cls(f.integer("sequence", 1), tuple(hosts), previous, legacy)
