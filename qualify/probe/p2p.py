"""GPU peer-to-peer access and vLLM's custom all-reduce on the GPUs a tensor-parallel server would use.

vLLM all-reduces small tensors with its own kernels, which read the other GPUs' buffers directly over P2P
through CUDA IPC (vllm/distributed/device_communicators/custom_all_reduce.py), and everything else with
NCCL. Its rule, as `custom_all_reduce` applies it: the world size must be one of 2, 4, 6, 8; more than two
GPUs must be fully connected by NVLink (NVML's NVLink P2P status for every pair; here `nvidia-smi topo -m`
reading NV# for every pair); and every pair must pass P2P: vLLM's own transfer test (two processes, a CUDA
IPC handle, a write read back), or with VLLM_SKIP_P2P_CHECK=1 only the driver's word
(torch.cuda.can_device_access_peer). Failing any, vLLM turns it off and uses NCCL throughout: slower for small
tensors, not wrong.

What is wrong is a driver that reports P2P which a transfer does not bear out (an IOMMU translating P2P, ACS
redirecting it through the root complex: deploy/iommu.py reads the host's side): NCCL's P2P transport takes
the driver's word, and so does vLLM with VLLM_SKIP_P2P_CHECK=1. That check fails; the deploy's gate judges it
against the server's settings (deploy/p2p.py). Standard library only: torch runs in snippets/p2p_access.py.
"""

from __future__ import annotations

import json
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from qualify.core import ncclenv, topology
from qualify.probe.model import FAIL, PASS, CheckResult, not_run
from qualify.probe.subproc import run_snippet

P2P_CHECK = "gpu.p2p"
TITLE = "GPU peer-to-peer access (driver and a real transfer) and vLLM's custom all-reduce"
# vLLM's CustomAllreduce._SUPPORTED_WORLD_SIZES
CUSTOM_ALLREDUCE_WORLD_SIZES = (2, 4, 6, 8)


def _pairs(rows: Sequence[Any], world: int, key: str) -> Dict[Tuple[int, int], Mapping[str, Any]]:
    out = {}
    for r in rows:
        if isinstance(r, Mapping) and isinstance(r.get("src"), int) and isinstance(r.get("dst"), int) and \
                0 <= r["src"] < world and 0 <= r["dst"] < world and isinstance(r.get(key), bool):
            out[(r["src"], r["dst"])] = r
    return out


def custom_all_reduce(world: int, nvlink_every_pair: bool, p2p_every_pair: bool,
                      skip_p2p_check: bool = False) -> Tuple[bool, str]:
    """(whether vLLM's custom all-reduce turns on, why), by vLLM's own rule."""
    if world not in CUSTOM_ALLREDUCE_WORLD_SIZES:
        return False, (f"world size {world} is not one vLLM's custom all-reduce supports "
                       f"({', '.join(map(str, CUSTOM_ALLREDUCE_WORLD_SIZES))})")
    if world > 2 and not nvlink_every_pair:
        return False, f"{world} GPUs not all joined by NVLink (vLLM needs NVLink between every pair above 2 GPUs)"
    if not p2p_every_pair:
        return False, ("the driver reports no P2P between every pair" if skip_p2p_check else
                       "P2P does not work between every pair (vLLM's transfer test)")
    return True, (f"{world} GPUs, " + ("NVLink between every pair" if nvlink_every_pair else "P2P over PCIe")
                  + (", P2P as the driver reports it (VLLM_SKIP_P2P_CHECK=1)" if skip_p2p_check else
                     ", P2P proven by a transfer between every pair"))


def judge(data: Mapping[str, Any], world: int, joined: topology.Topology,
          env: ncclenv.CollectiveEnv) -> Tuple[str, str, Dict[str, Any]]:
    """(status, reason, evidence) of one run of the snippet on `world` GPUs joined as `joined`."""
    driver = _pairs(data.get("driver") or [], world, "peer")
    transfer = _pairs(data.get("transfer") or [], world, "ok")
    others = [(i, j) for i in range(world) for j in range(world) if i != j]
    missing = [p for p in others if p not in driver or p not in transfer] + \
        [(i, i) for i in range(world) if (i, i) not in transfer]
    if missing:
        return FAIL, f"the P2P result lacks GPU pairs {missing[:4]} (of {world} GPUs)", {}
    claimed = [p for p in others if driver[p]["peer"]]
    broken = [p for p in claimed if not transfer[p]["ok"]]
    ipc = [i for i in range(world) if not transfer[(i, i)]["ok"]]
    nvlink = joined.kind == topology.NVLINK and len(joined.links) == world * (world - 1) // 2
    skip = env.get("VLLM_SKIP_P2P_CHECK") == "1"
    working = all(driver[p]["peer"] if skip else transfer[p]["ok"] for p in others) and not ipc
    on, why = custom_all_reduce(world, nvlink, working, skip)
    evidence = {"pairs": [{"src": i, "dst": j, "driver": driver[(i, j)]["peer"], "transfer": transfer[(i, j)]["ok"],
                           "error": transfer[(i, j)].get("error") or ""} for i, j in others],
                "ipc_same_gpu": {str(i): transfer[(i, i)]["ok"] for i in range(world)},
                "nvlink_every_pair": nvlink, "skip_p2p_check": skip,
                "custom_all_reduce": {"enabled": on, "reason": why}, "broken_pairs": [list(p) for p in broken]}
    said = f"custom all-reduce {'on' if on else 'off'}: {why}"
    if broken:
        first = transfer[broken[0]].get("error") or "it did not arrive"
        return FAIL, (f"the driver reports P2P between {_names(broken)}, but a transfer through it failed "
                      f"({first}): P2P on this host does not work as reported (an IOMMU translating it, or ACS "
                      f"redirecting it through the root complex); NCCL takes the driver's word; {said}"), evidence
    if ipc:
        first = transfer[(ipc[0], ipc[0])].get("error") or "it did not arrive"
        return FAIL, f"CUDA IPC does not work on GPU {ipc[0]} in this container ({first}); {said}", evidence
    peers = "P2P between every pair" if len(claimed) == len(others) else \
        "no P2P between any pair" if not claimed else f"P2P between {_names(claimed)} only"
    return PASS, f"the driver's report and a transfer agree ({peers}); {said}", evidence


def _names(pairs: Sequence[Tuple[int, int]]) -> str:
    shown = ", ".join(f"GPU {i} -> {j}" for i, j in pairs[:4])
    return shown + (f" and {len(pairs) - 4} more" if len(pairs) > 4 else "")


def p2p_check(gpus: Optional[List[Dict[str, str]]], needs: Optional[str], world: int, joined: topology.Topology,
              env: ncclenv.CollectiveEnv = ncclenv.DEFAULT) -> CheckResult:
    """The check on the visible GPUs (exactly the deployment's: `world` of them). Not required for promotion:
    it judges the host's P2P, which the deploy's gate weighs against the server's settings."""
    count = len(gpus or [])
    if count < 2 or world < 2:
        return not_run(P2P_CHECK, TITLE, f"{count} GPU(s) visible, world size {world}: P2P needs 2", required=False)
    if count != world:
        return not_run(P2P_CHECK, TITLE, f"{count} GPUs visible, but the tensor-parallel size is {world}",
                       required=False)
    if needs:
        return not_run(P2P_CHECK, TITLE, needs, required=False)
    data = _child(world, env)
    if data.get("skipped"):
        return not_run(P2P_CHECK, TITLE, str(data["skipped"]), required=False, **data)
    if not data.get("ok"):
        return CheckResult(P2P_CHECK, TITLE, FAIL, f"the P2P test did not complete: {data.get('error')}",
                           required=False, evidence=data)
    status, reason, judged = judge(data, world, joined, env)
    return CheckResult(P2P_CHECK, TITLE, status, reason, required=False,
                       evidence={**judged, "env": data.get("child_env") or {}, "cudart": data.get("cudart"),
                                 "exit_codes": data.get("exit_codes")})


def _child(world: int, env: ncclenv.CollectiveEnv) -> Dict[str, Any]:
    res = run_snippet("p2p_access", [str(world), json.dumps(env.as_dict())], timeout=300)
    return res.data if res.ok else {"ok": False, "error": res.failure(), **res.evidence()}
