"""Attention, MoE and quantized-linear providers vLLM would select for a target.

`predict()` applies vLLM 0.33.0's own priority rules, encoded below as data
(each table names the vLLM file it comes from), to the target capability and
then asks the census whether each provider's kernels can really run there. A
provider whose library carries no code for the target is not available, however
well it imports (seed 000: "importable is not available"); one that runs only by
JIT-compiling PTX from an older generation is available with a warning (the
FA2-from-sm_80 case of seed 003).

vLLM's own gates are mostly import checks, so every provider dict records both
`vllm_would_select` (vLLM's rules with "importable" taken as "available") and
`selected` (the first provider that can really run). Where they differ, a
default deployment fails at the first kernel launch (or first download) unless
the backend is overridden; the check says which override.

`observe()` runs snippets/vllm_providers.py in a child interpreter, which asks
vLLM's selector functions themselves; `observed_providers()` turns its answer
into provider dicts with mode "observed" (only when a GPU was present).

How the tables were confirmed: read from the vLLM 0.33.0 wheel's sources, then
executed: the snippet's `--assume-capability` mode ran vLLM 0.33.0's own
selector functions (torch 2.14.0, flashinfer-python 0.7.2.post1) for 9.0, 10.0,
10.3, 12.0, 12.1 and 13.0 on a CPU host, and vLLM's choices matched
`vllm_would_select` here (tests/test_providers.py keeps that matrix). Not
executable that way: MLA on 10.x (a backend module needs a driver at import),
model-dependent constraints (head sizes, routing methods, group sizes), and
what happens inside a kernel launch. Reasons say where a rule is unconfirmed.

Inputs:

census: per-library census for the target, keyed by path relative to
site-packages (absolute paths work too: a key matches when it ends with the
relative path):

    {"vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so":
        {"class": "native" | "compatible" | "ptx-jit" | "none" | None,  # worst unit
         "sass": ["sm_80", ...], "ptx": ["compute_80", ...],
         "cross_generation_ptx": bool}}

A record may carry "worst" (and "best") as well; "worst" then wins over "class"
(qualify/probe/runner.py passes class=best, worst=class).

`census_index()` builds it from `qualify.core.census.CensusReport.to_json()`. An
empty census means "not examined": library-backed providers are then reported
available but unverified.

toolchain (from `selfsufficiency.toolchain()`; None when not examined):
{"nvcc": path | None, "nvcc_version": "13.0" | None, "nvcc_targets":
["sm_120", ...] | None, "ninja": path | None}. `nvcc` is the one vLLM and
FlashInfer would find (CUDA_HOME, CUDA_PATH, PATH, /usr/local/cuda).

Standard library only, Python 3.9 compatible (runs inside images).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from qualify.core import arch
from qualify.core.arch import Capability, CodeTarget, Compat
from qualify.probe.model import FAIL, PASS, WARN, CheckResult, not_run
from qualify.probe.selfsufficiency import norm_dist
from qualify.probe.subproc import ChildResult, run_snippet

VLLM_TARGET = "0.33.0"
NOT_INSTALLED = "vLLM is not installed in this image"

# --- capability gates ---------------------------------------------------------


@dataclass(frozen=True)
class CapRule:
    """A capability gate as vLLM writes it: bounds, then majors or exact pairs."""

    lo: Tuple[int, int] = (0, 0)
    hi: Tuple[int, int] = (99, 9)
    majors: Tuple[int, ...] = ()
    exact: Tuple[Tuple[int, int], ...] = ()

    def admits(self, cap: Capability) -> bool:
        pair = (cap.major, cap.minor)
        if not self.lo <= pair <= self.hi:
            return False
        if not self.majors and not self.exact:
            return True
        return cap.major in self.majors or pair in self.exact

    def describe(self) -> str:
        parts = [f"{a}.{b}" for a, b in self.exact] + [f"{m}.x" for m in self.majors]
        text = " or ".join(parts) if parts else "any capability"
        bounds = []
        if self.lo != (0, 0):
            bounds.append(f">= {self.lo[0]}.{self.lo[1]}")
        if self.hi != (99, 9):
            bounds.append(f"<= {self.hi[0]}.{self.hi[1]}")
        return text + (f" ({', '.join(bounds)})" if bounds else "")


ANY = CapRule()


# --- where kernels live -------------------------------------------------------


@dataclass(frozen=True)
class LibRule:
    """A prebuilt library carrying a provider's kernels.

    judge: "all" -- the census class (every compiled unit must run: a
    single-purpose library); "any" -- the best code anywhere in the library
    (vLLM's _C dispatches per capability, so units for other GPUs are never
    launched); "sass" -- the best SASS only (arch-specific CUTLASS kernels,
    which PTX cannot stand in for).
    """

    paths: Tuple[str, ...]  # relative to site-packages; the first present is used
    judge: str
    what: str


LIB_FA2 = LibRule(("vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so",), "all", "vLLM's FlashAttention 2")
LIB_FA3 = LibRule(("vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so",), "all", "vLLM's FlashAttention 3")
LIB_FLASHMLA = LibRule(("vllm/_flashmla_C.abi3.so",), "all", "FlashMLA")
# vLLM 0.33.0 ships the stable-ABI names; older releases used _C / _moe_C.
_C_PATHS = ("vllm/_C_stable_libtorch.abi3.so", "vllm/_C.abi3.so")
LIB_C = LibRule(_C_PATHS, "any", "vLLM's _C kernels")
LIB_C_CUTLASS = LibRule(_C_PATHS, "sass", "vLLM's CUTLASS kernels in _C")
LIB_MOE_C = LibRule(("vllm/_moe_C_stable_libtorch.abi3.so", "vllm/_moe_C.abi3.so"), "any",
                    "vLLM's MoE routing kernels (_moe_C)")
LIB_TORCH = LibRule(("torch/lib/libtorch_cuda.so",), "any", "torch's CUDA kernels")

FA3_SO = LIB_FA3.paths[0]
FA2_SO = LIB_FA2.paths[0]
FA4_INTERFACE = "vllm/vllm_flash_attn/cute/interface.py"  # vLLM's FA4 gate is this file existing
FLASHMLA_SO = LIB_FLASHMLA.paths[0]

# Run-time kernel sources other than prebuilt libraries.
TRITON = "triton"  # JIT by Triton (its ptxas wiring is the triton.* checks' job)
FI_JIT = "flashinfer-jit"  # FlashInfer modules: flashinfer-jit-cache, else nvcc + ninja at first use
FI_CUBIN = "flashinfer-cubin"  # trtllm-gen cubins: flashinfer-cubin, else downloaded at first use
CUTE_DSL = "cute-dsl"  # compiled at first use by nvidia-cutlass-dsl (no nvcc)
NVRTC_JIT = "nvrtc-jit"  # Humming: NVRTC (or nvcc) at first use

FI = "flashinfer-python"
FI_CUBIN_DIST = "flashinfer-cubin"
FI_JIT_CACHE_DIST = "flashinfer-jit-cache"
CUTLASS_DSL = "nvidia-cutlass-dsl"


@dataclass(frozen=True)
class Provider:
    name: str
    caps: CapRule  # vLLM's capability gate
    libs: Tuple[LibRule, ...] = ()
    needs: Tuple[str, ...] = ()  # run-time sources (above)
    packages: Tuple[str, ...] = ()  # distributions vLLM's gate imports
    gate_files: Tuple[str, ...] = ()  # files vLLM's gate imports or looks for
    has_flashinfer: bool = False  # vLLM's gate also calls has_flashinfer()
    trtllm_on: Optional[CapRule] = None  # switches to trtllm-gen cubins when vLLM sees flashinfer-cubin
    optional: bool = False  # an extra: its absence is normal, not worth flagging
    fallback: str = ""  # why it is a slow path ("" when it is not)
    cli: str = ""  # the override that selects it
    note: str = ""


@dataclass(frozen=True)
class Table:
    kind: str
    variant: str
    source: str  # the vLLM files the rules come from
    case: str  # what configuration the rules assume
    priority: Tuple[Tuple[Any, Tuple[str, ...]], ...]  # ((major, minor) | major | None, names)
    providers: Tuple[Provider, ...]

    def order(self, cap: Capability) -> Tuple[str, ...]:
        keyed = dict(self.priority)
        for key in ((cap.major, cap.minor), cap.major, None):
            if key in keyed:
                return keyed[key]
        return ()

    def provider(self, name: str) -> Provider:
        return next(p for p in self.providers if p.name == name)


def _attn(name: str) -> str:
    return f"--attention-backend {name}"


# vllm/platforms/cuda.py (_get_backend_priorities, non-MLA, causal, no mm-prefix);
# gates: each backend's supports_compute_capability in vllm/v1/attention/backends/;
# FA version: vllm/v1/attention/backends/fa_utils.py (get_flash_attn_version) and
# vllm/vllm_flash_attn/flash_attn_interface.py (_is_fa{2,3,4}_supported: import + family).
# TURBOQUANT (TurboQuant KV-cache dtypes only) and the mm-prefix Triton variants are left out.
ATTENTION_BF16 = Table(
    "attention", "bf16",
    "vllm/platforms/cuda.py, vllm/v1/attention/backends/{flash_attn,flashinfer,triton_attn,flex_attention}.py, "
    "vllm/v1/attention/backends/fa_utils.py, vllm/vllm_flash_attn/flash_attn_interface.py",
    "decoder, bf16, head size 128, KV cache 'auto', causal",
    (
        (9, ("FLASH_ATTN(FA3)", "FLASH_ATTN(FA2)", "FLASHINFER", "TRITON_ATTN", "FLEX_ATTENTION")),
        (10, ("FLASHINFER", "FLASH_ATTN(FA4)", "FLASH_ATTN(FA2)", "TRITON_ATTN", "FLEX_ATTENTION")),
        (None, ("FLASH_ATTN(FA2)", "FLASHINFER", "TRITON_ATTN", "FLEX_ATTENTION")),
    ),
    (
        Provider("FLASH_ATTN(FA3)", CapRule(majors=(9,)), libs=(LIB_FA3,), gate_files=(FA3_SO,),
                 cli="--attention-backend FLASH_ATTN --attention-config.flash_attn_version=3"),
        Provider("FLASH_ATTN(FA4)", CapRule(majors=(10,)), needs=(CUTE_DSL,), packages=(CUTLASS_DSL,),
                 gate_files=(FA4_INTERFACE,),
                 cli="--attention-backend FLASH_ATTN --attention-config.flash_attn_version=4",
                 note="CuTe DSL kernels compiled at first use"),
        Provider("FLASH_ATTN(FA2)", CapRule(lo=(8, 0)), libs=(LIB_FA2,), gate_files=(FA2_SO,),
                 cli="--attention-backend FLASH_ATTN --attention-config.flash_attn_version=2"),
        Provider("FLASHINFER", CapRule(lo=(8, 0), hi=(12, 1)), needs=(FI_JIT,), packages=(FI,),
                 trtllm_on=CapRule(majors=(10,)), cli=_attn("FLASHINFER")),
        Provider("TRITON_ATTN", ANY, needs=(TRITON,), cli=_attn("TRITON_ATTN")),
        Provider("FLEX_ATTENTION", ANY, needs=(TRITON,), cli=_attn("FLEX_ATTENTION"),
                 fallback="FlexAttention through torch.compile is vLLM's last resort"),
    ),
)

# vllm/platforms/cuda.py (_get_backend_priorities, use_mla=True, dense, bf16 KV);
# gates: vllm/v1/attention/backends/mla/*.py supports_compute_capability. TOKENSPEED_MLA
# (FP8 KV with R1 dims only) and the sparse backends are left out.
ATTENTION_MLA = Table(
    "attention", "mla",
    "vllm/platforms/cuda.py, vllm/v1/attention/backends/mla/{flashinfer_mla,cutlass_mla,flashattn_mla,"
    "flashmla,triton_mla}.py",
    "DeepSeek-style MLA, head size 576, bf16 KV cache, dense",
    (
        (10, ("FLASHINFER_MLA", "CUTLASS_MLA", "FLASH_ATTN_MLA", "FLASHMLA", "TRITON_MLA")),
        (12, ("TRITON_MLA",)),
        (None, ("FLASH_ATTN_MLA", "FLASHMLA", "FLASHINFER_MLA", "TRITON_MLA")),
    ),
    (
        Provider("FLASHINFER_MLA", CapRule(majors=(10,)), needs=(FI_CUBIN, FI_JIT), packages=(FI,),
                 cli=_attn("FLASHINFER_MLA"),
                 note="trtllm-gen MLA kernels (from the source; not executed here)"),
        Provider("CUTLASS_MLA", CapRule(majors=(10,)), libs=(LIB_C_CUTLASS,), cli=_attn("CUTLASS_MLA")),
        Provider("FLASH_ATTN_MLA", CapRule(majors=(9,)), libs=(LIB_FA3,), gate_files=(FA3_SO,),
                 cli=_attn("FLASH_ATTN_MLA")),
        Provider("FLASHMLA", CapRule(majors=(9, 10)), libs=(LIB_FLASHMLA,), gate_files=(FLASHMLA_SO,),
                 cli=_attn("FLASHMLA")),
        Provider("TRITON_MLA", ANY, needs=(TRITON,), cli=_attn("TRITON_MLA")),
    ),
)

# vllm/model_executor/layers/fused_moe/oracle/unquantized.py (_get_priority_backends:
# FlashInfer moved behind Triton on 9.x); gates: _supports_current_device in
# experts/trtllm_bf16_moe.py, experts/flashinfer_cutlass_moe.py, experts/triton_moe.py, and
# has_flashinfer_{trtllm,cutlass}_fused_moe in vllm/utils/flashinfer.py. BATCHED_TRITON
# (DP/EP batched format only) is left out.
MOE_BF16 = Table(
    "moe", "bf16",
    "vllm/model_executor/layers/fused_moe/oracle/unquantized.py, vllm/model_executor/layers/fused_moe/experts/"
    "{trtllm_bf16_moe,flashinfer_cutlass_moe,triton_moe}.py, vllm/utils/flashinfer.py",
    "unquantized (bf16) experts, SiLU, no DP/EP, no LoRA",
    (
        (9, ("TRITON", "FLASHINFER_TRTLLM", "FLASHINFER_CUTLASS")),
        (None, ("FLASHINFER_TRTLLM", "FLASHINFER_CUTLASS", "TRITON")),
    ),
    (
        Provider("FLASHINFER_TRTLLM", CapRule(majors=(10,)), needs=(FI_CUBIN, FI_JIT), packages=(FI,),
                 has_flashinfer=True, cli="--moe-backend flashinfer_trtllm"),
        Provider("FLASHINFER_CUTLASS", CapRule(majors=(10, 12), exact=((9, 0),)), needs=(FI_JIT,),
                 packages=(FI,), has_flashinfer=True, cli="--moe-backend flashinfer_cutlass"),
        Provider("TRITON", ANY, libs=(LIB_MOE_C,), needs=(TRITON,), cli="--moe-backend triton"),
    ),
)

# vllm/model_executor/kernels/linear/__init__.py (_POSSIBLE_FP8_KERNELS, CUDA) with
# vllm/model_executor/layers/quantization/fp8.py: dynamic `--quantization fp8` uses per-token
# activation scales wherever CUTLASS FP8 is supported (>= 8.9), which rules out FlashInfer's
# per-tensor-only kernel (first in vLLM's list; it applies to static-scale checkpoints on >= 10.0).
# prioritize_humming (quantization/utils/humming/priority.py) moves Humming ahead of Marlin on 9.0.
# CUTLASS: csrc scaled_mm_entry.cu dispatches capability >= 12.0 to its sm120 kernels, 10.x-11.x
# to sm100, 9.x to sm90; cutlass_scaled_mm_supports_fp8 is true for >= 9.0.
_MARLIN_FP8 = "weight-only FP8 (Marlin dequantizes; no FP8 tensor-core compute)"
LINEAR_FP8 = Table(
    "linear", "fp8",
    "vllm/model_executor/kernels/linear/__init__.py, vllm/model_executor/kernels/linear/scaled_mm/"
    "{cutlass,b12x,pytorch,marlin,humming}.py, vllm/model_executor/layers/quantization/fp8.py",
    "W8A8 FP8, per-tensor weight scales, dynamic per-token activation scales (`--quantization fp8`)",
    (
        ((9, 0), ("CUTLASS", "B12X", "TORCH", "HUMMING", "MARLIN")),
        (None, ("CUTLASS", "B12X", "TORCH", "MARLIN", "HUMMING")),
    ),
    (
        Provider("CUTLASS", CapRule(lo=(8, 9)), libs=(LIB_C_CUTLASS,), cli="--linear-backend cutlass"),
        Provider("B12X", CapRule(majors=(12,)), packages=("b12x",), optional=True, cli="--linear-backend b12x",
                 note="vllm[b12x] extra; its kernels are not examined"),
        Provider("TORCH", CapRule(lo=(8, 9)), libs=(LIB_TORCH,), packages=("torch",), cli="--linear-backend torch",
                 note="torch._scaled_mm (cuBLASLt) with per-channel scales"),
        Provider("HUMMING", CapRule(lo=(7, 5)), needs=(NVRTC_JIT,), packages=("humming-kernels",), optional=True,
                 fallback=_MARLIN_FP8, cli="--linear-backend humming"),
        Provider("MARLIN", CapRule(lo=(7, 5)), libs=(LIB_C,), fallback=_MARLIN_FP8, cli="--linear-backend marlin"),
    ),
)

# vllm/model_executor/kernels/linear/__init__.py (_POSSIBLE_NVFP4_KERNELS, init_nvfp4_linear_kernel)
# and kernels/linear/nvfp4/{flashinfer,cutlass,marlin,humming}.py. cutlass_fp4_supported() is
# true for 10.0 <= capability < 13.0 (vLLM 0.33.0's compiled op, executed). Kernels listed after
# Marlin are never reached on CUDA >= 7.5 and are left out.
_FP4_WEIGHT_ONLY = "weight-only NVFP4 (no FP4 tensor cores before Blackwell: weights dequantized)"
LINEAR_NVFP4 = Table(
    "linear", "nvfp4",
    "vllm/model_executor/kernels/linear/__init__.py, vllm/model_executor/kernels/linear/nvfp4/"
    "{flashinfer,cutlass,marlin,humming}.py, vllm/utils/flashinfer.py",
    "NVFP4 weights and activations (W4A4), group size 16",
    (
        ((9, 0), ("FLASHINFER_CUTEDSL", "FLASHINFER_CUTLASS", "FLASHINFER_B12X", "CUTLASS", "HUMMING", "MARLIN")),
        (None, ("FLASHINFER_CUTEDSL", "FLASHINFER_CUTLASS", "FLASHINFER_B12X", "CUTLASS", "MARLIN")),
    ),
    (
        Provider("FLASHINFER_CUTEDSL", CapRule(majors=(10,)), needs=(CUTE_DSL,), packages=(FI, CUTLASS_DSL),
                 has_flashinfer=True, cli="--linear-backend flashinfer_cutedsl"),
        Provider("FLASHINFER_CUTLASS", CapRule(lo=(10, 0), hi=(12, 9)), needs=(FI_JIT,), packages=(FI,),
                 has_flashinfer=True, cli="--linear-backend flashinfer_cutlass"),
        Provider("FLASHINFER_B12X", CapRule(lo=(12, 0)), needs=(CUTE_DSL,), packages=(FI, CUTLASS_DSL),
                 has_flashinfer=True, cli="--linear-backend flashinfer_b12x",
                 note="FlashInfer's Sm120 b12x CuTe DSL GEMM"),
        Provider("CUTLASS", CapRule(lo=(10, 0), hi=(12, 9)), libs=(LIB_C_CUTLASS,), cli="--linear-backend cutlass"),
        Provider("HUMMING", CapRule(lo=(7, 5)), needs=(NVRTC_JIT,), packages=("humming-kernels",), optional=True,
                 fallback=_FP4_WEIGHT_ONLY, cli="--linear-backend humming"),
        Provider("MARLIN", CapRule(lo=(7, 5)), libs=(LIB_C,), fallback=_FP4_WEIGHT_ONLY,
                 cli="--linear-backend marlin"),
    ),
)

# vllm/model_executor/kernels/linear/__init__.py (_POSSIBLE_KERNELS, choose_mp_linear_kernel)
# and kernels/linear/mixed_precision/{machete,marlin,conch,exllama,triton_w4a16,humming}.py.
# CutlassW4A8 (FP8 activations only) is left out.
LINEAR_W4A16 = Table(
    "linear", "w4a16",
    "vllm/model_executor/kernels/linear/__init__.py, vllm/model_executor/kernels/linear/mixed_precision/"
    "{machete,marlin,conch,exllama,triton_w4a16,humming}.py",
    "GPTQ/AWQ-style int4 weights (uint4b8), group size 128, bf16 activations",
    (
        ((9, 0), ("MACHETE", "HUMMING", "MARLIN", "CONCH", "EXLLAMA", "TRITON_W4A16")),
        (None, ("MACHETE", "MARLIN", "CONCH", "EXLLAMA", "TRITON_W4A16", "HUMMING")),
    ),
    (
        Provider("MACHETE", CapRule(exact=((9, 0),)), libs=(LIB_C_CUTLASS,), cli="--linear-backend machete"),
        Provider("HUMMING", CapRule(lo=(7, 5)), needs=(NVRTC_JIT,), packages=("humming-kernels",), optional=True,
                 cli="--linear-backend humming"),
        Provider("MARLIN", CapRule(lo=(7, 5)), libs=(LIB_C,), cli="--linear-backend marlin"),
        Provider("CONCH", CapRule(lo=(8, 0)), needs=(TRITON,), packages=("conch-triton-kernels",), optional=True,
                 cli="--linear-backend conch"),
        Provider("EXLLAMA", CapRule(lo=(6, 0)), libs=(LIB_C,), fallback="ExLlama kernels (slower than Marlin)",
                 cli="--linear-backend exllama"),
        Provider("TRITON_W4A16", ANY, needs=(TRITON,), fallback="Triton W4A16 (slower than Marlin)",
                 cli="--linear-backend triton"),
    ),
)

TABLES: Tuple[Table, ...] = (ATTENTION_BF16, ATTENTION_MLA, MOE_BF16, LINEAR_FP8, LINEAR_NVFP4, LINEAR_W4A16)
KINDS = ("attention", "moe", "linear")
CHECK_TITLES = {
    "attention": "Attention provider vLLM would use",
    "moe": "MoE provider vLLM would use",
    "linear": "Quantized linear providers vLLM would use",
}

# vLLM's names (snippets/vllm_providers.py reports them) -> ours.
OBSERVED_NAMES = {
    "CutlassFP8ScaledMMLinearKernel": "CUTLASS", "B12xTensorFP8ScaledMMLinearKernel": "B12X",
    "ChannelWiseTorchFP8ScaledMMLinearKernel": "TORCH", "PerTensorTorchFP8ScaledMMLinearKernel": "TORCH",
    "MarlinFP8ScaledMMLinearKernel": "MARLIN", "HummingFP8ScaledMMLinearKernel": "HUMMING",
    "FlashInferFP8ScaledMMLinearKernel": "FLASHINFER",
    "FlashInferCuteDslNvFp4LinearKernel": "FLASHINFER_CUTEDSL",
    "FlashInferCutlassNvFp4LinearKernel": "FLASHINFER_CUTLASS",
    "FlashInferB12xNvFp4LinearKernel": "FLASHINFER_B12X", "CutlassNvFp4LinearKernel": "CUTLASS",
    "MarlinNvFp4LinearKernel": "MARLIN", "HummingNvFp4LinearKernel": "HUMMING",
    "EmulationNvFp4LinearKernel": "EMULATION",
    "MacheteLinearKernel": "MACHETE", "MarlinLinearKernel": "MARLIN", "HummingLinearKernel": "HUMMING",
    "ConchLinearKernel": "CONCH", "ExllamaLinearKernel": "EXLLAMA", "TritonW4A16LinearKernel": "TRITON_W4A16",
}


# --- the image as predict() sees it -------------------------------------------


@dataclass(frozen=True)
class Finding:
    ok: bool
    reason: str
    warning: str = ""  # runs, but degraded or unverified


@dataclass
class Image:
    cap: Capability
    packages: Dict[str, str]
    census: Mapping[str, Any]
    toolchain: Optional[Mapping[str, Any]]
    site_packages: Tuple[str, ...]

    def has(self, dist: str) -> bool:
        return norm_dist(dist) in self.packages

    def version(self, dist: str) -> Optional[str]:
        return self.packages.get(norm_dist(dist))


def census_entry(census: Mapping[str, Any], rel: str) -> Optional[Mapping[str, Any]]:
    """The census record for a library, by relative path or a path ending in it."""
    if rel in census:
        return census[rel]
    tail = "/" + rel.lstrip("/")
    for key, value in census.items():
        if str(key).replace(os.sep, "/").endswith(tail):
            return value
    return None


def census_under(census: Mapping[str, Any], folder: str) -> List[Mapping[str, Any]]:
    """Census records of every library below a package folder (kernel wheels of many files)."""
    mark = folder.strip("/") + "/"
    return [v for k, v in census.items() if ("/" + str(k).replace(os.sep, "/")).find("/" + mark) >= 0]


def census_index(report: Mapping[str, Any]) -> Dict[str, Dict[str, Any]]:
    """predict()'s census shape from qualify.core.census.CensusReport.to_json() (for one target)."""
    out: Dict[str, Dict[str, Any]] = {}
    for lib in report.get("libraries", []):
        verdict = lib.get("verdict") or {}
        out[str(lib["path"])] = {"class": verdict.get("class"), "worst": verdict.get("class"),
                                 "best": verdict.get("best"), "sass": list(lib.get("sass", [])),
                                 "ptx": list(lib.get("ptx", [])),
                                 "cross_generation_ptx": bool(verdict.get("cross_generation_jit"))}
    # ELF files with no device code at all still import; their kernels run nowhere.
    for path in report.get("without_device_code", []):
        out.setdefault(str(path), {"class": "none", "sass": [], "ptx": [], "cross_generation_ptx": False})
    return out


def file_present(img: Image, rel: str) -> Optional[bool]:
    """Is a file in the image? None when that cannot be told: no site-packages given
    and either no census or a file the census does not record (only libraries)."""
    if img.site_packages:
        return any(os.path.exists(os.path.join(sp, rel)) for sp in img.site_packages)
    if img.census and rel.endswith(".so"):
        return census_entry(img.census, rel) is not None
    return None


# --- judging libraries and sources --------------------------------------------


def _targets(names: Iterable[str]) -> List[CodeTarget]:
    out = []
    for name in names:
        try:
            out.append(CodeTarget.parse(name))
        except arch.ArchError:
            continue
    return out


def code_class(record: Mapping[str, Any], cap: Capability, judge: str) -> Tuple[Compat, bool]:
    """(class, cross-generation PTX only) of one census record under a LibRule judge."""
    if judge == "all":
        raw = record.get("worst", record.get("class"))
        klass = Compat(raw) if raw in {c.value for c in Compat} else Compat.NONE
        return klass, bool(record.get("cross_generation_ptx")) and klass is Compat.PTX_JIT
    names = list(record.get("sass", []))
    if judge == "any":
        names += list(record.get("ptx", []))
    targets = _targets(names)
    klass = arch.best(arch.compatibility(t, cap) for t in targets)
    cross = klass is Compat.PTX_JIT and all(
        arch.is_cross_generation(t, cap) for t in targets if arch.compatibility(t, cap) is Compat.PTX_JIT)
    return klass, cross


def _arches(record: Mapping[str, Any]) -> str:
    names = list(record.get("sass", [])) + list(record.get("ptx", []))
    return ", ".join(names) if names else "no device code"


def judge_library(img: Image, lib: LibRule) -> Finding:
    if not img.census:
        return Finding(True, f"{lib.what}: not examined (no census)", "no census: kernels not verified")
    for rel in lib.paths:
        record = census_entry(img.census, rel)
        if record is None:
            continue
        klass, cross = code_class(record, img.cap, lib.judge)
        where = f"{lib.what} ({rel}: {_arches(record)})"
        if klass is Compat.NONE:
            return Finding(False, f"{where} has no code that runs on {img.cap}")
        if cross:
            return Finding(True, f"{where} runs on {img.cap} only by JIT-compiling older-generation PTX",
                           f"cross-generation PTX JIT: first-load cost and none of {img.cap}'s features")
        if klass is Compat.PTX_JIT:
            return Finding(True, f"{where} runs on {img.cap} through PTX JIT", "PTX JIT at first load")
        return Finding(True, f"{where} has {klass.value} code for {img.cap}")
    return Finding(False, f"{lib.what} not in the image ({' or '.join(lib.paths)})")


def _toolchain_compiles(img: Image) -> Finding:
    tc = img.toolchain
    if tc is None:
        return Finding(True, "needs nvcc and ninja at first use (JIT toolchain not examined)",
                       "JIT toolchain not examined")
    if not tc.get("nvcc") or not tc.get("ninja"):
        missing = [n for n in ("nvcc", "ninja") if not tc.get(n)]
        return Finding(False, f"no {' or '.join(missing)} for JIT compilation")
    targets = tc.get("nvcc_targets")
    if targets is not None and not any(
            t.capability == img.cap for t in _targets(targets) if t.kind is arch.CodeKind.SASS):
        return Finding(False, f"nvcc {tc.get('nvcc_version') or ''} cannot compile for {img.cap}".replace("  ", " "))
    # Compiling at first use is runtime.jit-nvcc's concern; here it only has to be possible.
    return Finding(True, f"JIT-compiled with nvcc {tc.get('nvcc_version') or ''} at first use".replace("  ", " "))


def _flashinfer_jit(img: Image) -> Finding:
    fi, cache = img.version(FI), img.version(FI_JIT_CACHE_DIST)
    if not cache:
        prefix = "no flashinfer-jit-cache"
    elif not (fi and (cache == fi or cache.startswith(fi + "+"))):
        prefix = f"flashinfer-jit-cache {cache} does not match flashinfer-python {fi}"
    else:
        records = census_under(img.census, "flashinfer_jit_cache")
        if not records or any(code_class(r, img.cap, "any")[0].runnable for r in records):
            return Finding(True, f"FlashInfer modules precompiled in flashinfer-jit-cache {cache}")
        prefix = f"flashinfer-jit-cache {cache} has no code for {img.cap}"
    found = _toolchain_compiles(img)
    return Finding(found.ok, f"FlashInfer modules: {prefix}; {found.reason}", found.warning)


def _flashinfer_cubin(img: Image) -> Finding:
    fi, cubin = img.version(FI), img.version(FI_CUBIN_DIST)
    if cubin is None:
        return Finding(False, "trtllm-gen cubins: flashinfer-cubin is not installed, FlashInfer downloads them "
                              "at first use (fails air-gapped)")
    if cubin != fi:
        return Finding(False, f"trtllm-gen cubins: flashinfer-cubin {cubin} does not match flashinfer-python {fi}; "
                              "FlashInfer ignores it and downloads them at first use (fails air-gapped)")
    records = census_under(img.census, "flashinfer_cubin")
    if records and not any(code_class(r, img.cap, "any")[0].runnable for r in records):
        return Finding(False, f"trtllm-gen cubins in flashinfer-cubin {cubin} have no code for {img.cap}")
    return Finding(True, f"trtllm-gen cubins from flashinfer-cubin {cubin}")


def _triton(img: Image) -> Finding:
    if not img.has("triton"):
        return Finding(False, "Triton is not installed")
    return Finding(True, f"JIT-compiled by Triton {img.version('triton')} (its ptxas wiring: triton.* checks)")


def _cute_dsl(img: Image) -> Finding:
    if not img.has(CUTLASS_DSL):
        return Finding(False, "nvidia-cutlass-dsl is not installed")
    return Finding(True, f"compiled at first use by nvidia-cutlass-dsl {img.version(CUTLASS_DSL)}")


def _nvrtc(img: Image) -> Finding:
    return Finding(True, "compiled at first use with NVRTC or nvcc (Humming's JIT; not examined further)")


SOURCES = {TRITON: _triton, FI_JIT: _flashinfer_jit, FI_CUBIN: _flashinfer_cubin, CUTE_DSL: _cute_dsl,
           NVRTC_JIT: _nvrtc}


def has_flashinfer(img: Image) -> Optional[bool]:
    """vLLM's has_flashinfer() (vllm/utils/flashinfer.py): installed, and flashinfer-cubin
    importable (any version) or nvcc and ninja found. None: toolchain not examined."""
    if not img.has(FI):
        return False
    if img.has(FI_CUBIN_DIST):
        return True
    if img.toolchain is None:
        return None
    return bool(img.toolchain.get("nvcc") and img.toolchain.get("ninja"))


# --- one provider -------------------------------------------------------------


def vllm_gate(img: Image, p: Provider) -> Tuple[bool, str]:
    """vLLM's own check: capability and imports, nothing about kernels."""
    if not p.caps.admits(img.cap):
        return False, f"vLLM admits it only on {p.caps.describe()}"
    for dist in p.packages:
        if not img.has(dist):
            return False, f"{dist} is not installed"
    for rel in p.gate_files:
        if file_present(img, rel) is False:
            return False, f"{rel} is not in the image"
    if p.has_flashinfer and has_flashinfer(img) is False:
        return False, ("vLLM disables FlashInfer kernels here: no flashinfer-cubin and no nvcc/ninja "
                       "(vllm/utils/flashinfer.py has_flashinfer)")
    return True, ""


def _trtllm_attention(img: Image, p: Provider) -> Optional[Finding]:
    """FlashInfer attention on 10.x switches to trtllm-gen cubins when vLLM believes
    they are reachable: flashinfer-cubin importable (any version) or the CDN answers."""
    if p.trtllm_on is None or not p.trtllm_on.admits(img.cap):
        return None
    cubin = _flashinfer_cubin(img)
    if cubin.ok:
        return cubin
    if not img.has(FI_CUBIN_DIST):
        return Finding(True, "no flashinfer-cubin: air-gapped, vLLM's start-up probe of the cubin CDN fails "
                             "(5 s) and FlashInfer's own kernels are used instead of trtllm-gen",
                       "trtllm-gen attention kernels unavailable air-gapped")
    return Finding(False, "vLLM sees flashinfer-cubin (its check ignores the version) and selects trtllm-gen "
                          "attention; " + cubin.reason.replace("trtllm-gen cubins: ", ""))


def evaluate(img: Image, p: Provider) -> Dict[str, Any]:
    """One candidate: vLLM's gate, then whether its kernels can run."""
    gate_ok, why = vllm_gate(img, p)
    out: Dict[str, Any] = {"name": p.name, "vllm_gate": gate_ok}
    if not gate_ok:
        return dict(out, available=False, reason=why)
    findings = [judge_library(img, lib) for lib in p.libs] + [SOURCES[s](img) for s in p.needs]
    trtllm = _trtllm_attention(img, p)
    if trtllm is not None:
        findings.append(trtllm)
    if has_flashinfer(img) is None and p.has_flashinfer:
        findings.append(Finding(True, "vLLM enables FlashInfer only with flashinfer-cubin or nvcc+ninja "
                                      "(not examined)", "FlashInfer gate not examined"))
    failed = [f for f in findings if not f.ok]
    reasons = [f.reason for f in (failed or findings)] + ([p.note] if p.note and not failed else [])
    warnings = [f.warning for f in findings if f.ok and f.warning]
    if p.fallback and not failed:
        warnings.append(f"slow path: {p.fallback}")
    out.update(available=not failed, reason="; ".join(reasons) or "no kernels to check")
    if warnings and not failed:
        out["warning"] = "; ".join(warnings)
    return out


# --- one table ----------------------------------------------------------------


def _preferred(table: Table, img: Image, names: Sequence[str]) -> Optional[str]:
    """The provider vLLM ranks first for this capability, extras that are absent aside."""
    for name in names:
        p = table.provider(name)
        if not p.caps.admits(img.cap):
            continue
        if p.optional and any(not img.has(d) for d in p.packages):
            continue
        return name
    return None


def predict_table(table: Table, img: Image) -> Dict[str, Any]:
    names = table.order(img.cap)
    candidates = [evaluate(img, table.provider(n)) for n in names]
    vllm_pick = next((c["name"] for c in candidates if c["vllm_gate"]), None)
    selected = next((c for c in candidates if c["available"]), None)
    preferred = _preferred(table, img, names)
    return {
        "kind": table.kind, "variant": table.variant, "mode": "predicted",
        "selected": selected["name"] if selected else None,
        "vllm_would_select": vllm_pick, "preferred": preferred,
        "candidates": [{k: v for k, v in c.items() if k != "vllm_gate"} for c in candidates],
        "reason": _provider_reason(table, img, candidates, selected, vllm_pick),
        "case": table.case, "rules": table.source,
    }


def _provider_reason(table: Table, img: Image, candidates: List[dict], selected: Optional[dict],
                     vllm_pick: Optional[str]) -> str:
    if selected is None:
        return f"no provider can run on {img.cap}: " + " | ".join(f"{c['name']}: {c['reason']}" for c in candidates)
    text = f"{selected['name']}: {selected['reason']}"
    if vllm_pick and vllm_pick != selected["name"]:
        picked = next(c for c in candidates if c["name"] == vllm_pick)
        hint = table.provider(selected["name"]).cli
        text = (f"vLLM would pick {vllm_pick} (its check is import-only) but it cannot run: {picked['reason']}; "
                f"{selected['name']} can ({hint}). " + text)
    return text


# --- checks -------------------------------------------------------------------


def _problems(entry: Mapping[str, Any]) -> Tuple[bool, List[str]]:
    """(nothing runs, reasons worth a warning) for one provider entry, either mode."""
    tag = f"{entry['kind']}.{entry['variant']}"
    if entry.get("selected") is None:
        return True, [f"{tag}: {entry['reason']}"]
    by_name = {c["name"]: c for c in entry.get("candidates", [])}
    chosen = by_name.get(entry["selected"], {})
    notes = []
    if chosen and not chosen.get("available", True):
        notes.append(f"{tag}: vLLM selected {entry['selected']} but it cannot run: {chosen['reason']}"
                     + (f"; {entry['predicted']} can" if entry.get("predicted") else ""))
    elif entry.get("vllm_would_select") not in (None, entry["selected"]):
        notes.append(f"{tag}: {entry['reason']}")
    elif entry.get("preferred") not in (None, entry["selected"]) and entry["preferred"] in by_name:
        pref = by_name[entry["preferred"]]
        notes.append(f"{tag}: {entry['preferred']} unavailable ({pref['reason']}); using {entry['selected']}")
    if chosen.get("available", True) and chosen.get("warning"):
        notes.append(f"{tag}: {entry['selected']}: {chosen['warning']}")
    return False, notes


def provider_checks(entries: Sequence[Mapping[str, Any]], capability: Capability, vllm_version: str,
                    **evidence: Any) -> List[CheckResult]:
    """providers.attention / .moe / .linear from provider entries (predicted, observed or merged)."""
    out = []
    for kind in KINDS:
        mine = [dict(e) for e in entries if e["kind"] == kind]
        failed: List[str] = []
        notes: List[str] = []
        for entry in mine:
            dead, why = _problems(entry)
            (failed if dead else notes).extend(why)
        if not arch.is_recognised(capability):
            notes.append(f"{capability} is not a recognised capability: vLLM's rules applied as written, "
                         "never validated for it")
        if vllm_version.split("+")[0] != VLLM_TARGET:
            notes.append(f"rules are vLLM {VLLM_TARGET}'s; the image has vLLM {vllm_version}")
        status = FAIL if failed else (WARN if notes else PASS)
        summary = "; ".join(f"{e['variant']}: {e['selected']} ({e['mode']})" for e in mine)
        reason = " | ".join(failed + notes) if (failed or notes) else f"{summary}: vLLM's first choice, and it runs"
        out.append(CheckResult(f"providers.{kind}", CHECK_TITLES[kind], status, reason,
                               evidence=dict(evidence, capability=str(capability), vllm=vllm_version,
                                             rules_from_vllm=VLLM_TARGET, providers=mine)))
    return out


def predict(capability: Capability, packages: Mapping[str, str], census: Optional[Mapping[str, Any]],
            gpu: Optional[Mapping[str, Any]] = None, *, toolchain: Optional[Mapping[str, Any]] = None,
            site_packages: Sequence[str] = ()) -> Tuple[List[Dict[str, Any]], List[CheckResult]]:
    """Providers vLLM would select for `capability` in this image, and the three checks."""
    pkgs = {norm_dist(k): str(v) for k, v in packages.items()}
    if "vllm" not in pkgs:
        return [], [not_run(f"providers.{k}", CHECK_TITLES[k], NOT_INSTALLED, required=False) for k in KINDS]
    img = Image(capability, pkgs, census or {}, toolchain, tuple(site_packages))
    entries = [predict_table(t, img) for t in TABLES]
    checks = provider_checks(entries, capability, pkgs["vllm"], census="examined" if census else "not examined",
                             toolchain=dict(toolchain) if toolchain is not None else None,
                             gpu=dict(gpu) if gpu else None)
    return entries, checks


# --- observation --------------------------------------------------------------


def observe(capability: Optional[Capability] = None, timeout: float = 300) -> ChildResult:
    """Ask vLLM's selectors in a child interpreter. Needs a GPU: without one the
    child answers status 'no-gpu' (or 'not-installed') and observed_providers()
    returns nothing."""
    args = ["--target", str(capability)] if capability is not None else []
    return run_snippet("vllm_providers", args, timeout=timeout)


def observation_failure(child: ChildResult) -> Optional[str]:
    """Why there is no observation (None when there is one): for a not-run reason."""
    if not child.ok:
        return f"vLLM's selectors could not be asked: {child.failure()}"
    data = child.data
    if data.get("status") != "ok" or data.get("mode") != "observed":
        return str(data.get("reason") or data.get("status"))
    if data.get("target") and data.get("capability") != data.get("target"):
        return f"the GPU is {data.get('capability')}, not the target {data.get('target')}"
    return None


def _observed_name(key: str, section: Mapping[str, Any]) -> Optional[str]:
    name = section.get("chosen_by_vllm") or section.get("selected")
    if name is None:
        return None
    if key == "attention.bf16" and name == "FLASH_ATTN" and section.get("flash_attn_version"):
        return f"FLASH_ATTN(FA{section['flash_attn_version']})"
    return OBSERVED_NAMES.get(name, name)


def observed_providers(data: Mapping[str, Any], predicted: Sequence[Mapping[str, Any]] = ()) -> List[Dict[str, Any]]:
    """Provider entries (mode 'observed') from the snippet's JSON; empty unless a GPU answered.

    `selected` is what vLLM chose; with `predicted`, the candidates are the
    predicted ones (judged against the census), so a choice vLLM made on
    imports alone but that cannot run still shows up.
    """
    if data.get("status") != "ok" or data.get("mode") != "observed":
        return []
    by_key = {f"{p['kind']}.{p['variant']}": p for p in predicted}
    out = []
    for key, section in sorted((data.get("sections") or {}).items()):
        kind, variant = key.split(".", 1)
        rejected = section.get("rejected") or {}
        seen = [{"name": OBSERVED_NAMES.get(n, n), "available": n not in rejected,
                 "reason": "; ".join(rejected.get(n, [])) or "accepted by vLLM"} for n in section.get("order", [])]
        entry: Dict[str, Any] = {
            "kind": kind, "variant": variant, "mode": "observed", "selected": _observed_name(key, section),
            "candidates": seen, "vllm_candidates": seen,
            "reason": section.get("error") or (f"vLLM {data.get('vllm')} chose it on {data.get('gpu')} "
                                               f"({data.get('capability')})"),
        }
        guess = by_key.get(key)
        if guess is not None:
            entry.update(candidates=guess.get("candidates", seen), predicted=guess.get("selected"),
                         preferred=guess.get("preferred"))
            if entry["selected"] != guess.get("vllm_would_select"):
                entry["reason"] += f"; predicted vLLM's pick was {guess.get('vllm_would_select')}"
        out.append(entry)
    return out


def merge(predicted: Sequence[Mapping[str, Any]], observed: Sequence[Mapping[str, Any]]) -> List[Dict[str, Any]]:
    """Observed entries where there are some, predicted ones elsewhere."""
    seen = {(o["kind"], o["variant"]): o for o in observed if o.get("selected") is not None}
    return [dict(seen.get((p["kind"], p["variant"]), p)) for p in predicted]


# What vLLM 0.33.0 itself chose (`nox -s vllm-rules` re-checks it inside the vLLM image),
# run through the snippet's --assume-capability mode on a CPU
# host (torch 2.14.0, flashinfer-python 0.7.2.post1, nvcc + ninja present, no flashinfer-cubin).
# attention.mla on 10.x could not be executed there (a backend imports CUDA at import time).
VLLM_0_33_SELECTIONS = {
    "9.0": {"attention.bf16": "FLASH_ATTN(FA3)", "attention.mla": "FLASH_ATTN_MLA", "moe.bf16": "TRITON",
            "linear.fp8": "CUTLASS", "linear.nvfp4": "HUMMING", "linear.w4a16": "MACHETE"},
    "10.0": {"attention.bf16": "FLASHINFER", "moe.bf16": "FLASHINFER_TRTLLM", "linear.fp8": "CUTLASS",
             "linear.nvfp4": "FLASHINFER_CUTEDSL", "linear.w4a16": "MARLIN"},
    "10.3": {"attention.bf16": "FLASHINFER", "moe.bf16": "FLASHINFER_TRTLLM", "linear.fp8": "CUTLASS",
             "linear.nvfp4": "FLASHINFER_CUTEDSL", "linear.w4a16": "MARLIN"},
    "12.0": {"attention.bf16": "FLASH_ATTN(FA2)", "attention.mla": "TRITON_MLA", "moe.bf16": "FLASHINFER_CUTLASS",
             "linear.fp8": "CUTLASS", "linear.nvfp4": "FLASHINFER_CUTLASS", "linear.w4a16": "MARLIN"},
    "12.1": {"attention.bf16": "FLASH_ATTN(FA2)", "attention.mla": "TRITON_MLA", "moe.bf16": "FLASHINFER_CUTLASS",
             "linear.fp8": "CUTLASS", "linear.nvfp4": "FLASHINFER_CUTLASS", "linear.w4a16": "MARLIN"},
    "13.0": {"attention.bf16": "FLASH_ATTN(FA2)", "attention.mla": "TRITON_MLA", "moe.bf16": "TRITON",
             "linear.fp8": "CUTLASS", "linear.nvfp4": "FLASHINFER_B12X", "linear.w4a16": "MARLIN"},
}
