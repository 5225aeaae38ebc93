"""`nox -s publish -- TAG [--to REGISTRY/NAMESPACE]`: copy each image of a
release by digest to a registry, attach its attestations the way cosign does,
publish multi-platform indexes, and write manifests/<tag>/published.json.

The release is read through release/folder.py with the public half of the
release key given (it must be the release's own key): only targets its signed
index lists are published, from verified bytes.

Order per target: the image by digest (digest kept, or refused naming both
digests), then its attestations (the qualification statement named for the
published repository, the release statement binding it to the released
manifest, SLSA, SBOM; what they supersede at the attestation tag is said:
supersede.py), and only then the version tag `<target>:<tag>`, so an interrupted
publish never leaves a version-tagged image without its attestations. The
record comes last. Every step is idempotent: blobs the destination has are
skipped, so an interrupted publish is resumed by running it again, and the
record holds no per-run facts, so a re-run writes the same bytes.
"""

from __future__ import annotations

import hashlib
import re
import tempfile
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from qualify import __version__
from qualify.config.targets import load as load_targets
from qualify.config.targets import lock_path
from qualify.core import manifest as mf
from qualify.core.errors import ConfigError, RegistryError
from qualify.core.fsutil import canonical_json
from qualify.core.manifest import PREDICATE_TYPE as QUALIFICATION_TYPE
from qualify.core.readlimit import strict_json
from qualify.core.report import Progress, Reporter
from qualify.host import clients, paths, skopeo, workcontainers
from qualify.host.engine import Engine
from qualify.host.registry import Registry
from qualify.imagebuild import image, wheelhouse
from qualify.publish import dsse, imagefs, oci, referrers, sbom, slsa, supersede
from qualify.signing import formats
from qualify.signing.signer import Signer
from qualify.trust import records as rec
from qualify.trust.folder import read_release
from qualify.trust.journal import release_lock, write_signed_files
from qualify.trust.verify import KeyAnchor, TrustedKey, VerifiedRelease, VerifiedTarget

# host[:port]/namespace[/more]: lower case, as registries require.
_DEST = re.compile(r"(?P<host>[a-z0-9.-]+(?::\d{1,5})?)(?P<ns>(?:/[a-z0-9]+(?:[._-][a-z0-9]+)*)+)")
DESTINATION_ENV = "QUALIFY_PUBLISH_TO"


stderr_progress = Reporter("publish")


@dataclass(frozen=True)
class Destination:
    host: str
    namespace: str  # without leading slash

    @classmethod
    def parse(cls, text: str, where: str = "--to") -> Destination:
        m = _DEST.fullmatch(text.strip())
        if not m:
            raise ConfigError(f"{where}: {text!r} is not REGISTRY/NAMESPACE (e.g. ghcr.io/acme/blackwell)",
                              hint="lower-case host[:port] followed by at least one path part")
        return cls(m.group("host"), m.group("ns").lstrip("/"))

    def repository(self, name: str) -> str:
        return f"{self.namespace}/{name}"

    def ref(self, name: str) -> str:
        return f"{self.host}/{self.repository(name)}"

    def __str__(self) -> str:
        return f"{self.host}/{self.namespace}"


@dataclass(frozen=True)
class PublishOptions:
    tag: str
    destination: Destination
    release_root: Path  # manifests/
    signer: Signer = field(repr=False)  # the release key's: every attestation and published.json
    docker: str = clients.DEBIAN_DOCKER
    build_dir: Path = paths.HERE.build_records
    attest_build: bool = True  # SLSA + SBOM (need the build record and the engine)
    @property
    def release_dir(self) -> Path:
        return self.release_root / self.tag


def _insecure() -> Tuple[str, ...]:
    # Only the build host's own loopback registry speaks plain HTTP.
    return (Registry.from_env().address,)


def _copy_image(img: VerifiedTarget, dest: str, progress: Progress, source: str = ""):
    """Copy to `dest` (by digest, or the version tag at the end) and read back what it serves there."""
    result = skopeo.copy(f"docker://{source or img.manifest.subject}", f"docker://{dest}", label=img.target, progress=progress,
                         insecure_hosts=_insecure())
    served = oci.digest_of(skopeo.inspect_raw(f"docker://{dest}", _insecure(), what=f"reading back {dest}"))
    if served != img.manifest.digest:
        raise RegistryError(f"{img.target}: the destination serves {dest} as {served}, but the release names "
                            f"{img.manifest.digest}; refusing a copy that changed the digest",
                            hint="the registry rewrote the manifest; publish to a registry that stores it as pushed")
    return result


def _build_record(opts: PublishOptions, img: VerifiedTarget) -> Optional[image.BuildRecord]:
    """This host's record of the build the release names (by digest); None when it has none."""
    path = opts.build_dir / paths.build_record_name(img.target, img.manifest.profile, img.manifest.base_kind)
    if not path.is_file():
        return None
    record = image.read_record(path)
    return record if record.digest == img.manifest.digest else None


def _sbom_statement(opts: PublishOptions, img: VerifiedTarget, name: str, record: image.BuildRecord, lock: Path,
                    created: str, progress: Progress) -> dict:
    engine = Engine("docker", binary=opts.docker)
    for left in workcontainers.sweep(engine.binary):
        progress(f"  {img.target}: SBOM: {left.line()}")
    with engine.exported_filesystem(img.manifest.subject) as stream:
        contents = imagefs.read_contents(stream, img.manifest.subject)
    for problem in contents.problems:
        progress(f"  {img.target}: SBOM: {problem}")
    venv = {(d.name, d.version) for d in contents.python if d.location.startswith(sbom.PAYLOAD_VENV)}
    missing = [f"{p.name}=={p.version}" for p in wheelhouse.parse_lock(lock) if (p.name, p.version) not in venv]
    if missing:
        progress(f"  {img.target}: SBOM: {len(missing)} package(s) of {lock.name} are not in {sbom.PAYLOAD_VENV}: "
                 f"{', '.join(missing[:5])}")
    document = sbom.bom(contents, name, img.manifest.digest, record.wheels)
    # Same image, same SBOM bytes: serial number from the digest, time from the image's creation label.
    document.serial_number = uuid.uuid5(uuid.NAMESPACE_URL, f"{name}@{img.manifest.digest}")
    if created:
        import datetime as dt

        document.metadata.timestamp = dt.datetime.strptime(created, "%Y-%m-%dT%H:%M:%SZ").replace(
            tzinfo=dt.timezone.utc)
    progress(f"  {img.target}: SBOM: {len(contents.debs)} Debian packages, {len(contents.python)} Python "
             f"distributions, {len(contents.cuda_wheels)} CUDA wheels ({contents.members} filesystem entries read)")
    return sbom.statement(name, img.manifest.digest, document)


def published_statement(img: VerifiedTarget, name: str) -> bytes:
    """The released manifest with its subject named for the published repository, as publish signs it. Renamed
    back it must be the released bytes, or the release statement could not bind the two."""
    published = mf.with_subject_name(img.manifest_bytes, name, f"{img.target}.json")
    released_name = mf.subject_name(img.manifest.statement)
    if mf.with_subject_name(published, released_name, f"{img.target}.json") != img.manifest_bytes:
        raise ConfigError(f"{img.target}.json of the release is not canonical JSON (as qualify writes it), so its "
                          "published statement cannot be bound to it",
                          hint="qualify the image again and release it again")
    return published


def release_statement(release: VerifiedRelease, img: VerifiedTarget, published: bytes) -> rec.ReleaseStatement:
    return rec.ReleaseStatement(release.tag, release.index.sequence, img.promotion_sequence, release.index.time,
                                release.index_sha256, img.target, img.manifest_sha256,
                                hashlib.sha256(published).hexdigest(), mf.subject_name(img.manifest.statement))


def attestation_statements(opts: PublishOptions, release: VerifiedRelease, img: VerifiedTarget, name: str,
                           progress: Progress, tf=None) -> List[Tuple[bytes, str]]:
    """(statement bytes, predicateType) for the image: the qualification manifest as released with its subject
    named `name` (the published repository), the release statement that binds it to the released manifest and
    says which release (and promotion) it is, then SLSA provenance and the SBOM when the build record is here."""
    published = published_statement(img, name)
    statement = release_statement(release, img, published).statement(name, img.manifest.digest)
    out = [(published, QUALIFICATION_TYPE), (canonical_json(statement), rec.RELEASE_STATEMENT_TYPE)]
    if not opts.attest_build:
        return out
    record = _build_record(opts, img)
    if record is None:
        progress(f"  {img.target}: no build record for {img.manifest.digest} in {opts.build_dir}: "
                 "no SLSA provenance or SBOM (publish from the build host to attach them)")
        return out
    lock = _lock_for(img, record, tf if tf is not None else load_targets())
    facts = slsa.facts_from_record(record, lock, __version__)
    out.append((canonical_json(slsa.statement(name, img.manifest.digest, facts)), slsa.PREDICATE_TYPE))
    created = record.labels.get(paths.OCI_CREATED, "")
    out.append((canonical_json(_sbom_statement(opts, img, name, record, lock, created, progress)), sbom.PREDICATE_TYPE))
    return out


def _lock_for(img: VerifiedTarget, record: image.BuildRecord, tf) -> Path:
    """The lock the image was built with, by the interpreter the targets file gives its base (never a Python
    version of our own), checked against the build's label."""
    from qualify.core.fsutil import sha256_file

    if img.target in tf.targets:
        python = tf.get(img.target).python_for(img.manifest.base_kind, tf.hermetic)
    elif img.manifest.base_kind == "hermetic":
        python = tf.hermetic.python
    else:
        raise ConfigError(f"{img.target} is not a target of {tf.path}, so the lock its image was built with is not known",
                          hint="check out the release's source revision and publish again")
    lock = lock_path(img.manifest.profile, img.manifest.platform, python)
    label = record.labels.get(paths.LABEL_LOCK_SHA256, "")
    if not lock.is_file() or (label and sha256_file(lock) != label):
        raise ConfigError(f"{lock}: not the lock {img.target} was built with (label lock.sha256 {label[:12]}...)",
                          hint="check out the release's source revision and publish again")
    return lock


@dataclass(frozen=True)
class Attached:
    """One image's attestations as this publish left them, and what it found there before."""

    reference: str  # name:sha256-<hex>.att
    predicate_types: Tuple[str, ...]
    referrers: str
    plan: supersede.Plan

    @property
    def superseded(self) -> Tuple[str, ...]:
        return self.plan.superseded


def push_document(doc: oci.Document, dest: str, label: str, progress: Progress, extra: Sequence[str] = ()) -> None:
    with tempfile.TemporaryDirectory(prefix="qualify-oci-") as tmp:
        oci.write_layout(Path(tmp), doc, "push")
        skopeo.copy(f"oci:{tmp}:push", f"docker://{dest}", label=label, progress=progress, extra=extra,
                    insecure_hosts=_insecure())


def attach(opts: PublishOptions, release: VerifiedRelease, img: VerifiedTarget, repo_ref: str, progress: Progress,
           tf=None) -> Attached:
    statements = attestation_statements(opts, release, img, repo_ref, progress, tf)
    att_ref = f"{repo_ref}:{oci.att_tag(img.manifest.digest)}"
    ours = release_statement(release, img, statements[0][0])
    done = supersede.plan(supersede.found(repo_ref, img.manifest.digest, release.key), statements, ours,
                          f"attestations at {att_ref}")
    for line in done.lines(img.target, att_ref):
        progress(line)
    if done.push:
        envelopes = [(dsse.sign(opts.signer, body).to_json(), ptype) for body, ptype in statements]
        push_document(oci.attestation_image([*envelopes, *done.kept]), att_ref, f"{img.target} attestations", progress)
    host, repository = repo_ref.split("/", 1)
    answer = referrers.supported(host, repository, img.manifest.digest)
    if answer is None:
        note = "not pushed: the referrers API could not be queried"
    elif not answer:
        note = "not pushed: the registry has no OCI 1.1 referrers API (cosign's tag scheme is used)"
    elif not done.push:
        note = "not pushed: a newer release's attestations are there"
    else:
        note = _push_referrers(img, repo_ref, opts.signer, statements, progress)
    progress(f"  {img.target}: attestations at {att_ref} ({', '.join(p for _, p in statements)}); referrers {note}")
    carried = tuple(p for _, p in done.kept if p in supersede.CARRIED) if done.push else ()
    return Attached(att_ref, tuple(p for _, p in statements) + carried, note, done)


def _push_referrers(img, repo_ref, signer: Signer, statements, progress) -> str:
    # Not exercised here: Debian's distribution 2.8 has no referrers API.
    manifest = skopeo.inspect_raw(f"docker://{repo_ref}@{img.manifest.digest}", _insecure())
    media = strict_json(manifest, f"{repo_ref}@{img.manifest.digest}: its manifest", RegistryError).get(
        "mediaType", oci.OCI_MANIFEST)
    subject = oci.Descriptor(media, img.manifest.digest, len(manifest))
    for body, ptype in statements:
        envelope = dsse.sign(signer, body)
        bundle = formats.bundle_bytes(dsse.sigstore_bundle(envelope, signer.public_key()))
        doc = oci.bundle_referrer(bundle, subject, ptype, "1970-01-01T00:00:00Z")
        push_document(doc, f"{repo_ref}@{doc.digest}", f"{img.target} referrer", progress)
    return "pushed"


def _groups(images: Sequence[VerifiedTarget]) -> Dict[str, List[VerifiedTarget]]:
    by_cap: Dict[str, List[VerifiedTarget]] = {}
    for img in images:
        by_cap.setdefault(img.manifest.capability, []).append(img)
    return {cap: imgs for cap, imgs in by_cap.items() if len({i.manifest.platform for i in imgs}) > 1}


def publish_index(opts: PublishOptions, cap: str, imgs: List[VerifiedTarget], progress: Progress) -> rec.PublishedIndex:
    """One tag for a capability built for several platforms: an OCI index in `cc<major><minor>`,
    whose children are copied into that repository first (a registry refuses dangling children)."""
    name = "cc" + cap.replace(".", "")
    repo_ref = opts.destination.ref(name)
    children = []
    for m in sorted((t.manifest for t in imgs), key=lambda m: m.platform):
        skopeo.copy(f"docker://{m.subject}", f"docker://{repo_ref}@{m.digest}", label=f"{m.target} into {name}",
                    progress=progress, insecure_hosts=_insecure())
        raw = skopeo.inspect_raw(f"docker://{repo_ref}@{m.digest}", _insecure())
        media = strict_json(raw, f"{repo_ref}@{m.digest}: its manifest", RegistryError).get("mediaType") \
            or oci.OCI_MANIFEST
        os_, arch = m.platform.split("/", 1)
        children.append(oci.Descriptor(media, m.digest, len(raw), platform=(os_, arch)))
    doc = oci.index(children, {paths.OCI_REF_NAME: opts.tag, paths.LABEL_CAPABILITY: cap})
    dest = f"{repo_ref}:{opts.tag}"
    push_document(doc, dest, f"{name} index", progress, extra=["--multi-arch", "index-only"])
    served = oci.digest_of(skopeo.inspect_raw(f"docker://{dest}", _insecure()))
    if served != doc.digest:
        raise RegistryError(f"{dest}: the registry serves {served}, not the index we pushed ({doc.digest})")
    return rec.PublishedIndex(cap, dest, f"{repo_ref}@{doc.digest}", tuple(i.target for i in imgs))


def read_signed_release(opts: PublishOptions) -> VerifiedRelease:
    """The release, verified with the public half of the signer that signs the attestations: a release signed
    with another key is not published under this one."""
    return read_release(opts.release_dir, KeyAnchor(trusted=TrustedKey.of_signer(opts.signer, "the publishing key")))


@dataclass(frozen=True)
class Published:
    """What a publish did: the signed record (the same bytes every run) and this run's own copies."""

    record: rec.Publication
    copies: Dict[str, skopeo.CopyResult]  # per target: seconds, blobs sent, blobs the registry had
    attached: Dict[str, Attached] = field(default_factory=dict)  # per target: what its attestation tag holds now


def publish(opts: PublishOptions, progress: Progress = stderr_progress) -> Published:
    if not opts.release_dir.is_dir():
        raise ConfigError(f"{opts.release_dir}: no such release folder", hint="run `nox -s release -- TAG` first")
    with release_lock(opts.release_dir):  # the folder's one writer at a time (release, promote, publish)
        return _publish(opts, progress)


def _publish(opts: PublishOptions, progress: Progress) -> Published:
    release = read_signed_release(opts)
    images = list(release.targets)  # every target the signed index lists, nothing else in the folder
    tf = load_targets() if opts.attest_build else None  # once per publish, not once per image
    published, copies, attachments = [], {}, {}
    for img in images:
        repo_ref = opts.destination.ref(img.target)
        by_digest, dest_tag = f"{repo_ref}@{img.manifest.digest}", f"{repo_ref}:{opts.tag}"
        progress(f"[publish] {img.target}: {img.manifest.subject} -> {by_digest}")
        copied = copies[img.target] = _copy_image(img, by_digest, progress)
        attached = attachments[img.target] = attach(opts, release, img, repo_ref, progress, tf)
        _copy_image(img, dest_tag, progress, source=by_digest)  # the version tag last: attested before it is named
        published.append(rec.PublishedImage(
            target=img.target, reference=by_digest, tag=dest_tag, digest=img.manifest.digest, source=img.manifest.subject,
            attestations=attached.reference, predicate_types=attached.predicate_types, referrers=attached.referrers))
        progress(f"[publish] {img.target}: {by_digest}, tagged {opts.tag} ({copied.seconds:.1f} s, "
                 f"{len(copied.copied)} blobs sent, {len(copied.skipped)} already there)")
    indexes = tuple(publish_index(opts, cap, imgs, progress) for cap, imgs in sorted(_groups(images).items()))
    record = rec.Publication(opts.tag, release.index_sha256, str(opts.destination), release.key.fingerprint,
                             tuple(published), indexes)
    write_record(opts, record, release.key)
    return Published(record, copies, attachments)


def write_record(opts: PublishOptions, record: rec.Publication, public: TrustedKey) -> Path:
    """published.json and its signature and bundle (cosign's blob formats), replaced together."""
    write_signed_files(opts.release_dir, [(rec.PUBLICATION_FILE, record.to_bytes())], opts.signer, public)
    return opts.release_dir / rec.PUBLICATION_FILE
