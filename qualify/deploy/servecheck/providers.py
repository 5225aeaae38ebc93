"""serve.providers: what the running server selected, from its own start-up log, against the release manifest.

vLLM names its attention backend, MoE and linear kernels and the engine's dtype and quantization in the lines
it logs while it starts (the matrix's `log_rules` say which lines); its class names become the manifest's
provider names through the provider rules' observed_names. The prediction is the verified release manifest's
`providers` (predicted from the census, or observed through vLLM's selectors where a GPU was present).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence

from qualify.deploy.servecheck.result import CheckResult, failed, not_run, passed
from qualify.probe import servematrix as sm
from qualify.probe.providers import rules as provider_rules

PROVIDERS = "serve.providers"
MAX_LOG_BYTES = 64 << 20  # start-up comes first; a long-running server's log is cut, never read whole


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


def providers(log: Optional[str], log_source: str, manifest_providers: Optional[Sequence[Mapping[str, Any]]],
              manifest_source: str, p: sm.Providers) -> CheckResult:
    """`log`: the server's start-up log (None: unreadable, `log_source` says why); `manifest_providers`: the
    verified manifest's `providers` (None: no manifest, `manifest_source` says why)."""
    if log is None:
        return not_run(PROVIDERS, f"the server's start-up log cannot be read: {log_source}")
    seen = observe(log[:MAX_LOG_BYTES], p)
    server = {k: [s.name for s in seen if s.kind == k] for k in sm.LOG_KINDS}
    evidence: Dict[str, Any] = {"log": log_source, "server": {k: v for k, v in server.items() if v},
                                "lines": [{"kind": s.kind, "name": s.name, "line": s.line,
                                           **({"note": s.note} if s.note else {})} for s in seen]}
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
