"""Compile a real Triton kernel for a GPU target without a GPU.

usage: triton_compile.py CAPABILITY_NUMBER OUT_DIR
Writes OUT_DIR/kernel_<cap>.cubin and .ptx; prints what ptxas Triton used.
This is where 'ptxas fatal: Value sm_121a is not defined' shows up.
"""

import inspect
import json
import os
import sys

import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget


@triton.jit
def _scale_add(x_ptr, y_ptr, out_ptr, n, alpha, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    y = tl.load(y_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, alpha * x + y, mask=mask)


def _source():
    signature = {"x_ptr": "*fp32", "y_ptr": "*fp32", "out_ptr": "*fp32", "n": "i32", "alpha": "fp32",
                 "BLOCK": "constexpr"}
    params = inspect.signature(triton.compiler.ASTSource.__init__).parameters
    if "constexprs" in params:
        return triton.compiler.ASTSource(fn=_scale_add, signature=signature, constexprs={"BLOCK": 128})
    signature.pop("BLOCK")  # pragma: no cover (older Triton)
    return triton.compiler.ASTSource(fn=_scale_add, signature=signature, constants={"BLOCK": 128})


def main():
    arch = int(sys.argv[1])
    out_dir = sys.argv[2]
    kernel = triton.compile(_source(), target=GPUTarget("cuda", arch, 32))
    cubin = kernel.asm["cubin"]
    ptx = kernel.asm["ptx"]
    base = os.path.join(out_dir, f"kernel_{arch}")
    with open(base + ".cubin", "wb") as fh:
        fh.write(cubin)
    with open(base + ".ptx", "w") as fh:
        fh.write(ptx)
    target_line = next((ln.strip() for ln in ptx.splitlines() if ln.strip().startswith(".target")), "")
    print(json.dumps({"triton": triton.__version__, "arch": arch, "cubin": base + ".cubin",
                      "cubin_bytes": len(cubin), "ptx_target": target_line}))


main()
