"""Compiled architectures of every fatbin-carrying library in the image, judged
for the target: importable is not runnable.

Policy (the issue's words): `fail` when a library the serving path needs has
no runnable code for the target; `warn` for cross-generation PTX JIT only
(FlashAttention-2 on 12.1, the GB10 compatibility report) and for arch-specific (`a`/`f`) code
that does not match; the torch arch list it claims is compared with the
cubins libtorch really carries.

The serving path is vLLM's libraries (SERVING_PATH) and, for an engine the
image has installed whose rules name them (`EngineLibrary`: SGLang's
sgl_kernel), the library that engine's loader takes on the target: sgl_kernel
ships sm90/ and sm100/ builds of its common_ops and loads sm100/ on every
capability but 9.0, so an sgl_kernel built for SM100 only has nothing for
12.0 (sgl-project/sglang#12178). Such a library that is absent fails too; for
the package folders the rules name, what each library carries per Blackwell
capability is reported (`coverage`).
"""

from __future__ import annotations

import os
import re
import sys
import sysconfig
from dataclasses import dataclass
from typing import Any, Dict, Iterable, List, Optional, Sequence, Set, Tuple

from qualify.core import arch, census, ptxisa
from qualify.core.enums import Profile
from qualify.probe.model import FAIL, PASS, WARN, CheckResult, not_run

# Libraries the serving path cannot do without. A library that is only optional
# (FA3, FlashMLA, a Marlin kernel) is reported, not failed: vLLM falls back when
# it is unusable. vLLM 0.33 names its extensions `_C_stable_libtorch.abi3.so`.
SERVING_PATH = tuple(re.compile(p) for p in (
    r"torch/lib/libtorch_cuda\.so$",
    r"torch/lib/libc10_cuda\.so$",
    r"vllm/_C(_stable_libtorch)?\.abi3\.so$",
    r"vllm/_moe_C(_stable_libtorch)?\.abi3\.so$",
    r"vllm/cumem_allocator\.abi3\.so$",
    r"^/opt/blackwell/ext/libsmoke_ext\.so$",
))
SMOKE_EXT = "/opt/blackwell/ext/libsmoke_ext.so"

# The classes judged here; a census may report another for input it could not decode.
DECIDED = tuple(c.value for c in (arch.Compat.NATIVE, arch.Compat.COMPATIBLE, arch.Compat.PTX_JIT, arch.Compat.NONE))


@dataclass(frozen=True)
class EngineLibrary:
    """A library an installed engine loads at start-up whatever the model (its rules' serving_path)."""

    engine: str  # for people: "SGLang 0.5.23" (the image's release)
    what: str
    candidates: Tuple[str, ...]  # relative to site-packages, in the order its loader tries them on the target


def resolve(lib: EngineLibrary, roots: Sequence[str]) -> Optional[str]:
    """The file the engine's loader takes: the first candidate present (None: none is)."""
    for rel in lib.candidates:
        for root in roots:
            path = os.path.join(root, rel)
            if os.path.isfile(path):
                return os.path.realpath(path)
    return None


def blackwell_capabilities() -> List[arch.Capability]:
    return [arch.Capability.parse(f"{f.major}.{m}") for f in arch.FAMILIES if f.major in arch.BLACKWELL_MAJORS
            for m in f.minors]


def search_paths(extra: Iterable[str] = ()) -> List[str]:
    """site-packages of this interpreter, the CUDA toolkit and our own /opt/blackwell."""
    paths = []
    for key in ("purelib", "platlib"):
        paths.append(sysconfig.get_paths()[key])
    paths += [p for p in sys.path if p.endswith(("site-packages", "dist-packages"))]
    paths += [os.environ.get("CUDA_HOME") or "/usr/local/cuda", "/opt/blackwell", *extra]
    out: List[str] = []
    for p in paths:
        real = os.path.realpath(p)
        if os.path.isdir(real) and real not in out:
            out.append(real)
    return out


def _is_serving(path: str) -> bool:
    return any(p.search(path) for p in SERVING_PATH)


def _specific_only(unit: Dict[str, Any]) -> bool:
    """A unit with no code for the target whose code is all a/f-specific: kernels the
    library dispatches only on that exact architecture (torch's sm_100a GEMMs)."""
    names = list(unit.get("sass", [])) + list(unit.get("ptx", []))
    if not names:
        return False
    return all(arch.CodeTarget.parse(n).variant is not arch.Variant.PLAIN for n in names)


def _short(path: str, roots: Sequence[str]) -> str:
    for root in roots:
        if path.startswith(root + os.sep):
            return os.path.relpath(path, root)
    return path


# Packages such as flashinfer-cubin ship thousands of standalone cubins; the
# manifest keeps one aggregated row per directory of them instead.
AGGREGATE_AT = 20


def summarise(report: Dict[str, Any], roots: Sequence[str], serving: Iterable[str] = ()) -> List[Dict[str, Any]]:
    """One compact row per library for the manifest; `serving`: more serving-path files (real paths)."""
    return _aggregate_cubins(_rows(report, roots, set(serving)))


def _rows(report: Dict[str, Any], roots: Sequence[str], serving: Set[str] = frozenset()) -> List[Dict[str, Any]]:
    rows = []
    for lib in report["libraries"]:
        v = lib.get("verdict") or {}
        rows.append({
            "path": lib["path"], "short": _short(lib["path"], roots), "size": lib["size"],
            "containers": lib["containers"], "sass": lib["sass"], "ptx": lib["ptx"],
            "compression": {k: n for k, n in lib["compression"].items() if n},
            "class": v.get("class"), "best": v.get("best"), "counts": v.get("counts"),
            "cross_generation_jit": v.get("cross_generation_jit", False),
            "no_code_units": len(v.get("no_code", [])),
            # Units with no code for the target whose kernels could not be read: unknown, never a pass.
            "no_code_unknown_units": len(v.get("no_code_unknown", [])),
            "unknown_units": (v.get("counts") or {}).get("unknown", 0),
            "no_code_specific_only": sum(1 for u in v.get("no_code", []) if _specific_only(u)),
            # Whatever their containers hold, code that is all a/f-specific for other devices cannot run here.
            "no_code_specific_unknown": sum(1 for u in v.get("no_code_unknown", []) if _specific_only(u)),
            "link_only": lib.get("link_only") or {"sass": [], "ptx": []},
            # Issue 51: each PTX entry's ISA, and the units that run here only by JIT, by the ISA they need.
            "ptx_isa": lib.get("ptx_isa") or {},
            "ptx_jit": _ptx_jit(v),
            "errors": lib["errors"],
            "serving_path": _is_serving(lib["path"]) or os.path.realpath(lib["path"]) in serving,
            "format": lib.get("format"),
            **({"archive": lib["archive"]} if lib.get("archive") else {}),
        })
    return rows


def _ptx_jit(verdict: Dict[str, Any]) -> Dict[str, Any]:
    found = verdict.get("ptx_jit") or {}
    return {"units": found.get("units", 0), "isa": dict(found.get("isa") or {})}


def _group_key(row: Dict[str, Any]) -> Optional[str]:
    if row["format"] not in ("cubin", "fatbin") or row["serving_path"]:
        return None
    parts = row["short"].split("/")
    return "/".join(parts[:2]) if len(parts) > 2 else None


def _aggregate_cubins(rows: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    groups: Dict[str, List[Dict[str, Any]]] = {}
    for row in rows:
        key = _group_key(row)
        if key:
            groups.setdefault(key, []).append(row)
    big = {k: v for k, v in groups.items() if len(v) >= AGGREGATE_AT}
    out = [r for r in rows if _group_key(r) not in big]
    for key, members in sorted(big.items()):
        out.append(_merged(key, members))
    return sorted(out, key=lambda r: r["path"])


def names_of(members: List[Dict[str, Any]], kind: str) -> List[str]:
    found = {n for m in members for n in (m.get("link_only") or {}).get(kind, [])}
    return sorted(found, key=lambda n: (arch.CodeTarget.parse(n).capability, n))


def _merged(key: str, members: List[Dict[str, Any]]) -> Dict[str, Any]:
    def names(field: str) -> List[str]:
        found = {n for m in members for n in m[field]}
        return sorted(found, key=lambda n: (arch.CodeTarget.parse(n).capability, n))

    isas: Dict[str, set] = {}
    jit: Dict[str, int] = {}
    for m in members:
        for name, found in m["ptx_isa"].items():
            isas.setdefault(name, set()).update(found)
        for isa, n in m["ptx_jit"]["isa"].items():
            jit[isa] = jit.get(isa, 0) + n
    classes = [arch.Compat(m["class"]) for m in members if m["class"]]
    bests = [arch.Compat(m["best"]) for m in members if m["best"]]
    counts: Dict[str, int] = {}
    for m in members:
        for k, n in (m["counts"] or {}).items():
            counts[k] = counts.get(k, 0) + n
    first = members[0]["path"]
    return {
        "path": first[: first.index(key) + len(key)] if key in first else key,
        "short": f"{key}/** ({len(members)} standalone {members[0]['format']} files)",
        "size": sum(m["size"] for m in members), "containers": sum(m["containers"] for m in members),
        "sass": names("sass"), "ptx": names("ptx"), "compression": {},
        "class": max(classes, key=lambda c: c.rank).value if classes else None,
        "best": arch.best(bests).value if bests else None,
        "counts": counts, "cross_generation_jit": any(m["cross_generation_jit"] for m in members),
        "no_code_units": sum(m["no_code_units"] for m in members),
        "no_code_unknown_units": sum(m["no_code_unknown_units"] for m in members),
        "unknown_units": sum(m["unknown_units"] for m in members),
        "no_code_specific_only": sum(m["no_code_specific_only"] for m in members),
        "no_code_specific_unknown": sum(m["no_code_specific_unknown"] for m in members),
        "link_only": {"sass": names_of(members, "sass"), "ptx": names_of(members, "ptx")},
        "ptx_isa": {name: sorted(found, key=ptxisa.sort_key) for name, found in sorted(isas.items())},
        "ptx_jit": {"units": sum(jit.values()), "isa": {k: jit[k] for k in sorted(jit, key=ptxisa.sort_key)}},
        "errors": [e for m in members for e in m["errors"]][:10], "serving_path": False,
        "format": members[0]["format"], "files": len(members),
    }


def run(target: arch.Capability, arch_list: str, paths: Sequence[str], torch_claimed: Optional[List[str]],
        profile: Optional[Profile], torch_missing: Optional[str] = None, own_extension: bool = True,
        engine_libraries: Sequence[EngineLibrary] = (), coverage: Sequence[str] = ()) -> Dict[str, Any]:
    """Scan, judge and return {'libraries': rows, 'checks': [CheckResult...], 'scan_seconds': s}.
    `own_extension`: the image is one of our smoke builds, which carry the smoke extension (an image built
    elsewhere has no reason to). `engine_libraries`: what the installed engines load at start-up on the
    target; `coverage`: package folders whose libraries' code per Blackwell capability is reported."""
    import time

    from qualify.core import kernels

    start = time.monotonic()
    report = census.scan(list(paths), target).to_json()
    seconds = time.monotonic() - start
    decoders = kernels.decoder_status()
    loads = [(lib, resolve(lib, paths)) for lib in engine_libraries]
    rows = summarise(report, paths, (chosen for _, chosen in loads if chosen))
    for row in rows:  # where a decoder is missing, say per library what could not be read
        undecodable = {k: n for k, n in (row.get("compression") or {}).items() if k in decoders and not decoders[k]}
        if undecodable:
            row["undecodable"] = undecodable
    jit = ptx_jit(rows)
    checks = [
        serving_path(rows, target, loads, coverage),
        unit_gaps(rows, target),
        cross_generation(rows, target),
        ptx_isa_check(jit, target),
        arch_specific(rows, target),
        torch_arch_list(rows, torch_claimed, torch_missing),
        unreadable(rows),
    ]
    if profile == Profile.SMOKE and own_extension:
        checks.append(smoke_extension(rows, arch_list))
    return {"libraries": rows, "checks": checks, "scan_seconds": round(seconds, 3), "ptx_jit": jit,
            "files_scanned": report["files_scanned"], "paths": list(paths), "decoders": decoders}


def coverage_of(rows: List[Dict[str, Any]], folders: Sequence[str]) -> Dict[str, Dict[str, str]]:
    """Per library below the folders: its best class on each Blackwell capability, from the code it carries."""
    out: Dict[str, Dict[str, str]] = {}
    for r in rows:
        if any(r["short"].startswith(f.strip("/") + "/") for f in folders):
            targets = [arch.CodeTarget.parse(n) for n in list(r["sass"]) + list(r["ptx"])]
            out[r["short"]] = {str(c): arch.best(arch.compatibility(t, c) for t in targets).value
                               for c in blackwell_capabilities()}
    return out


def _coverage_line(cov: Dict[str, Dict[str, str]]) -> str:
    """"sgl_kernel/sm100/common_ops.abi3.so: 10.0, 10.3, 12.0 (none for 11.0, 12.1)", libraries of one answer
    together."""
    groups: Dict[Tuple[Tuple[str, ...], Tuple[str, ...]], List[str]] = {}
    for short, classes in cov.items():
        runs = tuple(c for c, k in classes.items() if k != arch.Compat.NONE.value)
        groups.setdefault((runs, tuple(c for c in classes if c not in runs)), []).append(short)
    return "; ".join(f"{', '.join(names)}: {', '.join(runs) or 'no Blackwell capability'}"
                     + (f" (none for {', '.join(none)})" if none and runs else "")
                     for (runs, none), names in groups.items())


def serving_path(rows: List[Dict[str, Any]], target: arch.Capability,
                 loads: Sequence[Tuple[EngineLibrary, Optional[str]]] = (), coverage: Sequence[str] = ()) -> CheckResult:
    cid, title = "census.serving-path", f"Serving-path libraries carry runnable code for {target}"
    serving = [r for r in rows if r["serving_path"]]
    if not serving and not loads:
        return not_run(cid, title, "no serving-path library found in the image", required=False)
    by_path = {os.path.realpath(r["path"]): r for r in rows if loads and r.get("path")}
    loaded: Dict[str, str] = {}  # row short -> which engine loads it
    bad = []
    for lib, chosen in loads:
        if chosen is None:
            bad.append(f"{lib.engine} loads {lib.what} at start-up: {' or '.join(lib.candidates)} is not in the "
                       "image (it fails there)")
        elif chosen not in by_path:
            bad.append(f"{lib.engine} loads {chosen} at start-up ({lib.what}): it has no device code at all")
        else:
            loaded[by_path[chosen]["short"]] = lib.engine
    bad += [f"{r['short']}{_loaded_by(loaded, r, target)}: no runnable code at all (SASS {', '.join(r['sass']) or '-'}; "
            f"PTX {', '.join(r['ptx']) or '-'})" for r in serving if r["best"] in (None, "none")]
    evidence: Dict[str, Any] = {"libraries": {r["short"]: {"class": r["class"], "best": r["best"], "sass": r["sass"],
                                                           "ptx": r["ptx"]} for r in serving}}
    if loads:
        evidence["engines"] = [{"engine": lib.engine, "what": lib.what, "candidates": list(lib.candidates),
                                "loads": by_path[chosen]["short"] if chosen in by_path else chosen}
                               for lib, chosen in loads]
    cov = coverage_of(rows, coverage)
    tail = f"; Blackwell code in {', '.join(coverage)}: {_coverage_line(cov)}" if cov else ""
    if cov:
        evidence["coverage"] = cov
    if bad:
        return CheckResult(cid, title, FAIL, "; ".join(bad) + tail, evidence=evidence)
    undecided = [r for r in serving if r["best"] not in DECIDED]
    if undecided:  # the census could not tell whether anything runs (damaged input): never a pass
        return CheckResult(cid, title, FAIL, "the census could not tell whether these serving-path libraries run "
                           "anything on the target: " + ", ".join(f"{r['short']} ({r['best']})" for r in undecided)
                           + tail, evidence=evidence)
    return CheckResult(cid, title, PASS, f"{len(serving)} serving-path librar{'y' if len(serving) == 1 else 'ies'}: "
                       + ", ".join(f"{r['short']} {r['best']}{_loaded_by(loaded, r, target)}" for r in serving) + tail,
                       evidence=evidence)


def _loaded_by(loaded: Dict[str, str], row: Dict[str, Any], target: arch.Capability) -> str:
    who = loaded.get(row["short"])
    return f" (what {who} loads on {target})" if who else ""


def cross_generation(rows: List[Dict[str, Any]], target: arch.Capability) -> CheckResult:
    cid, title = "census.cross-generation-jit", f"No library runs on {target} only through cross-generation PTX JIT"
    hits = [r for r in rows if r["cross_generation_jit"]]
    if not hits:
        return CheckResult(cid, title, PASS, f"{len(rows)} libraries checked", required=False)
    return CheckResult(cid, title, WARN,
                       "PTX from an older generation would be JIT-compiled (slow first load, no "
                       f"{target.major}.x features) in: " + ", ".join(f"{r['short']} (PTX {', '.join(r['ptx'])})" for r in hits),
                       required=False, evidence={"libraries": [r["short"] for r in hits]})


def ptx_jit(rows: List[Dict[str, Any]]) -> Dict[str, Any]:
    """What the image needs a driver to JIT-compile on the target (issue 51), for the manifest's
    `census.ptx_jit`: the newest PTX ISA among the units that run here only by JIT, how many units' ISA could
    not be read (never assumed), and which libraries. The deploy compares `highest_isa` with what the host's
    driver JITs (deploy/ptxgate.py, by the release's signed table)."""
    libs = [r for r in rows if r["ptx_jit"]["units"]]
    known = {isa for r in libs for isa in r["ptx_jit"]["isa"] if isa != ptxisa.UNKNOWN}
    return {"highest_isa": max(known, key=ptxisa.key) if known else None,
            "unknown_units": sum(r["ptx_jit"]["isa"].get(ptxisa.UNKNOWN, 0) for r in libs),
            "libraries": [{"library": r["short"], "units": r["ptx_jit"]["units"], "isa": r["ptx_jit"]["isa"],
                           "ptx": r["ptx"], "serving_path": r["serving_path"]} for r in libs]}


def ptx_isa_check(jit: Dict[str, Any], target: arch.Capability) -> CheckResult:
    cid, title = "census.ptx-isa", f"The PTX ISA of code that runs on {target} only by JIT is known"
    libs = jit["libraries"]
    evidence = {"highest_isa": jit["highest_isa"], "libraries": {x["library"]: x["isa"] for x in libs}}
    if not libs:
        return CheckResult(cid, title, PASS, f"nothing runs on {target} only by PTX JIT", required=False,
                           evidence=evidence)
    named = ", ".join(f"{x['library']} ({x['units']} unit(s), PTX ISA {'/'.join(x['isa'])})" for x in libs[:10])
    more = f" and {len(libs) - 10} more" if len(libs) > 10 else ""
    if jit["unknown_units"]:
        return CheckResult(cid, title, WARN, f"{jit['unknown_units']} unit(s) run here only by JIT and their PTX ISA "
                           "could not be read (compressed, no decoder, or not opening with .version), so no driver "
                           f"can be said to JIT them; the deploy refuses them: {named}{more}", required=False,
                           evidence=evidence)
    return CheckResult(cid, title, PASS, f"{len(libs)} librar{'y runs' if len(libs) == 1 else 'ies run'} on {target} "
                       f"only by PTX JIT; the newest PTX ISA a driver must compile is {jit['highest_isa']} (the deploy "
                       f"compares it with the host driver's): {named}{more}", required=False, evidence=evidence)


def unit_gaps(rows: List[Dict[str, Any]], target: arch.Capability) -> CheckResult:
    """Serving-path libraries that run, but with compiled units holding only plain code for other
    devices (vLLM builds some sources for one architecture and dispatches them only there)."""
    cid, title = "census.unit-gaps", f"Serving-path units without code for {target}"
    runs = [r for r in rows if r["serving_path"] and r["best"] not in (None, "none")]
    known = {r["short"]: r["no_code_units"] - r["no_code_specific_only"] for r in runs
             if r["no_code_units"] > r["no_code_specific_only"]}
    unknown = {r["short"]: r["unknown_units"] for r in runs if r["unknown_units"]}
    if not known and not unknown:
        return CheckResult(cid, title, PASS, "every compiled unit of the serving path has code for the target",
                           required=False)
    units = {r["short"]: sum((r["counts"] or {}).values()) for r in runs}
    said = []
    if known:
        said.append("kernels in these units cannot launch here (the library dispatches them only on other devices): "
                    + ", ".join(f"{name} ({n} of {units[name]} units)" for name, n in known.items()))
    if unknown:  # undecodable containers (no decoder in the image): unknown, never a pass
        said.append("could not tell whether these units hold kernels for the target (their containers could not be "
                    "decompressed here): " + ", ".join(f"{name} ({n} of {units[name]} units)" for name, n in unknown.items()))
    return CheckResult(cid, title, WARN, "; ".join(said), required=False,
                       evidence={"libraries": known, "unknown": unknown})



def arch_specific(rows: List[Dict[str, Any]], target: arch.Capability) -> CheckResult:
    cid, title = "census.arch-specific", f"Arch-specific (a/f) code that does not match {target}"
    hits = [r for r in rows if r["no_code_specific_only"] + r["no_code_specific_unknown"]]
    if not hits:
        return CheckResult(cid, title, PASS, "none", required=False)
    # Libraries with nothing at all for the target first (FA3 sm_90a-only), big cubin directories last.
    hits.sort(key=lambda r: (r["best"] not in (None, "none"), "files" in r, r["short"]))

    def describe(r: Dict[str, Any]) -> str:
        code = ", ".join(r["sass"] + r["ptx"])
        only = f"only {code}" if len(code) <= 40 else f"{len(r['sass'])} SASS arches"
        n = r["no_code_specific_only"] + r["no_code_specific_unknown"]
        nothing = "; nothing in it runs here" if r["best"] == "none" else ""
        return f"{r['short']} ({n} unit(s); {only}{nothing})"

    return CheckResult(cid, title, WARN,
                       "units whose only code is arch-specific for other devices (dispatched only there): "
                       + "; ".join(describe(r) for r in hits[:20])
                       + (f" and {len(hits) - 20} more" if len(hits) > 20 else ""),
                       required=False, evidence={"libraries": {r["short"]: r["no_code_specific_only"] +
                                                               r["no_code_specific_unknown"] for r in hits}})


def torch_arch_list(rows: List[Dict[str, Any]], claimed: Optional[List[str]], why_missing: Optional[str] = None) -> CheckResult:
    cid, title = "census.torch-arch-list", "torch.cuda.get_arch_list() against the cubins libtorch carries"
    lib = next((r for r in rows if r["path"].endswith("torch/lib/libtorch_cuda.so")), None)
    if claimed is None or lib is None:
        return not_run(cid, title, why_missing or "torch is not installed", required=False)
    real = set(lib["sass"]) | set(lib["ptx"])
    plain_real = {arch.CodeTarget.parse(n).without_variant() for n in real}
    missing = [c for c in claimed if c not in real and c not in plain_real]
    extra = sorted(n for n in real if n not in claimed)
    evidence = {"claimed": claimed, "carried": sorted(real), "claimed_not_carried": missing, "carried_not_claimed": extra}
    if missing:
        return CheckResult(cid, title, WARN, f"torch claims {', '.join(missing)} but libtorch_cuda.so has no such code",
                           required=False, evidence=evidence)
    return CheckResult(cid, title, PASS, f"every claimed arch is carried; also carried, unclaimed: {', '.join(extra) or 'none'}",
                       required=False, evidence=evidence)


def unreadable(rows: List[Dict[str, Any]]) -> CheckResult:
    cid, title = "census.unreadable", "Every library could be read"
    bad = [r for r in rows if r["errors"]]
    if not bad:
        return CheckResult(cid, title, PASS, f"{len(rows)} libraries read", required=False)
    return CheckResult(cid, title, WARN, "; ".join(f"{r['short']}: {r['errors'][0]}" for r in bad[:10]),
                       required=False, evidence={"files": {r["short"]: r["errors"] for r in bad}})


def smoke_extension(rows: List[Dict[str, Any]], arch_list: str) -> CheckResult:
    """The smoke extension must carry exactly what TORCH_CUDA_ARCH_LIST asks for."""
    cid, title = "census.smoke-extension", f"Smoke extension carries exactly the code of TORCH_CUDA_ARCH_LIST={arch_list}"
    lib = next((r for r in rows if r["path"] == SMOKE_EXT), None)
    if lib is None:
        return CheckResult(cid, title, FAIL, f"{SMOKE_EXT} not found in the image")
    want = sorted(str(t) for t in arch.expected_code_targets(arch_list))
    got = sorted(set(lib["sass"]) | set(lib["ptx"]))
    evidence = {"expected": want, "found": got}
    if want == got:
        return CheckResult(cid, title, PASS, f"{', '.join(got)}", evidence=evidence)
    return CheckResult(cid, title, FAIL, f"expected {', '.join(want)}, found {', '.join(got) or 'nothing'}",
                       evidence=evidence)
