"""What the provider rules hand on: one entry per kind and variant
(attention.bf16, moe.bf16, linear.fp8, ...), predicted or observed, per engine.

`vllm_would_select` is the engine's rules (vLLM's, or SGLang's for an entry
whose `engine` is sglang) with "importable" taken as "available";
`selected` is the first provider that can really run (predicted) or what
vLLM chose on the GPU (observed). `to_json()` is the manifest's
`providers[]` item.

Standard library only, Python 3.9 compatible (runs inside images).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Optional, Tuple

from qualify.core.enums import ValueEnum
from qualify.core.servingpaths import Family


class Mode(ValueEnum):
    PREDICTED = "predicted"  # vLLM's rules applied to the census
    OBSERVED = "observed"  # vLLM's own selectors asked on a GPU


@dataclass(frozen=True)
class Candidate:
    """One provider considered: can its kernels run here, and why (not)."""

    name: str
    available: bool
    reason: str
    warning: str = ""  # runs, but degraded or unverified
    unknown: bool = False  # not available because its kernels could not be read (never a pass)
    families: Tuple[Family, ...] = ()  # its kernel families on the target, judged (issue 50)

    def to_json(self) -> Dict[str, Any]:
        out: Dict[str, Any] = {"name": self.name, "available": self.available, "reason": self.reason}
        if self.warning:
            out["warning"] = self.warning
        if self.unknown:
            out["unknown"] = True
        if self.families:
            out["families"] = [{"name": f.name, "library": f.library, "present": f.present, "code": list(f.code)}
                               for f in self.families]
        return out


@dataclass(frozen=True)
class ProviderEntry:
    kind: str
    variant: str
    mode: Mode
    selected: Optional[str]
    candidates: Tuple[Candidate, ...]
    reason: str
    vllm_would_select: Optional[str] = None  # predicted: vLLM's pick on imports alone
    preferred: Optional[str] = None  # vLLM's first choice for the capability, absent extras aside
    case: str = ""  # predicted: the configuration the rules assume
    rules: str = ""  # predicted: the vLLM files the rules come from
    vllm_candidates: Tuple[Candidate, ...] = ()  # observed: what vLLM itself accepted or rejected
    predicted: Optional[str] = None  # observed: the prediction's selection
    with_prediction: bool = False  # observed: a prediction was there to compare with
    engine: str = "vllm"  # whose rules: "vllm" or "sglang" (`vllm_would_select` is then that engine's pick)

    @property
    def key(self) -> str:
        return f"{self.kind}.{self.variant}"

    def candidate(self, name: Optional[str]) -> Optional[Candidate]:
        """The candidate of that name (the last one where vLLM's names map to one of ours twice)."""
        found = None
        for c in self.candidates:
            if c.name == name:
                found = c
        return found

    def to_json(self) -> Dict[str, Any]:
        out: Dict[str, Any] = {"kind": self.kind, "variant": self.variant, "mode": self.mode.value,
                               "selected": self.selected}
        if self.engine != "vllm":  # vLLM's entries keep the form they had before other engines
            out["engine"] = self.engine
        if self.mode is Mode.PREDICTED:
            out.update(vllm_would_select=self.vllm_would_select, preferred=self.preferred)
        out["candidates"] = [c.to_json() for c in self.candidates]
        if self.mode is Mode.OBSERVED:
            out["vllm_candidates"] = [c.to_json() for c in self.vllm_candidates]
        out["reason"] = self.reason
        if self.mode is Mode.PREDICTED:
            out.update(case=self.case, rules=self.rules)
        elif self.with_prediction:
            out.update(predicted=self.predicted, preferred=self.preferred)
        return out
