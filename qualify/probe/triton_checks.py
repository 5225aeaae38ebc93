"""Triton checks: ptxas wiring, sm_XYa assembly, a real cross-compile, the allocator.

The questions are asked of Triton itself, in child interpreters; this module
only compares answers with what the target expects.
"""

from __future__ import annotations

import os
import re
import tempfile
import time
from typing import Dict, List, Optional, Sequence

from qualify.core import arch
from qualify.core.fatbin import read_file
from qualify.probe.model import FAIL, PASS, WARN, CheckResult, not_run
from qualify.probe.subproc import run_command, run_snippet
from qualify.probe.versions import tool_version

# A minimal PTX module; .version 8.8 is the first to know sm_121a/sm_103a (CUDA 12.9).
_PTX = """.version 8.8
.target {gpu}
.address_size 64
.visible .entry probe_empty()
{{
  ret;
}}
"""


def _ptxas_selector_arch(cap: arch.Capability) -> int:
    return cap.number


def wiring(cap: arch.Capability, expected: Dict[str, str], triton_version: Optional[str]) -> CheckResult:
    """Which ptxas Triton really uses for `cap`, and is it the one we wired?"""
    title = f"Triton ptxas wiring for {cap}"
    if triton_version is None:
        return not_run("triton.ptxas-wiring", title, "Triton is not installed in this image")
    child = run_snippet("triton_wiring", [str(_ptxas_selector_arch(cap))], timeout=120)
    if not child.ok:
        return CheckResult("triton.ptxas-wiring", title, FAIL,
                           f"asking Triton which ptxas it uses failed: {child.failure()}", evidence=child.evidence())
    data = child.data
    used = data["ptxas_path"]
    knob = "ptxas_blackwell" if "ptxas_blackwell" in data.get("knobs", {}) and cap.major >= 10 else "ptxas"
    wired = expected.get("TRITON_PTXAS_BLACKWELL_PATH" if knob == "ptxas_blackwell" else "TRITON_PTXAS_PATH")
    evidence = {**data, "expected_knob": knob, "expected_path": wired}
    if wired and os.path.realpath(used) == os.path.realpath(wired):
        return CheckResult("triton.ptxas-wiring", title, PASS,
                           f"Triton {data['triton']} uses {used} (CUDA {data['ptxas_version']}) via {knob}",
                           evidence=evidence)
    if data.get("uses_bundled"):
        env = data.get("knobs", {}).get(knob, {})
        why = ("the wired path is not set" if not env.get("env_value")
               else f"{env.get('env')}={env.get('env_value')} failed `--version`, so Triton fell back silently")
        return CheckResult("triton.ptxas-wiring", title, FAIL,
                           f"Triton {data['triton']} uses its bundled ptxas {used} (CUDA {data['ptxas_version']}): {why}",
                           evidence=evidence)
    return CheckResult("triton.ptxas-wiring", title, FAIL,
                       f"Triton {data['triton']} uses {used}, not the wired {wired}", evidence=evidence)


def assembles(cap: arch.Capability, ptxas: Optional[str]) -> CheckResult:
    """Does that ptxas accept `--gpu-name sm_XYa` for the target?"""
    gpu = arch.triton_gpu_name(cap)
    title = f"ptxas assembles {gpu}"
    if not ptxas:
        return not_run("triton.ptxas-assembles", title, "no ptxas to try (Triton not installed or wiring unknown)")
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "probe.ptx")
        with open(src, "w") as fh:
            fh.write(_PTX.format(gpu=gpu))
        child = run_command([ptxas, "--gpu-name", gpu, src, "-o", os.path.join(tmp, "probe.cubin")], timeout=60)
    evidence = {"ptxas": ptxas, "version": tool_version(ptxas), "gpu_name": gpu,
                "returncode": child.returncode, "stderr_tail": child.stderr_tail}
    if child.returncode == 0 and not child.timed_out:
        return CheckResult("triton.ptxas-assembles", title, PASS, f"{ptxas} (V{evidence['version']}) accepts {gpu}",
                           evidence=evidence)
    lines = child.stderr_tail.strip().splitlines()
    return CheckResult("triton.ptxas-assembles", title, FAIL,
                       f"{ptxas} rejects {gpu}: {lines[-1] if lines else child.failure()}", evidence=evidence)


def cross_compile(caps: Sequence[arch.Capability], target: arch.Capability,
                  triton_version: Optional[str]) -> List[CheckResult]:
    """Compile a real kernel for each capability without a GPU; confirm the cubin's arch."""
    results = []
    for cap in caps:
        check_id = "triton.cross-compile" if cap == target else f"triton.cross-compile.{cap.number}"
        title = f"Triton compiles a kernel for GPUTarget('cuda', {cap.number}, 32)"
        if triton_version is None:
            results.append(not_run(check_id, title, "Triton is not installed in this image", required=cap == target))
            continue
        results.append(_compile_one(check_id, title, cap, required=cap == target))
    return results


def _compile_one(check_id: str, title: str, cap: arch.Capability, required: bool) -> CheckResult:
    with tempfile.TemporaryDirectory() as tmp:
        env = {"TRITON_CACHE_DIR": os.path.join(tmp, "cache")}
        start = time.monotonic()
        child = run_snippet("triton_compile", [str(cap.number), tmp], timeout=300, env=env)
        if not child.ok:
            log = child.stderr_tail
            m = re.search(r"ptxas fatal\s*:.*", log)
            reason = m.group(0).strip() if m else child.failure()
            return CheckResult(check_id, title, FAIL, f"compile for {cap} failed: {reason}", required,
                               evidence=child.evidence())
        cubin = read_file(child.data["cubin"])
        found = sorted({str(e.code_target) for e in cubin.entries if e.code_target is not None})
        evidence = {**child.data, "cubin_arches": found, "seconds": round(time.monotonic() - start, 2)}
        want_sm = f"sm_{cap.number}"
        if not any(a.startswith(want_sm) for a in found):
            return CheckResult(check_id, title, FAIL,
                               f"the compiled cubin is for {found or 'nothing readable'}, not {want_sm}", required,
                               evidence=evidence)
        want_target = arch.triton_gpu_name(cap)
        if want_target not in child.data.get("ptx_target", ""):
            return CheckResult(check_id, title, WARN, f"cubin is {want_sm} but the PTX says {child.data.get('ptx_target')!r}",
                               required, evidence=evidence)
        return CheckResult(check_id, title, PASS,
                           f"Triton {child.data['triton']} built a {want_target} cubin ({child.data['cubin_bytes']} bytes); "
                           f"census of the cubin: {', '.join(found)}", required, evidence=evidence)


def allocator(triton_version: Optional[str]) -> CheckResult:
    title = "Triton default allocator in a fresh interpreter, a new thread and a spawned process"
    if triton_version is None:
        return not_run("triton.allocator", title, "Triton is not installed in this image")
    startup = run_snippet("triton_allocator", ["startup"], timeout=60)
    check = run_snippet("triton_allocator", ["check"], timeout=180)
    evidence = {"startup": startup.data if startup.ok else startup.evidence(),
                "contexts": check.data if check.ok else check.evidence()}
    if not startup.ok or not check.ok:
        bad = startup if not startup.ok else check
        return CheckResult("triton.allocator", title, FAIL, f"allocator probe failed: {bad.failure()}", evidence=evidence)
    s, c = startup.data, check.data
    problems = []
    if s["triton_loaded"] or s["torch_loaded"]:
        problems.append("the start-up hook imported triton or torch")
    if not s["hook_on_meta_path"]:
        problems.append("no allocator hook is registered at start-up (blackwell_triton_allocator .pth missing)")
    for where in ("main", "thread", "spawned"):
        if c[where]["is_null"]:
            problems.append(f"{where}: the default allocator is Triton's NullAllocator")
    if not c.get("explicit_wins", False):
        problems.append("an explicit triton.set_allocator() no longer takes precedence")
    if problems:
        return CheckResult("triton.allocator", title, FAIL, "; ".join(problems), evidence=evidence)
    return CheckResult("triton.allocator", title, PASS,
                       f"{c['main']['type']} in the main thread, a new thread and a spawned process; "
                       "start-up imported neither triton nor torch", evidence=evidence)
