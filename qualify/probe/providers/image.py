"""What the image offers a provider: its libraries' code (through the census),
its packages, files and JIT toolchain. Each question is answered by a Finding.

A provider whose library carries no code for the target is not available,
however well it imports (the Blackwell support RFC: "importable is not available"); one that
runs only by JIT-compiling PTX from an older generation is available with a
warning (the FA2-from-sm_80 case of the GB10 compatibility report).

toolchain (from `selfsufficiency.toolchain()`; None when not examined):
{"nvcc": path | None, "nvcc_version": "13.0" | None, "nvcc_targets":
["sm_120", ...] | None, "ninja": path | None}. `nvcc` is the one vLLM and
FlashInfer would find (CUDA_HOME, CUDA_PATH, PATH, /usr/local/cuda).

Standard library only, Python 3.9 compatible (runs inside images).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from qualify.core import arch
from qualify.core.arch import Capability, CodeTarget, Compat
from qualify.probe.providers.census_view import CensusIndex, CensusRecord, census_entry, census_under
from qualify.probe.providers.rules import Judge, LibRule, Source
from qualify.probe.selfsufficiency import norm_dist

# Distributions whose presence and versions decide FlashInfer's and CuTe DSL's kernels.
FI = "flashinfer-python"
FI_CUBIN_DIST = "flashinfer-cubin"
FI_JIT_CACHE_DIST = "flashinfer-jit-cache"
CUTLASS_DSL = "nvidia-cutlass-dsl"


@dataclass(frozen=True)
class Finding:
    ok: bool
    reason: str
    warning: str = ""  # runs, but degraded or unverified
    unknown: bool = False  # not ok because it could not be read, not because it is known to be missing


@dataclass
class Image:
    cap: Capability
    packages: Dict[str, str]
    census: CensusIndex
    toolchain: Optional[Mapping[str, Any]]
    site_packages: Tuple[str, ...]
    names_of: Optional[Callable[[str], Any]] = None  # families.NamesOf: a library's kernel names

    def has(self, dist: str) -> bool:
        return norm_dist(dist) in self.packages

    def version(self, dist: str) -> Optional[str]:
        return self.packages.get(norm_dist(dist))


def file_present(img: Image, rel: str) -> Optional[bool]:
    """Is a file in the image? None when that cannot be told: no site-packages given
    and either no census or a file the census does not record (only libraries)."""
    if img.site_packages:
        return any(os.path.exists(os.path.join(sp, rel)) for sp in img.site_packages)
    if img.census and rel.endswith(".so"):
        return census_entry(img.census, rel) is not None
    return None


# --- libraries ----------------------------------------------------------------


def _targets(names: Iterable[str]) -> List[CodeTarget]:
    out = []
    for name in names:
        try:
            out.append(CodeTarget.parse(name))
        except arch.ArchError:
            continue
    return out


def code_class(record: CensusRecord, cap: Capability, judge: Judge) -> Tuple[Optional[Compat], bool]:
    """(class, cross-generation PTX only) of one census record under a LibRule judge.

    The class is None when the census could not decide: never runnable, never
    proof that nothing runs.
    """
    if judge is Judge.ALL:
        if not record.decided:
            return None, False
        klass = record.worst or Compat.NONE  # no unit judged: nothing of it runs
        return klass, record.cross_generation_ptx and klass is Compat.PTX_JIT
    targets = _targets(list(record.sass) + (list(record.ptx) if judge is Judge.ANY else []))
    klass = arch.best(arch.compatibility(t, cap) for t in targets)
    if not klass.runnable and not record.decided:
        return None, False  # what was decoded has nothing; what was not might
    cross = klass is Compat.PTX_JIT and all(
        arch.is_cross_generation(t, cap) for t in targets if arch.compatibility(t, cap) is Compat.PTX_JIT)
    return klass, cross


def runs_somewhere(records: Sequence[CensusRecord], cap: Capability) -> Optional[bool]:
    """Does any of these records carry code for `cap`? None: none does, but some are undecided."""
    classes = [code_class(r, cap, Judge.ANY)[0] for r in records]
    if any(c is not None and c.runnable for c in classes):
        return True
    return None if None in classes else False


def _arches(record: CensusRecord) -> str:
    names = list(record.sass) + list(record.ptx)
    return ", ".join(names) if names else "no device code"


def judge_library(img: Image, lib: LibRule) -> Finding:
    if not img.census:
        return Finding(True, f"{lib.what}: not examined (no census)", "no census: kernels not verified")
    paths = lib.paths_for(img.cap)
    for rel in paths:
        record = census_entry(img.census, rel)
        if record is None:
            continue
        klass, cross = code_class(record, img.cap, lib.judge)
        where = f"{lib.what} ({rel}: {_arches(record)})"
        if klass is None:
            return Finding(True, f"{where}: the census could not tell whether it runs on {img.cap}",
                           "kernels not verified: the census could not judge the library")
        if klass is Compat.NONE:
            return Finding(False, f"{where} has no code that runs on {img.cap}")
        if cross:
            return Finding(True, f"{where} runs on {img.cap} only by JIT-compiling older-generation PTX",
                           f"cross-generation PTX JIT: first-load cost and none of {img.cap}'s features")
        if klass is Compat.PTX_JIT:
            return Finding(True, f"{where} runs on {img.cap} through PTX JIT", "PTX JIT at first load")
        return Finding(True, f"{where} has {klass.value} code for {img.cap}")
    return Finding(False, f"{lib.what} not in the image ({' or '.join(paths)})")


# --- run-time sources ---------------------------------------------------------


def _nvcc_compiles_for(img: Image, tc) -> Finding:
    """The last step of both JIT checks: the toolchain's nvcc has SASS targets for the image's capability.
    Compiling at first use is runtime.jit-nvcc's concern; here it only has to be possible."""
    targets = tc.get("nvcc_targets")
    version = tc.get("nvcc_version") or ""
    if targets is not None and not any(
            t.capability == img.cap for t in _targets(targets) if t.kind is arch.CodeKind.SASS):
        return Finding(False, f"nvcc {version} cannot compile for {img.cap}".replace("  ", " "))
    return Finding(True, f"JIT-compiled with nvcc {version} at first use".replace("  ", " "))


def _toolchain_compiles(img: Image) -> Finding:
    tc = img.toolchain
    if tc is None:
        return Finding(True, "needs nvcc and ninja at first use (JIT toolchain not examined)",
                       "JIT toolchain not examined")
    if not tc.get("nvcc") or not tc.get("ninja"):
        missing = [n for n in ("nvcc", "ninja") if not tc.get(n)]
        return Finding(False, f"no {' or '.join(missing)} for JIT compilation")
    return _nvcc_compiles_for(img, tc)


def _flashinfer_jit(img: Image) -> Finding:
    fi, cache = img.version(FI), img.version(FI_JIT_CACHE_DIST)
    if not cache:
        prefix = "no flashinfer-jit-cache"
    elif not (fi and (cache == fi or cache.startswith(fi + "+"))):
        prefix = f"flashinfer-jit-cache {cache} does not match flashinfer-python {fi}"
    else:
        records = census_under(img.census, "flashinfer_jit_cache")
        runs = runs_somewhere(records, img.cap) if records else True
        if runs:
            return Finding(True, f"FlashInfer modules precompiled in flashinfer-jit-cache {cache}")
        if runs is None:
            return Finding(True, f"FlashInfer modules precompiled in flashinfer-jit-cache {cache} (the census "
                                 f"could not tell whether they run on {img.cap})", "flashinfer-jit-cache not verified")
        prefix = f"flashinfer-jit-cache {cache} has no code for {img.cap}"
    found = _toolchain_compiles(img)
    return Finding(found.ok, f"FlashInfer modules: {prefix}; {found.reason}", found.warning)


def flashinfer_cubin(img: Image) -> Finding:
    fi, cubin = img.version(FI), img.version(FI_CUBIN_DIST)
    if cubin is None:
        return Finding(False, "trtllm-gen cubins: flashinfer-cubin is not installed, FlashInfer downloads them "
                              "at first use (fails air-gapped)")
    if cubin != fi:
        return Finding(False, f"trtllm-gen cubins: flashinfer-cubin {cubin} does not match flashinfer-python {fi}; "
                              "FlashInfer ignores it and downloads them at first use (fails air-gapped)")
    records = census_under(img.census, "flashinfer_cubin")
    runs = runs_somewhere(records, img.cap) if records else True
    if runs is False:
        return Finding(False, f"trtllm-gen cubins in flashinfer-cubin {cubin} have no code for {img.cap}")
    if runs is None:
        return Finding(True, f"trtllm-gen cubins from flashinfer-cubin {cubin} (the census could not tell whether "
                             f"they run on {img.cap})", "trtllm-gen cubins not verified")
    return Finding(True, f"trtllm-gen cubins from flashinfer-cubin {cubin}")


def _triton(img: Image) -> Finding:
    if not img.has("triton"):
        return Finding(False, "Triton is not installed")
    return Finding(True, f"JIT-compiled by Triton {img.version('triton')} (its ptxas wiring: triton.* checks)")


def _cute_dsl(img: Image) -> Finding:
    if not img.has(CUTLASS_DSL):
        return Finding(False, "nvidia-cutlass-dsl is not installed")
    return Finding(True, f"compiled at first use by nvidia-cutlass-dsl {img.version(CUTLASS_DSL)}")


def _nvcc(img: Image) -> Finding:
    tc = img.toolchain
    if tc is None:
        return Finding(True, "needs nvcc at first use (JIT toolchain not examined)", "JIT toolchain not examined")
    if not tc.get("nvcc"):
        return Finding(False, "no nvcc for its JIT compilation at first use")
    return _nvcc_compiles_for(img, tc)


def _sglang_jit(img: Image) -> Finding:
    found = _toolchain_compiles(img)
    return Finding(found.ok, f"SGLang's JIT kernels (sglang/kernels/jit): {found.reason}", found.warning)


def _nvrtc(img: Image) -> Finding:
    return Finding(True, "compiled at first use with NVRTC or nvcc (Humming's JIT; not examined further)")


SOURCES: Dict[Source, Callable[[Image], Finding]] = {
    Source.TRITON: _triton, Source.FLASHINFER_JIT: _flashinfer_jit, Source.FLASHINFER_CUBIN: flashinfer_cubin,
    Source.CUTE_DSL: _cute_dsl, Source.NVRTC_JIT: _nvrtc, Source.NVCC_JIT: _nvcc, Source.SGLANG_JIT: _sglang_jit,
}


def source(img: Image, kind: Source) -> Finding:
    return SOURCES[kind](img)


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
