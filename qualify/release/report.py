"""Readable summaries of manifests (`show`) and of what changed between two (`diff`)."""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Dict, List, Mapping, Optional, Tuple

from qualify.core import manifest
from qualify.core.servingpaths import ServingPaths
from qualify.host.tables import ELLIPSIS, clip, table  # noqa: F401  (ELLIPSIS: what cut text ends in)

if TYPE_CHECKING:
    from qualify.release.standing import Standing

_MARK = {"pass": "PASS", "fail": "FAIL", "warn": "WARN", "not-run": "----"}
DEFAULT_WIDTH = 100
_MIN_WIDTH = 40


def show(stmt: Mapping[str, Any], width: int = DEFAULT_WIDTH, standing: Optional[Standing] = None) -> str:
    """The manifest for people, every line at most `width` characters (cut text ends in an ellipsis). The level
    is `standing`'s where given (a manifest in a release folder: the verified current level and the promotion
    record behind it; from release/v3 the manifest itself keeps the released level)."""
    width = max(width, _MIN_WIDTH)
    p = manifest.predicate(as_current(stmt, standing))
    level, promotion = p.get("support_level"), p.get("promotion")
    t = p.get("target") or {}
    toolkit = p.get("toolkit") or {}
    out = [
        f"target     {t.get('name')}  capability {t.get('capability')}  {t.get('platform')}  "
        f"arch list {t.get('torch_cuda_arch_list')}",
        f"image      {(p.get('image') or {}).get('reference', manifest.subject_name(stmt))}",
        f"base       {(p.get('base') or {}).get('image', '-')}",
        f"verdict    {p.get('verdict')}   support level {level}   scope {p.get('scope')}",
        f"toolkit    {toolkit.get('version')}  revision {toolkit.get('source_revision', '-')}",
    ]
    out += _promotion_lines(promotion)
    if standing and standing.note:
        out.append(f"note       {standing.note}")
    gpus = (p.get("gpu") or {}).get("devices") or []
    out.append("gpu        " + (", ".join(f"{g.get('name')} ({g.get('compute_cap')})" for g in gpus) or "none visible"))
    tp, joined = (p.get("gpu") or {}).get("tensor_parallel_size"), (p.get("gpu") or {}).get("topology") or {}
    if tp:
        links = ", ".join(sorted({str(lk.get("link")) for lk in joined.get("links") or []})) or "not read"
        out.append(f"parallel   tensor parallel {tp}, GPUs joined by {joined.get('kind')} ({links})")
    versions = (p.get("versions") or {}).get("packages") or {}
    key = [k for k in ("torch", "triton", "vllm", "sglang", "sglang-kernel", "sgl-kernel", "flashinfer-python",
                       "flashinfer-cubin", "transformers") if k in versions]
    if key:
        out.append("versions   " + ", ".join(f"{k} {versions[k]}" for k in key))
    out = [clip(line, width) for line in out]
    checks = [[_MARK.get(c.get("status"), "????"), c.get("id", ""), ("" if c.get("required", True) else "(info) ")
               + str(c.get("reason", ""))] for c in p.get("checks") or []]
    out += ["", "checks", table(checks, ["status", "check", "reason"], width)]
    providers = p.get("providers") or []
    if providers:
        rows = [[" ".join(str(k) for k in (x.get("engine"), x.get("kind", "")) if k), x.get("variant", ""),
                 str(x.get("selected")), x.get("mode", ""), x.get("reason", "")] for x in providers]
        out += ["", "providers", table(rows, ["kind", "variant", "selected", "mode", "reason"], width)]
    paths = ServingPaths.of_predicate(p)
    if paths.recorded:
        rows = [[sp.path + (f" ({sp.engine})" if sp.engine != "vllm" else ""), sp.verdict, sp.line(),
                 ", ".join(f"{f.name} {_present(f.present)}" for f in sp.families)] for sp in paths.paths]
        out += ["", clip(f"serving paths on {t.get('capability')} (what a model's quantization runs; the deploy "
                         "refuses a path with no kernels)", width),
                table(rows, ["path", "verdict", "", "kernel families"], width)]
    libs = (p.get("census") or {}).get("libraries") or []
    if libs:
        rows = [[lib.get("short", lib.get("path", "")), _class_cell(lib, "class"), _class_cell(lib, "best"),
                 " ".join(lib.get("sass") or []), " ".join(lib.get("ptx") or [])] for lib in libs]
        out += ["", clip(f"libraries ({len(libs)}) for {t.get('capability')}", width),
                table(rows, ["library", "worst", "best", "SASS", "PTX"], width)]
    return "\n".join(out)


def as_current(stmt: Mapping[str, Any], standing: Optional[Standing]) -> Mapping[str, Any]:
    """The statement as `show` and `diff` read it: with the verified current level and, where one exists, the
    signed promotion record (its level, passes and evidence) in place of what the manifest says itself (from
    release/v3 the released level, no promotion section). A copy; the manifest is never changed."""
    if standing is None:
        return stmt
    p = dict(manifest.predicate(stmt), support_level=standing.level)
    if standing.promotion is not None:
        p["promotion"] = standing.promotion
    return {**stmt, "predicate": p}


def _present(value: Optional[bool]) -> str:
    return {True: "present", False: "missing"}.get(value, "unknown")


def _class_cell(lib: dict, key: str) -> str:
    """A library's class; a library without one says why: a static archive is a link input, and device code
    without kernels (a container of data or link stubs only) has nothing to judge."""
    value = lib.get(key)
    if value is not None:
        return str(value)
    return "link input" if lib.get("format") == "archive" else "no kernels"


def _promotion_lines(promotion: Any) -> List[str]:
    """The level with the evidence behind it (the signed promotion record's; in a release/v2 folder the copy
    promote wrote into the manifest has the same keys)."""
    if not isinstance(promotion, dict):
        return []
    evidence = [e for e in promotion.get("evidence") or [] if isinstance(e, dict)]
    lines = [f"level      {promotion.get('level')} by evidence: {promotion.get('consecutive_passes')} of "
             f"{promotion.get('required_consecutive_passes')} consecutive passes (released as "
             f"{promotion.get('released_level')})" + (f"; {promotion['note']}" if promotion.get("note") else "")]
    for e in evidence:
        figures = ", ".join(f"{k} {v:g}" for k, v in sorted((e.get("figures") or {}).items()))
        lines.append(f"  evidence {e.get('time')}  {e.get('outcome')}  {e.get('gpu')} (driver {e.get('driver')})"
                     + (f"  {figures}" if figures else "") + f"  {e.get('file')}")
    return lines


def sku_figures(p: Mapping[str, Any]) -> Dict[Tuple[str, str], float]:
    """(GPU name, figure) -> the median over the passing evidence the level rests on: a per-SKU baseline
    (the Blackwell support RFC: performance is watched against each SKU's own figures, not a single number)."""
    values: Dict[Tuple[str, str], List[float]] = {}
    for e in (p.get("promotion") or {}).get("evidence") or []:
        if isinstance(e, dict) and e.get("outcome") == "pass":
            for name, value in (e.get("figures") or {}).items():
                if isinstance(value, (int, float)):
                    values.setdefault((str(e.get("gpu")), name), []).append(float(value))
    return {key: statistics.median(v) for key, v in values.items()}


# --- diff -----------------------------------------------------------------------


@dataclass(frozen=True)
class Change:
    """One difference between two manifests; `before`/`after` are None when absent."""

    kind: str  # target | platform | capability | verdict | support_level | image | package | library | check | figure
    name: str
    before: Optional[str]
    after: Optional[str]
    detail: str = ""

    def line(self) -> str:
        before = "absent" if self.before is None else self.before
        after = "absent" if self.after is None else self.after
        if self.kind in ("verdict", "support_level", "image", "target", "platform", "capability"):
            return f"{self.kind}: {before} -> {after}"
        if self.kind == "check":
            return f"check {self.name}: {before} -> {after} ({self.detail[:120]})"
        if self.kind == "figure":
            return f"figure {self.name}: {before} -> {after}" + (f" ({self.detail})" if self.detail else "")
        return f"{self.kind} {self.name}: {before} -> {after}"

    def as_dict(self) -> Dict[str, Any]:
        return asdict(self)


def _libs(p: Mapping[str, Any]) -> Dict[str, Tuple[str, ...]]:
    return {lib.get("short", lib.get("path")): (str(lib.get("class")), " ".join(lib.get("sass") or []),
                                               " ".join(lib.get("ptx") or []))
            for lib in (p.get("census") or {}).get("libraries") or []}


def _target_changes(a: Mapping[str, Any], b: Mapping[str, Any]) -> List[Change]:
    ta, tb = a.get("target") or {}, b.get("target") or {}
    return [Change(key, key, ta.get(src), tb.get(src))
            for key, src in (("target", "name"), ("platform", "platform"), ("capability", "capability"))
            if ta.get(src) != tb.get(src)]


def changes(old: Mapping[str, Any], new: Mapping[str, Any]) -> List[Change]:
    a, b = manifest.predicate(old), manifest.predicate(new)
    found = _target_changes(a, b)
    for key in ("verdict", "support_level"):
        if a.get(key) != b.get(key):
            found.append(Change(key, key, a.get(key), b.get(key)))
    if manifest.subject_digest(old) != manifest.subject_digest(new):
        found.append(Change("image", "image", manifest.subject_digest(old), manifest.subject_digest(new)))
    va = (a.get("versions") or {}).get("packages") or {}
    vb = (b.get("versions") or {}).get("packages") or {}
    for name in sorted(set(va) | set(vb)):
        if va.get(name) != vb.get(name):
            found.append(Change("package", name, va.get(name, "-"), vb.get(name, "-")))
    la, lb = _libs(a), _libs(b)
    for lib in sorted(set(la) | set(lb), key=str):
        if la.get(lib) != lb.get(lib):
            fmt = lambda v: f"{v[0]} [{v[1]}] [{v[2]}]"  # noqa: E731
            found.append(Change("library", str(lib), fmt(la[lib]) if lib in la else None,
                                fmt(lb[lib]) if lib in lb else None))
    fa, fb = sku_figures(a), sku_figures(b)
    for gpu, name in sorted(set(fa) | set(fb)):
        before, after = fa.get((gpu, name)), fb.get((gpu, name))
        if before != after:
            change = f"{(after - before) / before:+.1%}" if before and after is not None else ""
            found.append(Change("figure", f"{name} on {gpu}", None if before is None else f"{before:g}",
                                None if after is None else f"{after:g}", change))
    ca = {c.get("id"): c for c in a.get("checks") or []}
    cb = {c.get("id"): c for c in b.get("checks") or []}
    for cid in sorted(set(ca) | set(cb), key=str):
        sa, sb = ca.get(cid, {}).get("status"), cb.get(cid, {}).get("status")
        if sa != sb:
            found.append(Change("check", str(cid), sa, sb, str(cb.get(cid, ca.get(cid)).get("reason", ""))))
    return found


def diff(old: Mapping[str, Any], new: Mapping[str, Any]) -> List[str]:
    return [c.line() for c in changes(old, new)]
