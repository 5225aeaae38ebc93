"""The closed vocabularies of targets, checks and manifests, each spelled once.

Every enum is `str`-valued: a member compares, hashes, formats and
serialises as its value, so the JSON a manifest carries is the same bytes
whether a producer wrote the member or the plain string, and plain strings
read back from JSON look members up directly.

Standard library only, Python 3.9 compatible (runs inside images).
"""

from __future__ import annotations

from enum import Enum
from typing import Dict, Tuple


class ValueEnum(str, Enum):
    """A str enum that behaves as its value everywhere (f-strings, dict keys, JSON)."""

    # Enum hashes by name and (from 3.12) formats as `Class.MEMBER`: both would
    # make a member differ from the string it stands for.
    __hash__ = str.__hash__

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)

    @classmethod
    def values(cls) -> Tuple[str, ...]:
        return tuple(m.value for m in cls)


class Profile(ValueEnum):
    """What an image is built to serve."""

    SMOKE = "smoke"
    VLLM = "vllm"


class Accelerator(ValueEnum):
    """What a target's images compute on: an NVIDIA GPU (CUDA), or the CPU alone (vLLM's CPU build)."""

    CUDA = "cuda"
    CPU = "cpu"


# A cpu target's manifests carry this where a GPU target's carry its compute capability.
CPU_CAPABILITY = "cpu"


class BaseKind(ValueEnum):
    """Where an image's base comes from."""

    PINNED = "pinned"
    HERMETIC = "hermetic"


class Origin(ValueEnum):
    """Who built the image a manifest qualifies: our own build, or an image built elsewhere (issue 34)."""

    BUILT = "built"
    EXTERNAL = "external"


class CheckStatus(ValueEnum):
    """One check's outcome. NOT_RUN is never a pass."""

    PASS = "pass"
    FAIL = "fail"
    WARN = "warn"
    NOT_RUN = "not-run"


class Verdict(ValueEnum):
    """A qualification's outcome over all its checks."""

    PASS = "pass"
    WARN = "warn"
    FAIL = "fail"
    INCOMPLETE = "incomplete"


class SupportLevel(ValueEnum):
    """How far a target is supported; `rank` orders them by strength of evidence."""

    BASELINE = "baseline"
    OPTIMIZED = "optimized"
    EXPERIMENTAL = "experimental"
    UNSUPPORTED = "unsupported"
    UNVERIFIED = "unverified"

    @property
    def rank(self) -> int:
        return _LEVEL_RANK[self]


_LEVEL_RANK: Dict[SupportLevel, int] = {
    SupportLevel.UNSUPPORTED: 0, SupportLevel.UNVERIFIED: 1, SupportLevel.EXPERIMENTAL: 2,
    SupportLevel.BASELINE: 3, SupportLevel.OPTIMIZED: 4,
}
