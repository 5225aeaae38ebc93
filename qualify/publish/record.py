"""The lines a publication adds to the release's tag message. What publishing takes from a release is its
VerifiedRelease (release/folder.py): each VerifiedTarget's typed manifest, never a re-parse. The
publication record's format, manifests/<tag>/published.json, is a signed release record
(release/records.py: Publication), read back only by release/folder.py."""

from __future__ import annotations

from typing import List

from qualify.trust.records import PUBLICATION_FILE as RECORD_FILE  # noqa: F401  (the CLI names it)
from qualify.trust.records import Publication, PublishedImage, PublishedIndex  # noqa: F401


def tag_message_lines(record: Publication) -> List[str]:
    """Lines for the release tag's message (the release helper adds them; this module does not tag)."""
    lines = [f"Published to {record.destination}:"]
    lines += [f"  {i.target}  {i.reference}" for i in record.images]
    lines += [f"  {x.capability} (multi-platform: {', '.join(x.targets)})  {x.reference}" for x in record.indexes]
    lines.append(f"  attestations: cosign layout (sha256-<hex>.att), signed with {record.key_fingerprint}")
    return lines
