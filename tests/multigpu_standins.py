"""Stand-ins for the multi-GPU tests (not a test module): the GPUs the stand-in nvidia-smi describes, and a
STAND-IN for the result the probe's NCCL snippet prints (its exact shape, with the bandwidth a test chooses)."""

from __future__ import annotations

import json

from evidence_helpers import TF

from qualify.core import topology
from qualify.probe import gpu

PRO = "12.0|NVIDIA RTX PRO 6000 Blackwell Workstation Edition|97887 MiB|GPU-pro6000-{}"
B200 = "10.0|NVIDIA B200|183359 MiB|GPU-b200-{}"


def gpus_of(model: str, n: int) -> str:
    return ";".join(model.format(i) for i in range(n))


def standin_result(world: int = 2, busbw: float = 290.0, **change) -> dict:
    """A STAND-IN for what the probe's snippet prints after NCCL on `world` GPUs (its exact shape), with a bus
    bandwidth the test chooses; `change` edits one rank's reference rows."""
    def row(dtype, shape=None):
        out = {"dtype": dtype, "finite": True, "max_abs_error": 1e-7, "max_error_over_bound": 0.4,
               "within_tolerance": True, "elements": world << 17}
        return {**out, "shape": shape} if shape else out

    ranks = []
    for r in range(world):
        ref = {"all_reduce": [row("float32"), row("bfloat16")],
               "reduce_scatter": [row("float32", [1 << 17]), row("bfloat16", [1 << 17])],
               "all_gather": [{"dtype": d, "shape": [world << 17], "slots_not_their_rank": []}
                              for d in ("float32", "bfloat16")], "ok": True}
        if r == world - 1 and change:
            ref["all_reduce"][1].update(change)
            ref["ok"] = False
        ranks.append({"rank": r, "device": "NVIDIA RTX PRO 6000 Blackwell Workstation Edition", "value": world * (world + 1) / 2,
                      "all_equal": True, "expected": world * (world + 1) / 2, "reference": ref,
                      "seconds_per_allreduce": 0.001})
    return {"world_size": world, "visible": world, "backend": "nccl", "nccl": "2.28.9", "seed": 4400,
            "tolerance": "stand-in", "env": {}, "ranks": ranks, "exit_codes": [0] * world,
            "bandwidth": {"bytes": 256 << 20, "busbw_gbs": busbw, "algbw_gbs": busbw},
            "sum_ok": True, "reference_ok": not change, "ok": not change}


NVLINK = topology.Topology("nvlink", (topology.Link(0, 1, "NV18"),))


def probe_check(monkeypatch, result: dict, joined: topology.Topology = NVLINK, floors=None):
    monkeypatch.setattr(gpu, "_nccl_child", lambda world: json.loads(json.dumps(result)))  # STAND-IN result
    monkeypatch.setattr(gpu, "read_topology", lambda n: joined)
    two = [{"index": str(i), "compute_cap": "12.0", "name": "stand-in"} for i in range(result["world_size"])]
    return gpu.nccl_allreduce(two, [], None, result["world_size"], TF.allreduce_floors if floors is None else floors,
                              required=True)
