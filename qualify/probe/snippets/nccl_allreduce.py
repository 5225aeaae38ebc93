"""All-reduce across every visible GPU with the image's own NCCL (one process per GPU).

usage: nccl_allreduce.py [BANDWIDTH_MIB]
Rank r contributes a tensor filled with r + 1; every rank must end with
n(n+1)/2. Then a BANDWIDTH_MIB (default 256) float32 all-reduce is timed with
CUDA events and reported as nccl-tests does: algbw = bytes / time and
busbw = algbw * 2(n-1)/n (the per-link figure comparable across GPU counts),
from the mean time over ranks. NVLink multicast (NVLS) stays off: it can take
shared GPUs out of service, and the qualification does not need it.
"""

import json
import os
import socket
import sys

WARMUP, ITERS = 5, 20


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _bandwidth(torch, dist, world, nbytes):
    x = torch.ones(nbytes // 4, dtype=torch.float32, device="cuda")
    for _ in range(WARMUP):
        dist.all_reduce(x)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(ITERS):
        dist.all_reduce(x)
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / 1000.0 / ITERS


def _worker(rank, world, port, nbytes, queue):
    import torch
    import torch.distributed as dist

    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world, device_id=torch.device("cuda", rank))
    try:
        x = torch.full((1 << 20,), float(rank + 1), device="cuda")
        dist.all_reduce(x)
        torch.cuda.synchronize()
        expected = world * (world + 1) / 2
        seconds = _bandwidth(torch, dist, world, nbytes)
        queue.put({"rank": rank, "device": torch.cuda.get_device_name(rank),
                   "value": x[0].item(), "all_equal": bool((x == expected).all().item()), "expected": expected,
                   "seconds_per_allreduce": seconds})
    finally:
        dist.destroy_process_group()


def _rates(world, nbytes, seconds):
    algbw = nbytes / seconds / 1e9
    return {"bytes": nbytes, "dtype": "float32", "iterations": ITERS, "warmup": WARMUP,
            "time_us": round(seconds * 1e6, 1), "algbw_gbs": round(algbw, 2),
            "busbw_gbs": round(algbw * 2 * (world - 1) / world, 2),
            "method": "mean time over ranks, CUDA events; busbw = algbw * 2(n-1)/n as nccl-tests"}


def main():
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
    os.environ.setdefault("NVSHMEM_DISABLE_NVLS", "1")
    import torch
    import torch.multiprocessing as mp

    nbytes = int(sys.argv[1] if len(sys.argv) > 1 else 256) << 20
    world = torch.cuda.device_count()
    out = {"world_size": world, "nccl": ".".join(str(p) for p in torch.cuda.nccl.version()),
           "env": {k: os.environ[k] for k in ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST",
                                              "NVSHMEM_DISABLE_NVLS")}}
    if world < 2:
        out.update({"ok": False, "skipped": f"{world} GPU(s) visible; an all-reduce needs at least 2"})
        print(json.dumps(out))
        return
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_worker, args=(r, world, port, nbytes, queue)) for r in range(world)]
    for p in procs:
        p.start()
    ranks = [queue.get(timeout=240) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    ranks.sort(key=lambda r: r["rank"])
    out["ranks"] = ranks
    out["exit_codes"] = [p.exitcode for p in procs]
    out["bandwidth"] = _rates(world, nbytes, sum(r["seconds_per_allreduce"] for r in ranks) / world)
    out["ok"] = all(r["all_equal"] for r in ranks) and all(c == 0 for c in out["exit_codes"])
    print(json.dumps(out))


if __name__ == "__main__":
    main()
