"""Readable summaries of manifests (`show`) and of what changed between two (`diff`)."""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Sequence, Tuple

from qualify.core import manifest

_MARK = {"pass": "PASS", "fail": "FAIL", "warn": "WARN", "not-run": "----"}


def table(rows: Sequence[Sequence[str]], headers: Sequence[str]) -> str:
    widths = [max(len(str(x)) for x in col) for col in zip(headers, *rows)] if rows else [len(h) for h in headers]
    line = lambda r: "  ".join(str(v).ljust(w) for v, w in zip(r, widths)).rstrip()  # noqa: E731
    return "\n".join([line(headers), line(["-" * w for w in widths])] + [line(r) for r in rows])


def show(stmt: Mapping[str, Any], width: int = 100) -> str:
    p = manifest.predicate(stmt)
    t = p["target"]
    out = [
        f"target     {t['name']}  capability {t['capability']}  {t['platform']}  arch list {t['torch_cuda_arch_list']}",
        f"image      {p.get('image', {}).get('reference', manifest.subject_name(stmt))}",
        f"base       {p.get('base', {}).get('image', '-')}",
        f"verdict    {p['verdict']}   support level {p['support_level']}   scope {p['scope']}",
        f"toolkit    {p['toolkit'].get('version')}  revision {p['toolkit'].get('source_revision', '-')}",
    ]
    gpus = p.get("gpu", {}).get("devices") or []
    out.append("gpu        " + (", ".join(f"{g.get('name')} ({g.get('compute_cap')})" for g in gpus) or "none visible"))
    versions = p.get("versions", {}).get("packages", {})
    key = [k for k in ("torch", "triton", "vllm", "flashinfer-python", "flashinfer-cubin", "transformers") if k in versions]
    if key:
        out.append("versions   " + ", ".join(f"{k} {versions[k]}" for k in key))
    out += ["", "checks", table([[_MARK[c["status"]], c["id"], ("" if c["required"] else "(info) ") + c["reason"][:width]]
                                  for c in p["checks"]], ["status", "check", "reason"])]
    providers = p.get("providers") or []
    if providers:
        out += ["", "providers", table([[x["kind"], x.get("variant", ""), str(x["selected"]), x["mode"], x["reason"][:width]]
                                        for x in providers], ["kind", "variant", "selected", "mode", "reason"])]
    libs = p.get("census", {}).get("libraries") or []
    if libs:
        rows = [[lib.get("short", lib["path"]), str(lib["class"]), str(lib["best"]), " ".join(lib["sass"])[:40],
                 " ".join(lib["ptx"])[:24]] for lib in libs]
        out += ["", f"libraries ({len(libs)}) for {t['capability']}", table(rows, ["library", "worst", "best", "SASS", "PTX"])]
    return "\n".join(out)


def _libs(p: Mapping[str, Any]) -> Dict[str, Tuple[str, ...]]:
    return {lib.get("short", lib["path"]): (str(lib["class"]), " ".join(lib["sass"]), " ".join(lib["ptx"]))
            for lib in p.get("census", {}).get("libraries", [])}


def diff(old: Mapping[str, Any], new: Mapping[str, Any]) -> List[str]:
    a, b = manifest.predicate(old), manifest.predicate(new)
    lines: List[str] = []
    for key in ("verdict", "support_level"):
        if a.get(key) != b.get(key):
            lines.append(f"{key}: {a.get(key)} -> {b.get(key)}")
    if manifest.subject_digest(old) != manifest.subject_digest(new):
        lines.append(f"image: {manifest.subject_digest(old)} -> {manifest.subject_digest(new)}")
    va, vb = a.get("versions", {}).get("packages", {}), b.get("versions", {}).get("packages", {})
    for name in sorted(set(va) | set(vb)):
        if va.get(name) != vb.get(name):
            lines.append(f"package {name}: {va.get(name, '-')} -> {vb.get(name, '-')}")
    la, lb = _libs(a), _libs(b)
    for lib in sorted(set(la) | set(lb)):
        if la.get(lib) != lb.get(lib):
            before = "absent" if lib not in la else f"{la[lib][0]} [{la[lib][1]}] [{la[lib][2]}]"
            after = "absent" if lib not in lb else f"{lb[lib][0]} [{lb[lib][1]}] [{lb[lib][2]}]"
            lines.append(f"library {lib}: {before} -> {after}")
    ca = {c["id"]: c for c in a["checks"]}
    cb = {c["id"]: c for c in b["checks"]}
    for cid in sorted(set(ca) | set(cb)):
        sa, sb = ca.get(cid, {}).get("status", "absent"), cb.get(cid, {}).get("status", "absent")
        if sa != sb:
            lines.append(f"check {cid}: {sa} -> {sb} ({cb.get(cid, ca.get(cid))['reason'][:120]})")
    return lines
