"""A provider's kernel families on the target: does the library carry kernels of that family in code that
runs on the GPU (SASS for its arch or family, or PTX it can JIT)? Issue 50: `_C` carrying other sm_120
code proves nothing about its SM120 CUTLASS NVFP4 grouped GEMM (vllm-project/vllm#24921, #41738).

The answer is True (the entries that carry it), False (read whole: none of the runnable entries has one),
or None (a runnable entry could not be read: compressed with no decoder, damaged). None is never a pass.

Standard library only, Python 3.9 compatible (runs inside images).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable, Dict, Optional, Tuple

from qualify.core import arch
from qualify.core.arch import Capability, Compat
from qualify.core.kernelnames import NamesScan
from qualify.probe.providers.rules import FamilyRule

# The library path under site-packages -> its names scan (None: not in the image). The runner gives one that
# reads the image's own files, once each; tests give their own. A symbol family asks `symbols` instead:
# the library's bytes searched for the pattern (None: not in the image).
NamesOf = Callable[[str], Optional[NamesScan]]
SYMBOL_LIMIT = 1 << 30  # a JIT library's host part is tens of MB (DeepGEMM's in vLLM 0.33: 29 MB)
ABSENT = "absent"  # what `symbols` answers for a library the image does not have
# Code below this is a guarded-out body (an immediate exit), not the kernel: 384 bytes were seen for an SM120
# GEMM in an sm_100f cubin, where real CUTLASS GEMMs are tens of KB; the smallest real kernels of a family
# (a quantize step) are a few KB.
MIN_KERNEL_BYTES = 1024


@dataclass(frozen=True)
class FamilyFinding:
    rule: FamilyRule
    library: str  # the library path that was read ("" when none of the rule's paths is in the image)
    present: Optional[bool]
    code: Tuple[str, ...]  # the runnable entries that carry it: "sm_120f", "compute_80 (PTX JIT)"
    reason: str
    cross_generation: bool = False  # only through older-generation PTX

    @property
    def summary(self) -> str:
        return f"{self.rule.what}: " + ("present in " + ", ".join(self.code) if self.present
                                        else "missing" if self.present is False else "unknown")


def _judge_symbol(rule: FamilyRule, cap: Capability, names_of) -> FamilyFinding:
    """A host symbol family: a JIT library's dispatch for the architecture (DeepGEMM's SM120 runtimes; without
    them it raises "Unsupported architecture" at the first call, deepseek-ai/DeepGEMM#317)."""
    symbols = getattr(names_of, "symbols", None)
    if symbols is None:
        return FamilyFinding(rule, "", None, (), f"{rule.what}: the library's symbols not examined")
    for rel in rule.library.paths_for(cap):
        found = symbols(rel, rule.pattern)
        if found == ABSENT:
            continue
        if found is None:
            return FamilyFinding(rule, rel, None, (), f"{rule.what}: {rel} could not be read (larger than "
                                 f"{SYMBOL_LIMIT >> 20} MB, or unreadable): unknown, not a pass")
        if found:
            return FamilyFinding(rule, rel, True, ("host dispatch",), f"{rule.what}: {rel} dispatches {cap}")
        return FamilyFinding(rule, rel, False, (), f"{rule.what}: missing from {rel}: its dispatch has no "
                             f"entry for {cap} (it raises at the first call)")
    return FamilyFinding(rule, "", False, (), f"{rule.what}: {' or '.join(rule.library.paths_for(cap))} not in the "
                         "image")


def judge(rule: FamilyRule, cap: Capability, names_of: Optional[NamesOf]) -> FamilyFinding:
    if rule.kind == "symbol":
        return _judge_symbol(rule, cap, names_of)
    if names_of is None:
        return FamilyFinding(rule, "", None, (), f"{rule.what}: kernel names not examined (no files to read)")
    scan, rel = None, ""
    for rel in rule.library.paths_for(cap):
        scan = names_of(rel)
        if scan is not None:
            break
    if scan is None:
        return FamilyFinding(rule, "", False, (), f"{rule.what}: {' or '.join(rule.library.paths_for(cap))} not in "
                             "the image")
    code, unknown, jit_only = [], [], True
    for entry in scan.entries:
        if entry.code is None:
            continue
        klass = arch.compatibility(entry.code, cap)
        if not klass.runnable:
            continue
        if entry.kernels is None:
            unknown.append(f"{entry.arch} ({entry.why_unknown})")
            continue
        if any((size < 0 or size >= MIN_KERNEL_BYTES) and rule.pattern.search(name) for name, size in entry.kernels):
            label = entry.arch + (" (PTX JIT)" if klass is Compat.PTX_JIT else "")
            if label not in code:
                code.append(label)
            jit_only = jit_only and arch.is_cross_generation(entry.code, cap)
    if code:
        cross = jit_only
        how = "only by JIT-compiling older-generation PTX" if cross else "in code that runs there"
        return FamilyFinding(rule, rel, True, tuple(code), f"{rule.what}: {rel} carries it for {cap} {how} "
                             f"({', '.join(code)})", cross)
    if unknown:
        shown = "; ".join(sorted(set(unknown))[:3])
        return FamilyFinding(rule, rel, None, (), f"{rule.what}: {rel} has entries for {cap} that could not be read "
                             f"({shown}): unknown, not a pass")
    runnable = sorted({e.arch for e in scan.entries if e.code is not None and arch.compatibility(e.code, cap).runnable})
    where = f"its code for {cap} ({', '.join(runnable)}) has none" if runnable else f"it has no code for {cap}"
    return FamilyFinding(rule, rel, False, (), f"{rule.what}: missing from {rel}: {where}")


class Libraries:
    """The image's libraries, each read once: kernel names (`__call__`) and host symbols (`symbols`)."""

    def __init__(self, read: Callable[[str], Optional[NamesScan]],
                 raw: Optional[Callable[[str], Any]] = None) -> None:
        self._read, self._raw = read, raw
        self._names: Dict[str, Optional[NamesScan]] = {}
        self._bytes: Dict[str, Any] = {}  # bytes, None (unreadable) or ABSENT

    def __call__(self, rel: str) -> Optional[NamesScan]:
        if rel not in self._names:
            self._names[rel] = self._read(rel)
        return self._names[rel]

    def symbols(self, rel: str, pattern):
        """True/False: the pattern is (not) in the library's bytes; None: unreadable; ABSENT: no such file."""
        if self._raw is None:
            return None
        if rel not in self._bytes:
            self._bytes[rel] = self._raw(rel)
        data = self._bytes[rel]
        if data is ABSENT or data is None:
            return data
        return re.search(pattern.pattern.encode(), data) is not None


def cached(read: Callable[[str], Optional[NamesScan]], raw: Optional[Callable[[str], Any]] = None) -> Libraries:
    """`read` (and `raw`) once per library path."""
    return Libraries(read, raw)
