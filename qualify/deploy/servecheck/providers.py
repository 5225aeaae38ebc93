"""serve.providers: what the running server selected, from its own start-up log, against the release manifest.

vLLM names its attention backend, MoE and linear kernels and the engine's dtype and quantization in the lines
it logs while it starts (the matrix's `log_rules` say which lines); its class names become the manifest's
provider names through the provider rules' observed_names. The prediction is the verified release manifest's
`providers` (predicted from the census, or observed through vLLM's selectors where a GPU was present).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence

from qualify.core.servingpaths import ServingPaths
from qualify.deploy.modelpaths import ModelPaths
from qualify.deploy.servecheck.result import CheckResult, failed, not_run, passed
from qualify.probe import servematrix as sm
from qualify.probe.providers import rules as provider_rules

PROVIDERS = "serve.providers"
MAX_LOG_BYTES = 64 << 20  # start-up comes first; a long-running server's log is cut, never read whole
# vLLM 0.33 logs a backend chosen with --attention-backend as the enum member ("Using
# AttentionBackendEnum.FLASH_ATTN backend.", platforms/cuda.py); its name is what the rules match.
_ENUM_MEMBER = re.compile(r"\bAttentionBackendEnum\.([A-Z0-9_]+)")
# The quantization word of vLLM's MoE oracle lines ("Using 'MARLIN' NvFp4 MoE backend", fused_moe/oracle/*.py)
# -> the MoE paths it can be.
_MOE_FAMILY = re.compile(r"Using '?[A-Za-z0-9_.-]+'? ([A-Za-z0-9_]+) MoE backend")
MOE_FAMILIES = {"unquantized": ("moe.bf16",), "fp8": ("moe.fp8", "moe.fp8-block"), "nvfp4": ("moe.nvfp4",),
                "mxfp4": ("moe.mxfp4",)}


@dataclass(frozen=True)
class Seen:
    kind: str
    name: str  # in the manifest's names where observed_names knows vLLM's
    line: str
    note: str = ""


def observe(log: str, p: sm.Providers) -> List[Seen]:
    """Every selection the log states, first occurrence of each (kind, name), in log order."""
    names = provider_rules.default().observed_names
    out: List[Seen] = []
    for line in log.splitlines():
        line = _ENUM_MEMBER.sub(r"\1", line)
        for rule in p.log_rules:
            m = rule.pattern.search(line)
            if not m:
                continue
            raw = rule.name or m.group("name")
            seen = Seen(rule.kind, names.get(raw, raw), line.strip()[:300], rule.note)
            if not any(s.kind == seen.kind and s.name == seen.name for s in out):
                out.append(seen)
    return out


def predicted(providers: Sequence[Mapping[str, Any]]) -> Dict[str, List[str]]:
    """kind -> the providers the manifest selected, over its variants (attention.bf16, attention.fp8, ...)."""
    out: Dict[str, List[str]] = {}
    for e in providers:
        if isinstance(e, Mapping) and isinstance(e.get("selected"), str):
            out.setdefault(str(e.get("kind")), [])
            if e["selected"] not in out[str(e.get("kind"))]:
                out[str(e.get("kind"))].append(e["selected"])
    return out


@dataclass(frozen=True)
class ServingInput:
    """What serve-check knows of the model's serving paths (issue 50): the paths its config maps to (or None
    and why not) and the verified manifest's prediction for them (or None and why not)."""

    model: Optional[ModelPaths]
    model_why: str
    paths: Optional[ServingPaths]
    paths_why: str


def _same(a: Optional[str], b: Optional[str]) -> bool:
    """FLASH_ATTN(FA2), flash_attn and FLASH_ATTN are one provider."""
    def name(x: Optional[str]) -> str:
        return (x or "").split("(", 1)[0].strip().upper().replace("-", "_")
    return bool(name(a)) and name(a) == name(b)


def taken(seen: Sequence[Seen], serving: ServingInput) -> Dict[str, Any]:
    """Per path the model takes: the manifest's prediction (vLLM's pick, what runs, the verdict, the fallback)
    beside the provider the server's log names for its kind, and which of them the server took."""
    out: Dict[str, Any] = {"model": serving.model.source if serving.model else None,
                           "manifest": "recorded" if serving.paths else serving.paths_why}
    if serving.model is None:
        out["why"] = serving.model_why
        return out
    out["maps_to"] = serving.model.describe()
    rows = []
    for need in serving.model.needs:
        lines = [s for s in seen if s.kind == need.kind]
        if need.kind == "moe":  # the oracle's line names its quantization: keep the ones this path can be
            fitting = [s for s in lines if need.path in MOE_FAMILIES.get(_moe_family(s.line), ())]
            lines = fitting or [s for s in lines if not _moe_family(s.line)]
        observed = list(dict.fromkeys(s.name for s in lines))
        sp = serving.paths.get(need.path) if serving.paths else None
        row: Dict[str, Any] = {"path": need.path, "kind": need.kind, "why": need.why, "observed": observed}
        if sp is not None:
            row["predicted"] = {"provider": sp.provider, "runs": sp.runs, "verdict": sp.verdict,
                                "fallback": sp.fallback.provider if sp.fallback else None}
        row["took"] = _took(observed, sp)
        rows.append(row)
    out["paths"] = rows
    if serving.model.undescribed:
        out["not_described"] = list(serving.model.undescribed)
    return out


def _moe_family(line: str) -> str:
    m = _MOE_FAMILY.search(line)
    return m.group(1).lower() if m else ""


def _took(observed: Sequence[str], sp: Any) -> str:
    """pick (vLLM's pick, as predicted), fallback, runs (the first provider whose kernels run), other, or
    unknown (the log names no provider of the kind; never read as a match)."""
    if not observed:
        return "unknown"
    if sp is None:
        return "not predicted"
    for label, name in (("pick", sp.provider), ("fallback", sp.fallback.provider if sp.fallback else None),
                        ("runs", sp.runs)):
        if all(_same(o, name) for o in observed):
            return label
    return "other"


def providers(log: Optional[str], log_source: str, manifest_providers: Optional[Sequence[Mapping[str, Any]]],
              manifest_source: str, p: sm.Providers, serving: Optional[ServingInput] = None) -> CheckResult:
    """`log`: the server's start-up log (None: unreadable, `log_source` says why); `manifest_providers`: the
    verified manifest's `providers` (None: no manifest, `manifest_source` says why); `serving`: the model's
    serving paths and their prediction, recorded in the evidence beside what the log names (issue 50)."""
    if log is None:
        return not_run(PROVIDERS, f"the server's start-up log cannot be read: {log_source}")
    seen = observe(log[:MAX_LOG_BYTES], p)
    server = {k: [s.name for s in seen if s.kind == k] for k in sm.LOG_KINDS}
    evidence: Dict[str, Any] = {"log": log_source, "server": {k: v for k, v in server.items() if v},
                                "lines": [{"kind": s.kind, "name": s.name, "line": s.line,
                                           **({"note": s.note} if s.note else {})} for s in seen]}
    if serving is not None:
        evidence["serving_paths"] = taken(seen, serving)
    if manifest_providers is None:
        return not_run(PROVIDERS, f"the server selected {_said(server)}, but there is no release manifest to "
                       f"compare with: {manifest_source}", evidence)
    expect = predicted(manifest_providers)
    evidence.update(manifest=manifest_source, predicted=expect)
    rows, mismatches = [], []
    for kind in p.compared:
        got = server.get(kind) or []
        want = expect.get(kind) or []
        if not got:
            rows.append({"kind": kind, "server": None, "predicted": want, "result": "unknown"})
            continue
        wrong = [g for g in got if g not in want]
        rows.append({"kind": kind, "server": got, "predicted": want, "result": "mismatch" if wrong else "match"})
        if wrong:
            mismatches.append(f"{kind}: the server selected {', '.join(wrong)}; the manifest predicted "
                              f"{', '.join(want) or 'nothing for ' + kind}")
    evidence["compared"] = rows
    if mismatches:
        return failed(PROVIDERS, "; ".join(mismatches), evidence)
    matched = [r["kind"] for r in rows if r["result"] == "match"]
    if not matched:
        return not_run(PROVIDERS, f"the log names none of {', '.join(p.compared)} ({_said(server)})", evidence)
    unknown = [r["kind"] for r in rows if r["result"] == "unknown"]
    return passed(PROVIDERS, "; ".join(f"{r['kind']}: {', '.join(r['server'])} as predicted" for r in rows
                                       if r["result"] == "match")
                  + (f"; not in the log: {', '.join(unknown)}" if unknown else "") + f"; {_said(server, extras=True)}",
                  evidence)


def _said(server: Mapping[str, List[str]], extras: bool = False) -> str:
    kinds = ("dtype", "quantization", "kv_cache_dtype") if extras else sm.LOG_KINDS
    parts = [f"{k} {', '.join(server[k])}" for k in kinds if server.get(k)]
    return ", ".join(parts) or "nothing the matrix reads"
