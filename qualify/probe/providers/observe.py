"""What vLLM itself selects, asked on a GPU.

`observe()` runs snippets/vllm_providers.py in a child interpreter, which asks
vLLM's selector functions themselves; `observed_providers()` turns its answer
into entries with mode "observed" (only when a GPU was present), and
`merge()` puts them in place of the predicted ones.

Standard library only, Python 3.9 compatible (runs inside images).
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Sequence

from qualify.core.arch import Capability
from qualify.probe.providers.entry import Candidate, Mode, ProviderEntry
from qualify.probe.providers.rules import default
from qualify.probe.subproc import ChildResult, run_snippet


def observe(capability: Optional[Capability] = None, timeout: float = 300) -> ChildResult:
    """Ask vLLM's selectors in a child interpreter. Needs a GPU: without one the
    child answers status 'no-gpu' (or 'not-installed') and observed_providers()
    returns nothing."""
    args = ["--target", str(capability)] if capability is not None else []
    return run_snippet("vllm_providers", args, timeout=timeout)


def observation_failure(child: ChildResult) -> Optional[str]:
    """Why there is no observation (None when there is one): for a not-run reason."""
    if not child.ok:
        return f"vLLM's selectors could not be asked: {child.failure()}"
    data = child.data
    if data.get("status") != "ok" or data.get("mode") != "observed":
        return str(data.get("reason") or data.get("status"))
    if data.get("target") and data.get("capability") != data.get("target"):
        return f"the GPU is {data.get('capability')}, not the target {data.get('target')}"
    return None


def observed_name(key: str, section: Mapping[str, Any], names: Optional[Mapping[str, str]] = None) -> Optional[str]:
    """Our name for what vLLM chose in one section of the snippet's answer."""
    names = default().observed_names if names is None else names
    name = section.get("chosen_by_vllm") or section.get("selected")
    if name is None:
        return None
    if key == "attention.bf16" and name == "FLASH_ATTN" and section.get("flash_attn_version"):
        return f"FLASH_ATTN(FA{section['flash_attn_version']})"
    return names.get(name, name)


def _seen(section: Mapping[str, Any], names: Mapping[str, str]) -> List[Candidate]:
    rejected = section.get("rejected") or {}
    return [Candidate(names.get(n, n), n not in rejected, "; ".join(rejected.get(n, [])) or "accepted by vLLM")
            for n in section.get("order", [])]


def observed_providers(data: Mapping[str, Any], predicted: Sequence[ProviderEntry] = ()) -> List[ProviderEntry]:
    """Entries (mode 'observed') from the snippet's JSON; empty unless a GPU answered.

    `selected` is what vLLM chose; with `predicted`, the candidates are the
    predicted ones (judged against the census), so a choice vLLM made on
    imports alone but that cannot run still shows up.
    """
    if data.get("status") != "ok" or data.get("mode") != "observed":
        return []
    names = default().observed_names
    by_key: Dict[str, ProviderEntry] = {p.key: p for p in predicted}
    out = []
    for key, section in sorted((data.get("sections") or {}).items()):
        kind, variant = key.split(".", 1)
        seen = tuple(_seen(section, names))
        selected = observed_name(key, section, names)
        reason = section.get("error") or (f"vLLM {data.get('vllm')} chose it on {data.get('gpu')} "
                                          f"({data.get('capability')})")
        guess = by_key.get(key)
        if guess is None:
            out.append(ProviderEntry(kind, variant, Mode.OBSERVED, selected, seen, reason, vllm_candidates=seen))
            continue
        if selected != guess.vllm_would_select:
            reason += f"; predicted vLLM's pick was {guess.vllm_would_select}"
        out.append(ProviderEntry(kind, variant, Mode.OBSERVED, selected, guess.candidates, reason,
                                 preferred=guess.preferred, vllm_candidates=seen, predicted=guess.selected,
                                 with_prediction=True))
    return out


def merge(predicted: Sequence[ProviderEntry], observed: Sequence[ProviderEntry]) -> List[ProviderEntry]:
    """Observed entries where there are some, predicted ones elsewhere."""
    seen = {(o.kind, o.variant): o for o in observed if o.selected is not None}
    return [seen.get((p.kind, p.variant), p) for p in predicted]
