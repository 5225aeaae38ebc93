"""Issue 51 item 6 against the released wheels: sglang 0.5.23 and what it pins (sglang-kernel 0.4.10, for x86_64
and aarch64; sgl-deep-gemm 0.2.3.post2; flashinfer-python 0.7.2), from PyPI (pip's cache keeps them).

SGLang's own selector functions are run out of the wheel's source (tests/sglang_source.py) and must choose
what rules/sglang-0.5.23.json says, capability by capability, sgl_kernel's loader included; then the
unpacked libraries are judged as the probe judges an image. Only what the judgement reads is unpacked:
sgl_kernel's libraries and loader, DeepGEMM's host library, FlashInfer's JIT module lists, the dist-infos
and SGLang's selector files. sgl_kernel's flash_ops.abi3.so (1.1 GB: FlashAttention 3 for sm_80/86/90a, on
no Blackwell path) is left packed.
"""

from __future__ import annotations

import subprocess
import sys
import zipfile
from importlib import metadata
from pathlib import Path
from typing import Dict

import pytest
import sglang_source as S

from qualify.core.arch import Capability
from qualify.probe import census_check, providers, runner
from qualify.probe.model import FAIL, PASS
from qualify.probe.providers import rules

pytestmark = pytest.mark.slow  # 510 MB of wheels the first time
SGLANG = rules.for_engine("sglang")
JIT_OK = {"nvcc": "/usr/local/cuda/bin/nvcc", "nvcc_version": "13.0", "ninja": "/usr/bin/ninja",
          "nvcc_targets": ["sm_90", "sm_100", "sm_103", "sm_110", "sm_120", "sm_121"]}
PINS = ["sglang==0.5.23", "sglang-kernel==0.4.10", "sgl-deep-gemm==0.2.3.post2", "flashinfer-python==0.7.2"]
SELECTORS = ["srt/utils/common.py", "srt/runtime_context.py", "srt/arg_groups/model_override_base.py",
             "srt/arg_groups/overrides.py", "srt/layers/quantization/fp4_utils.py",
             "srt/layers/quantization/fp8_utils.py", "srt/layers/quantization/modelopt_quant.py",
             "srt/layers/deep_gemm_wrapper/configurer.py", "srt/layers/moe/utils.py"]
KEEP = ("sgl_kernel/load_utils.py", "deep_gemm/__init__.py", "deep_gemm/_C.so", "flashinfer/jit/fused_moe.py",
        "flashinfer/jit/gemm/core.py", *(f"sglang/{f}" for f in SELECTORS))


def download(dest: Path, machine: str) -> Dict[str, Path]:
    dest.mkdir(parents=True, exist_ok=True)
    platforms = [f"manylinux2014_{machine}", f"manylinux_2_28_{machine}", f"manylinux_2_34_{machine}"]
    argv = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "--python-version",
            "3.12", *[a for p in platforms for a in ("--platform", p)], "-d", str(dest), *PINS]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, done.stderr[-3000:]
    return {p.name.split("-")[0]: p for p in dest.glob("*.whl")}


def unpack(wheels: Dict[str, Path], site: Path) -> Path:
    for whl in wheels.values():
        with zipfile.ZipFile(whl) as zf:
            for name in zf.namelist():
                kernel = name.startswith("sgl_kernel/") and name.endswith(".so") and "flash_ops" not in name
                if kernel or name in KEEP or ".dist-info/" in name:
                    zf.extract(name, site)
    return site


@pytest.fixture(scope="module")
def sites(tmp_path_factory):
    root = tmp_path_factory.mktemp("sglang-wheels")
    x86 = download(root / "x86_64", "x86_64")
    arm = {"sglang_kernel": download(root / "aarch64", "aarch64")["sglang_kernel"]}
    return {"x86_64": unpack(x86, root / "site-x86_64"),
            "aarch64": unpack({**{k: v for k, v in x86.items() if k != "sglang_kernel"}, **arm}, root / "site-aarch64")}


def judge(site: Path, cap: str):
    """(census.serving-path, SGLang's serving paths by path, its checks by id) for `cap`, as the probe's static
    run judges an image holding `site` (its distributions only, and Triton)."""
    c = Capability.parse(cap)
    pkgs = {d.metadata["Name"]: d.version for d in metadata.distributions(path=[str(site)])}
    pkgs["triton"] = "3.8.0"
    engines = providers.engines_in(pkgs)
    assert [r.engine for r in engines] == ["sglang"]
    census = census_check.run(c, "", [str(site)], None, None, engine_libraries=runner.engine_libraries(engines, pkgs, c),
                              coverage=["sgl_kernel"])
    serving = next(x for x in census["checks"] if x.id == "census.serving-path")
    entries, checks = providers.predict(c, pkgs, providers.index_rows(census["libraries"]), None, toolchain=JIT_OK,
                                        site_packages=[str(site)], names_of=runner.library_reader([str(site)]),
                                        rules=SGLANG)
    return serving, {p.path: p for p in providers.serving_paths(entries, SGLANG)}, {x.id: x for x in checks}


@pytest.mark.parametrize("cap", sorted(SGLANG.selections))
def test_sglangs_own_selectors_choose_what_the_tables_say(sites, cap, tmp_path):
    src, c = sites["x86_64"], Capability.parse(cap)
    ran = {"attention.bf16": S.default_attention(src, c, mla=False, flashinfer=True),
           "attention.mla": S.default_attention(src, c, mla=True, flashinfer=True),
           "linear.nvfp4": S.fp4_gemm_backend(src, c),
           "linear.fp8-block": S.block_fp8_linear(src, c, deep_gemm=True, flashinfer=True),
           "moe.nvfp4": S.nvfp4_moe(src, c)}
    assert ran == SGLANG.selections[cap]
    # the judgement on the real files picks the same (sglang, flashinfer and deep_gemm are in the site)
    _, paths, _ = judge(src, cap)
    assert {k: paths[k].provider for k in ran} == ran
    # sgl_kernel's own loader, run on a folder with both builds: the library the rules take for the capability
    (lib,) = SGLANG.serving
    assert "sgl_kernel/" + S.kernel_loader_subdir(src, c, tmp_path) == lib.paths_for(c)[0]


@pytest.mark.parametrize("cap, flashinfer, deep_gemm, key, chosen", [
    ("12.0", False, True, "attention.bf16", "triton"),  # no flashinfer to find: triton
    ("10.0", False, True, "attention.bf16", "trtllm_mha"),  # picked by capability alone
    ("10.0", True, False, "linear.fp8-block", "flashinfer_trtllm"),  # no deep_gemm: FlashInfer on Blackwell
    ("10.0", False, False, "linear.fp8-block", "triton"),
    ("9.0", False, False, "linear.fp8-block", "triton"),
])
def test_sglangs_own_selectors_without_flashinfer_or_deep_gemm(sites, cap, flashinfer, deep_gemm, key, chosen,
                                                              tmp_path):
    src, c = sites["x86_64"], Capability.parse(cap)
    if key == "attention.bf16":
        assert S.default_attention(src, c, mla=False, flashinfer=flashinfer) == chosen
    else:
        assert S.block_fp8_linear(src, c, deep_gemm=deep_gemm, flashinfer=flashinfer) == chosen
    pkgs = {"sglang": "0.5.23", "sglang-kernel": "0.4.10", "triton": "3.8.0"}
    if flashinfer:
        pkgs["flashinfer-python"] = "0.7.2"
    entries, _ = providers.predict(c, pkgs, {}, None, toolchain=JIT_OK, rules=SGLANG,
                                   site_packages=[str(src) if deep_gemm else str(tmp_path)])
    assert {e.key: e for e in entries}[key].vllm_would_select == chosen


def test_the_x86_64_wheel_serves_b200_b300_and_the_rtx_5090_and_has_nothing_for_gb10(sites):
    """sglang-kernel 0.4.10's x86_64 common_ops: sm_80 sm_89 sm_90 sm_90a sm_100f sm_120a, the same in sm90/ and
    sm100/ (one arch list: sgl-kernel/CMakeLists.txt); sm_121a only in the aarch64 build."""
    for cap, klass in (("10.0", "native"), ("10.3", "compatible"), ("12.0", "native")):
        serving, _, _ = judge(sites["x86_64"], cap)
        assert serving.status == PASS, serving.reason
        assert f"sgl_kernel/sm100/common_ops.abi3.so {klass} (what SGLang 0.5.23 loads on {cap})" in serving.reason
    cov = serving.evidence["coverage"]
    assert cov["sgl_kernel/sm100/common_ops.abi3.so"] == cov["sgl_kernel/sm90/common_ops.abi3.so"] == {
        "10.0": "native", "10.3": "compatible", "11.0": "none", "12.0": "native", "12.1": "none"}
    assert cov["sgl_kernel/flashmla_ops.abi3.so"] == {"10.0": "native", "10.3": "native", "11.0": "none",
                                                      "12.0": "none", "12.1": "none"}
    gb10, _, _ = judge(sites["x86_64"], "12.1")
    assert gb10.status == FAIL
    assert "sgl_kernel/sm100/common_ops.abi3.so (what SGLang 0.5.23 loads on 12.1): no runnable code" in gb10.reason


def test_the_aarch64_wheel_carries_gb10(sites):
    serving, _, _ = judge(sites["aarch64"], "12.1")
    assert serving.status == PASS and "sgl_kernel/sm100/common_ops.abi3.so native" in serving.reason
    assert serving.evidence["coverage"]["sgl_kernel/sm100/common_ops.abi3.so"] == {
        "10.0": "native", "10.3": "compatible", "11.0": "native", "12.0": "native", "12.1": "native"}


def test_sgl_kernels_gemm_families_on_the_real_libraries(sites):
    """Measured on the wheel: fp8_scaled_mm's SM100 CUTLASS GEMM in sm_100f, the SM90 one in sm_90a (sm90/),
    the cutlass MoE runner's grouped block-FP8 GEMM likewise; DeepGEMM dispatches SM90, SM100 and SM120."""
    site = sites["x86_64"]
    _, paths, _ = judge(site, "10.0")
    fp8 = paths["linear.fp8"]
    assert (fp8.provider, fp8.verdict) == ("cutlass", "present")
    assert [(f.name, f.present, f.code) for f in fp8.families] == [("sgl-fp8-sm100", True, ("sm_100f",))]
    assert paths["linear.fp8-block"].provider == "deep_gemm" and paths["linear.fp8-block"].verdict == "present"
    assert paths["linear.fp8-block"].families[0].name == "sgl-deepgemm-fp8-sm100"
    _, hopper, checks = judge(site, "9.0")
    assert [(f.name, f.present, f.code) for f in hopper["linear.fp8"].families] == [("sgl-fp8-sm90", True, ("sm_90a",))]
    _, paths, checks = judge(site, "12.0")
    assert paths["linear.fp8"].provider == "torch"  # per-tensor FP8 on 12.x: torch._scaled_mm (no torch here)
    assert paths["linear.fp8-block"].provider == "cutlass" and paths["linear.fp8-block"].verdict == "present"
    # FlashInfer's CUTLASS MoE and FP4 GEMM JIT modules for SM120 are in flashinfer-python 0.7.2
    for key in ("moe.nvfp4", "linear.nvfp4", "moe.mxfp4"):
        assert [f.present for f in paths[key].families] == [True], (key, paths[key].reason)
