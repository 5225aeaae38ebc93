"""providers.attention / .moe / .linear: one check per kind over its entries.

fail when nothing of a kind can run; warn when vLLM's own pick cannot run
(the override is named), when its first choice is unavailable, when the
chosen provider runs degraded, or when the rules were not written for this
capability or vLLM release.

Standard library only, Python 3.9 compatible (runs inside images).
"""

from __future__ import annotations

from typing import Any, List, Optional, Sequence, Tuple

from qualify.core import arch
from qualify.core.arch import Capability
from qualify.probe.model import FAIL, PASS, WARN, CheckResult
from qualify.probe.providers.entry import ProviderEntry
from qualify.probe.providers.rules import PROVIDER_KINDS, default

NOT_INSTALLED = "vLLM is not installed in this image"
CHECK_TITLES = {
    "attention": "Attention provider vLLM would use",
    "moe": "MoE provider vLLM would use",
    "linear": "Quantized linear providers vLLM would use",
}
assert set(CHECK_TITLES) == set(PROVIDER_KINDS)


def problems(entry: ProviderEntry) -> Tuple[bool, List[str]]:
    """(nothing runs, reasons worth a warning) for one provider entry, either mode."""
    tag = entry.key
    if entry.selected is None:
        return True, [f"{tag}: {entry.reason}"]
    chosen = entry.candidate(entry.selected)
    notes = []
    if chosen is not None and not chosen.available:
        notes.append(f"{tag}: vLLM selected {entry.selected} but it cannot run: {chosen.reason}"
                     + (f"; {entry.predicted} can" if entry.predicted else ""))
    elif entry.vllm_would_select not in (None, entry.selected):
        notes.append(f"{tag}: {entry.reason}")
    elif entry.preferred not in (None, entry.selected) and entry.candidate(entry.preferred) is not None:
        pref = entry.candidate(entry.preferred)
        notes.append(f"{tag}: {entry.preferred} unavailable ({pref.reason}); using {entry.selected}")
    if chosen is not None and chosen.available and chosen.warning:
        notes.append(f"{tag}: {entry.selected}: {chosen.warning}")
    return False, notes


def provider_checks(entries: Sequence[ProviderEntry], capability: Capability, vllm_version: str, *,
                    rules_from: Optional[str] = None, **evidence: Any) -> List[CheckResult]:
    """One check per kind from provider entries (predicted, observed or merged);
    `rules_from` is the vLLM release the rules were read from."""
    rules_from = rules_from or default().vllm
    out = []
    for kind in PROVIDER_KINDS:
        mine = [e for e in entries if e.kind == kind]
        failed: List[str] = []
        notes: List[str] = []
        for entry in mine:
            dead, why = problems(entry)
            (failed if dead else notes).extend(why)
        if not arch.is_recognised(capability):
            notes.append(f"{capability} is not a recognised capability: vLLM's rules applied as written, "
                         "never validated for it")
        if vllm_version.split("+")[0] != rules_from:
            notes.append(f"rules are vLLM {rules_from}'s; the image has vLLM {vllm_version}")
        status = FAIL if failed else (WARN if notes else PASS)
        summary = "; ".join(f"{e.variant}: {e.selected} ({e.mode.value})" for e in mine)
        reason = " | ".join(failed + notes) if (failed or notes) else f"{summary}: vLLM's first choice, and it runs"
        out.append(CheckResult(f"providers.{kind}", CHECK_TITLES[kind], status, reason,
                               evidence=dict(evidence, capability=str(capability), vllm=vllm_version,
                                             rules_from_vllm=rules_from, providers=[e.to_json() for e in mine])))
    return out
