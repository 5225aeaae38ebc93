"""All-reduce across every visible GPU with the image's own NCCL (one process per GPU).

usage: nccl_allreduce.py
Rank r contributes a tensor filled with r + 1; every rank must end with
n(n+1)/2. NVLink multicast (NVLS) stays off: it can take shared GPUs out of
service, and the qualification does not need it.
"""

import json
import os
import socket


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank, world, port, queue):
    import torch
    import torch.distributed as dist

    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world)
    try:
        x = torch.full((1 << 20,), float(rank + 1), device="cuda")
        dist.all_reduce(x)
        torch.cuda.synchronize()
        expected = world * (world + 1) / 2
        queue.put({"rank": rank, "device": torch.cuda.get_device_name(rank),
                   "value": x[0].item(), "all_equal": bool((x == expected).all().item()), "expected": expected})
    finally:
        dist.destroy_process_group()


def main():
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
    os.environ.setdefault("NVSHMEM_DISABLE_NVLS", "1")
    import torch
    import torch.multiprocessing as mp

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
    procs = [ctx.Process(target=_worker, args=(r, world, port, queue)) for r in range(world)]
    for p in procs:
        p.start()
    ranks = [queue.get(timeout=240) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    ranks.sort(key=lambda r: r["rank"])
    out["ranks"] = ranks
    out["exit_codes"] = [p.exitcode for p in procs]
    out["ok"] = all(r["all_equal"] for r in ranks) and all(c == 0 for c in out["exit_codes"])
    print(json.dumps(out))


if __name__ == "__main__":
    main()
