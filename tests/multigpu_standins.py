"""Stand-ins for the multi-GPU tests (not a test module): the GPUs the stand-in nvidia-smi describes, and
STAND-INS for the results the probe's NCCL and P2P snippets print (their exact shape, with the bandwidth, the
environment and the P2P a test chooses). No GPU produced any of these."""

from __future__ import annotations

import json

from evidence_helpers import TF

from qualify.core import ncclenv, topology
from qualify.probe import gpu

PRO = "12.0|NVIDIA RTX PRO 6000 Blackwell Workstation Edition|97887 MiB|GPU-pro6000-{}"
B200 = "10.0|NVIDIA B200|183359 MiB|GPU-b200-{}"


def gpus_of(model: str, n: int) -> str:
    return ";".join(model.format(i) for i in range(n))


def standin_result(world: int = 2, busbw: float = 290.0, env: dict = None, **change) -> dict:
    """A STAND-IN for what the probe's snippet prints after NCCL on `world` GPUs (its exact shape), with a bus
    bandwidth the test chooses and the environment each rank reports (the defaults unless `env`); `change`
    edits one rank's reference rows."""
    env = ncclenv.DEFAULT.as_dict() if env is None else env

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
                      "seconds_per_allreduce": 0.001, "env": dict(env)})
    return {"world_size": world, "visible": world, "backend": "nccl", "nccl": "2.28.9", "seed": 4400,
            "tolerance": "stand-in", "env": dict(env), "ranks": ranks, "exit_codes": [0] * world,
            "bandwidth": {"bytes": 256 << 20, "busbw_gbs": busbw, "algbw_gbs": busbw},
            "sum_ok": True, "reference_ok": not change, "ok": not change}


NVLINK = topology.Topology("nvlink", (topology.Link(0, 1, "NV18"),))


def standin_p2p(world: int = 2, peer: bool = True, transfer: bool = True, env: dict = None,
                ipc: bool = True) -> dict:
    """A STAND-IN for what snippets/p2p_access.py prints on `world` GPUs: the driver reporting `peer` for every
    pair, every transfer between two GPUs `transfer`, on one GPU (CUDA IPC) `ipc`."""
    env = ncclenv.DEFAULT.as_dict() if env is None else env
    return {"world_size": world, "visible": world, "env": dict(env), "ok": True, "cudart": "stand-in",
            "driver": [{"src": i, "dst": j, "peer": peer} for i in range(world) for j in range(world) if i != j],
            "transfer": [{"src": i, "dst": j, "ok": ipc if i == j else transfer,
                          "error": "" if (ipc if i == j else transfer) else "read back other bytes than written"}
                         for i in range(world) for j in range(world)],
            "child_env": dict(env), "exit_codes": [0, 0]}


def probe_check(monkeypatch, result: dict, joined: topology.Topology = NVLINK, floors=None):
    monkeypatch.setattr(gpu, "_nccl_child", lambda world, env: json.loads(json.dumps(result)))  # STAND-IN result
    monkeypatch.setattr(gpu, "read_topology", lambda n: joined)
    two = [{"index": str(i), "compute_cap": "12.0", "name": "stand-in"} for i in range(result["world_size"])]
    return gpu.nccl_allreduce(two, [], None, result["world_size"], TF.allreduce_floors if floors is None else floors,
                              required=True)


# --- a STAND-IN sysfs: the IOMMU and PCIe bridges this machine lacks (deploy/iommu.py reads it) ---------------

ACS_REDIRECT = 0x1D  # SrcValid+ ReqRedir+ CmpltRedir+ UpstreamFwd+: what Linux sets with an IOMMU on
ACS_OFF = 0x0000


def config_space(acs_ctrl=None, size: int = 4096) -> bytes:
    """A PCI function's config space: an AER capability at 0x100 pointing at ACS (when `acs_ctrl` is given) at
    0x148, with that ACS Control value; `size` 64 is what a user who is not root reads."""
    data = bytearray(size)
    if size >= 0x150:
        data[0x100:0x104] = (0x0001 | 1 << 16 | (0x148 if acs_ctrl is not None else 0) << 20).to_bytes(4, "little")
        if acs_ctrl is not None:
            data[0x148:0x14C] = (0x000D | 1 << 16).to_bytes(4, "little")
            data[0x14C:0x14E] = (0x5F).to_bytes(2, "little")
            data[0x14E:0x150] = acs_ctrl.to_bytes(2, "little")
    return bytes(data)


def standin_sysfs(root, n: int = 2, switch: bool = True, group_type: str = "DMA-FQ", acs_ctrl=ACS_REDIRECT,
                  config_size: int = 4096, cmdline: str = "BOOT_IMAGE=/vmlinuz root=/dev/sda1 quiet"):
    """STAND-IN /sys and /proc/cmdline under `root` for `n` GPUs at the PCI addresses the stand-in nvidia-smi
    reports (00000000:18:00.0, ...): below one PCIe switch (its upstream port 0000:10:00.0, a downstream port
    0000:11:0i.0 per GPU, whose ACS Control is `acs_ctrl`) or each on a root port of its own; each GPU in an
    IOMMU group of type `group_type` (None: no IOMMU group, no IOMMU unit)."""
    from pathlib import Path

    root = Path(root)
    top = root / "sys" / "devices" / "pci0000:00"
    bus = root / "sys" / "bus" / "pci" / "devices"
    bus.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        if switch:
            port = top / "0000:00:01.0" / "0000:10:00.0" / f"0000:11:{i:02x}.0"
        else:
            port = top / f"0000:00:{i + 1:02x}.0"
        gpu_dir = port / f"0000:{0x18 + i:02x}:00.0"
        gpu_dir.mkdir(parents=True)
        for bridge in [p for p in gpu_dir.parents if p.name.startswith("0000:")]:
            (bridge / "config").write_bytes(config_space(acs_ctrl if bridge == port else None, config_size))
        (gpu_dir / "config").write_bytes(config_space(None, config_size))
        (bus / gpu_dir.name).symlink_to(gpu_dir)
        if group_type is not None:
            group = root / "sys" / "kernel" / "iommu_groups" / str(20 + i)
            group.mkdir(parents=True)
            (group / "type").write_text(group_type + "\n")
            (gpu_dir / "iommu_group").symlink_to(group)
    if group_type is not None:
        (root / "sys" / "class" / "iommu" / "dmar0").mkdir(parents=True)
    (root / "proc").mkdir(exist_ok=True)
    (root / "proc" / "cmdline").write_text(cmdline + "\n")
    return root
