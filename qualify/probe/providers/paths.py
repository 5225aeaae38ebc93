"""The manifest's serving paths from the predicted provider entries (issue 50): for each path, the engine's own
pick on the target (vLLM's; SGLang's for SGLang's rules, marked with its engine), its kernel families as
judged on the image's files, what runs where it does not, and one verdict (core/servingpaths.py: present,
fallback, missing, none, unknown).

vLLM's gate is its capability check and imports; it does not look at the kernels, so a pick whose families
have no code for the GPU is selected and then fails at its first launch ("No compiled cutlass_scaled_mm for
CUDA device capability: 120", vllm-project/vllm#32109). Such a path is `missing`, and `fallback` names the
provider that would run and the flag that selects it.

Standard library only, Python 3.9 compatible (runs inside images).
"""

from __future__ import annotations

from typing import List, Optional, Sequence

from qualify.core.servingpaths import Fallback, PathVerdict, ServingPath
from qualify.probe.providers.entry import ProviderEntry
from qualify.probe.providers.rules import Rules, default


def _fallback(rules_table, name: Optional[str]) -> Optional[Fallback]:
    if name is None:
        return None
    p = rules_table.provider(name)
    return Fallback(name, p.cli, p.fallback)


def serving_path(entry: ProviderEntry, rules: Optional[Rules] = None) -> ServingPath:
    rules = rules or default()
    table = rules.table(entry.key)
    engine, e = rules.name, rules.engine
    pick, runs = entry.vllm_would_select, entry.selected
    picked = entry.candidate(pick) if pick else None
    families = picked.families if picked is not None else ()
    if runs is None:
        unknown = any(c.unknown for c in entry.candidates)
        verdict = PathVerdict.UNKNOWN if unknown else PathVerdict.NONE
        return ServingPath(entry.key, pick, None, families, None, verdict.value, entry.reason, e)
    if picked is not None and picked.unknown:
        return ServingPath(entry.key, pick, runs, families, _fallback(table, runs), PathVerdict.UNKNOWN.value,
                           f"{pick}: {picked.reason}", e)
    if pick == runs and any(f.present is None for f in families):
        return ServingPath(entry.key, pick, runs, families, None, PathVerdict.UNKNOWN.value,
                           f"{pick}: its kernel families were not examined (no files read): unknown, not a pass", e)
    if pick is not None and pick != runs:
        why = picked.reason if picked is not None else f"{engine}'s pick cannot run"
        return ServingPath(entry.key, pick, runs, families, _fallback(table, runs), PathVerdict.MISSING.value,
                           f"{engine} selects {pick}, which cannot run here ({why}); it fails at its first kernel "
                           f"launch; {runs} runs ({table.provider(runs).cli})", e)
    chosen = table.provider(runs)
    if chosen.fallback:
        return ServingPath(entry.key, runs, runs, families, _fallback(table, runs), PathVerdict.FALLBACK.value,
                           f"{runs} runs, a slower path: {chosen.fallback}", e)
    return ServingPath(entry.key, pick or runs, runs, families, None, PathVerdict.PRESENT.value,
                       f"{runs}: {entry.candidate(runs).reason}", e)


def serving_paths(entries: Sequence[ProviderEntry], rules: Optional[Rules] = None) -> List[ServingPath]:
    """One path per predicted entry, in the rules' order."""
    return [serving_path(e, rules) for e in entries]
