"""The GPUs a deployment uses (GPU_DEVICE: one, a list, or all), as preflight checks them before anything runs.

One query of every GPU (nvidia-smi --query-gpu), then the choice made here rather than by `nvidia-smi -i`, so
a list that names a missing GPU, or one GPU twice (by index and by UUID), is refused naming it. Several GPUs
serve one model with tensor parallelism: they must be the same model and capability, each must have the free
memory the server's fraction asks for, TENSOR_PARALLEL_SIZE must be their number, and how they are joined
(`nvidia-smi topo -m`: NVLink, a PCIe switch, the CPU's host bridge) is read and recorded; the all-reduce
floor the deploy's NCCL check must reach depends on it (core/topology.py).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Dict, List, Sequence, Tuple

from qualify.core import arch, nvsmi, topology
from qualify.deploy import memory, settings
from qualify.deploy.settings import Settings
from qualify.deploy.ui import EX_PREFLIGHT, Stop, Ui
from qualify.host import cmd

SMI_TIMEOUT = 30
DRIVER_FIX = ("an R580-branch driver or newer for CUDA 13: your distribution's nvidia-driver-580 (or newer) package, "
              "or NVIDIA's installer from https://www.nvidia.com/drivers; reboot, then check with nvidia-smi")


@dataclass(frozen=True)
class Gpu:
    device: str  # how GPU_DEVICE named it (its index or UUID; its index for `all`)
    capability: str
    name: str
    memory: str
    uuid: str
    driver: str
    index: int = 0  # nvidia-smi's
    memory_free: str = ""  # NVML's free memory now ("" where it reports none: GB10)
    pci_bus_id: str = ""  # nvidia-smi's 00000000:18:00.0: where preflight reads the IOMMU and ACS (iommu.py)


@dataclass(frozen=True)
class GpuSet:
    """The chosen GPUs, in nvidia-smi's order (PCI bus order: the order CUDA ranks them with
    CUDA_DEVICE_ORDER=PCI_BUS_ID), how they are joined, and the tensor-parallel size over them."""

    gpus: Tuple[Gpu, ...]
    topology: topology.Topology
    tensor_parallel_size: int

    @property
    def first(self) -> Gpu:
        return self.gpus[0]

    def describe(self) -> str:
        if len(self.gpus) == 1:
            return self.first.name
        return f"{len(self.gpus)} x {self.first.name} ({self.topology.kind})"


def smi(args: Sequence[str]) -> cmd.Result:
    return cmd.ask(["nvidia-smi", *args], timeout=SMI_TIMEOUT)


def said(proc: cmd.Result) -> str:
    text = ((proc.stdout or "") + (proc.stderr or "")).strip()
    return text.splitlines()[0] if text else ""


def _listed() -> str:
    return " ".join(smi(["-L"]).stdout.splitlines())


def query_all(s: Settings) -> List[Gpu]:
    proc = smi(nvsmi.query_args(nvsmi.DEPLOY_FIELDS))
    if proc.returncode != 0:
        raise Stop(EX_PREFLIGHT, f"nvidia-smi cannot list this host's GPUs: {said(proc)}",
                   f"check that `nvidia-smi -L` works; then set GPU_DEVICE in {s.env_file}")
    out = []
    for row in nvsmi.parse(proc.stdout, nvsmi.DEPLOY_FIELDS, pad=True):
        index = row["index"]
        if not index.isdigit():
            raise Stop(EX_PREFLIGHT, f"nvidia-smi printed a GPU row this toolkit cannot read: {','.join(row.values())[:200]}",
                       f"update the NVIDIA driver ({DRIVER_FIX})")
        known = {k: ("" if nvsmi.not_available(v) else v) for k, v in row.items()}
        out.append(Gpu(index, row["compute_cap"], row["name"], row["memory.total"], row["uuid"],
                       known["driver_version"], int(index), known["memory.free"], known["pci.bus_id"]))
    if not out:
        raise Stop(EX_PREFLIGHT, "nvidia-smi lists no GPU on this host", "check the driver with nvidia-smi -L")
    return out


def choose(s: Settings, ui: Ui) -> List[Gpu]:
    """The GPUs GPU_DEVICE names (every GPU for `all`), each once, in nvidia-smi's order."""
    every = query_all(s)
    wanted = settings.gpu_devices(s.gpu_device)
    chosen: Dict[int, Gpu] = {}
    for token in wanted or [str(g.index) for g in every]:
        gpu = next((g for g in every if token in (str(g.index), g.uuid)), None)
        if gpu is None:
            where = f"GPU_DEVICE={token}" if len(wanted) == 1 else f"GPU_DEVICE={s.gpu_device}: {token}"
            raise Stop(EX_PREFLIGHT, f"{where} does not name a GPU on this host (nvidia-smi lists {len(every)})",
                       f"set GPU_DEVICE in {s.env_file} to indices or UUIDs that nvidia-smi -L lists: {_listed()}")
        if gpu.index in chosen:
            raise Stop(EX_PREFLIGHT, f"GPU_DEVICE={s.gpu_device} names GPU {gpu.index} ({gpu.uuid}) twice",
                       f"name each GPU once in GPU_DEVICE in {s.env_file}")
        chosen[gpu.index] = replace(gpu, device=token)
    gpus = [chosen[i] for i in sorted(chosen)]
    for g in gpus:
        try:
            arch.Capability.parse(g.capability)
        except ValueError:
            raise Stop(EX_PREFLIGHT, f"the driver does not report the compute capability of {g.name} ({g.capability})",
                       f"update the NVIDIA driver ({DRIVER_FIX})") from None
        ui.say(f"GPU {g.device}: {g.name}, compute capability {g.capability}, memory {g.memory}, {g.uuid}")
    _same_model(gpus, s)
    return gpus


def _same_model(gpus: Sequence[Gpu], s: Settings) -> None:
    kinds = sorted({(g.name, g.capability) for g in gpus})
    if len(kinds) == 1:
        return
    each = "; ".join(f"GPU {g.index}: {g.name} ({g.capability})" for g in gpus)
    groups = "; ".join(f"{name}: GPU_DEVICE={','.join(str(g.index) for g in gpus if (g.name, g.capability) == (name, cap))}"
                       for name, cap in kinds)
    raise Stop(EX_PREFLIGHT, f"GPU_DEVICE={s.gpu_device} mixes GPU models ({each}); one server spans only GPUs of "
               "one model and capability (tensor parallelism splits every layer evenly across them)",
               f"choose GPUs of one model in {s.env_file}: {groups}")


def check_free_memory(gpus: Sequence[Gpu], fit: memory.MemoryFit, s: Settings, ui: Ui) -> None:
    """vLLM stops at start-up on a GPU whose free memory is below its fraction of the total: each is checked."""
    if fit.unified:
        return  # the unified pool's free memory was judged from /proc/meminfo (memory.py)
    short = []
    for g in gpus:
        total, free = nvsmi.mib(g.memory), nvsmi.mib(g.memory_free)
        if total is None or free is None:
            ui.warn(f"GPU {g.index}: nvidia-smi reports no free memory ({g.memory_free or 'none'}); not checked")
            continue
        if free < fit.gpu_memory_utilization * total:
            short.append((g, total, free))
    if not short:
        return
    fits = min(int(free / total * 100) / 100 for _, total, free in short)
    each = "; ".join(f"GPU {g.index} has {free / 1024:.1f} of {total / 1024:.1f} GiB free, the server asks for "
                     f"{fit.gpu_memory_utilization * total / 1024:.1f} GiB" for g, total, free in short)
    raise Stop(EX_PREFLIGHT, f"GPU memory: {each} (gpu_memory_utilization {fit.gpu_memory_utilization:g}); vLLM "
               "would stop at start-up ('Free memory on device ... is less than desired GPU memory utilization')",
               "stop what holds it (nvidia-smi lists the processes), or choose other GPUs (GPU_DEVICE)",
               *([f"or set GPU_MEMORY_UTILIZATION={fits} in {s.env_file} (what is free now)"] if fits >= 0.05 else []))


def read_topology(gpus: Sequence[Gpu], ui: Ui) -> topology.Topology:
    """How the chosen GPUs are joined (nvidia-smi topo -m); one GPU needs no reading."""
    if len(gpus) < 2:
        return topology.Topology(topology.SINGLE)
    fix = "check that `nvidia-smi topo -m` works on this host (it comes with the NVIDIA driver)"
    proc = smi(["topo", "-m"])
    if proc.returncode != 0:
        raise Stop(EX_PREFLIGHT, f"cannot tell how the GPUs are joined: nvidia-smi topo -m failed: {said(proc)}; the "
                   "all-reduce floor depends on it", fix)
    try:
        found = topology.for_gpus(topology.parse_matrix(proc.stdout), [g.index for g in gpus])
    except topology.TopologyError as exc:
        raise Stop(EX_PREFLIGHT, f"cannot tell how the GPUs are joined: {exc}", fix) from None
    if found.kind == topology.UNKNOWN:
        odd = sorted({lk.cell for lk in found.links if lk.kind == topology.UNKNOWN})
        raise Stop(EX_PREFLIGHT, f"nvidia-smi topo -m joins the GPUs by {', '.join(odd)}, which this toolkit does not "
                   f"know (it knows NV#, PIX, PXB, PHB, NODE, SYS); no all-reduce floor applies", fix)
    ui.say(f"topology: {found.describe()} (nvidia-smi topo -m)")
    return found


def tensor_parallel_size(gpus: Sequence[Gpu], s: Settings, unified: bool) -> int:
    tp = s.tensor_parallel_size or len(gpus)
    if tp != len(gpus):
        raise Stop(EX_PREFLIGHT, f"TENSOR_PARALLEL_SIZE={tp}, but GPU_DEVICE={s.gpu_device} names {len(gpus)} GPU"
                   f"{'s' * (len(gpus) != 1)}: each rank of the server takes one GPU",
                   f"name exactly the GPUs to use in {s.env_file} (e.g. GPU_DEVICE="
                   f"{','.join(str(g.index) for g in gpus[:tp]) if tp <= len(gpus) else '0,1'}), or leave "
                   "TENSOR_PARALLEL_SIZE empty for their number")
    if tp > 1 and unified:
        raise Stop(EX_PREFLIGHT, f"GPU_DEVICE={s.gpu_device}: a unified-memory GPU shares the host's memory; this "
                   "target serves on one GPU", f"set GPU_DEVICE in {s.env_file} to one GPU")
    return tp
