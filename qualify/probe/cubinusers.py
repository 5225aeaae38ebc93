"""Which of vLLM's providers on a target run FlashInfer's downloaded cubins (issue 51, runtime.downloads).

FlashInfer fetches its precompiled cubins (trtllm-gen FMHA, batched GEMM and GEMM for sm100f/sm103a/sm107a;
cuDNN SDPA's sm100 kernels; CuTe-DSL FMHA for sm_100a-110a; DeepGEMM for 10.0/10.3/10.7: flashinfer 0.7.2.post1,
flashinfer/artifacts.py ArtifactPath) from NVIDIA's server at first use unless a flashinfer-cubin of its exact
version is installed; air-gapped that first use fails (flashinfer-ai/flashinfer#2941). Whether an image
depends on them is a question of the target: the providers vLLM 0.33 can select there that need them
(`needs: flashinfer-cubin`) or switch to them (`trtllm_on`) in the provider rules (probe/rules/vllm-0.33.json).
On 10.x they are trtllm-gen attention, MLA and MoE; on 12.x none: FlashInfer's paths there (its attention with
the XQA decode kernel, CUTLASS and b12x MoE) are compiled at first use (runtime.jit-nvcc).

Standard library only, Python 3.9 compatible (runs inside images).
"""

from __future__ import annotations

from typing import List, Optional, Tuple

from qualify.core.arch import Capability
from qualify.probe.providers.rules import Rules, Source


def users(rules: Rules, cap: Optional[Capability]) -> Tuple[str, ...]:
    """"attention.bf16: FLASHINFER (trtllm-gen kernels on 10.x)", ... for the providers admitted on `cap` that
    run the downloaded cubins; () where none does. A cpu target (cap None) has none."""
    if cap is None:
        return ()
    out: List[str] = []
    for table in rules.tables:
        for p in table.providers:
            if not p.caps.admits(cap):
                continue
            if Source.FLASHINFER_CUBIN in p.needs:
                out.append(f"{table.key}: {p.name}")
            elif p.trtllm_on is not None and p.trtllm_on.admits(cap):
                out.append(f"{table.key}: {p.name} (its trtllm-gen kernels on {p.trtllm_on.describe()})")
    return tuple(dict.fromkeys(out))
