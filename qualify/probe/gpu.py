"""GPU checks: run only when a GPU is visible; `not-run: no GPU` otherwise.

A 9.0 device can prove the allocator, matmul and Inductor paths, but it is
not a Blackwell target: the device check says so, and only evidence on the
target's own architecture lifts a manifest above `unverified`.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

from qualify.core import arch
from qualify.probe.model import FAIL, PASS, WARN, CheckResult, not_run
from qualify.probe.subproc import run_snippet

NO_ALLOCATOR = "no allocator was set"
# The GPU checks every run with a GPU must pass to count as a pass (seed 000), whatever a record says
# about `required`: `qualify promote` recomputes a run's outcome from these (release/evidence.py).
# gpu.device only says which GPU it was; gpu.nccl-allreduce needs two GPUs.
REQUIRED_GPU_CHECKS = ("gpu.memory", "gpu.triton-scratch", "gpu.bf16-matmul", "gpu.torch-compile")


def device_check(gpus: Optional[List[Dict[str, str]]], target: arch.Capability) -> CheckResult:
    title = f"GPU is a {target} device"
    if not gpus:
        return not_run("gpu.device", title, "no GPU visible", required=False)
    gpu = gpus[0]
    cap = arch.Capability.parse(gpu["compute_cap"])
    evidence = {"gpus": gpus}
    if cap == target:
        return CheckResult("gpu.device", title, PASS, f"{gpu['name']} ({cap}), driver {gpu['driver_version']}",
                           evidence=evidence)
    where = "outside the Blackwell targets" if not arch.is_blackwell(cap) else f"not the target's {target}"
    return CheckResult("gpu.device", title, WARN,
                       f"{gpu['name']} is capability {cap} ({arch.describe(cap)}), {where}: GPU checks below ran on it, "
                       f"but they are not evidence for {target}", required=False, evidence=evidence)


def _child(args: List[str], env: Optional[Dict[str, str]] = None, timeout: float = 300) -> Dict[str, Any]:
    res = run_snippet("gpu_checks", args, timeout=timeout, env=env)
    if res.ok:
        return res.data
    return {"ok": False, "error": res.failure(), **res.evidence()}


def allocator_on_gpu(has_gpu: bool, triton_version: Optional[str], needs: Optional[str] = None) -> CheckResult:
    cid, title = "gpu.triton-scratch", "A Triton kernel that needs global scratch, with and without the allocator hook"
    if not has_gpu:
        return not_run(cid, title, "no GPU visible", required=False)
    if triton_version is None or needs:
        return not_run(cid, title, needs or "Triton is not installed", required=False)
    without = _child(["scratch", "main"], env={"BLACKWELL_TRITON_ALLOCATOR": "off"})
    runs = {where: _child(["scratch", where]) for where in ("main", "thread", "spawn")}
    evidence = {"hook_off": without, **runs}
    failed = [w for w, r in runs.items() if not r.get("ok")]
    if failed:
        return CheckResult(cid, title, FAIL, "with the hook the kernel failed in: " + ", ".join(
            f"{w} ({runs[w].get('error', 'wrong result')})" for w in failed), evidence=evidence)
    proven = NO_ALLOCATOR in str(without.get("error", ""))
    reason = "runs correctly in the main thread, a new thread and a spawned process"
    reason += ("; with the hook off it fails with 'no allocator was set' (the failure it prevents)" if proven
               else f"; with the hook off it did not fail as expected ({without.get('error') or 'it ran'})")
    return CheckResult(cid, title, PASS if proven else WARN, reason, evidence=evidence)


def simple(cid: str, title: str, mode: str, has_gpu: bool, needs: Optional[str]) -> CheckResult:
    if not has_gpu:
        return not_run(cid, title, "no GPU visible", required=False)
    if needs:
        return not_run(cid, title, needs, required=False)
    data = _child([mode], timeout=600)
    if data.get("ok"):
        return CheckResult(cid, title, PASS, ", ".join(f"{k}={v}" for k, v in data.items() if k != "ok"), evidence=data)
    return CheckResult(cid, title, FAIL, str(data.get("error") or "wrong result"), evidence=data)


def memory_check(gpus: Optional[List[Dict[str, str]]], unified: bool, fraction: float,
                 min_gib: int) -> CheckResult:
    """NVML memory, or the unified pool from /proc/meminfo when NVML says 'Not Supported' (GB10)."""
    cid, title = "gpu.memory", "GPU memory (NVML; unified pool on GB10)"
    if not gpus:
        return not_run(cid, title, "no GPU visible", required=False)
    raw = gpus[0].get("memory.total", "")
    evidence: Dict[str, Any] = {"nvml_memory_total": raw, "target_unified_memory": unified}
    try:
        total_gib = float(raw) / 1024
        source = "NVML"
    except ValueError:
        total_gib = _meminfo_gib()
        source = "/proc/meminfo (NVML reports memory as not supported: unified memory)"
        evidence["meminfo_total_gib"] = total_gib
    usable = total_gib * fraction
    evidence.update({"total_gib": round(total_gib, 1), "fraction": fraction, "usable_gib": round(usable, 1),
                     "source": source, "min_gib": min_gib})
    if usable < min_gib:
        return CheckResult(cid, title, FAIL, f"{usable:.1f} GiB usable at fraction {fraction} < {min_gib} GiB needed",
                           evidence=evidence)
    return CheckResult(cid, title, PASS, f"{total_gib:.1f} GiB from {source}; {usable:.1f} GiB at fraction {fraction}",
                       evidence=evidence)


def _meminfo_gib() -> float:
    with open("/proc/meminfo") as fh:
        for line in fh:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) / (1024 * 1024)
    return 0.0


def nccl_allreduce(gpus: Optional[List[Dict[str, str]]], census_rows: List[Dict[str, Any]],
                   needs: Optional[str]) -> CheckResult:
    """All-reduce across the visible GPUs with the image's own NCCL (tensor-parallel readiness)."""
    cid, title = "gpu.nccl-allreduce", "NCCL all-reduce across the visible GPUs"
    nccl = [{"library": r["short"], "class": r["class"], "best": r["best"], "sass": r["sass"], "ptx": r["ptx"]}
            for r in census_rows if "libnccl" in r["short"]]
    count = len(gpus or [])
    if count < 2:
        seen = "no GPU visible" if count == 0 else "1 GPU visible"
        return not_run(cid, title, f"{seen}; an all-reduce needs at least 2", required=False, nccl_census=nccl)
    if needs:
        return not_run(cid, title, needs, required=False, nccl_census=nccl)
    data = _nccl_child()
    data["nccl_census"] = nccl
    if data.get("ok"):
        ranks = data["ranks"]
        return CheckResult(cid, title, PASS,
                           f"NCCL {data['nccl']}: {data['world_size']} GPUs ({', '.join(r['device'] for r in ranks)}) "
                           f"each hold {ranks[0]['value']:g} = sum of 1..{data['world_size']}; "
                           f"256 MiB all-reduce busbw {data['bandwidth']['busbw_gbs']:g} GB/s", evidence=data)
    return CheckResult(cid, title, FAIL, str(data.get("error") or data.get("skipped") or "wrong all-reduce result"),
                       evidence=data)


def _nccl_child() -> Dict[str, Any]:
    env = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
    res = run_snippet("nccl_allreduce", [], timeout=420, env=env)
    return res.data if res.ok else {"ok": False, "error": res.failure(), **res.evidence()}
