"""Which provider an engine (vLLM, SGLang) would select, and which can really
run: the engine's own priority rules (rules.py) applied to the target
capability, each candidate then judged against the image (image.py).

The engines' own gates are mostly import checks, so every entry records both
`vllm_would_select` (the engine's rules with "importable" taken as
"available") and `selected` (the first provider that can really run). Where
they differ, a default deployment fails at the first kernel launch (or first
download) unless the backend is overridden; the check says which override.

Standard library only, Python 3.9 compatible (runs inside images).
"""

from __future__ import annotations

from typing import Any, List, Mapping, Optional, Sequence, Tuple

from qualify.core.arch import Capability
from qualify.core.servingpaths import Family
from qualify.probe.model import CheckResult, not_run
from qualify.probe.providers.census_view import CensusIndex
from qualify.probe.providers.checks import NOT_INSTALLED, check_titles, provider_checks
from qualify.probe.providers.entry import Candidate, Mode, ProviderEntry
from qualify.probe.providers.families import NamesOf
from qualify.probe.providers.families import judge as judge_family
from qualify.probe.providers.image import (
    FI_CUBIN_DIST,
    Finding,
    Image,
    file_present,
    flashinfer_cubin,
    has_flashinfer,
    judge_library,
    source,
)
from qualify.probe.providers.paths import serving_paths
from qualify.probe.providers.rules import Provider, Rules, Table, default
from qualify.probe.selfsufficiency import norm_dist


def vllm_gate(img: Image, p: Provider, engine: str = "vLLM") -> Tuple[bool, str]:
    """The engine's own check: capability and imports, nothing about kernels."""
    if not p.caps.admits(img.cap):
        return False, f"{engine} admits it only on {p.caps.describe()}"
    for dist in p.packages:
        if not img.has(dist):
            return False, f"{dist} is not installed"
    for rel in p.gate_files:
        if file_present(img, rel) is False:
            return False, f"{rel} is not in the image"
    if p.has_flashinfer and has_flashinfer(img) is False:
        return False, ("vLLM disables FlashInfer kernels here: no flashinfer-cubin and no nvcc/ninja "
                       "(vllm/utils/flashinfer.py has_flashinfer)")
    return True, ""


def _trtllm_attention(img: Image, p: Provider) -> Optional[Finding]:
    """FlashInfer attention on 10.x switches to trtllm-gen cubins when vLLM believes
    they are reachable: flashinfer-cubin importable (any version) or the CDN answers."""
    if p.trtllm_on is None or not p.trtllm_on.admits(img.cap):
        return None
    cubin = flashinfer_cubin(img)
    if cubin.ok:
        return cubin
    if not img.has(FI_CUBIN_DIST):
        return Finding(True, "no flashinfer-cubin: air-gapped, vLLM's start-up probe of the cubin CDN fails "
                             "(5 s) and FlashInfer's own kernels are used instead of trtllm-gen",
                       "trtllm-gen attention kernels unavailable air-gapped")
    return Finding(False, "vLLM sees flashinfer-cubin (its check ignores the version) and selects trtllm-gen "
                          "attention; " + cubin.reason.replace("trtllm-gen cubins: ", ""))


def _family_findings(img: Image, p: Provider) -> Tuple[List[Finding], Tuple[Family, ...]]:
    """The provider's kernel families for the target's major (rules data), each judged on the image's files."""
    findings, judged = [], []
    for rule in p.families_for(img.cap):
        got = judge_family(rule, img.cap, img.names_of)
        judged.append(Family(rule.name, got.library, got.present, got.code, rule.what))
        if got.present:
            findings.append(Finding(True, got.reason, "cross-generation PTX JIT: first-load cost and none of "
                                    f"{img.cap}'s features" if got.cross_generation else ""))
        elif img.names_of is None:  # like a library with no census: not judged, and the path says unknown
            findings.append(Finding(True, got.reason, "kernel families not examined"))
        else:
            findings.append(Finding(False, got.reason, unknown=got.present is None))
    return findings, tuple(judged)


def _findings(img: Image, p: Provider, engine: str = "vLLM") -> List[Finding]:
    findings = [Finding(False, f"{dist} is not installed: {engine} imports it for {p.name} once chosen, and fails "
                               "at start-up") for dist in p.imports if not img.has(dist)]
    findings += [judge_library(img, lib) for lib in p.libs] + [source(img, s) for s in p.needs]
    trtllm = _trtllm_attention(img, p)
    if trtllm is not None:
        findings.append(trtllm)
    if has_flashinfer(img) is None and p.has_flashinfer:
        findings.append(Finding(True, "vLLM enables FlashInfer only with flashinfer-cubin or nvcc+ninja "
                                      "(not examined)", "FlashInfer gate not examined"))
    return findings


def evaluate(img: Image, p: Provider, engine: str = "vLLM") -> Tuple[bool, Candidate]:
    """One candidate: (the engine's gate passes, whether its kernels can run)."""
    gate_ok, why = vllm_gate(img, p, engine)
    if not gate_ok:
        return False, Candidate(p.name, False, why)
    findings = _findings(img, p, engine)
    from_families, judged = _family_findings(img, p)
    findings += from_families
    failed = [f for f in findings if not f.ok]
    reasons = [f.reason for f in (failed or findings)] + ([p.note] if p.note and not failed else [])
    warnings = [f.warning for f in findings if f.ok and f.warning]
    if p.fallback and not failed:
        warnings.append(f"slow path: {p.fallback}")
    return True, Candidate(p.name, not failed, "; ".join(reasons) or "no kernels to check",
                           "; ".join(warnings) if warnings and not failed else "",
                           unknown=bool(failed) and all(f.unknown for f in failed), families=judged)


def _preferred(table: Table, img: Image, names: Sequence[str]) -> Optional[str]:
    """The provider vLLM ranks first for this capability, extras that are absent aside."""
    for name in names:
        p = table.provider(name)
        if not p.caps.admits(img.cap):
            continue
        if p.optional and any(not img.has(d) for d in p.packages):
            continue
        return name
    return None


def predict_table(table: Table, img: Image, rules: Optional[Rules] = None) -> ProviderEntry:
    rules = rules or default()
    names = table.order(img.cap)
    judged = [evaluate(img, table.provider(n), rules.name) for n in names]
    candidates = tuple(c for _, c in judged)
    vllm_pick = next((c.name for gate_ok, c in judged if gate_ok), None)
    selected = next((c for c in candidates if c.available), None)
    return ProviderEntry(
        kind=table.kind, variant=table.variant, mode=Mode.PREDICTED, selected=selected.name if selected else None,
        candidates=candidates, reason=_reason(table, img, candidates, selected, vllm_pick, rules.name),
        vllm_would_select=vllm_pick, preferred=_preferred(table, img, names), case=table.case, rules=table.source,
        engine=rules.engine)


def _reason(table: Table, img: Image, candidates: Sequence[Candidate], selected: Optional[Candidate],
            vllm_pick: Optional[str], engine: str = "vLLM") -> str:
    if selected is None:
        return f"no provider can run on {img.cap}: " + " | ".join(f"{c.name}: {c.reason}" for c in candidates)
    text = f"{selected.name}: {selected.reason}"
    if vllm_pick and vllm_pick != selected.name:
        picked = next(c for c in candidates if c.name == vllm_pick)
        hint = table.provider(selected.name).cli
        text = (f"{engine} would pick {vllm_pick} (its check is import-only) but it cannot run: {picked.reason}; "
                f"{selected.name} can ({hint}). " + text)
    return text


def predict(capability: Capability, packages: Mapping[str, str], census: Optional[CensusIndex],
            gpu: Optional[Mapping[str, Any]] = None, *, toolchain: Optional[Mapping[str, Any]] = None,
            site_packages: Sequence[str] = (), rules: Optional[Rules] = None,
            names_of: Optional[NamesOf] = None,
            ) -> Tuple[List[ProviderEntry], List[CheckResult]]:
    """Providers the rules' engine (vLLM unless `rules` say otherwise) would select for `capability` in this
    image, and one check per serving path. `names_of` reads a library's kernel names (the kernel families);
    None: families not examined."""
    rules = rules or default()
    pkgs = {norm_dist(k): str(v) for k, v in packages.items()}
    if rules.dist not in pkgs:
        titles = check_titles(rules.name)
        said = NOT_INSTALLED if rules.engine == "vllm" else f"{rules.name} is not installed in this image"
        return [], [not_run(f"{rules.check_prefix}{t.key}", titles.get(t.key, t.key), said, required=False)
                    for t in rules.tables]
    img = Image(capability, pkgs, census or {}, toolchain, tuple(site_packages), names_of)
    entries = [predict_table(t, img, rules) for t in rules.tables]
    checks = provider_checks(entries, capability, pkgs[rules.dist], rules_from=rules.version, rules=rules,
                             paths=serving_paths(entries, rules),
                             census="examined" if census else "not examined",
                             kernel_names="examined" if names_of is not None else "not examined",
                             toolchain=dict(toolchain) if toolchain is not None else None,
                             gpu=dict(gpu) if gpu else None)
    return entries, checks
