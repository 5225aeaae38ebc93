"""Ask vLLM's own selector functions which attention, MoE and linear kernels it picks.

Runs in a child interpreter (qualify.probe.subproc.run_snippet); the probe
process never imports vLLM. Prints one JSON object as the last stdout line:

    {"status": "ok" | "no-gpu" | "not-installed" | "error",
     "mode": "observed" | "evaluated", "vllm": "0.33.0", "capability": "12.1",
     "target": "12.1" | null,  # --target, for the caller to compare
     "gpu": "NVIDIA GB10" | null, "reason": "...",
     "sections": {"attention.bf16": {"selected": "FLASH_ATTN", "order": [...],
                                     "rejected": {"NAME": ["reason", ...]},
                                     "error": null, ...}, ...}}

`observed` means a GPU was present and vLLM read its capability itself.
With `--assume-capability X.Y` and no GPU, vLLM's CUDA platform is made to
report X.Y and the same selector functions run (`evaluated`): vLLM's rules for
the target, but nothing launched. The caller must never record that as observed.

The names are vLLM's (enum members and kernel class names); the probe maps
them to its own provider names. Each section is independent: one failing
section is reported as an error and the others still run.

Standard library at module level (Python 3.9 syntax); vLLM and torch are
imported only inside main().
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import traceback
from types import SimpleNamespace

ATTN_HEAD_SIZE = 128  # a typical bf16 decoder (Llama/Qwen class)
ATTN_NUM_HEADS = 32
MLA_HEAD_SIZE = 576  # DeepSeek-style MLA: kv_lora_rank 512 + rope 64
LINEAR_SHAPE = (4096, 4096)


def emit(obj: dict) -> None:
    sys.stdout.flush()
    print(json.dumps(obj, sort_keys=True, default=str))
    sys.stdout.flush()


def parse_capability(text: str):
    major, minor = text.strip().split(".")
    return int(major), int(minor)


def fake_platform(capability):
    """vLLM's CUDA platform reporting `capability` (for --assume-capability)."""
    from vllm.platforms.cuda import NonNvmlCudaPlatform
    from vllm.platforms.interface import DeviceCapability

    cap = DeviceCapability(*capability)

    class AssumedCudaPlatform(NonNvmlCudaPlatform):
        @classmethod
        def get_device_capability(cls, device_id: int = 0):
            return cap

        @classmethod
        def get_device_name(cls, device_id: int = 0) -> str:
            return "assumed"

    return AssumedCudaPlatform()


def section(fn):
    """Run one selector; a failure becomes that section's error, not the run's."""
    try:
        return fn()
    except Exception as exc:  # noqa: BLE001 - report any failure of vLLM's code
        return {"selected": None, "error": f"{type(exc).__name__}: {exc}",
                "traceback": traceback.format_exc(limit=6)[-1500:]}


def attention(use_mla: bool):
    import torch
    from vllm.platforms import current_platform
    from vllm.v1.attention.selector import AttentionSelectorConfig

    cfg = AttentionSelectorConfig(
        head_size=MLA_HEAD_SIZE if use_mla else ATTN_HEAD_SIZE,
        dtype=torch.bfloat16, kv_cache_dtype="auto", block_size=None, use_mla=use_mla)
    cap = current_platform.get_device_capability()
    valid, invalid = current_platform.get_valid_backends(cap, cfg, num_heads=ATTN_NUM_HEADS)
    order = sorted([(c.priority, c.backend.name) for c in valid]
                   + [(prio, b.name) for b, (prio, _) in invalid.items()])
    chosen = min(valid, key=lambda c: c.priority).backend.name if valid else None
    out = {"selected": chosen, "order": [name for _, name in order],
           "rejected": {b.name: reasons for b, (_, reasons) in invalid.items()}}
    if not use_mla:
        out["flash_attn_version"] = _flash_attn_version()
    return out


def _flash_attn_version():
    from vllm.v1.attention.backends.fa_utils import get_flash_attn_version

    return get_flash_attn_version(head_size=ATTN_HEAD_SIZE)


def moe_bf16():
    from vllm.model_executor.layers.fused_moe.activation import MoEActivation
    from vllm.model_executor.layers.fused_moe.oracle import unquantized as oracle

    # _get_priority_backends reads only these two fields; a full FusedMoEConfig
    # needs a model. Per-kernel checks use the device and quant-scheme parts of
    # is_supported_config, which are what depend on the GPU.
    stub = SimpleNamespace(moe_parallel_config=SimpleNamespace(dp_size=1), activation=MoEActivation.SILU)
    order = oracle._get_priority_backends(stub)
    rejected, chosen = {}, None
    for backend in order:
        reasons = []
        for k_cls in oracle.backend_to_kernel_cls(backend):
            if not k_cls._supports_current_device():
                reasons.append(f"{k_cls.__name__}: current device not supported")
            elif not k_cls._supports_quant_scheme(None, None):
                reasons.append(f"{k_cls.__name__}: unquantized scheme not supported")
            else:
                reasons = []
                break
        if reasons:
            rejected[backend.name] = reasons
        elif chosen is None:
            chosen = backend.name
    return {"selected": chosen, "order": [b.name for b in order], "rejected": rejected}


def _kernel_loop(kernels, check):
    rejected, chosen = {}, None
    for kernel in kernels:
        ok, reason = check(kernel)
        if not ok:
            rejected[kernel.__name__] = [str(reason).strip()]
        elif chosen is None:
            chosen = kernel.__name__
    return {"selected": chosen, "order": [k.__name__ for k in kernels], "rejected": rejected}


def linear_fp8():
    import torch
    from vllm.model_executor import kernels as _  # noqa: F401 - package import order
    from vllm.model_executor.kernels import linear as L
    from vllm.model_executor.layers.quantization.utils.quant_utils import (
        kFp8DynamicTensorSym,
        kFp8DynamicTokenSym,
        kFp8StaticTensorSym,
    )
    from vllm.model_executor.layers.quantization.utils.w8a8_utils import cutlass_fp8_supported
    from vllm.platforms import current_platform

    # Same activation choice as Fp8LinearMethod for a dynamic `--quantization fp8`.
    act = kFp8DynamicTokenSym if cutlass_fp8_supported() else kFp8DynamicTensorSym
    cfg = L.FP8ScaledMMLinearLayerConfig(weight_quant_key=kFp8StaticTensorSym, activation_quant_key=act,
                                         weight_shape=LINEAR_SHAPE, input_dtype=torch.bfloat16,
                                         out_dtype=torch.bfloat16)
    kernels = L._resolve_backend_kernels(L._POSSIBLE_FP8_KERNELS.get(current_platform._enum, []),
                                         "scaled-mm", quantization="fp8_w8a8")
    out = _kernel_loop(kernels, lambda k: L.is_supported_and_can_implement_kernel(k, cfg, None))
    out["chosen_by_vllm"] = L.choose_scaled_mm_linear_kernel(
        cfg, L._POSSIBLE_FP8_KERNELS, quantization="fp8_w8a8").__name__
    out["activation_scales"] = "per-token" if act is kFp8DynamicTokenSym else "per-tensor"
    return out


def linear_nvfp4():
    from vllm.model_executor.kernels import linear as L
    from vllm.platforms import current_platform

    config = L.NvFp4LinearLayerConfig()

    def check(kernel):
        ok, reason = kernel.is_supported()
        return (ok, reason) if not ok else kernel.can_implement(config)

    kernels = L._resolve_backend_kernels(list(L._POSSIBLE_NVFP4_KERNELS.get(current_platform._enum, [])),
                                         "NVFP4", quantization="nvfp4_w4a4")
    out = _kernel_loop(kernels, check)
    out["chosen_by_vllm"] = type(L.init_nvfp4_linear_kernel()).__name__
    return out


def linear_w4a16():
    import torch
    from vllm.model_executor.kernels import linear as L
    from vllm.scalar_type import scalar_types

    cfg = L.MPLinearLayerConfig(full_weight_shape=LINEAR_SHAPE, partition_weight_shape=LINEAR_SHAPE,
                                weight_type=scalar_types.uint4b8, act_type=torch.bfloat16,
                                group_size=128, zero_points=False)
    chosen = L.choose_mp_linear_kernel(cfg)
    return {"selected": chosen.__name__, "chosen_by_vllm": chosen.__name__}


SECTIONS = (
    ("attention.bf16", lambda: attention(False)),
    ("attention.mla", lambda: attention(True)),
    ("moe.bf16", moe_bf16),
    ("linear.fp8", linear_fp8),
    ("linear.nvfp4", linear_nvfp4),
    ("linear.w4a16", linear_w4a16),
)


def gpu_state():
    """(name, (major, minor)) of GPU 0, or None when torch sees no GPU."""
    import torch

    if not torch.cuda.is_available() or torch.cuda.device_count() == 0:
        return None
    return torch.cuda.get_device_name(0), tuple(torch.cuda.get_device_capability(0))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", default=None, help="the capability the image is for (recorded, compared)")
    ap.add_argument("--assume-capability", default=None,
                    help="with no GPU, evaluate vLLM's rules for this capability (mode 'evaluated')")
    args = ap.parse_args(argv)
    base = {"mode": None, "vllm": None, "capability": None, "gpu": None, "sections": {}, "target": args.target}
    if importlib.util.find_spec("vllm") is None:
        emit(dict(base, status="not-installed", reason="vLLM is not installed in this image"))
        return 0
    # vLLM logs to stdout by default; the last stdout line must be our JSON.
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
    try:
        gpu = gpu_state()
    except Exception as exc:  # noqa: BLE001 - a broken torch is a finding
        emit(dict(base, status="error", reason=f"torch: {type(exc).__name__}: {exc}"))
        return 0
    if gpu is None and not args.assume_capability:
        emit(dict(base, status="no-gpu", reason="no CUDA GPU visible: vLLM's selectors need one to observe"))
        return 0
    import vllm
    import vllm.platforms as platforms

    if gpu is None:
        platforms._current_platform = fake_platform(parse_capability(args.assume_capability))
        mode, name, cap = "evaluated", None, parse_capability(args.assume_capability)
    else:
        mode, (name, cap) = "observed", gpu
    from vllm.config import VllmConfig, set_current_vllm_config

    with set_current_vllm_config(VllmConfig()):
        sections = {key: section(fn) for key, fn in SECTIONS}
    emit(dict(base, status="ok", mode=mode, vllm=getattr(vllm, "__version__", None),
              capability=f"{cap[0]}.{cap[1]}", gpu=name, sections=sections,
              reason="vLLM's own selector functions with a minimal default configuration"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
