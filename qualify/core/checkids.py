"""Every check id the toolkit writes, with what it catches: the one list `docs/reference/checks.md` is
generated from (devtools/reference.py) and a test holds against the code that emits them.

The checks are made where their evidence is (probe/*, deploy/servecheck/*); this is their catalogue for
people and for the signed policy's level names. Standard library only (the image side imports it).
"""

from __future__ import annotations

from typing import Dict, Tuple

# id -> (what it proves or catches, where it runs). `{cap}` and `{path}` stand for the parts made per
# capability (triton.cross-compile.121) and per serving path (providers.moe.nvfp4).
CHECKS: Dict[str, Tuple[str, str]] = {
    "versions": ("package versions (torch and its claimed arch list, triton, vllm, flashinfer, transformers, nvidia-*), "
                 "nvcc/ptxas, cuDNN, NCCL, the GPU through nvidia-smi", "qualification"),
    "census.serving-path": ("every library the serving path cannot do without (libtorch_cuda, vLLM's _C and _moe_C) "
                            "carries code that runs on the target: importable is not runnable", "qualification"),
    "census.unit-gaps": ("compiled units of serving-path libraries with no code for the target (kernels that cannot "
                         "launch there)", "qualification"),
    "census.cross-generation-jit": ("libraries that run on the target only by JIT-compiling PTX of an older "
                                    "generation (a slow first load, none of the new architecture's features)",
                                    "qualification"),
    "census.ptx-isa": ("the PTX ISA (.version) of code that runs on the target only by JIT is known, so the deploy "
                       "can refuse a driver too old to JIT it (CUDA_ERROR_UNSUPPORTED_PTX_VERSION)", "qualification"),
    "census.arch-specific": ("arch-specific (a/f) code for other devices only: dispatched there, never here",
                             "qualification"),
    "census.torch-arch-list": ("torch.cuda.get_arch_list() against the cubins libtorch really carries", "qualification"),
    "census.unreadable": ("every library could be read; what could not be decoded is named, never passed", "qualification"),
    "census.smoke-extension": ("the smoke image's extension carries exactly the code of its TORCH_CUDA_ARCH_LIST",
                               "qualification"),
    "census.gpu-code": ("cpu target: no GPU code is needed, the census does not apply", "qualification"),
    "arch.torch-build": ("cpu target: torch is a CPU build (a CUDA torch pulls gigabytes for nothing)", "qualification"),
    "cpu.kernels": ("cpu target: vLLM's CPU kernel library for this CPU's instruction set is in the image", "qualification"),
    "cpu.serving": ("cpu target: transformers and vLLM's CPU build import, and vLLM names its CPU attention backend",
                    "qualification"),
    "cpu.vllm-cli": ("cpu target: vLLM's own command runs (`vllm --version`, `vllm bench serve --help`)", "qualification"),
    "env.torch-cuda-arch-list": ("TORCH_CUDA_ARCH_LIST gives code for the target (CUDA extensions built in the image)",
                                 "qualification"),
    "env.cuda-toolkit": ("a CUDA toolkit (nvcc, ptxas) in the image new enough for the target", "qualification"),
    "env.runtime-user": ("the server runs as a non-root user", "qualification"),
    "env.cuda-compat": ("libcuda comes from the host driver, not CUDA's forward-compatibility libraries "
                        "(errors 803/804)", "qualification"),
    "triton.ptxas-wiring": ("the ptxas Triton itself would use for the capability is the wired one (Triton silently "
                            "falls back to its bundled binary)", "qualification"),
    "triton.ptxas-assembles": ("ptxas accepts `--gpu-name sm_XYa` (the 'sm_121a is not defined' failure)",
                               "qualification"),
    "triton.cross-compile": ("a real Triton kernel compiled for the target without a GPU; the census confirms the "
                             "cubin's arch", "qualification"),
    "triton.cross-compile.{cap}": ("the same for another capability (scripts/gpu-evidence.sh's extra capabilities)",
                                   "qualification"),
    "triton.allocator": ("Triton's default allocator in a fresh interpreter, a new thread and a spawned process ('no "
                         "allocator was set')", "qualification"),
    "providers.{path}": ("one per serving path (attention.bf16, moe.nvfp4, linear.fp8-block, ...): the provider vLLM "
                         "picks on the target, judged by its kernel families; fail when the pick has no kernels "
                         "for the GPU, naming what runs instead and its flag", "qualification"),
    "runtime.flashinfer-cubin": ("FlashInfer's precompiled cubins match FlashInfer (it ignores another version)",
                                 "qualification"),
    "runtime.jit-nvcc": ("kernels JIT-compiled at run time have an nvcc that targets the GPU", "qualification"),
    "runtime.downloads": ("nothing is downloaded at run time (FlashInfer cubins, vocabularies): air-gap "
                          "self-sufficiency", "qualification"),
    "gpu.device": ("the GPU is a device of the target's capability", "GPU"),
    "gpu.memory": ("GPU memory from NVML, or GB10's unified pool", "GPU"),
    "gpu.triton-scratch": ("a Triton kernel that needs global scratch runs, with the allocator hook and without it",
                           "GPU"),
    "gpu.bf16-matmul": ("a bf16 matmul matches an fp32 reference (and its TFLOP/s, the SKU's figure)", "GPU"),
    "gpu.torch-compile": ("torch.compile (Inductor, Triton, ptxas) runs and matches eager", "GPU"),
    "gpu.nccl-allreduce": ("NCCL collectives across the GPUs a tensor-parallel server uses, under the server's own "
                           "NCCL settings, against the signed bus-bandwidth floor", "GPU"),
    "gpu.p2p": ("peer-to-peer access between the chosen GPUs and what vLLM's custom all-reduce needs of it", "GPU"),
    "gpu.none": ("cpu target: no GPU checks apply", "qualification"),
    "serve.determinism": ("greedy decoding repeats exactly, alone and batched", "serving"),
    "serve.niah": ("a needle retrieved from contexts up to half of MAX_MODEL_LEN", "serving"),
    "serve.tools": ("a tool call the configured parser accepts, valid against the tool's schema", "serving"),
    "serve.soak": ("concurrent requests without errors, within latency and memory bounds", "serving"),
    "serve.providers": ("the providers the server's log names against the signed manifest's prediction", "serving"),
    "serve.accuracy": ("top-1 agreement and KL against a BF16 reference of the same model, prompts and seed",
                       "serving"),
}


def known(check_id: str, paths=()) -> bool:
    """Whether `check_id` is one of the catalogue's (`paths`: the serving paths providers.{path} stands for)."""
    if check_id in CHECKS:
        return True
    head, _, tail = check_id.rpartition(".")
    if head == "triton.cross-compile" and tail.isdigit():
        return True
    return check_id.startswith("providers.") and check_id[len("providers."):] in paths
