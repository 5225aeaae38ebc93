"""GPU checks: run only when a GPU is visible; `not-run: no GPU` otherwise.

A 9.0 device can prove the allocator, matmul and Inductor paths, but it is
not a Blackwell target: the device check says so, and only evidence on the
target's own architecture lifts a manifest above `unverified`.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from typing import Any, Dict, List, Optional, Sequence

from qualify.core import arch, ncclenv, nvsmi, topology
from qualify.probe.model import FAIL, PASS, WARN, CheckResult, not_run
from qualify.probe.subproc import run_snippet

NO_ALLOCATOR = "no allocator was set"
# The GPU checks every run with a GPU must pass to count as a pass (the Blackwell support RFC), whatever a record says
# about `required`: `qualify promote` recomputes a run's outcome from these (release/evidence.py).
# gpu.device only says which GPU it was; gpu.nccl-allreduce needs two GPUs, and is required on top of these in
# a run of a multi-GPU configuration (release/evidence.py: required_checks).
REQUIRED_GPU_CHECKS = ("gpu.memory", "gpu.triton-scratch", "gpu.bf16-matmul", "gpu.torch-compile")
ALLREDUCE_CHECK = "gpu.nccl-allreduce"


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
    mib = nvsmi.mib(raw)
    if mib is not None:
        total_gib = mib / 1024
        source = "NVML"
    else:
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


def read_topology(count: int) -> topology.Topology:
    """How the GPUs this probe sees are joined (nvidia-smi topo -m, indices 0..count-1 as it numbers them here);
    `unknown` when that cannot be read."""
    if count < 2:
        return topology.Topology(topology.SINGLE)
    smi = shutil.which("nvidia-smi")
    try:
        proc = subprocess.run([smi or "nvidia-smi", "topo", "-m"], capture_output=True, text=True, timeout=60)
        if proc.returncode == 0:
            return topology.for_gpus(topology.parse_matrix(proc.stdout), list(range(count)))
    except (OSError, subprocess.TimeoutExpired, topology.TopologyError):
        pass
    return topology.Topology(topology.UNKNOWN)


def _failed_part(data: Dict[str, Any]) -> str:
    """What of the collectives went wrong, in words: the sum, the reference, the shards, a rank that died."""
    parts = []
    if data.get("sum_ok") is False:
        parts.append("ranks do not all hold n(n+1)/2 after the all-reduce: " + ", ".join(
            f"rank {r['rank']} holds {r['value']:g}" for r in data.get("ranks", []) if not r.get("all_equal")))
    for r in data.get("ranks", []):
        ref = r.get("reference") or {}
        for row in ref.get("all_reduce", []) + ref.get("reduce_scatter", []):
            if not row.get("finite") or not row.get("within_tolerance"):
                parts.append(f"rank {r['rank']} {row['dtype']}: " + ("non-finite values" if not row.get("finite") else
                             f"error {row['max_abs_error']:g} = {row['max_error_over_bound']:.2f} x the tolerance"))
        for row in ref.get("all_gather", []):
            if row.get("slots_not_their_rank"):
                parts.append(f"rank {r['rank']} {row['dtype']}: all-gather slots {row['slots_not_their_rank']} "
                             "do not hold their rank's shard")
    codes = [c for c in data.get("exit_codes", []) if c != 0]
    if codes:
        parts.append(f"rank processes exited {codes}")
    return "; ".join(parts[:6]) or str(data.get("error") or data.get("skipped") or "wrong all-reduce result")


def nccl_allreduce(gpus: Optional[List[Dict[str, str]]], census_rows: List[Dict[str, Any]],
                   needs: Optional[str], world_size: int = 0, floors: Sequence[Any] = (),
                   required: bool = False, env: ncclenv.CollectiveEnv = ncclenv.DEFAULT) -> CheckResult:
    """Collectives across the visible GPUs with the image's own NCCL (tensor-parallel readiness; the Blackwell support RFC's
    two-rank test): exact sums, a single-GPU reference within a stated tolerance, shard ownership, then the bus
    bandwidth, judged against the floor for the topology seen when the host passes floors. `world_size`: the
    deployment's tensor-parallel size, which must be the number of GPUs visible (0: every visible GPU). `env`:
    what the ranks run under, the server's when a deployment runs it (core/ncclenv.py)."""
    cid, title = "gpu.nccl-allreduce", "NCCL all-reduce across the visible GPUs"
    nccl = [{"library": r["short"], "class": r["class"], "best": r["best"], "sass": r["sass"], "ptx": r["ptx"]}
            for r in census_rows if "libnccl" in r["short"]]
    count = len(gpus or [])
    world = world_size or count
    if count < 2 or world < 2:
        seen = "no GPU visible" if count == 0 else f"{count} GPU visible" if count == 1 else f"world size {world}"
        return not_run(cid, title, f"{seen}; an all-reduce needs at least 2", required=required, nccl_census=nccl)
    if count != world:
        return not_run(cid, title, f"{count} GPUs visible, but the deployment's tensor-parallel size is {world}: "
                       "the check runs on exactly the GPUs the server would use", required=required, nccl_census=nccl)
    if needs:
        return not_run(cid, title, needs, required=required, nccl_census=nccl)
    joined = read_topology(count)
    data = _nccl_child(world, env)
    data["nccl_census"] = nccl
    data["topology"] = joined.as_json()
    floor = topology.floor_for(floors, joined.kind, world)
    data["floor"] = floor.as_json() if floor is not None else None
    if data.get("backend", "nccl") != "nccl":  # a stand-in proves the checking, never the GPUs: not-run, not fail
        return not_run(cid, title, f"the collectives ran over {data.get('backend')!r}, not NCCL on the GPUs (a "
                       "stand-in): nothing about these GPUs is proven", required=required, **data)
    if data.get("skipped"):
        return not_run(cid, title, str(data["skipped"]), required=required, **data)
    if not data.get("ok"):
        return CheckResult(cid, title, FAIL, _failed_part(data), evidence=data)
    ranks, busbw = data["ranks"], data["bandwidth"]["busbw_gbs"]
    worst = max(row["max_error_over_bound"] for r in ranks
                for row in r["reference"]["all_reduce"] + r["reference"]["reduce_scatter"])
    said = (f"NCCL {data['nccl']}: {world} GPUs ({', '.join(r['device'] for r in ranks)}) joined by "
            f"{joined.kind}; each holds {ranks[0]['value']:g} = sum of 1..{world}; float32 and bfloat16 all-reduce "
            f"and reduce-scatter match the single-GPU reference (worst {worst:.2f} x the tolerance), all-gather "
            f"shards in their ranks' slots; 256 MiB all-reduce busbw {busbw:g} GB/s")
    if not floors:
        return CheckResult(cid, title, PASS, said + " (no floor given: bandwidth not judged)", evidence=data)
    if floor is None:
        return CheckResult(cid, title, WARN, said + f"; no all-reduce floor for {world} GPUs joined by {joined.kind} "
                           "(nvidia-smi topo -m could not be read, or the floors name no such topology): the "
                           "bandwidth is not judged", evidence=data)
    if busbw < floor.min_bus_gbps:
        return CheckResult(cid, title, FAIL, f"busbw {busbw:g} GB/s is below the floor of {floor.min_bus_gbps:g} GB/s "
                           f"for {world} GPUs joined by {joined.kind} ({said})", evidence=data)
    return CheckResult(cid, title, PASS, f"{said}, at or above the floor of {floor.min_bus_gbps:g} GB/s",
                       evidence=data)


def _nccl_child(world: int, env: ncclenv.CollectiveEnv) -> Dict[str, Any]:
    res = run_snippet("nccl_allreduce", [str(world), "256", json.dumps(env.as_dict())], timeout=420)
    return res.data if res.ok else {"ok": False, "error": res.failure(), "env": env.as_dict(), **res.evidence()}
