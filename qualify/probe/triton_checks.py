"""Triton checks: ptxas wiring, sm_XYa assembly, a real cross-compile, the allocator.

The questions are asked of Triton itself, in child interpreters; this module
only compares answers with what the target expects.
"""

from __future__ import annotations

import os
import re
import tempfile
import time
from typing import Dict, List, Optional, Sequence, Tuple

from qualify.core import arch
from qualify.core.fatbin import read_file
from qualify.probe.model import FAIL, PASS, WARN, CheckResult, not_run
from qualify.probe.subproc import run_command, run_snippet
from qualify.probe.versions import tool_version

# A minimal PTX module at the oldest PTX ISA that names the target (arch.first_ptx_isa): a newer `.version`
# than the ptxas knows is refused for that alone (CUDA 12.8's ptxas and `.version 8.8`, even for sm_120a).
_PTX = """.version {isa}
.target {gpu}
.address_size 64
.visible .entry probe_empty()
{{
  ret;
}}
"""


def _ptxas_selector_arch(cap: arch.Capability) -> int:
    return cap.number


def knob_env(data: Dict, cap: arch.Capability) -> Tuple[str, str]:
    """(knob, environment variable) Triton reads for `cap`: 3.6-3.8 `ptxas_blackwell` from 10.0 on, else `ptxas`."""
    knobs = data.get("knobs") or {}
    knob = "ptxas_blackwell" if "ptxas_blackwell" in knobs and cap.major >= 10 else "ptxas"
    env = (knobs.get(knob) or {}).get("env") or ("TRITON_PTXAS_BLACKWELL_PATH" if knob == "ptxas_blackwell"
                                                 else "TRITON_PTXAS_PATH")
    return knob, env


def fix_for(env: str, toolkit_ptxas: Optional[str]) -> str:
    """How to point Triton at a ptxas of the image's own CUDA toolkit, or get one."""
    if toolkit_ptxas:
        return f"set {env}={toolkit_ptxas} (the image's CUDA toolkit ptxas)"
    return (f"install a CUDA 13 ptxas (the nvidia-cuda-nvcc wheel or a CUDA 13 toolkit; the image has none) and set "
            f"{env} to it")


def wiring(cap: arch.Capability, expected: Dict[str, str], triton_version: Optional[str], external: bool = False,
           toolkit_ptxas: Optional[str] = None) -> CheckResult:
    """Which ptxas Triton really uses for `cap`, and is it the one we wired? For an image we did not build
    (`external`) there is no wiring of ours to expect: the question is what the image itself sets."""
    title = f"Triton ptxas wiring for {cap}"
    if triton_version is None:
        return not_run("triton.ptxas-wiring", title, "Triton is not installed in this image")
    child = run_snippet("triton_wiring", [str(_ptxas_selector_arch(cap))], timeout=120)
    if not child.ok:
        return CheckResult("triton.ptxas-wiring", title, FAIL,
                           f"asking Triton which ptxas it uses failed: {child.failure()}", evidence=child.evidence())
    data = child.data
    knob, env = knob_env(data, cap)
    if external:
        return _external_wiring(cap, data, knob, env, toolkit_ptxas)
    used = data["ptxas_path"]
    wired = expected.get(env) or expected.get("TRITON_PTXAS_BLACKWELL_PATH" if knob == "ptxas_blackwell"
                                              else "TRITON_PTXAS_PATH")
    evidence = {**data, "expected_knob": knob, "expected_path": wired}
    if wired and os.path.realpath(used) == os.path.realpath(wired):
        return CheckResult("triton.ptxas-wiring", title, PASS,
                           f"Triton {data['triton']} uses {used} (CUDA {data['ptxas_version']}) via {knob}",
                           evidence=evidence)
    if data.get("uses_bundled"):
        value = (data.get("knobs", {}).get(knob) or {}).get("env_value")
        why = (f"{env} is not set in the image (the build wires it to {wired})" if not value
               else f"{env}={value} failed `--version`, so Triton fell back silently")
        return CheckResult("triton.ptxas-wiring", title, FAIL,
                           f"Triton {data['triton']} uses its bundled ptxas {used} (CUDA {data['ptxas_version']}): {why}",
                           evidence=evidence)
    return CheckResult("triton.ptxas-wiring", title, FAIL,
                       f"Triton {data['triton']} uses {used}, not the wired {wired}", evidence=evidence)


def _external_wiring(cap: arch.Capability, data: Dict, knob: str, env: str, toolkit_ptxas: Optional[str]) -> CheckResult:
    """An image we did not build: pass when Triton uses the ptxas the image sets, fail when that setting is
    silently ignored, warn when nothing is set and Triton's bundled ptxas decides (triton.ptxas-assembles
    then says whether that one knows the target)."""
    title = f"Triton ptxas wiring for {cap}"
    used, version, triton = data["ptxas_path"], data["ptxas_version"], data["triton"]
    value = (data.get("knobs", {}).get(knob) or {}).get("env_value") or os.environ.get(env)
    evidence = {**data, "expected_knob": knob, "expected_env": env, "toolkit_ptxas": toolkit_ptxas}
    if value and os.path.realpath(used) == os.path.realpath(value):
        return CheckResult("triton.ptxas-wiring", title, PASS,
                           f"Triton {triton} uses {used} (CUDA {version}), as the image sets {env}", evidence=evidence)
    if value and data.get("uses_bundled"):
        return CheckResult("triton.ptxas-wiring", title, FAIL,
                           f"the image sets {env}={value}, but that fails `--version`, so Triton {triton} falls back "
                           f"silently to its bundled {used} (CUDA {version}). What it breaks: the ptxas the image means "
                           f"to use never runs. Fix: point {env} at a ptxas that runs", evidence=evidence)
    if data.get("uses_bundled"):
        return CheckResult("triton.ptxas-wiring", title, WARN,
                           f"not wired: {env} is not set, so Triton {triton} uses the ptxas it bundles, {used} "
                           f"(CUDA {version}). What it breaks on {cap}: nothing while that ptxas knows "
                           f"{arch.triton_gpu_name(cap)} (triton.ptxas-assembles), but it changes with every Triton "
                           f"release (Triton 3.5's CUDA 12.8 ptxas rejects sm_121a). Fix: {fix_for(env, toolkit_ptxas)}",
                           evidence=evidence)
    return CheckResult("triton.ptxas-wiring", title, WARN,
                       f"Triton {triton} uses {used} (CUDA {version}), which {env} does not name "
                       f"({env}={value or 'unset'})", evidence=evidence)


def assembles(cap: arch.Capability, ptxas: Optional[str], env: str = "TRITON_PTXAS_PATH",
              toolkit_ptxas: Optional[str] = None) -> CheckResult:
    """Does that ptxas accept `--gpu-name sm_XYa` for the target? `env` is the variable that would point
    Triton at another one (named in the fix)."""
    gpu = arch.triton_gpu_name(cap)
    title = f"ptxas assembles {gpu}"
    if not ptxas:
        return not_run("triton.ptxas-assembles", title, "no ptxas to try (Triton not installed or wiring unknown)")
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "probe.ptx")
        with open(src, "w") as fh:
            fh.write(_PTX.format(isa=arch.first_ptx_isa(cap), gpu=gpu))
        child = run_command([ptxas, "--gpu-name", gpu, src, "-o", os.path.join(tmp, "probe.cubin")], timeout=60)
    evidence = {"ptxas": ptxas, "version": tool_version(ptxas), "gpu_name": gpu, "ptx_isa": arch.first_ptx_isa(cap),
                "returncode": child.returncode, "stderr_tail": child.stderr_tail}
    if child.returncode == 0 and not child.timed_out:
        return CheckResult("triton.ptxas-assembles", title, PASS, f"{ptxas} (V{evidence['version']}) accepts {gpu}",
                           evidence=evidence)
    lines = child.stderr_tail.strip().splitlines()
    good = toolkit_ptxas if toolkit_ptxas and os.path.realpath(toolkit_ptxas) != os.path.realpath(ptxas) else None
    return CheckResult("triton.ptxas-assembles", title, FAIL,
                       f"{ptxas} (V{evidence['version']}) rejects {gpu}: {lines[-1] if lines else child.failure()}. "
                       f"What it breaks on {cap}: every Triton kernel fails at its first compile (torch.compile, "
                       f"vLLM's Triton attention and MoE kernels). Fix: {fix_for(env, good)}, or a Triton whose "
                       "bundled ptxas knows it", evidence=evidence)


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
            return CheckResult(check_id, title, FAIL, f"compile for {cap} failed: {reason}. What it breaks: Triton "
                               f"builds no kernel for {cap} (triton.ptxas-assembles names the ptxas and the fix)",
                               required, evidence=child.evidence())
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
    nulls = [name for where, name in (("main", "the main thread"), ("thread", "a new thread"),
                                      ("spawned", "a spawned process")) if c[where]["is_null"]]
    if nulls:
        problems.append(f"the default allocator is Triton's NullAllocator in {', '.join(nulls)}")
    if not c.get("explicit_wins", False):
        problems.append("an explicit triton.set_allocator() no longer takes precedence")
    if problems:
        consequence = ("; what it breaks: Triton kernels that need global scratch (TMA tensor descriptors: vLLM's "
                       "FLA/GDN kernels on capability 9.0 and newer) fail with 'Kernel requires a runtime memory "
                       "allocation, but no allocator was set' in every thread and process that did not call "
                       "triton.set_allocator itself; fix: install a start-up hook that gives Triton a default allocator "
                       "(this toolkit's images/triton-allocator/: a .pth line and its module in site-packages)"
                       if nulls else "")
        return CheckResult("triton.allocator", title, FAIL, "; ".join(problems) + consequence, evidence=evidence)
    return CheckResult("triton.allocator", title, PASS,
                       f"{c['main']['type']} in the main thread, a new thread and a spawned process; "
                       "start-up imported neither triton nor torch", evidence=evidence)
