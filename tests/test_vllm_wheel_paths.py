"""Issue 50 against released vLLM wheels whose history the field reports tell: the serving paths of sm120
judged on the real libraries of vLLM 0.33.0 (this project's lock) and of vLLM 0.10.2, the release behind
vllm-project/vllm#24921 ("No compiled get_cutlass_moe_mm_data ... capability: 120": its _C has no SM120
NVFP4 grouped GEMM). The wheels come from PyPI (pip's cache keeps them); only their libraries and vLLM's
dist-info are unpacked. FlashInfer is not unpacked, so the paths vLLM would give it are judged on the
providers after it, as in an image without FlashInfer.
"""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from test_kernel_families import judge

pytestmark = pytest.mark.slow  # 770 MB of wheels the first time; the census of 1.7 GB of libraries
PLATFORMS = ["manylinux1_x86_64", "manylinux_2_28_x86_64", "manylinux_2_31_x86_64", "manylinux_2_35_x86_64"]


def wheel(version: str, dest: Path) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "--python-version",
            "3.12", *[a for p in PLATFORMS for a in ("--platform", p)], "-d", str(dest), f"vllm=={version}"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stderr[-3000:]
    (found,) = dest.glob(f"vllm-{version}-*.whl")
    return found


def unpack(whl: Path, site: Path) -> Path:
    with zipfile.ZipFile(whl) as zf:
        for name in zf.namelist():
            if name.endswith(".so") or ".dist-info/" in name or name.startswith("vllm/third_party/deep_gemm/__init__"):
                zf.extract(name, site)
    return site


@pytest.fixture(scope="module")
def sites(tmp_path_factory):
    root = tmp_path_factory.mktemp("vllm-wheels")
    return {v: unpack(wheel(v, root / "wheels"), root / v) for v in ("0.33.0", "0.10.2")}


def test_vllm_0_33_carries_the_sm120_nvfp4_moe_family(sites):
    paths, checks = judge(sites["0.33.0"])
    p = paths["moe.nvfp4"]
    assert p.provider == "VLLM_CUTLASS" and p.verdict == "present", p.reason
    assert [(f.name, f.present, f.code) for f in p.families] == [("cutlass-nvfp4-moe-sm120", True, ("sm_120f",))]
    for path in ("linear.fp8", "linear.nvfp4", "linear.fp8-block", "linear.w4a16"):
        assert paths[path].verdict in ("present", "fallback"), (path, paths[path].reason)
    # gpt-oss on SM120: vLLM 0.33 puts Marlin first on the 12.x family (vllm-project/vllm#31085): a slower path
    assert paths["moe.mxfp4"].provider == "MARLIN" and paths["moe.mxfp4"].verdict == "fallback"


def test_vllm_0_10_2_has_no_sm120_nvfp4_moe_kernels(sites):
    """The field report's failure, found in the files: vLLM's CUTLASS MoE is picked and has nothing for 12.0
    (its NVFP4 GEMM for SM120 exists, as sm_120a: the dense path still runs)."""
    paths, checks = judge(sites["0.10.2"])
    p = paths["moe.nvfp4"]
    assert p.provider == "VLLM_CUTLASS" and p.verdict in ("missing", "none"), p.reason
    assert [(f.name, f.present) for f in p.families] == [("cutlass-nvfp4-moe-sm120", False)]
    assert checks["providers.moe.nvfp4"].status.value == "fail"
    assert "rules are vLLM 0.33.0's; the image has vLLM 0.10.2" in checks["providers.moe.nvfp4"].reason
    dense = paths["linear.nvfp4"]
    assert dense.provider == "CUTLASS" and dense.verdict == "present"
    assert dense.families[0].code == ("sm_120a",)
