"""The release's publication record, manifests/<tag>/published.json: which
reference each target was published as (same digest), where its attestations
are, and the lines the release's tag message adds for it."""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Dict, List

from qualify.core import manifest as mf
from qualify.core.errors import ConfigError

RECORD_FILE = "published.json"
_TARGET = re.compile(r"[a-z0-9][a-z0-9-]{0,63}")
_SKIP = {"release.json", RECORD_FILE}
MAX_MANIFEST_BYTES = 8 * 1024 * 1024


@dataclass(frozen=True)
class ReleasedImage:
    """One target of a release, as its signed manifest names it."""

    target: str
    platform: str
    capability: str
    profile: str
    base_kind: str
    source: str  # name@sha256:... where it was built (the loopback registry)
    digest: str
    manifest: Path
    manifest_bytes: bytes = field(repr=False)


def released_images(release_dir: Path) -> List[ReleasedImage]:
    if not release_dir.is_dir():
        raise ConfigError(f"{release_dir}: no such release folder", hint="run `nox -s release -- TAG` first")
    out = []
    for path in sorted(release_dir.glob("*.json")):
        if path.name in _SKIP:
            continue
        target = path.stem
        if not _TARGET.fullmatch(target):
            raise ConfigError(f"{path}: {target!r} is not a target name (lower-case letters, digits, '-')")
        if path.stat().st_size > MAX_MANIFEST_BYTES:
            raise ConfigError(f"{path}: larger than {MAX_MANIFEST_BYTES} bytes; not a manifest")
        raw = path.read_bytes()
        try:
            stmt = json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError):
            raise ConfigError(f"{path}: not JSON; not a qualification manifest") from None
        try:
            subject = stmt["subject"][0]
            pred = stmt["predicate"]
            digest = "sha256:" + subject["digest"]["sha256"]
            out.append(ReleasedImage(
                target=target, platform=pred["target"]["platform"], capability=str(pred["target"]["capability"]),
                profile=pred["target"].get("profile", ""), base_kind=(pred.get("base") or {}).get("kind", ""),
                source=f"{subject['name']}@{digest}", digest=digest, manifest=path, manifest_bytes=raw))
        except (KeyError, IndexError, TypeError):
            raise ConfigError(f"{path}: not a qualification manifest (subject/predicate.target missing)") from None
        if stmt.get("predicateType") != mf.PREDICATE_TYPE:
            raise ConfigError(f"{path}: predicateType {stmt.get('predicateType')!r}, expected {mf.PREDICATE_TYPE!r}")
    if not out:
        raise ConfigError(f"{release_dir}: holds no target manifests")
    return out


@dataclass
class PublishedImage:
    target: str
    reference: str  # destination name@sha256:...
    tag: str  # destination name:TAG
    digest: str
    source: str
    attestations: str  # name:sha256-<hex>.att
    predicate_types: List[str]
    referrers: str  # "pushed", or why not
    seconds: float = 0.0
    blobs_skipped: int = 0
    blobs_sent: int = 0


@dataclass
class PublishedIndex:
    capability: str
    tag: str
    reference: str
    targets: List[str]


@dataclass
class PublicationRecord:
    tag: str
    destination: str
    key_fingerprint: str
    images: List[PublishedImage] = field(default_factory=list)
    indexes: List[PublishedIndex] = field(default_factory=list)
    schema_version: int = 1

    def as_dict(self) -> Dict[str, Any]:
        return asdict(self)


def tag_message_lines(record: PublicationRecord) -> List[str]:
    """Lines for the release tag's message (the release helper adds them; this module does not tag)."""
    lines = [f"Published to {record.destination}:"]
    lines += [f"  {i.target}  {i.reference}" for i in record.images]
    lines += [f"  {x.capability} (multi-platform: {', '.join(x.targets)})  {x.reference}" for x in record.indexes]
    lines.append(f"  attestations: cosign layout (sha256-<hex>.att), signed with {record.key_fingerprint}")
    return lines
