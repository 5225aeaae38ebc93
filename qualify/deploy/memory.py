"""Does the model server fit this GPU, and with which memory fraction."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional, Tuple

from qualify.core import nvsmi
from qualify.deploy.errors import DeployError

# Headroom left to the host when the unified pool has to be shared (GB10).
UNIFIED_HEADROOM = 0.90


@dataclass(frozen=True)
class MemoryFit:
    gpu_memory_utilization: float
    pool_gib: float  # what vLLM will see as the device's total memory
    unified: bool
    source: str  # "nvml" or "/proc/meminfo"
    notes: Tuple[str, ...] = ()


def parse_meminfo(text: str) -> Dict[str, int]:
    """/proc/meminfo as {key: bytes}."""
    out = {}
    for line in text.splitlines():
        m = re.match(r"(\w+):\s+(\d+)(?:\s+kB)?", line)
        if m:
            out[m.group(1)] = int(m.group(2)) * 1024
    return out


def _check_fraction(fraction: float) -> float:
    if not 0.05 <= fraction <= 0.98:
        raise DeployError(f"GPU_MEMORY_UTILIZATION={fraction} is outside 0.05..0.98",
                          hint="leave it empty to use the target's value from images/targets.toml")
    return fraction


def memory_fit(runtime, nvml_memory: str, meminfo_text: Optional[str] = None,
               fraction: Optional[float] = None) -> MemoryFit:
    """Whether the model server fits this GPU, and with which memory fraction.

    `runtime` is the target's runtime table (targets.Runtime). A discrete GPU
    needs at least `min_gpu_memory_gib`. On a unified-memory GPU NVML reports
    no size; the pool is the host's memory, which the host also uses, so the
    fraction is lowered when less is free than it would ask for (the GB10 compatibility report:
    0.9 of 119.6 GB was refused with 39.9 GB free).
    """
    explicit = fraction is not None
    want = _check_fraction(fraction if explicit else runtime.gpu_memory_utilization)
    mib = nvsmi.mib(nvml_memory)
    if mib is not None:
        total = mib / 1024
        if total < runtime.min_gpu_memory_gib:
            raise DeployError(f"the GPU has {total:.1f} GiB of memory; this target needs at least "
                              f"{runtime.min_gpu_memory_gib} GiB",
                              hint="choose a larger GPU with GPU_DEVICE in .env")
        return MemoryFit(want, round(total, 1), False, "nvml")
    if not runtime.unified_memory:
        raise DeployError(f"the GPU reports no memory size ({nvml_memory.strip()!r}) and its target is not a "
                          "unified-memory target",
                          hint="check the driver with `nvidia-smi -q -d MEMORY`")
    if meminfo_text is None:
        raise DeployError("unified-memory GPU: /proc/meminfo is needed to size the shared pool")
    return _unified_fit(runtime, parse_meminfo(meminfo_text), want, explicit)


def _unified_fit(runtime, info: Mapping[str, int], want: float, explicit: bool) -> MemoryFit:
    gib = 1024 ** 3
    if "MemTotal" not in info or "MemAvailable" not in info:
        raise DeployError("/proc/meminfo has no MemTotal/MemAvailable; cannot size the unified memory pool")
    pool, available, free = info["MemTotal"] / gib, info["MemAvailable"] / gib, info.get("MemFree", 0) / gib
    notes = [f"unified memory: NVML reports no size; pool {pool:.1f} GiB from /proc/meminfo, "
             f"{available:.1f} GiB available"]
    fraction = want = _leave_the_host_its_share(runtime, pool, want, explicit, notes)
    if want * pool > available * UNIFIED_HEADROOM:
        if explicit:
            raise DeployError(f"GPU_MEMORY_UTILIZATION={want} asks for {want * pool:.1f} GiB of the unified pool, "
                              f"but only {available:.1f} GiB is available",
                              hint="lower GPU_MEMORY_UTILIZATION in .env, or stop other programs first")
        fraction = int(available * UNIFIED_HEADROOM / pool * 100) / 100
        notes.append(f"lowered gpu_memory_utilization from {want} to {fraction} to fit the available memory")
    if fraction * pool < runtime.min_gpu_memory_gib:
        raise DeployError(f"only {fraction * pool:.1f} GiB of the unified pool can go to the model server; "
                          f"this target needs at least {runtime.min_gpu_memory_gib} GiB",
                          hint="stop other programs, or drop the page cache: sync; echo 3 | sudo tee "
                          "/proc/sys/vm/drop_caches")
    if fraction * pool > free:
        # torch.cuda.mem_get_info follows MemFree on unified memory (vllm#48140): vLLM's start-up check
        # then fails with a spurious ValueError although MemAvailable would cover it.
        fits = int(free / pool * 100) / 100
        lower = (f"or set GPU_MEMORY_UTILIZATION={fits} in .env (what is free now)" if fits >= 0.05 and
                 fits * pool >= runtime.min_gpu_memory_gib else "a lower GPU_MEMORY_UTILIZATION does not fit this "
                 "target's minimum while the cache is full")
        raise DeployError(f"page cache holds memory the GPU needs: the server asks for {fraction * pool:.1f} GiB "
                          f"(gpu_memory_utilization {fraction}) of the {pool:.1f} GiB unified pool, but only "
                          f"{free:.1f} GiB is free (MemFree; {available:.1f} GiB available with the page cache). "
                          "On unified memory torch sees only MemFree, so vLLM would stop at start-up with "
                          "'ValueError: Free memory on device ... is less than desired GPU memory utilization'",
                          hint="drop the page cache as root: sync; echo 3 | sudo tee /proc/sys/vm/drop_caches; "
                          + lower)
    return MemoryFit(_check_fraction(fraction), round(pool, 1), True, "/proc/meminfo", tuple(notes))


def _leave_the_host_its_share(runtime, pool: float, fraction: float, explicit: bool, notes: List[str]) -> float:
    """The host keeps `host_reserve_gib` of the unified pool: a fraction that leaves less wedges it (vllm#46307)."""
    reserve = runtime.host_reserve_gib
    most = int(max(pool - reserve, 0) / pool * 100) / 100
    if fraction <= most:
        return fraction
    if explicit:
        raise DeployError(f"GPU_MEMORY_UTILIZATION={fraction} leaves the host {pool * (1 - fraction):.1f} GiB of the "
                          f"{pool:.1f} GiB unified pool; the target keeps at least {reserve} GiB for the host "
                          "(host_reserve_gib in images/targets.toml): more for the GPU wedges the machine",
                          hint=f"set GPU_MEMORY_UTILIZATION to {most} or less in .env")
    notes.append(f"lowered gpu_memory_utilization from {fraction} to {most} to leave the host {reserve} GiB")
    return most
