"""`nox -s publish -- TAG [--to REGISTRY/NAMESPACE]`: copy each image of a
release by digest to a registry, attach its attestations the way cosign does,
publish multi-platform indexes, and write manifests/<tag>/published.json.

Order per target: image (digest kept, or refused naming both digests), then
its attestations, then the record. Every step is idempotent: blobs the
destination has are skipped, so an interrupted publish is resumed by running
it again.
"""

from __future__ import annotations

import json
import re
import sys
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from qualify import __version__, skopeo
from qualify.build.registry import Registry
from qualify.config.targets import REPO_ROOT, lock_path
from qualify.core.errors import ConfigError, RegistryError
from qualify.core.fsutil import canonical_json, write_atomic
from qualify.core.manifest import PREDICATE_TYPE as QUALIFICATION_TYPE
from qualify.publish import dsse, interop, oci, referrers, sbom, slsa
from qualify.publish.record import (
    RECORD_FILE,
    PublicationRecord,
    PublishedImage,
    PublishedIndex,
    ReleasedImage,
    released_images,
)
from qualify.signing import formats
from qualify.signing import keys as cosign_keys

Progress = Callable[[str], None]
# host[:port]/namespace[/more]: lower case, as registries require.
_DEST = re.compile(r"(?P<host>[a-z0-9.-]+(?::\d{1,5})?)(?P<ns>(?:/[a-z0-9]+(?:[._-][a-z0-9]+)*)+)")
DESTINATION_ENV = "QUALIFY_PUBLISH_TO"


def stderr_progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


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
    key: Path
    password: bytes
    docker: str = "/usr/bin/docker"
    build_dir: Path = REPO_ROOT / "build" / "images"
    attest_build: bool = True  # SLSA + SBOM (need the build record and the engine)

    @property
    def release_dir(self) -> Path:
        return self.release_root / self.tag


def _insecure() -> Tuple[str, ...]:
    # Only the build host's own loopback registry speaks plain HTTP.
    return (Registry.from_env().address,)


def _copy_image(img: ReleasedImage, dest_tag: str, progress: Progress):
    result = skopeo.copy(f"docker://{img.source}", f"docker://{dest_tag}", label=img.target, progress=progress,
                         insecure_hosts=_insecure())
    served = oci.digest_of(skopeo.inspect_raw(f"docker://{dest_tag}", _insecure(), what=f"reading back {dest_tag}"))
    if served != img.digest:
        raise RegistryError(f"{img.target}: the destination serves {dest_tag} as {served}, but the release names "
                            f"{img.digest}; refusing a copy that changed the digest",
                            hint="the registry rewrote the manifest; publish to a registry that stores it as pushed")
    return result


def _build_record(opts: PublishOptions, img: ReleasedImage) -> Optional[dict]:
    path = opts.build_dir / f"{img.target}-{img.profile}-{img.base_kind}.json"
    if not path.is_file() or path.stat().st_size > 1024 * 1024:
        return None
    record = json.loads(path.read_text())
    return record if record.get("image_reference", "").endswith(img.digest) else None


def _sbom_statement(opts: PublishOptions, img: ReleasedImage, name: str, lock: Path, created: str) -> dict:
    debs = sbom.parse_dpkg_status(sbom.read_dpkg_status(opts.docker, img.source))
    document = sbom.bom(lock, debs, name, img.digest)
    # Same image, same SBOM bytes: serial number from the digest, time from the image's creation label.
    document.serial_number = uuid.uuid5(uuid.NAMESPACE_URL, f"{name}@{img.digest}")
    if created:
        import datetime as dt

        document.metadata.timestamp = dt.datetime.strptime(created, "%Y-%m-%dT%H:%M:%SZ").replace(
            tzinfo=dt.timezone.utc)
    return sbom.statement(name, img.digest, document)


def attestation_statements(opts: PublishOptions, img: ReleasedImage, name: str,
                           progress: Progress) -> List[Tuple[bytes, str]]:
    """(statement bytes, predicateType) for the image: the qualification manifest exactly as
    released, then SLSA provenance and the SBOM when the build record is here."""
    out = [(img.manifest_bytes, QUALIFICATION_TYPE)]
    if not opts.attest_build:
        return out
    record = _build_record(opts, img)
    if record is None:
        progress(f"  {img.target}: no build record for {img.digest} in {opts.build_dir}: "
                 "no SLSA provenance or SBOM (publish from the build host to attach them)")
        return out
    python = "3.11" if img.base_kind == "hermetic" else None
    lock = _lock_for(img, record, python)
    facts = slsa.facts_from_record(record, lock, __version__)
    out.append((canonical_json(slsa.statement(name, img.digest, facts)), slsa.PREDICATE_TYPE))
    created = (record.get("labels") or {}).get("org.opencontainers.image.created", "")
    out.append((canonical_json(_sbom_statement(opts, img, name, lock, created)), sbom.PREDICATE_TYPE))
    return out


def _lock_for(img: ReleasedImage, record: dict, python: Optional[str]) -> Path:
    from qualify.config import targets as cfg

    tf = cfg.load()
    py = tf.get(img.target).python_for(img.base_kind, tf.hermetic) if img.target in tf.targets else python
    lock = lock_path(img.profile, img.platform, py or "3.11")
    label = (record.get("labels") or {}).get("dev.blackwell-qualify.lock.sha256", "")
    from qualify.core.fsutil import sha256_file

    if not lock.is_file() or (label and sha256_file(lock) != label):
        raise ConfigError(f"{lock}: not the lock {img.target} was built with (label lock.sha256 {label[:12]}...)",
                          hint="check out the release's source revision and publish again")
    return lock


def push_document(doc: oci.Document, dest: str, label: str, progress: Progress, extra: Sequence[str] = ()) -> None:
    with tempfile.TemporaryDirectory(prefix="qualify-oci-") as tmp:
        oci.write_layout(Path(tmp), doc, "push")
        skopeo.copy(f"oci:{tmp}:push", f"docker://{dest}", label=label, progress=progress, extra=extra,
                    insecure_hosts=_insecure())


def attach(opts: PublishOptions, img: ReleasedImage, repo_ref: str, private_key,
           progress: Progress) -> Tuple[str, List[str], str]:
    statements = attestation_statements(opts, img, repo_ref, progress)
    envelopes = [(dsse.sign(private_key, body).to_json(), ptype) for body, ptype in statements]
    att_ref = f"{repo_ref}:{oci.att_tag(img.digest)}"
    push_document(oci.attestation_image(envelopes), att_ref, f"{img.target} attestations", progress)
    host, repository = repo_ref.split("/", 1)
    answer = referrers.supported(host, repository, img.digest)
    if answer is None:
        note = "not pushed: the referrers API could not be queried"
    elif not answer:
        note = "not pushed: the registry has no OCI 1.1 referrers API (cosign's tag scheme is used)"
    else:
        note = _push_referrers(img, repo_ref, private_key, statements, progress)
    progress(f"  {img.target}: attestations at {att_ref} ({', '.join(p for _, p in statements)}); referrers {note}")
    return att_ref, [p for _, p in statements], note


def _push_referrers(img, repo_ref, private_key, statements, progress) -> str:
    # Not exercised here: Debian's distribution 2.8 has no referrers API.
    manifest = skopeo.inspect_raw(f"docker://{repo_ref}@{img.digest}", _insecure())
    media = json.loads(manifest).get("mediaType", oci.OCI_MANIFEST)
    subject = oci.Descriptor(media, img.digest, len(manifest))
    for body, ptype in statements:
        envelope = dsse.sign(private_key, body)
        bundle = formats.bundle_bytes(interop.dsse_bundle(envelope, private_key.public_key()))
        doc = oci.bundle_referrer(bundle, subject, ptype, "1970-01-01T00:00:00Z")
        push_document(doc, f"{repo_ref}@{doc.digest}", f"{img.target} referrer", progress)
    return "pushed"


def _groups(images: Sequence[ReleasedImage]) -> Dict[str, List[ReleasedImage]]:
    by_cap: Dict[str, List[ReleasedImage]] = {}
    for img in images:
        by_cap.setdefault(img.capability, []).append(img)
    return {cap: imgs for cap, imgs in by_cap.items() if len({i.platform for i in imgs}) > 1}


def publish_index(opts: PublishOptions, cap: str, imgs: List[ReleasedImage], progress: Progress) -> PublishedIndex:
    """One tag for a capability built for several platforms: an OCI index in `cc<major><minor>`,
    whose children are copied into that repository first (a registry refuses dangling children)."""
    name = "cc" + cap.replace(".", "")
    repo_ref = opts.destination.ref(name)
    children = []
    for img in sorted(imgs, key=lambda i: i.platform):
        skopeo.copy(f"docker://{img.source}", f"docker://{repo_ref}@{img.digest}", label=f"{img.target} into {name}",
                    progress=progress, insecure_hosts=_insecure())
        raw = skopeo.inspect_raw(f"docker://{repo_ref}@{img.digest}", _insecure())
        media = json.loads(raw).get("mediaType") or oci.OCI_MANIFEST
        os_, arch = img.platform.split("/", 1)
        children.append(oci.Descriptor(media, img.digest, len(raw), platform=(os_, arch)))
    doc = oci.index(children, {"org.opencontainers.image.ref.name": opts.tag,
                               "dev.blackwell-qualify.capability": cap})
    dest = f"{repo_ref}:{opts.tag}"
    push_document(doc, dest, f"{name} index", progress, extra=["--multi-arch", "index-only"])
    served = oci.digest_of(skopeo.inspect_raw(f"docker://{dest}", _insecure()))
    if served != doc.digest:
        raise RegistryError(f"{dest}: the registry serves {served}, not the index we pushed ({doc.digest})")
    return PublishedIndex(cap, dest, f"{repo_ref}@{doc.digest}", [i.target for i in imgs])


def publish(opts: PublishOptions, progress: Progress = stderr_progress) -> PublicationRecord:
    images = released_images(opts.release_dir)
    key = cosign_keys.load_private_key(formats._read(opts.key, "private key"), opts.password, what=str(opts.key))
    formats._require_p256(key, str(opts.key))
    record = PublicationRecord(opts.tag, str(opts.destination), cosign_keys.fingerprint(key.public_key()))
    for img in images:
        repo_ref = opts.destination.ref(img.target)
        dest_tag = f"{repo_ref}:{opts.tag}"
        progress(f"[publish] {img.target}: {img.source} -> {dest_tag}")
        copied = _copy_image(img, dest_tag, progress)
        att_ref, types, note = attach(opts, img, repo_ref, key, progress)
        record.images.append(PublishedImage(
            target=img.target, reference=f"{repo_ref}@{img.digest}", tag=dest_tag, digest=img.digest,
            source=img.source, attestations=att_ref, predicate_types=types, referrers=note,
            seconds=copied.seconds, blobs_skipped=len(copied.skipped), blobs_sent=len(copied.copied)))
        progress(f"[publish] {img.target}: {repo_ref}@{img.digest} ({copied.seconds:.1f} s, "
                 f"{len(copied.copied)} blobs sent, {len(copied.skipped)} already there)")
    for cap, imgs in sorted(_groups(images).items()):
        record.indexes.append(publish_index(opts, cap, imgs, progress))
    write_record(opts.release_dir, record, key)
    return record


def write_record(release_dir: Path, record: PublicationRecord, private_key) -> Path:
    """published.json (canonical JSON) and its signature and bundle, in cosign's blob formats."""
    data = canonical_json(record.as_dict())
    sig = formats.sign_bytes(private_key, data)
    path = release_dir / RECORD_FILE
    write_atomic(formats.signature_path(path), formats.encode_signature(sig))
    write_atomic(formats.bundle_path(path), formats.bundle_bytes(formats.make_bundle(data, sig,
                                                                                     private_key.public_key())))
    write_atomic(path, data)  # last: present means complete
    return path
