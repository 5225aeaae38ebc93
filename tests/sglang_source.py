"""SGLang's own selection code, run on a CPU host without torch (tests/test_sglang_wheel_paths.py).

SGLang 0.5.23's selectors read the GPU through torch at import, so the whole package cannot be imported
here. Its selector functions are small and pure once their platform facts are given, so each is taken out
of the real wheel's source with `ast` (the function as written, its decorators dropped) and run in a
namespace where the facts come from SGLang's own definitions too: `srt/utils/common.py`'s
`_check_cuda_device_version` partials (is_sm100_supported, is_sm120_supported, ...) and
`srt/runtime_context.py`'s `_PLATFORM_PROBES` table, over a stubbed `get_device_sm()` and CUDA 13.0. What is
stubbed is only what a GPU or an installed package would answer (the device's SM, whether flashinfer or
deep_gemm import) and the imports of modules these functions call but do not decide with.

Each function answers with SGLang's own names: "trtllm_mha", "flashinfer_cutlass", the subdirectory its
kernel loader takes.
"""

from __future__ import annotations

import ast
import enum
import functools
import glob
import logging
import types
from pathlib import Path
from typing import Any, Dict, Iterable, Optional

from qualify.core.arch import Capability

CUDA = "13.0"


def extract(path: Path, names: Iterable[str], ns: Dict[str, Any]) -> Dict[str, Any]:
    """Run the top-level definitions (functions, classes, assignments) of `path` that define `names`, in `ns`."""
    wanted = set(names)
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    found = set()
    body = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name in wanted:
            if isinstance(node, ast.FunctionDef):
                node.decorator_list = []  # caches and op registration: nothing that decides
            body.append(node)
            found.add(node.name)
        elif isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id in wanted for t in node.targets):
            body.append(node)
            found.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id in wanted \
                and node.value is not None:
            body.append(ast.copy_location(ast.Assign(targets=[node.target], value=node.value), node))
            found.add(node.target.id)
    missing = wanted - found
    assert not missing, f"{path}: no top-level {', '.join(sorted(missing))} (SGLang moved its selection code)"
    exec(compile(ast.Module(body=body, type_ignores=[]), str(path), "exec"), ns)  # noqa: S102 - SGLang's own code
    return ns


class _Torch:
    class version:
        cuda = CUDA
        hip = None


def platform(src: Path, cap: Capability, *, flashinfer: bool) -> types.SimpleNamespace:
    """SGLang's get_platform() facts for a device of `cap`, from its own definitions."""
    ns: Dict[str, Any] = {"lru_cache": functools.lru_cache, "partial": functools.partial, "List": list,
                          "Tuple": tuple, "torch": _Torch, "is_cuda": lambda: True,
                          "get_device_sm": lambda: cap.major * 10 + cap.minor,
                          "get_bool_env_var": lambda name, default="false": default.lower() in ("true", "1"),
                          "importlib": types.SimpleNamespace(util=types.SimpleNamespace(
                              find_spec=lambda name: object() if name == "flashinfer" and flashinfer else None))}
    common = src / "sglang" / "srt" / "utils" / "common.py"
    extract(common, ["_check_cuda_device_version", "is_hopper_with_cuda_12_3", "is_blackwell_supported",
                     "is_sm120_supported", "is_sm100_supported", "is_sm100_or_sm110_supported", "is_sm110_supported",
                     "is_sm90_supported", "is_flashinfer_available"], ns)
    probes = extract(src / "sglang" / "srt" / "runtime_context.py", ["_PLATFORM_PROBES"], {})["_PLATFORM_PROBES"]
    facts = {fact: ns[fn]() for fact, fn in probes.items() if fn in ns}
    return types.SimpleNamespace(is_hip=False, is_npu=False, is_xpu=False, is_musa=False, is_mps=False, **facts)


def default_attention(src: Path, cap: Capability, *, mla: bool, flashinfer: bool) -> str:
    """get_default_attn_backend (srt/arg_groups/model_override_base.py): a decoder, no speculative decoding."""
    plat = platform(src, cap, flashinfer=flashinfer)
    ns: Dict[str, Any] = {"Any": Any, "get_platform": lambda: plat,
                          "current_platform": types.SimpleNamespace(is_out_of_tree=lambda: False),
                          "is_mps": lambda: False, "resolving_view": lambda v: v, "resolved_view": lambda v: v}
    extract(src / "sglang" / "srt" / "utils" / "common.py", ["is_no_spec_infer_or_topk_one"], ns)
    extract(src / "sglang" / "srt" / "arg_groups" / "model_override_base.py",
            ["get_default_attn_backend", "_forces_eagle_topk_one"], ns)
    args = types.SimpleNamespace(speculative_eagle_topk=None, speculative_algorithm=None, page_size=None, tp_size=1)
    model = types.SimpleNamespace(hf_config=types.SimpleNamespace(architectures=["LlamaForCausalLM"]),
                                  has_asymmetric_kv=False, has_attention_sinks=False)
    return ns["get_default_attn_backend"](args, mla, model)


def fp4_gemm_backend(src: Path, cap: Capability) -> str:
    """initialize_fp4_gemm_config (srt/layers/quantization/fp4_utils.py) with --fp4-gemm-backend auto."""
    plat = platform(src, cap, flashinfer=True)
    ns: Dict[str, Any] = {"Enum": enum.Enum, "Optional": Optional, "get_platform": lambda: plat,
                          "is_cuda": lambda: True, "get_device_capability": lambda: (cap.major, cap.minor),
                          "get_exec": lambda: types.SimpleNamespace(
                              kernel=types.SimpleNamespace(fp4_gemm_runner_backend="auto"))}
    extract(src / "sglang" / "srt" / "layers" / "quantization" / "fp4_utils.py",
            ["Fp4GemmRunnerBackend", "FP4_GEMM_RUNNER_BACKEND", "initialize_fp4_gemm_config"], ns)
    ns["initialize_fp4_gemm_config"]()
    return ns["FP4_GEMM_RUNNER_BACKEND"].value


# What each block-FP8 linear of fp8_utils.py is, by SGLang's --fp8-gemm-backend name.
_BLOCK_LINEARS = {"deepgemm_w8a8_block_fp8_linear_with_fallback": "deep_gemm",
                  "flashinfer_gemm_w8a8_block_fp8_linear_with_fallback": "flashinfer_trtllm",
                  "flashinfer_deepgemm_w8a8_block_fp8_linear_with_fallback": "flashinfer_deepgemm",
                  "cutlass_w8a8_block_fp8_linear_with_fallback": "cutlass",
                  "aiter_w8a8_block_fp8_linear": "aiter", "torch_w8a8_block_fp8_linear": "torch",
                  "triton_w8a8_block_fp8_linear": "triton"}


def block_fp8_linear(src: Path, cap: Capability, *, deep_gemm: bool, flashinfer: bool) -> str:
    """dispatch_w8a8_block_fp8_linear for 128x128 blocks (srt/layers/quantization/fp8_utils.py) after
    initialize_fp8_gemm_config with --fp8-gemm-backend auto; DeepGEMM enabled as its configurer decides
    (srt/layers/deep_gemm_wrapper/configurer.py), with a deep_gemm that imports and has the SM120 APIs."""
    plat = platform(src, cap, flashinfer=flashinfer)
    envs = types.SimpleNamespace(SGLANG_ENABLE_JIT_DEEPGEMM=types.SimpleNamespace(get=lambda: True))
    conf: Dict[str, Any] = {"_is_cuda": True, "_is_musa": False, "envs": envs,
                            "get_device_sm": lambda: cap.major * 10 + cap.minor,
                            "logger": logging.getLogger("sglang")}
    extract(src / "sglang" / "srt" / "layers" / "deep_gemm_wrapper" / "configurer.py",
            ["_compute_enable_deep_gemm", "_sm120_deep_gemm_apis_available"], conf)
    stub = types.ModuleType("deep_gemm")
    for name in ("fp8_einsum", "m_grouped_fp8_fp4_gemm_nt_contiguous", "transform_sf_into_required_layout"):
        setattr(stub, name, lambda *a, **k: None)
    import sys

    saved = sys.modules.get("deep_gemm")
    sys.modules["deep_gemm"] = stub if deep_gemm else None  # None: `import deep_gemm` raises ImportError
    try:
        enabled = conf["_compute_enable_deep_gemm"]()
    finally:
        if saved is None:
            sys.modules.pop("deep_gemm", None)
        else:
            sys.modules["deep_gemm"] = saved
    ns: Dict[str, Any] = {"Enum": enum.Enum, "Callable": Any, "List": list, "Optional": Optional,
                          "partial": functools.partial, "get_platform": lambda: plat,
                          "deep_gemm_wrapper": types.SimpleNamespace(ENABLE_JIT_DEEPGEMM=enabled),
                          "is_flashinfer_available": lambda: flashinfer, "_use_aiter": False, "_is_xpu": False,
                          "is_npu_arch35": lambda: False, "print_warning_once": lambda *a: None,
                          "envs": envs, "get_exec": lambda: types.SimpleNamespace(
                              kernel=types.SimpleNamespace(fp8_gemm_runner_backend="auto"))}
    ns.update({name: _sentinel(name) for name in _BLOCK_LINEARS})
    extract(src / "sglang" / "srt" / "layers" / "quantization" / "fp8_utils.py",
            ["Fp8GemmRunnerBackend", "FP8_GEMM_RUNNER_BACKEND", "initialize_fp8_gemm_config",
             "get_fp8_gemm_runner_backend", "dispatch_w8a8_block_fp8_linear", "_dispatch_explicit_backend",
             "_dispatch_auto_backend"], ns)
    ns["initialize_fp8_gemm_config"]()
    chosen = ns["dispatch_w8a8_block_fp8_linear"](weight_block_size=[128, 128])
    return _BLOCK_LINEARS[getattr(chosen, "func", chosen).__name__]


def _sentinel(name: str):
    def linear(*args, **kwargs):
        raise AssertionError(f"{name} was chosen, not called")
    linear.__name__ = name
    return linear


def nvfp4_moe(src: Path, cap: Capability) -> str:
    """--moe-runner-backend auto for modelopt_fp4: overrides.py's _moe_runner_backend_quant_constraints, then
    ModelOptNvFp4FusedMoEMethod.create_moe_runner's auto branch (srt/layers/quantization/modelopt_quant.py)."""
    plat = platform(src, cap, flashinfer=True)
    ns: Dict[str, Any] = {"Enum": enum.Enum, "get_platform": lambda: plat, "logger": logging.getLogger("sglang"),
                          "is_gfx95_supported": lambda: False, "envs": None}
    extract(src / "sglang" / "srt" / "arg_groups" / "overrides.py", ["_moe_runner_backend_quant_constraints"], ns)
    view = types.SimpleNamespace(moe_runner_backend="auto", quantization="modelopt_fp4", moe_a2a_backend="none")
    resolved = ns["_moe_runner_backend_quant_constraints"](view).get("moe_runner_backend", "auto")
    moe: Dict[str, Any] = {}
    extract(src / "sglang" / "srt" / "layers" / "moe" / "utils.py", ["_MoeRunnerBackendPredicates"], moe)
    moe["Enum"] = enum.Enum
    extract(src / "sglang" / "srt" / "layers" / "moe" / "utils.py", ["MoeRunnerBackend"], moe)
    backend = moe["MoeRunnerBackend"](resolved)
    tree = ast.parse((src / "sglang/srt/layers/quantization/modelopt_quant.py").read_text(encoding="utf-8"))
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "ModelOptNvFp4FusedMoEMethod")
    fn = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "create_moe_runner")
    fn.decorator_list = []
    run: Dict[str, Any] = {"torch": types.SimpleNamespace(nn=types.SimpleNamespace(Module=object)),
                           "MoeRunnerConfig": object, "MoeRunnerBackend": moe["MoeRunnerBackend"],
                           "get_moe_runner_backend": lambda: backend, "is_cuda": lambda: True,
                           "get_device_capability": lambda: (cap.major, cap.minor),
                           # megamoe returns right after the backend is chosen: nothing else is built
                           "get_moe_a2a_backend": lambda: types.SimpleNamespace(is_megamoe=lambda: True)}
    exec(compile(ast.Module(body=[fn], type_ignores=[]), "modelopt_quant.py", "exec"), run)  # noqa: S102
    method = types.SimpleNamespace()
    run["create_moe_runner"](method, None, None)
    return method._moe_runner_backend.value


def kernel_loader_subdir(kernel_src: Path, cap: Capability, tmp: Path) -> str:
    """What sgl_kernel's _load_architecture_specific_ops (sgl_kernel/load_utils.py) loads on a device of `cap`,
    from a folder holding both sm90/ and sm100/ builds and the flat fallback: the path relative to it."""
    for rel in ("sm90/common_ops.abi3.so", "sm100/common_ops.abi3.so", "common_ops.abi3.so"):
        (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp / rel).write_bytes(b"")
    loaded = []

    def spec_from_file_location(name, path):
        return types.SimpleNamespace(loader=types.SimpleNamespace(exec_module=lambda m: loaded.append(path)))

    util = types.SimpleNamespace(spec_from_file_location=spec_from_file_location,
                                 module_from_spec=lambda spec: types.SimpleNamespace(__file__="(stub)"))
    ns: Dict[str, Any] = {"Path": Path, "glob": glob, "logger": logging.getLogger("sgl_kernel"),
                          "importlib": types.SimpleNamespace(util=util), "List": list,
                          "torch": _Torch, "__file__": str(tmp / "load_utils.py")}
    extract(kernel_src / "sgl_kernel" / "load_utils.py", ["_filter_compiled_extensions",
                                                          "_load_architecture_specific_ops"], ns)
    ns["_get_compute_capability"] = lambda: cap.major * 10 + cap.minor
    ns["_load_architecture_specific_ops"]()
    return str(Path(loaded[0]).relative_to(tmp))
