"""The image's own environment for the target: TORCH_CUDA_ARCH_LIST and a CUDA toolkit.

Our builds set both; an image built another way often has neither, and the
consequence shows only later (an extension built for the wrong GPU, a JIT
compile with no nvcc). Each finding says what is missing, what it breaks on
the target and what would fix it. Informational (not required): neither
stops an image that needs no compiler at run time.

Standard library only, Python 3.9 compatible (runs inside images).
"""

from __future__ import annotations

import os
from typing import Any, Dict, Mapping, Optional

from qualify.core import arch
from qualify.probe.model import PASS, WARN, CheckResult
from qualify.probe.selfsufficiency import NVCC_FIRST

ARCH_LIST_ID, TOOLKIT_ID = "env.torch-cuda-arch-list", "env.cuda-toolkit"


def torch_cuda_arch_list(cap: arch.Capability, suggested: str, torch_installed: bool,
                         environ: Optional[Mapping[str, str]] = None) -> CheckResult:
    """Does TORCH_CUDA_ARCH_LIST give code for `cap`? `suggested` is the target's own list (the fix)."""
    value = (os.environ if environ is None else environ).get("TORCH_CUDA_ARCH_LIST")
    title = f"TORCH_CUDA_ARCH_LIST gives code for {cap}"
    builds = ("CUDA extensions built in this image (torch.utils.cpp_extension: vLLM's, FlashInfer's and "
              "DeepGEMM's JIT, a `pip install` of a kernel package)" if torch_installed else
              "nothing today (torch is not installed), but an extension built on top of this image "
              "(torch.utils.cpp_extension)")
    fix = f"Fix: ENV TORCH_CUDA_ARCH_LIST=\"{suggested}\""
    evidence: Dict[str, Any] = {"value": value, "torch_installed": torch_installed, "suggested": suggested}
    if not value:
        return CheckResult(ARCH_LIST_ID, title, WARN,
                           f"TORCH_CUDA_ARCH_LIST is not set. What it breaks on {cap}: {builds} would be compiled "
                           "for whatever GPU is visible at build time, and with none visible torch stops with an "
                           f"error. {fix}", required=False, evidence=evidence)
    try:
        targets = arch.expected_code_targets(value)
    except arch.ArchError as exc:
        return CheckResult(ARCH_LIST_ID, title, WARN, f"TORCH_CUDA_ARCH_LIST={value!r} is not a list torch reads "
                           f"({exc}). {fix}", required=False, evidence=evidence)
    best = arch.best(arch.compatibility(t, cap) for t in targets)
    evidence["best"] = best.value
    if best is arch.Compat.NATIVE:
        return CheckResult(ARCH_LIST_ID, title, PASS, f"TORCH_CUDA_ARCH_LIST={value}: native code for {cap}",
                           required=False, evidence=evidence)
    how = {arch.Compat.COMPATIBLE: f"only code that runs on {cap} through same-family compatibility, none of its own",
           arch.Compat.PTX_JIT: f"only PTX that {cap} must JIT-compile at first load",
           }.get(best, f"no code that runs on {cap}")
    return CheckResult(ARCH_LIST_ID, title, WARN,
                       f"TORCH_CUDA_ARCH_LIST={value} gives {how}. What it breaks: {builds} would carry that. {fix}",
                       required=False, evidence=evidence)


def _version(text: Optional[str]) -> Optional[tuple]:
    try:
        return tuple(int(x) for x in (text or "").split(".")[:2]) or None
    except ValueError:
        return None


def cuda_toolkit(cap: arch.Capability, toolkit: Mapping[str, Any]) -> CheckResult:
    """Is there a CUDA toolkit (nvcc, ptxas) new enough to target `cap`? `toolkit` is versions.toolkit()."""
    title = f"A CUDA toolkit in the image targets {cap}"
    ptxas, nvcc = toolkit.get("ptxas") or {}, toolkit.get("nvcc") or {}
    evidence = {"cuda_home": toolkit.get("cuda_home"), "nvcc": nvcc or None, "ptxas": ptxas or None}
    first = NVCC_FIRST.get((cap.major, cap.minor))
    if not ptxas and not nvcc:
        return CheckResult(TOOLKIT_ID, title, WARN,
                           "no CUDA toolkit: neither nvcc nor ptxas under CUDA_HOME or /usr/local/cuda. What it "
                           f"breaks on {cap}: Triton can only use the ptxas it bundles (triton.ptxas-wiring), and "
                           "kernels compiled at run time with nvcc (torch.utils.cpp_extension, FlashInfer, DeepGEMM) "
                           "cannot build. Fix: install a CUDA 13 compiler (the nvidia-cuda-nvcc wheel or a CUDA 13 "
                           "toolkit) and set CUDA_HOME", required=False, evidence=evidence)
    have = _version(ptxas.get("version") or nvcc.get("version"))
    where = toolkit.get("cuda_home")
    tools = ", ".join(t for t, d in (("nvcc", nvcc), ("ptxas", ptxas)) if d)
    if first and have and have < first:
        return CheckResult(TOOLKIT_ID, title, WARN,
                           f"the CUDA toolkit at {where} ({tools}, CUDA {'.'.join(map(str, have))}) predates {cap}, "
                           f"which CUDA {first[0]}.{first[1]} first targets. What it breaks: a ptxas or nvcc from it "
                           f"rejects {arch.triton_gpu_name(cap)}. Fix: a CUDA {first[0]}.{first[1]}+ toolkit (CUDA 13)",
                           required=False, evidence=evidence)
    if not ptxas:
        return CheckResult(TOOLKIT_ID, title, WARN, f"the CUDA toolkit at {where} has nvcc but no ptxas: nothing can "
                           "point Triton at it. Fix: install the toolkit's ptxas (nvidia-cuda-nvcc)",
                           required=False, evidence=evidence)
    version = ptxas.get("version") or "unknown version"
    return CheckResult(TOOLKIT_ID, title, PASS, f"CUDA {version} at {where} ({tools})", required=False,
                       evidence=evidence)
