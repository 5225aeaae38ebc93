"""GPU checks that need a real device (run only when one is visible).

usage: gpu_checks.py scratch main|thread|spawn
       gpu_checks.py matmul
       gpu_checks.py compile
Each prints one JSON object: {"ok": bool, ...}.
"""

import json
import sys
import traceback


def _scratch_kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def double_via_descriptors(in_ptr, out_ptr, M, N, BM: tl.constexpr, BN: tl.constexpr):
        # Device-side tensor descriptors (TMA) need global scratch from the allocator.
        pid_m = tl.program_id(0)
        pid_n = tl.program_id(1)
        src = tl.make_tensor_descriptor(in_ptr, shape=[M, N], strides=[N, 1], block_shape=[BM, BN])
        dst = tl.make_tensor_descriptor(out_ptr, shape=[M, N], strides=[N, 1], block_shape=[BM, BN])
        block = src.load([pid_m * BM, pid_n * BN])
        dst.store([pid_m * BM, pid_n * BN], block * 2)

    return double_via_descriptors


def scratch_once():
    import torch

    kernel = _scratch_kernel()
    M, N, BM, BN = 256, 256, 64, 64
    x = torch.randn(M, N, device="cuda", dtype=torch.float32)
    y = torch.empty_like(x)
    try:
        kernel[(M // BM, N // BN)](x, y, M, N, BM=BM, BN=BN)
        torch.cuda.synchronize()
    except Exception as exc:
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    err = (y - 2 * x).abs().max().item()
    return {"ok": err == 0.0, "max_abs_err": err}


def scratch(where):
    if where == "main":
        return scratch_once()
    if where == "thread":
        import threading

        box = {}
        t = threading.Thread(target=lambda: box.update(scratch_once()))
        t.start()
        t.join()
        return box
    import multiprocessing

    with multiprocessing.get_context("spawn").Pool(1) as pool:
        return pool.apply(scratch_once)


def matmul():
    import torch

    torch.manual_seed(0)
    a = torch.randn(2048, 2048, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(2048, 2048, device="cuda", dtype=torch.bfloat16)
    got = (a @ b).float()
    ref = a.float() @ b.float()
    rel = ((got - ref).norm() / ref.norm()).item()
    # Per-SKU figure (the Blackwell support RFC): bf16 TFLOP/s of a larger square matmul, after a warm-up.
    n, reps = 8192, 10
    x = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    y = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    x @ y
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        x @ y
    end.record()
    torch.cuda.synchronize()
    tflops = 2 * n ** 3 * reps / (start.elapsed_time(end) / 1000) / 1e12
    return {"ok": rel < 1e-2, "relative_error": rel, "device": torch.cuda.get_device_name(),
            "tflops": round(tflops, 1)}


def compile_check():
    import os

    import torch

    def f(x):
        return torch.sin(x) * 2 + torch.relu(x) - x.mean()

    x = torch.randn(4096, device="cuda")
    compiled = torch.compile(f, backend="inductor")
    got = compiled(x)
    err = (got - f(x)).abs().max().item()
    return {"ok": err < 1e-4, "max_abs_err": err, "torch": torch.__version__,
            "ptxas_env": {k: v for k, v in os.environ.items() if k.startswith("TRITON_PTXAS")}}


def main():
    what = sys.argv[1]
    try:
        if what == "scratch":
            out = scratch(sys.argv[2])
        elif what == "matmul":
            out = matmul()
        else:
            out = compile_check()
    except Exception as exc:
        out = {"ok": False, "error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()[-2000:]}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
