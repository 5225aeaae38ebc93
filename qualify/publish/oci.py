"""OCI documents we write and read: cosign's attestation image (`sha256-<hex>.att`),
an OCI 1.1 referrer holding a Sigstore bundle, a multi-platform index, and the
OCI image layout folder skopeo pushes them from.

Layouts as cosign writes them (sigstore/cosign pkg/oci/static/signature.go,
pkg/oci/empty/empty.go, cmd/cosign/cli/attest/attest.go): an OCI image
manifest whose config is go-containerregistry's empty image config and whose
layers are DSSE envelopes, media type application/vnd.dsse.envelope.v1+json,
annotations `dev.cosignproject.cosign/signature: ""` (the signature is inside
the envelope) and `predicateType`.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from qualify.core.errors import VerificationError
from qualify.core.fsutil import write_atomic
from qualify.core.readlimit import strict_json
from qualify.host import paths
from qualify.publish.dsse import ENVELOPE_MEDIA_TYPE

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
OCI_EMPTY = "application/vnd.oci.empty.v1+json"
BUNDLE_V03 = "application/vnd.dev.sigstore.bundle.v0.3+json"
SIGNATURE_ANNOTATION = "dev.cosignproject.cosign/signature"
PREDICATE_TYPE_ANNOTATION = "predicateType"
MAX_LAYERS = 64


def digest_of(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def dumps(doc: Mapping) -> bytes:
    return json.dumps(doc, separators=(",", ":"), sort_keys=True).encode("utf-8")


def att_tag(image_digest: str) -> str:
    """cosign v2's tag for an image's attestations: sha256:<hex> -> sha256-<hex>.att."""
    algo, _, hexpart = image_digest.partition(":")
    if algo != "sha256" or len(hexpart) != 64:
        raise ValueError(f"not a sha256 digest: {image_digest!r}")
    return f"sha256-{hexpart}.att"


@dataclass(frozen=True)
class Descriptor:
    media_type: str
    digest: str
    size: int
    annotations: Tuple[Tuple[str, str], ...] = ()
    platform: Optional[Tuple[str, str]] = None  # (os, architecture)

    def as_json(self) -> Dict:
        doc: Dict = {"mediaType": self.media_type, "digest": self.digest, "size": self.size}
        if self.annotations:
            doc["annotations"] = dict(self.annotations)
        if self.platform:
            doc["platform"] = {"os": self.platform[0], "architecture": self.platform[1]}
        return doc


@dataclass(frozen=True)
class Document:
    """A manifest and the blobs it needs pushed with it."""

    manifest: bytes
    media_type: str
    blobs: Tuple[Tuple[str, bytes], ...]

    @property
    def digest(self) -> str:
        return digest_of(self.manifest)


def attestation_image(layers: Sequence[Tuple[bytes, str]]) -> Document:
    """cosign's `.att` image: one layer per (DSSE envelope JSON, predicateType)."""
    descs = [Descriptor(ENVELOPE_MEDIA_TYPE, digest_of(env), len(env),
                        ((PREDICATE_TYPE_ANNOTATION, ptype), (SIGNATURE_ANNOTATION, ""))) for env, ptype in layers]
    # go-containerregistry's config for empty.Image plus appended layers (what cosign pushes).
    config = dumps({
        "architecture": "", "created": "0001-01-01T00:00:00Z", "os": "",
        "history": [{"created": "0001-01-01T00:00:00Z"} for _ in layers],
        "rootfs": {"type": "layers", "diff_ids": [d.digest for d in descs]}, "config": {},
    })
    manifest = dumps({
        "schemaVersion": 2, "mediaType": OCI_MANIFEST,
        "config": Descriptor(OCI_CONFIG, digest_of(config), len(config)).as_json(),
        "layers": [d.as_json() for d in descs],
    })
    return Document(manifest, OCI_MANIFEST, ((digest_of(config), config), *((digest_of(e), e) for e, _ in layers)))


def bundle_referrer(bundle: bytes, subject: Descriptor, predicate_type: str, created: str) -> Document:
    """What cosign v3 pushes where the registry has the referrers API: an OCI 1.1
    artifact manifest, artifactType the bundle media type, subject the image."""
    empty = b"{}"
    manifest = dumps({
        "schemaVersion": 2, "mediaType": OCI_MANIFEST, "artifactType": BUNDLE_V03,
        "config": Descriptor(OCI_EMPTY, digest_of(empty), len(empty)).as_json(),
        "layers": [Descriptor(BUNDLE_V03, digest_of(bundle), len(bundle)).as_json()],
        "subject": subject.as_json(),
        "annotations": {"dev.sigstore.bundle.content": "dsse-envelope",
                        "dev.sigstore.bundle.predicateType": predicate_type,
                        paths.OCI_CREATED: created},
    })
    return Document(manifest, OCI_MANIFEST, ((digest_of(empty), empty), (digest_of(bundle), bundle)))


def index(children: Sequence[Descriptor], annotations: Mapping[str, str]) -> Document:
    manifest = dumps({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": [c.as_json() for c in children],
                      "annotations": dict(annotations)})
    return Document(manifest, OCI_INDEX, ())


def write_layout(folder: Path, doc: Document, tag: str) -> Path:
    """An OCI image layout (oci-layout, index.json, blobs/sha256/) holding `doc` under `tag`."""
    blobs = folder / "blobs" / "sha256"
    blobs.mkdir(parents=True, exist_ok=True)
    for digest, data in (*doc.blobs, (doc.digest, doc.manifest)):
        write_atomic(blobs / digest.split(":", 1)[1], data)
    write_atomic(folder / "oci-layout", dumps({"imageLayoutVersion": "1.0.0"}))
    top = Descriptor(doc.media_type, doc.digest, len(doc.manifest), ((paths.OCI_REF_NAME, tag),))
    write_atomic(folder / "index.json", dumps({"schemaVersion": 2, "manifests": [top.as_json()]}))
    return folder


@dataclass(frozen=True)
class AttLayer:
    digest: str
    size: int
    media_type: str
    predicate_type: str


def parse_attestation_image(raw: bytes, what: str) -> List[AttLayer]:
    doc = strict_json(raw, f"{what}: the manifest", VerificationError)
    layers = doc.get("layers") if isinstance(doc, dict) else None
    if not isinstance(layers, list) or not layers or len(layers) > MAX_LAYERS:
        raise VerificationError(f"{what}: not an attestation image (layers: {type(layers).__name__})")
    out = []
    for i, layer in enumerate(layers):
        ok = isinstance(layer, dict) and isinstance(layer.get("digest"), str) and isinstance(layer.get("size"), int)
        if not ok:
            raise VerificationError(f"{what}: layer {i} is not a descriptor")
        ann = layer.get("annotations") or {}
        out.append(AttLayer(layer["digest"], layer["size"], str(layer.get("mediaType", "")),
                            str(ann.get(PREDICATE_TYPE_ANNOTATION, "")) if isinstance(ann, dict) else ""))
    return out
