"""Versions: Python packages, CUDA toolkit and runtime, torch's own view, the GPU.

Package versions come from dist-info (importlib.metadata imports nothing);
torch's view comes from a child interpreter; GPU facts from nvidia-smi.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
from importlib import metadata
from typing import Any, Dict, List, Optional, Sequence

from qualify.core import nvsmi
from qualify.core.enums import Profile
from qualify.probe.model import FAIL, NOT_RUN, PASS, WARN, CheckResult
from qualify.probe.subproc import run_snippet

# Packages whose versions a release engineer looks for first.
KEY_PACKAGES = ("torch", "triton", "vllm", "sglang", "sglang-kernel", "sgl-kernel", "flashinfer-python",
                "flashinfer-cubin", "transformers",
                "xformers", "flash-attn", "deep-gemm", "nvidia-cudnn-cu13", "nvidia-nccl-cu13",
                "nvidia-cuda-runtime", "nvidia-cublas", "nvidia-cuda-nvcc")


def normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def packages(extra_paths: Sequence[str] = ()) -> Dict[str, str]:
    """This interpreter's distributions, and those in `extra_paths` (`probe --path DIR`: an unpacked wheel or
    another environment's site-packages is judged as if installed: its providers and serving paths too)."""
    found: Dict[str, str] = {}
    dists = list(metadata.distributions()) + (list(metadata.distributions(path=list(extra_paths))) if extra_paths else [])
    for dist in dists:
        name = dist.metadata.get("Name")
        if name:
            found[normalise(name)] = dist.version
    return dict(sorted(found.items()))


def tool_version(path: str) -> Optional[str]:
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    m = re.search(r"V(\d+\.\d+\.\d+)", out)
    return m.group(1) if m else None


def cuda_home() -> Optional[str]:
    for candidate in (os.environ.get("CUDA_HOME"), "/usr/local/cuda"):
        if candidate and os.path.isdir(candidate):
            return candidate
    nvcc = shutil.which("nvcc")
    return os.path.dirname(os.path.dirname(nvcc)) if nvcc else None


def toolkit() -> Dict[str, Any]:
    home = cuda_home()
    out: Dict[str, Any] = {"cuda_home": home}
    if home:
        for tool in ("nvcc", "ptxas", "cuobjdump", "nvdisasm"):
            path = os.path.join(home, "bin", tool)
            out[tool] = {"path": path, "version": tool_version(path)} if os.path.exists(path) else None
        libs = sorted(os.path.basename(p) for p in glob.glob(os.path.join(home, "lib*", "libcudart.so.*")))
        out["cudart"] = libs
    return out


def nvidia_smi() -> Optional[List[Dict[str, str]]]:
    """GPUs as nvidia-smi reports them (core/nvsmi.py's fields); None when there is no nvidia-smi or no GPU."""
    smi = shutil.which("nvidia-smi")
    if not smi:
        return None
    try:
        proc = subprocess.run([smi, *nvsmi.query_args(nvsmi.PROBE_FIELDS, units=False)],
                              capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if proc.returncode != 0:
        return None
    return list(nvsmi.parse(proc.stdout, nvsmi.PROBE_FIELDS)) or None


def torch_view(pkgs: Dict[str, str], timeout: float = 180, emulated: bool = False) -> Dict[str, Any]:
    if "torch" not in pkgs:
        return {"status": NOT_RUN.value, "reason": "torch is not installed"}
    child = run_snippet("torch_info", timeout=timeout)
    if not child.ok and emulated and (child.returncode or 0) < 0:
        # qemu-user cannot run everything torch's native code does: that is the
        # emulator's limit, not a verdict on the image.
        return {"status": NOT_RUN.value, **child.evidence(),
                "reason": f"importing torch was {child.failure()} under qemu-user emulation; torch's own view "
                          "(arch list, cuDNN, NCCL) needs a probe on a native host of the target's platform"}
    if not child.ok:
        return {"status": FAIL.value, "reason": f"importing torch failed: {child.failure()}", **child.evidence()}
    return {"status": PASS.value, **child.data}


# What each profile's image must have installed.
PROFILE_PACKAGES = {Profile.SMOKE: ("triton",), Profile.VLLM: ("torch", "triton", "vllm", "flashinfer-python")}


def check(pkgs: Dict[str, str], tk: Dict[str, Any], torch: Dict[str, Any], profile: Optional[Profile]) -> CheckResult:
    """Versions are evidence; the check warns only when the profile's key packages are missing."""
    wanted = PROFILE_PACKAGES.get(profile, ()) if profile else ()
    missing = [p for p in wanted if p not in pkgs]
    key = {p: pkgs[p] for p in KEY_PACKAGES if p in pkgs}
    evidence = {"key_packages": key, "toolkit": tk, "torch": torch}
    if missing:
        return CheckResult("versions", "Versions of packages, CUDA toolkit and runtime", WARN,
                           f"the {profile} profile expects {', '.join(missing)}, which are not installed", evidence=evidence)
    if torch.get("status") == NOT_RUN and "torch" in pkgs:
        return CheckResult("versions", "Versions of packages, CUDA toolkit and runtime", NOT_RUN,
                           torch["reason"] + "; package versions come from dist-info", evidence=evidence)
    if torch.get("status") == FAIL:
        return CheckResult("versions", "Versions of packages, CUDA toolkit and runtime", FAIL, torch["reason"],
                           evidence=evidence)
    summary = ", ".join(f"{k} {v}" for k, v in key.items()) or "no key packages"
    nvcc = (tk.get("nvcc") or {}).get("version")
    return CheckResult("versions", "Versions of packages, CUDA toolkit and runtime", PASS,
                       f"{summary}; nvcc {nvcc or 'absent'}", evidence=evidence)
