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


def attention(use_mla: bool, kv_cache_dtype: str = "auto"):
    import torch
    from vllm.platforms import current_platform
    from vllm.v1.attention.selector import AttentionSelectorConfig

    cfg = AttentionSelectorConfig(
        head_size=MLA_HEAD_SIZE if use_mla else ATTN_HEAD_SIZE,
        dtype=torch.bfloat16, kv_cache_dtype=kv_cache_dtype, block_size=None, use_mla=use_mla)
    cap = current_platform.get_device_capability()
    valid, invalid = current_platform.get_valid_backends(cap, cfg, num_heads=ATTN_NUM_HEADS)
    order = sorted([(c.priority, c.backend.name) for c in valid]
                   + [(prio, b.name) for b, (prio, _) in invalid.items()])
    chosen = min(valid, key=lambda c: c.priority).backend.name if valid else None
    out = {"selected": chosen, "order": [name for _, name in order],
           "rejected": {b.name: reasons for b, (_, reasons) in invalid.items()}}
    if not use_mla and kv_cache_dtype == "auto":
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


# The quantized MoE paths (issue 50): vLLM's own select_*_moe_backend over a FusedMoEConfig of a typical
# model (Qwen3-30B-A3B class; gpt-oss-20b for MXFP4), no parallelism; each backend's kernels asked
# is_supported_config in vLLM's order, so a rejection carries vLLM's reason.
MOE_SHAPE = {"num_experts": 128, "experts_per_token": 8, "hidden_dim": 2048, "intermediate_size": 768}
GPT_OSS_SHAPE = {"num_experts": 32, "experts_per_token": 4, "hidden_dim": 2880, "intermediate_size": 2880}


class _ModelStandIn:
    """The little of a ModelConfig vLLM's kernel choices read for a checkpoint (its model type, no
    quantization_config override): DeepGEMM's FP8 kernels are chosen only for a known model
    (DeepGemmFp8BlockScaledMMKernel: "Model configuration is required"). A stand-in, not a model."""

    def __init__(self, model_type):
        self.hf_text_config = SimpleNamespace(model_type=model_type)
        self.hf_config = self.hf_text_config
        self.quantization_config = None


def _with_model(model_type, fn):
    from vllm.config import get_current_vllm_config

    cfg = get_current_vllm_config()
    before = cfg.model_config
    object.__setattr__(cfg, "model_config", _ModelStandIn(model_type))
    try:
        return fn()
    finally:
        object.__setattr__(cfg, "model_config", before)


def _moe_config(shape, **extra):
    import torch
    from vllm.model_executor.layers.fused_moe.activation import MoEActivation
    from vllm.model_executor.layers.fused_moe.config import FusedMoEConfig, FusedMoEParallelConfig, RoutingMethodType

    kw = dict(activation=MoEActivation.SILU, routing_method=RoutingMethodType.Renormalize)
    kw.update(extra)
    return FusedMoEConfig(num_local_experts=shape["num_experts"], num_logical_experts=shape["num_experts"],
                          device="cuda", moe_parallel_config=FusedMoEParallelConfig.make_no_parallel(),
                          in_dtype=torch.bfloat16, **{k: v for k, v in shape.items()}, **kw)


def _moe_rejections(oracle, order, cfg, wkey, akey):
    import vllm.model_executor.layers.fused_moe.modular_kernel as mk

    rejected = {}
    for backend in order:
        try:
            classes = oracle.backend_to_kernel_cls(backend)
        except Exception as exc:  # noqa: BLE001 - an import vLLM cannot make here is a rejection
            rejected[backend.name] = [f"{type(exc).__name__}: {exc}"]
            continue
        reasons = []
        for k_cls in classes:
            ok, why = k_cls.is_supported_config(k_cls, cfg, wkey, akey, mk.FusedMoEActivationFormat.Standard)
            if ok:
                reasons = []
                break
            reasons.append(f"{k_cls.__name__}: {why}")
        if reasons:
            rejected[backend.name] = reasons
    return rejected


def _moe_answer(selected, order, rejected):
    backend, k_cls = selected
    return {"selected": backend.name, "kernel": getattr(k_cls, "__name__", None),
            "order": [b.name for b in order], "rejected": rejected}


def moe_fp8(block: bool):
    from vllm.model_executor.layers.fused_moe.oracle import fp8 as oracle
    from vllm.model_executor.layers.quantization.utils import quant_utils as q

    cfg = _moe_config(MOE_SHAPE)
    # per-tensor: a checkpoint's static activation scales (ModelOpt and compressed-tensors FP8 MoE checkpoints;
    # `--quantization fp8` online is dynamic, and only Triton takes that); block: DeepSeek-style 128x128
    wkey, akey = (q.kFp8Static128BlockSym, q.kFp8Dynamic128Sym) if block else \
        (q.kFp8StaticTensorSym, q.kFp8StaticTensorSym)
    B = oracle.Fp8MoeBackend
    # select_fp8_moe_backend drops vLLM's own CUTLASS MoE unless a caller allows it (Fp8MoEMethod does not)
    order = [b for b in oracle._get_priority_backends(cfg, wkey, akey)
             if b not in (B.VLLM_CUTLASS, B.BATCHED_VLLM_CUTLASS)]
    return _moe_answer(oracle.select_fp8_moe_backend(cfg, wkey, akey), order,
                       _moe_rejections(oracle, order, cfg, wkey, akey))


def moe_nvfp4():
    from vllm.model_executor.layers.fused_moe.oracle import nvfp4 as oracle
    from vllm.model_executor.layers.quantization.utils import quant_utils as q
    from vllm.model_executor.layers.quantization.utils.humming import prioritize_humming

    cfg = _moe_config(MOE_SHAPE)
    B = oracle.NvFp4MoeBackend
    # select_nvfp4_moe_backend's own list (a local there), in its order
    order = prioritize_humming([B.FLASHINFER_TRTLLM, B.FLASHINFER_CUTEDSL, B.FLASHINFER_CUTEDSL_BATCHED,
                                B.FLASHINFER_CUTLASS, B.VLLM_CUTLASS, B.MARLIN, B.HUMMING, B.EMULATION])
    return _moe_answer(oracle.select_nvfp4_moe_backend(cfg, q.kNvfp4Static, q.kNvfp4Dynamic), order,
                       _moe_rejections(oracle, order, cfg, q.kNvfp4Static, q.kNvfp4Dynamic))


def moe_mxfp4():
    from vllm.model_executor.layers.fused_moe.activation import MoEActivation
    from vllm.model_executor.layers.fused_moe.oracle import mxfp4 as oracle
    from vllm.model_executor.layers.quantization.utils import quant_utils as q

    cfg = _moe_config(GPT_OSS_SHAPE, activation=MoEActivation.SWIGLUOAI, has_bias=True, swiglu_limit=7.0)
    order = oracle._get_priority_backends_for_gpt_oss()
    return _moe_answer(oracle.select_mxfp4_moe_backend(cfg), order,
                       _moe_rejections(oracle, order, cfg, q.kMxfp4Static, None))


def linear_fp8_block():
    import torch
    from vllm.model_executor import kernels as _  # noqa: F401 - package import order
    from vllm.model_executor.kernels import linear as L
    from vllm.model_executor.layers.quantization.utils.quant_utils import GroupShape, create_fp8_quant_key
    from vllm.platforms import current_platform

    # DeepSeek-style checkpoints: 128x128 weight blocks, 1x128 dynamic activation groups (Fp8LinearMethod).
    cfg = L.FP8ScaledMMLinearLayerConfig(
        weight_quant_key=create_fp8_quant_key(static=True, group_shape=GroupShape(128, 128)),
        activation_quant_key=create_fp8_quant_key(static=False, group_shape=GroupShape(1, 128)),
        weight_shape=LINEAR_SHAPE, input_dtype=torch.bfloat16, out_dtype=torch.bfloat16)
    kernels = L._resolve_backend_kernels(L._POSSIBLE_FP8_BLOCK_KERNELS.get(current_platform._enum, []),
                                         "scaled-mm", quantization="fp8_block_w8a8")
    out = _kernel_loop(kernels, lambda k: L.is_supported_and_can_implement_kernel(k, cfg, None))
    out["chosen_by_vllm"] = L.choose_scaled_mm_linear_kernel(
        cfg, L._POSSIBLE_FP8_BLOCK_KERNELS, quantization="fp8_block_w8a8").__name__
    return out


SECTIONS = (
    ("attention.bf16", lambda: attention(False)),
    ("attention.mla", lambda: attention(True)),
    ("attention.fp8-kv", lambda: attention(False, "fp8")),
    ("moe.bf16", moe_bf16),
    ("moe.fp8", lambda: moe_fp8(False)),
    ("moe.fp8-block", lambda: _with_model("deepseek_v3", lambda: moe_fp8(True))),
    ("moe.nvfp4", moe_nvfp4),
    ("moe.mxfp4", lambda: _with_model("gpt_oss", moe_mxfp4)),
    ("linear.fp8", linear_fp8),
    ("linear.fp8-block", lambda: _with_model("deepseek_v3", linear_fp8_block)),
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
