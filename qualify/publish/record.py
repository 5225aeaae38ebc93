"""What publishing takes from a verified release (one image per target) and the lines the release's tag
message adds for it. The publication record's format, manifests/<tag>/published.json, is a signed
release record (release/records.py: Publication), read back only by release/folder.py."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List

from qualify.release.folder import VerifiedRelease, VerifiedTarget
from qualify.release.records import PUBLICATION_FILE as RECORD_FILE  # noqa: F401  (the CLI names it)
from qualify.release.records import Publication, PublishedImage, PublishedIndex  # noqa: F401


@dataclass(frozen=True)
class ReleasedImage:
    """One target of a verified release, as publishing needs it."""

    target: str
    platform: str
    capability: str
    profile: str
    base_kind: str
    source: str  # name@sha256:... where it was built (the loopback registry)
    digest: str
    manifest_sha256: str
    promotion: int
    manifest_bytes: bytes = field(repr=False)

    @classmethod
    def of(cls, t: VerifiedTarget) -> ReleasedImage:
        m = t.manifest
        return cls(t.target, m.platform, m.capability, m.profile, m.base_kind, f"{m.subject_name}@{m.digest}",
                   m.digest, t.manifest_sha256, t.promotion_sequence, t.manifest_bytes)


def released_images(release: VerifiedRelease) -> List[ReleasedImage]:
    """Every target the release's signed index lists (and nothing else in its folder)."""
    return [ReleasedImage.of(t) for t in release.targets]


def tag_message_lines(record: Publication) -> List[str]:
    """Lines for the release tag's message (the release helper adds them; this module does not tag)."""
    lines = [f"Published to {record.destination}:"]
    lines += [f"  {i.target}  {i.reference}" for i in record.images]
    lines += [f"  {x.capability} (multi-platform: {', '.join(x.targets)})  {x.reference}" for x in record.indexes]
    lines.append(f"  attestations: cosign layout (sha256-<hex>.att), signed with {record.key_fingerprint}")
    return lines
