"""Container image references: `[registry/]name[:tag][@sha256:digest]`.

Standard library only; used by the loader, the engines, pin and verify.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable, List, Optional

_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
_REF = re.compile(
    r"(?P<name>[a-z0-9]+(?:[._/:-][a-z0-9]+)*?)"  # name, possibly with registry host:port
    r"(?::(?P<tag>[\w][\w.-]{0,127}))?"
    r"(?:@(?P<digest>sha256:[0-9a-f]{64}))?"
)


class ImageRefError(ValueError):
    pass


@dataclass(frozen=True)
class ImageRef:
    name: str
    tag: Optional[str] = None
    digest: Optional[str] = None

    @classmethod
    def parse(cls, text: str) -> ImageRef:
        raw = str(text).strip()
        m = _REF.fullmatch(raw)
        if not m or (m.group("tag") is None and m.group("digest") is None and ":" in raw.split("/")[-1]):
            raise ImageRefError(f"not an image reference: {text!r}")
        return cls(m.group("name"), m.group("tag"), m.group("digest"))

    @property
    def pinned(self) -> bool:
        return self.digest is not None

    @property
    def tagged(self) -> str:
        """`name:tag` (what a registry resolves to a digest)."""
        return f"{self.name}:{self.tag}" if self.tag else self.name

    @property
    def by_digest(self) -> str:
        """`name@sha256:...`, the immutable form."""
        if not self.digest:
            raise ImageRefError(f"{self} has no digest")
        return f"{self.name}@{self.digest}"

    def with_digest(self, digest: str) -> ImageRef:
        if not _DIGEST.fullmatch(digest):
            raise ImageRefError(f"not a sha256 digest: {digest!r}")
        return ImageRef(self.name, self.tag, digest)

    def __str__(self) -> str:
        out = self.name
        if self.tag:
            out += f":{self.tag}"
        if self.digest:
            out += f"@{self.digest}"
        return out


def parse_pinned(text: str, what: str, error: type = ImageRefError,
                 hint: str = "write it as registry/name@sha256:<digest>") -> ImageRef:
    """`text` as a reference pinned by digest, or `error` naming `what`: whatever is deployed, run or
    published must be the image that was qualified, not what a tag points at today."""
    try:
        ref = ImageRef.parse(text)
    except ImageRefError as exc:
        raise error(f"{what} {text!r}: {exc}") from None
    if not ref.pinned:
        raise error(f"{what} {text!r} is not pinned by digest", hint=hint)
    return ref


def try_parse(text: object) -> Optional[ImageRef]:
    """`text` as a reference, or None when it is none (an engine's `<none>@<none>`, an empty value)."""
    try:
        return ImageRef.parse(str(text)) if text else None
    except ImageRefError:
        return None


def digests_for(references: Iterable[object], name: Optional[str] = None) -> List[str]:
    """The digests the references pin (an engine's RepoDigests), in order; only those of repository `name`
    when it is given."""
    refs = [try_parse(r) for r in references]
    return [r.digest for r in refs if r is not None and r.digest and (name is None or r.name == name)]
