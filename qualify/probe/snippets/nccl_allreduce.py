"""Collectives across the GPUs a tensor-parallel server would use, with the image's own NCCL (one process per GPU).

usage: nccl_allreduce.py [WORLD_SIZE [BANDWIDTH_MIB [ENV_JSON]]]
WORLD_SIZE 0 (the default) is every visible GPU; another number must be exactly the number visible (the
deployment's --tensor-parallel-size), else nothing runs. ENV_JSON is the environment the ranks run under, a
JSON object of names and values (the probe passes the server's: core/ncclenv.py); it is set before torch is
imported, so every rank process inherits it, and each rank reports what it saw. Per rank, the Blackwell support RFC's two-rank
test:

- sum: rank r contributes a tensor filled with r + 1; every rank must end with n(n+1)/2, exactly;
- reference: rank r contributes seeded normal values (generated on the CPU from seed SEED + r, so every rank
  can make every rank's input), in float32 and in bfloat16; each rank's all-reduced result must be finite and
  equal, within the tolerance below, to the sum of all inputs computed on its own GPU alone in float64 (the
  single-GPU reference);
- shards: an all-gather puts rank r's shard at slot r of a (world x K) result on every rank, bit for bit, and a
  reduce-scatter leaves on rank r exactly shard r of the reference sum (within the tolerance): the shape and
  ownership tensor parallelism relies on.

Tolerance: |x - ref| <= n * u * sum_i |x_i| elementwise, u the unit roundoff (float32 2^-24, bfloat16 2^-8):
the textbook bound on a floating-point sum of n terms in any order ((n - 1) u), with a factor n of slack.
Then a BANDWIDTH_MIB (default 256) float32 all-reduce is timed with CUDA events and reported as nccl-tests
does: algbw = bytes / time and busbw = algbw * 2(n-1)/n (the per-link figure comparable across GPU counts),
from the mean time over ranks. NVLink multicast (NVLS) stays off because the environment the probe passes
says so (core/ncclenv.py): it can take shared GPUs out of service, and the qualification does not need it.

TEST DOUBLE: with BLACKWELL_COLLECTIVES_STANDIN=gloo the same collectives run over gloo between CPU processes
(no GPU, no NCCL, no bandwidth worth the name), so CI on a machine without GPUs exercises every comparison
above with real torch.distributed. The result then says `"backend": "gloo"`, and the probe's check never
passes it (probe/gpu.py): it proves the checking, not a GPU.
"""

import json
import os
import socket
import sys

WARMUP, ITERS = 5, 20
SEED = 4400
SHARD = 1 << 17  # elements per rank's shard in the reference and shard checks
UNIT_ROUNDOFF = {"float32": 2.0 ** -24, "bfloat16": 2.0 ** -8}
TOLERANCE = "|x - ref| <= n * u * sum_i |x_i| (u: float32 2^-24, bfloat16 2^-8); ref: the float64 sum on one GPU"


def _standin():  # read when used, never at import (tests/test_house_rules.py)
    return os.environ.get("BLACKWELL_COLLECTIVES_STANDIN") == "gloo"


def _device(torch, rank):
    return torch.device("cpu") if _standin() else torch.device("cuda", rank)


def _sync(torch):
    if not _standin():
        torch.cuda.synchronize()


def _gather(dist):  # torch 2.13 renamed these (the old names warn); images and hosts carry older ones too
    return getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def _scatter(dist):
    return getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _bandwidth(torch, dist, world, nbytes):
    if _standin():  # wall time on CPU processes: no CUDA events; the figure means nothing for a GPU
        import time

        x = torch.ones(nbytes // 4, dtype=torch.float32)
        dist.all_reduce(x)
        began = time.perf_counter()
        for _ in range(2):
            dist.all_reduce(x)
        return (time.perf_counter() - began) / 2
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


def _inputs(torch, world):
    """Every rank's input, made on the CPU from its seed: the same numbers on every rank and every GPU."""
    out = []
    for r in range(world):
        g = torch.Generator().manual_seed(SEED + r)
        out.append(torch.randn(world * SHARD, generator=g, dtype=torch.float32))
    return out


def _compare(torch, got, exact, magnitude, world, dtype):
    """got (on the GPU, any dtype) against the float64 reference; the worst error and its share of the bound."""
    got = got.double()
    bound = world * UNIT_ROUNDOFF[dtype] * magnitude + 1e-30
    err = (got - exact).abs()
    return {"dtype": dtype, "finite": bool(torch.isfinite(got).all().item()),
            "max_abs_error": float(err.max().item()), "max_error_over_bound": float((err / bound).max().item()),
            "within_tolerance": bool((err <= bound).all().item()), "elements": got.numel()}


def _reference(torch, dist, rank, world, inputs):
    """The all-reduce, all-gather and reduce-scatter against a single-GPU reference, in float32 and bfloat16."""
    device = _device(torch, rank)
    out = {"all_reduce": [], "reduce_scatter": []}
    owned = True
    for name, dtype in (("float32", torch.float32), ("bfloat16", torch.bfloat16)):
        mine = [t.to(dtype, copy=True) for t in inputs]  # what each rank contributes, in this dtype
        stacked = torch.stack([t.to(device).double() for t in mine])
        exact, magnitude = stacked.sum(0), stacked.abs().sum(0)  # the reference, on this GPU alone
        x = mine[rank].to(device, copy=True)  # collectives work in place: the inputs stay as made
        dist.all_reduce(x)
        out["all_reduce"].append(_compare(torch, x, exact, magnitude, world, name))
        shard = torch.empty(SHARD, dtype=dtype, device=device)
        _scatter(dist)(shard, mine[rank].to(device, copy=True))
        sl = slice(rank * SHARD, (rank + 1) * SHARD)
        row = _compare(torch, shard, exact[sl], magnitude[sl], world, name)
        row["shape"] = list(shard.shape)
        out["reduce_scatter"].append(row)
        gathered = torch.empty(world * SHARD, dtype=dtype, device=device)
        _gather(dist)(gathered, mine[rank][:SHARD].to(device, copy=True))
        wrong = [r for r in range(world) if not torch.equal(gathered[r * SHARD:(r + 1) * SHARD].cpu(),
                                                            mine[r][:SHARD])]
        owned = owned and not wrong and list(gathered.shape) == [world * SHARD]
        out.setdefault("all_gather", []).append({"dtype": name, "shape": list(gathered.shape),
                                                 "slots_not_their_rank": wrong})
    out["ok"] = owned and all(r["finite"] and r["within_tolerance"]
                              for r in out["all_reduce"] + out["reduce_scatter"])
    return out


def _worker(rank, world, port, nbytes, queue, names):
    import torch
    import torch.distributed as dist

    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
    if _standin():
        dist.init_process_group("gloo", rank=rank, world_size=world)
    else:
        torch.cuda.set_device(rank)
        dist.init_process_group("nccl", rank=rank, world_size=world, device_id=torch.device("cuda", rank))
    try:
        x = torch.full((1 << 20,), float(rank + 1), device=_device(torch, rank))
        dist.all_reduce(x)
        _sync(torch)
        expected = world * (world + 1) / 2
        reference = _reference(torch, dist, rank, world, _inputs(torch, world))
        seconds = _bandwidth(torch, dist, world, nbytes)
        queue.put({"rank": rank, "device": "cpu (gloo stand-in)" if _standin() else torch.cuda.get_device_name(rank),
                   "value": x[0].item(), "all_equal": bool((x == expected).all().item()), "expected": expected,
                   "reference": reference, "seconds_per_allreduce": seconds,
                   "env": {k: os.environ.get(k) for k in names}})  # what this rank's NCCL read
    finally:
        dist.destroy_process_group()


def _rates(world, nbytes, seconds):
    algbw = nbytes / seconds / 1e9
    return {"bytes": nbytes, "dtype": "float32", "iterations": ITERS, "warmup": WARMUP,
            "time_us": round(seconds * 1e6, 1), "algbw_gbs": round(algbw, 2),
            "busbw_gbs": round(algbw * 2 * (world - 1) / world, 2),
            "method": ("wall time of CPU processes (gloo stand-in: not a GPU figure)" if _standin() else
                       "mean time over ranks, CUDA events") + "; busbw = algbw * 2(n-1)/n as nccl-tests"}


def main():
    given = json.loads(sys.argv[3]) if len(sys.argv) > 3 else {}
    if not isinstance(given, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in given.items()):
        raise SystemExit("ENV_JSON must be a JSON object of names and string values")
    os.environ.update(given)  # before torch and NCCL load; the spawned ranks inherit it
    import torch
    import torch.multiprocessing as mp

    asked = int(sys.argv[1]) if len(sys.argv) > 1 else 0
    nbytes = int(sys.argv[2] if len(sys.argv) > 2 else 256) << 20
    visible = asked if _standin() else torch.cuda.device_count()
    world = asked or visible
    backend = "gloo" if _standin() else "nccl"
    out = {"world_size": world, "visible": visible, "backend": backend, "tolerance": TOLERANCE, "seed": SEED,
           "nccl": "none (gloo stand-in)" if _standin() else ".".join(str(p) for p in torch.cuda.nccl.version()),
           "env": given}
    if world < 2 or visible != world:
        out.update({"ok": False, "skipped": f"{visible} GPU(s) visible, world size {world}: an all-reduce needs at "
                    "least 2, and exactly the GPUs the deployment uses"})
        print(json.dumps(out))
        return
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_worker, args=(r, world, port, nbytes, queue, sorted(given))) for r in range(world)]
    for p in procs:
        p.start()
    ranks = [queue.get(timeout=240) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    ranks.sort(key=lambda r: r["rank"])
    out["ranks"] = ranks
    out["exit_codes"] = [p.exitcode for p in procs]
    out["bandwidth"] = _rates(world, nbytes, sum(r["seconds_per_allreduce"] for r in ranks) / world)
    out["sum_ok"] = all(r["all_equal"] for r in ranks)
    out["reference_ok"] = all(r["reference"]["ok"] for r in ranks)
    out["ok"] = out["sum_ok"] and out["reference_ok"] and all(c == 0 for c in out["exit_codes"])
    print(json.dumps(out))


if __name__ == "__main__":
    main()
