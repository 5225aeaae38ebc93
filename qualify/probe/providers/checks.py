"""providers.<kind>.<variant>: one check per serving path (attention.bf16, moe.nvfp4, linear.fp8-block, ...);
providers.sglang.<kind>.<variant> for SGLang's (an image with both engines gets both).

Each path's status comes from its serving path (paths.py) and the entry's own findings: fail when the
engine's pick has no kernels for the target (it fails at its first launch: the fallback and its flag are
named) or nothing of the path can run; not-run when the kernels could not be read (never a pass); warn when
the pick is itself a slower fallback, when the engine's first choice is unavailable, when the chosen
provider runs degraded, or when the rules were not written for this capability or engine release.

Only attention.bf16 is required for the image's verdict: every model serves through it. The others depend
on the model; the manifest's serving_paths say which a model can run, and the deploy refuses one whose path
has no kernels (deploy/modelpaths.py; vLLM's paths only: the deploy serves vLLM).

Standard library only, Python 3.9 compatible (runs inside images).
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

from qualify.core import arch
from qualify.core.arch import Capability
from qualify.core.enums import CheckStatus
from qualify.core.servingpaths import TITLES, PathVerdict, ServingPath
from qualify.probe.model import FAIL, NOT_RUN, PASS, WARN, CheckResult
from qualify.probe.providers.entry import ProviderEntry
from qualify.probe.providers.rules import PROVIDER_KINDS, Rules, default

NOT_INSTALLED = "vLLM is not installed in this image"
KIND_TITLES = {
    "attention": "Attention provider {engine} would use",
    "moe": "MoE provider {engine} would use",
    "linear": "Quantized linear provider {engine} would use",
}
assert set(KIND_TITLES) == set(PROVIDER_KINDS)


def check_titles(engine: str = "vLLM") -> Dict[str, str]:
    return {key: f"{KIND_TITLES[key.split('.')[0]].format(engine=engine)}: {title}" for key, title in TITLES.items()}


CHECK_TITLES: Dict[str, str] = check_titles()
REQUIRED_PATHS = frozenset({"attention.bf16"})
_BY_VERDICT = {PathVerdict.PRESENT.value: PASS, PathVerdict.FALLBACK.value: WARN, PathVerdict.MISSING.value: FAIL,
               PathVerdict.NONE.value: FAIL, PathVerdict.UNKNOWN.value: NOT_RUN}
_SEVERITY = {PASS: 0, WARN: 1, NOT_RUN: 2, FAIL: 3}


def problems(entry: ProviderEntry, engine: str = "vLLM") -> Tuple[bool, List[str]]:
    """(nothing runs, reasons worth a warning) for one provider entry, either mode."""
    tag = entry.key
    if entry.selected is None:
        return True, [f"{tag}: {entry.reason}"]
    chosen = entry.candidate(entry.selected)
    notes = []
    if chosen is not None and not chosen.available:
        notes.append(f"{tag}: {engine} selected {entry.selected} but it cannot run: {chosen.reason}"
                     + (f"; {entry.predicted} can" if entry.predicted else ""))
    elif entry.vllm_would_select not in (None, entry.selected):
        notes.append(f"{tag}: {entry.reason}")
    elif entry.preferred not in (None, entry.selected) and entry.candidate(entry.preferred) is not None:
        pref = entry.candidate(entry.preferred)
        notes.append(f"{tag}: {entry.preferred} unavailable ({pref.reason}); using {entry.selected}")
    if chosen is not None and chosen.available and chosen.warning:
        notes.append(f"{tag}: {entry.selected}: {chosen.warning}")
    return False, notes


def _worst(*statuses: CheckStatus) -> CheckStatus:
    return max(statuses, key=lambda st: _SEVERITY[st])


def provider_checks(entries: Sequence[ProviderEntry], capability: Capability, vllm_version: str, *,
                    rules_from: Optional[str] = None, paths: Sequence[ServingPath] = (), rules: Optional[Rules] = None,
                    **evidence: Any) -> List[CheckResult]:
    """One check per entry (predicted, observed or merged), judged with its serving path where there is one;
    `vllm_version` is the image's release of the rules' engine (vLLM unless `rules` say otherwise),
    `rules_from` the release the rules were read from."""
    rules = rules or default()
    engine = rules.name
    rules_from = rules_from or rules.version
    by_path = {p.path: p for p in paths}
    titles = check_titles(engine)
    general: List[str] = []
    if not arch.is_recognised(capability):
        general.append(f"{capability} is not a recognised capability: {engine}'s rules applied as written, "
                       "never validated for it")
    if vllm_version.split("+")[0] != rules_from:
        general.append(f"rules are {engine} {rules_from}'s; the image has {engine} {vllm_version}")
    out = []
    for entry in entries:
        dead, notes = problems(entry, engine)
        path = by_path.get(entry.key)
        status = FAIL if dead else (WARN if notes or general else PASS)
        said: List[str] = []
        if path is not None:
            # The path decides failure and unknown (nothing runs because nothing could be read is unknown, not
            # a failure); the entry's notes can only turn a pass into a warning.
            judged = _BY_VERDICT.get(path.verdict, NOT_RUN)
            status = judged if judged in (FAIL, NOT_RUN) else _worst(judged, WARN if notes or general else PASS)
            said.append(path.line() + (f": {path.reason}" if path.verdict != PathVerdict.PRESENT.value else ""))
        # The prediction's "vLLM would pick X but it cannot run" is what a missing path already says.
        said += [n for n in notes if not (path is not None and path.verdict == PathVerdict.MISSING.value
                                          and f"{engine} would pick" in n)] + general
        if status is PASS:
            said = [f"{entry.selected} ({entry.mode.value}): {engine}'s first choice, and it runs"
                    + (f"; {path.line()}" if path is not None else "")]
        which = {"vllm": vllm_version, "rules_from_vllm": rules_from} if rules.engine == "vllm" else \
            {"engine": rules.engine, rules.engine: vllm_version, f"rules_from_{rules.engine}": rules_from}
        ev = dict(evidence, capability=str(capability), **which, provider=entry.to_json())
        if path is not None:
            ev["serving_path"] = path.to_json()
        out.append(CheckResult(f"{rules.check_prefix}{entry.key}", titles.get(entry.key, entry.key), status,
                               " | ".join(said), required=entry.key in REQUIRED_PATHS, evidence=ev))
    return out
