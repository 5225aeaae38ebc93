"""CUDA architecture names and the rules for which code runs on which device.

This is the only module that parses `sm_121a`, `compute_120f`, `12.0+PTX` or
`12.1`. It runs inside images too (the probe), so it uses the standard
library only and stays Python 3.9 compatible.

Compatibility rules (ARCHITECTURE.md, "CUDA architecture rules"):
- SASS `sm_Mn`: runs on capability M.m when the major is the same and n <= m.
- SASS `sm_XYa`: runs only on exactly X.Y.
- SASS `sm_XYf`: runs on the same major (family) with minor >= Y.
- PTX `compute_XY`: JIT-compiles on any capability >= X.Y; with `a`/`f` it
  follows the same exactness rules as its SASS.
"""

from __future__ import annotations

import re
from enum import Enum

from qualify.core.record import record

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: typing is not imported at run time (the census's start-up)
    from typing import Iterable, List, Optional, Tuple


class ArchError(ValueError):
    """A string that is not a CUDA architecture name we understand."""


@record(frozen=True, order=True)
class Capability:
    """A device compute capability such as 12.1."""

    major: int
    minor: int

    @classmethod
    def parse(cls, text: str) -> Capability:
        """Accept `12.1`, `121`, `sm_121`, `sm121`, `sm_121a` (suffix ignored)."""
        raw = str(text).strip()
        m = re.fullmatch(r"(\d{1,2})\.(\d)", raw)
        if m:
            return cls(int(m.group(1)), int(m.group(2)))
        m = re.fullmatch(r"(?:sm_?|compute_)?(\d{2,3})[af]?", raw.lower())
        if m:
            return cls.from_number(int(m.group(1)))
        raise ArchError(
            f"not a compute capability: {text!r} (expected e.g. '12.1', '121' or 'sm_121')"
        )

    @classmethod
    def from_number(cls, number: int) -> Capability:
        """The fatbin and cubin headers store 121 for 12.1."""
        if number < 10:
            raise ArchError(f"not a compute capability number: {number}")
        return cls(number // 10, number % 10)

    @property
    def number(self) -> int:
        return self.major * 10 + self.minor

    def __str__(self) -> str:
        return f"{self.major}.{self.minor}"


class Variant(str, Enum):
    """Suffix of an architecture name."""

    PLAIN = ""
    ARCH = "a"  # arch-specific: only this exact capability
    FAMILY = "f"  # family-specific: same major, minor >= this one


class CodeKind(str, Enum):
    SASS = "sass"
    PTX = "ptx"


class Compat(str, Enum):
    """Whether code can run on a device, best first.

    UNKNOWN: the bytes that would decide could not be read (damaged, or
    compressed with no decoder at hand). It ranks between PTX_JIT and NONE so
    that damage never improves a verdict: the worst of (native, unknown) is
    unknown, and the best of (unknown, none) is unknown, never none.
    """

    NATIVE = "native"
    COMPATIBLE = "compatible"
    PTX_JIT = "ptx-jit"
    UNKNOWN = "unknown"
    NONE = "none"

    @property
    def rank(self) -> int:
        return _COMPAT_ORDER.index(self)

    @property
    def runnable(self) -> bool:
        """Known to run (UNKNOWN promises nothing)."""
        return self in (Compat.NATIVE, Compat.COMPATIBLE, Compat.PTX_JIT)


_COMPAT_ORDER = [Compat.NATIVE, Compat.COMPATIBLE, Compat.PTX_JIT, Compat.UNKNOWN, Compat.NONE]


def best(classes: Iterable[Compat]) -> Compat:
    """The best class among several (NONE when there are none)."""
    found = list(classes)
    return min(found, key=lambda c: c.rank) if found else Compat.NONE


@record(frozen=True)
class CodeTarget:
    """One compiled code object: SASS `sm_XY[a|f]` or PTX `compute_XY[a|f]`."""

    kind: CodeKind
    capability: Capability
    variant: Variant = Variant.PLAIN

    @classmethod
    def parse(cls, text: str) -> CodeTarget:
        raw = str(text).strip().lower()
        m = re.fullmatch(r"(sm|compute)_(\d{2,3})([af]?)", raw)
        if not m:
            raise ArchError(
                f"not a CUDA code target: {text!r} (expected sm_XY, sm_XYa, sm_XYf or compute_XY[a|f])"
            )
        kind = CodeKind.SASS if m.group(1) == "sm" else CodeKind.PTX
        return cls(kind, Capability.from_number(int(m.group(2))), Variant(m.group(3)))

    @classmethod
    def ptx(cls, number: int, variant: Variant = Variant.PLAIN) -> CodeTarget:
        return cls(CodeKind.PTX, Capability.from_number(number), variant)

    def __str__(self) -> str:
        prefix = "sm" if self.kind is CodeKind.SASS else "compute"
        return f"{prefix}_{self.capability.number}{self.variant.value}"

    def without_variant(self) -> str:
        """The name cuobjdump prints (it drops the `f` suffix)."""
        prefix = "sm" if self.kind is CodeKind.SASS else "compute"
        return f"{prefix}_{self.capability.number}"


def _variant_allows(code: CodeTarget, device: Capability, *, plain_rule) -> bool:
    cc = code.capability
    if code.variant is Variant.ARCH:
        return device == cc
    if code.variant is Variant.FAMILY:
        return device.major == cc.major and device.minor >= cc.minor
    return plain_rule(cc, device)


def compatibility(code: CodeTarget, device: Capability) -> Compat:
    """Can `code` run on a device of capability `device`, and how well?"""
    if code.kind is CodeKind.SASS:
        ok = _variant_allows(
            code, device, plain_rule=lambda cc, d: d.major == cc.major and d.minor >= cc.minor
        )
        if not ok:
            return Compat.NONE
        return Compat.NATIVE if device == code.capability else Compat.COMPATIBLE
    ok = _variant_allows(code, device, plain_rule=lambda cc, d: d >= cc)
    return Compat.PTX_JIT if ok else Compat.NONE


def compatibility_variant_unknown(code: CodeTarget, device: Capability) -> Compat:
    """For code whose a/f suffix could not be read (a cubin whose note is
    damaged): the class every variant would give, or UNKNOWN when they differ
    (sm_100 on 10.3 is compatible as plain or `f`, none as `a`)."""
    found = {compatibility(CodeTarget(code.kind, code.capability, v), device) for v in Variant}
    return found.pop() if len(found) == 1 else Compat.UNKNOWN


def is_cross_generation(code: CodeTarget, device: Capability) -> bool:
    """PTX from an older major that would be JIT-compiled: runs, but none of
    the newer architecture's features are used (a performance defect)."""
    return (
        code.kind is CodeKind.PTX
        and compatibility(code, device) is Compat.PTX_JIT
        and code.capability.major != device.major
    )


# --- families and recognised capabilities ---------------------------------


@record(frozen=True)
class Family:
    name: str
    major: int
    description: str
    minors: Tuple[int, ...]  # minors with a validated meaning


FAMILIES: Tuple[Family, ...] = (
    Family("sm_7x", 7, "Volta/Turing", (0, 2, 5)),
    Family("sm_8x", 8, "Ampere/Ada", (0, 6, 7, 9)),
    Family("sm_9x", 9, "Hopper", (0,)),
    Family("sm_10x", 10, "datacenter Blackwell (B200/GB200 10.0, B300/GB300 10.3)", (0, 3)),
    Family("sm_11x", 11, "Thor (named 10.1 before CUDA 13)", (0,)),
    Family("sm_12x", 12, "workstation Blackwell (RTX 5090/PRO 6000 12.0, GB10 12.1)", (0, 1)),
)

BLACKWELL_MAJORS = (10, 11, 12)


def family_of(cap: Capability) -> Optional[Family]:
    for fam in FAMILIES:
        if fam.major == cap.major:
            return fam
    return None


def is_recognised(cap: Capability) -> bool:
    """A capability whose meaning we know (unknown ones are unvalidated)."""
    fam = family_of(cap)
    return fam is not None and cap.minor in fam.minors


def is_blackwell(cap: Capability) -> bool:
    return cap.major in BLACKWELL_MAJORS and is_recognised(cap)


def describe(cap: Capability) -> str:
    fam = family_of(cap)
    if fam is None or cap.minor not in fam.minors:
        return f"{cap}: unknown or unvalidated capability"
    return f"{cap}: {fam.name} {fam.description}"


# --- TORCH_CUDA_ARCH_LIST ---------------------------------------------------


@record(frozen=True)
class TorchArch:
    """One entry of TORCH_CUDA_ARCH_LIST: `12.0`, `12.0a`, `12.0+PTX`."""

    capability: Capability
    arch_specific: bool = False
    ptx: bool = False

    @classmethod
    def parse(cls, text: str) -> TorchArch:
        raw = str(text).strip()
        m = re.fullmatch(r"(\d{1,2})\.(\d)([af]?)(\+PTX)?", raw)
        if not m:
            raise ArchError(
                f"not a TORCH_CUDA_ARCH_LIST entry: {text!r} (expected e.g. '12.1', '12.0a' or '12.0+PTX')"
            )
        if m.group(3) == "f":
            raise ArchError(
                f"TORCH_CUDA_ARCH_LIST entry {text!r}: torch's cpp_extension rejects 'f' suffixes; "
                "use the plain or 'a' form"
            )
        return cls(Capability(int(m.group(1)), int(m.group(2))), m.group(3) == "a", bool(m.group(4)))

    def __str__(self) -> str:
        return f"{self.capability}{'a' if self.arch_specific else ''}{'+PTX' if self.ptx else ''}"

    @property
    def variant(self) -> Variant:
        return Variant.ARCH if self.arch_specific else Variant.PLAIN

    def code_targets(self) -> List[CodeTarget]:
        """What nvcc emits for this entry (as torch's cpp_extension asks it to)."""
        out = [CodeTarget(CodeKind.SASS, self.capability, self.variant)]
        if self.ptx:
            out.append(CodeTarget(CodeKind.PTX, self.capability, self.variant))
        return out

    def gencode_flags(self) -> List[str]:
        num = f"{self.capability.number}{'a' if self.arch_specific else ''}"
        flags = [f"-gencode=arch=compute_{num},code=sm_{num}"]
        if self.ptx:
            flags.append(f"-gencode=arch=compute_{num},code=compute_{num}")
        return flags


def parse_torch_arch_list(text: str) -> List[TorchArch]:
    """Split on ';' or whitespace as torch does; refuse an empty list."""
    parts = [p for p in re.split(r"[;\s]+", str(text).strip()) if p]
    if not parts:
        raise ArchError("TORCH_CUDA_ARCH_LIST is empty")
    entries = [TorchArch.parse(p) for p in parts]
    seen = set()
    for e in entries:
        if str(e) in seen:
            raise ArchError(f"TORCH_CUDA_ARCH_LIST {text!r}: {e} appears twice")
        seen.add(str(e))
    return entries


def gencode_flags(arch_list: str) -> List[str]:
    flags: List[str] = []
    for entry in parse_torch_arch_list(arch_list):
        flags.extend(entry.gencode_flags())
    return flags


def expected_code_targets(arch_list: str) -> List[CodeTarget]:
    out: List[CodeTarget] = []
    for entry in parse_torch_arch_list(arch_list):
        out.extend(entry.code_targets())
    return out


def arch_list_problems(arch_list: str, target: Capability) -> List[str]:
    """Why an arch list does not fit a target capability (empty when it fits).

    Every entry must belong to the target's family (code for another family
    is dead weight and usually a copy-paste mistake) and at least one entry
    must give native SASS for the target.
    """
    try:
        entries = parse_torch_arch_list(arch_list)
    except ArchError as exc:
        return [str(exc)]
    problems = []
    for e in entries:
        if e.capability.major != target.major:
            problems.append(f"entry {e} is for family {e.capability.major}.x, not the target's {target}")
    natives = [
        e for e in entries if any(compatibility(c, target) is Compat.NATIVE for c in e.code_targets())
    ]
    if not natives:
        problems.append(f"no entry gives native code for {target} (add '{target}' or '{target}a')")
    return problems


def triton_gpu_name(cap: Capability) -> str:
    """The ptxas `--gpu-name` Triton uses: `sm_XYa` from capability 9.0 on."""
    return f"sm_{cap.number}{'a' if cap.major >= 9 else ''}"


# The PTX ISA release that first names each arch-specific target (NVIDIA's PTX ISA release notes: 8.0 with
# CUDA 12.0, 8.6 with 12.7, 8.7 with 12.8, 8.8 with 12.9, 9.0 with 13.0). A PTX module must declare at least
# this `.version`; a newer one than its ptxas knows is refused for that reason alone (CUDA 12.8's ptxas
# rejects `.version 8.8` even for sm_120a, which it assembles).
_FIRST_PTX_ISA = {90: (8, 0), 100: (8, 6), 101: (8, 6), 103: (8, 8), 110: (9, 0), 120: (8, 7), 121: (8, 8)}


def first_ptx_isa(cap: Capability) -> str:
    """`.version` of the oldest PTX ISA that can name Triton's target for `cap` (before 9.0: 7.0, CUDA 11.0's,
    which names up to sm_80; a newer capability not in the table: 8.8)."""
    major, minor = _FIRST_PTX_ISA.get(cap.number, (7, 0) if cap.major < 9 else (8, 8))
    return f"{major}.{minor}"
