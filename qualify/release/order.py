"""Release names and their order: which tag names a release may have, and which of two releases is newer.

Releases are ordered as TUF orders metadata, by what their signed `release.json` says, never by a
folder's name or a file's time:

- a version tag (`v1.2.3`, `v1.2.3-rc.1`) by Semantic Versioning 2.0.0 precedence: numbers compare
  as numbers, a pre-release is below its release (`v1.1.0-rc.1` < `v1.1.0`), pre-release fields compare
  numerically or in ASCII order, numeric fields below alphanumeric ones;
- a tag made with `--any-tag` (no version) by its signed sequence number alone, and below every
  version tag (nothing else orders it against versions);
- the same release promoted or demoted again: by the promotion record's signed sequence.

The folder name must be the signed tag (the reader checks it), so an old signed folder copied under
a greater name does not verify at all.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional, Tuple

MAX_TAG_LENGTH = 128
TAG_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,127}")
# Semantic Versioning 2.0.0 with an optional leading v; build metadata is not allowed in a tag.
_ID = r"(?:0|[1-9]\d*|\d*[A-Za-z-][0-9A-Za-z-]*)"
SEMVER = re.compile(r"v?(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(?:-(" + _ID + r"(?:\." + _ID + r")*))?")


def tag_problem(tag: str) -> str:
    """Why `tag` cannot name a release ("" when it can): git-safe, a usable folder name, bounded."""
    if not isinstance(tag, str) or not tag:
        return "an empty tag name"
    if len(tag) > MAX_TAG_LENGTH:
        return f"a tag name of {len(tag)} characters (at most {MAX_TAG_LENGTH})"
    if not TAG_NAME.fullmatch(tag) or ".." in tag or tag.endswith((".lock", ".")):
        return f"{tag!r} is not a usable tag name (letters, digits, . _ + -; no '..', not ending in '.' or '.lock')"
    return ""


@dataclass(frozen=True, order=True)
class Version:
    """A semver version; ordering is semver precedence (through `key`)."""

    key: Tuple
    text: str  # without the leading v, e.g. "1.2.3-rc.1"

    @classmethod
    def parse(cls, tag: str) -> Optional[Version]:
        m = SEMVER.fullmatch(tag)
        if not m:
            return None
        major, minor, patch, pre = m.groups()
        if pre is None:
            pre_key: Tuple = (1,)  # a release is above every pre-release of it
        else:
            pre_key = (0, tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in pre.split(".")))
        text = tag[1:] if tag.startswith("v") else tag
        return cls((int(major), int(minor), int(patch), pre_key), text)


def is_prerelease(tag: str) -> bool:
    """`v1.2.0-rc.1`: a version tag with a pre-release part (never chosen as "the newest" unless named)."""
    version = Version.parse(tag)
    return version is not None and version.key[3][0] == 0


@dataclass(frozen=True, order=True)
class ReleaseOrder:
    """Where a release stands: compare two with < and ==. `promotion` is the promotion record's sequence
    (0: never promoted), so a later promotion or demotion of one release is newer than the release."""

    versioned: bool
    version: Tuple
    sequence: int
    promotion: int = 0

    @classmethod
    def of(cls, tag: str, sequence: int, promotion: int = 0) -> ReleaseOrder:
        version = Version.parse(tag)
        if version is None:
            return cls(False, (), sequence, promotion)
        return cls(True, version.key, sequence, promotion)

    def release_only(self) -> ReleaseOrder:
        return ReleaseOrder(self.versioned, self.version, self.sequence, 0)
