"""Issue 50: each serving path judged by its provider's kernel families, not by the library carrying some
sm_120 code. The libraries are real nvcc builds (ZSTD-compressed, as vLLM 0.33's wheel is): stand-ins for
vLLM's `_C` and `_moe_C` whose kernels carry the mangled names of the families the rule data names
(tests/data/vllm_c_families.cu), and for DeepGEMM's host library with and without its SM120 dispatch
(tests/data/deep_gemm_dispatch.cc). They are judged with the probe's own census and kernel-name reader.
The real vLLM 0.33.0 wheel: test_vllm_wheel_paths.py.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Dict, Tuple

import pytest

from qualify.core import kernelnames
from qualify.core.arch import Capability
from qualify.probe import census_check, providers, runner, versions
from qualify.probe.model import FAIL, NOT_RUN, PASS, WARN

REPO = Path(__file__).resolve().parent.parent
DATA = REPO / "tests" / "data"
CAP = Capability.parse("12.0")
JIT_OK = {"nvcc": "/usr/local/cuda/bin/nvcc", "nvcc_version": "13.0", "ninja": "/usr/bin/ninja",
          "nvcc_targets": ["sm_90", "sm_100", "sm_120", "sm_121"]}
ZSTD = ["-Xfatbin", "-compress-all"]
SM120F = ["-gencode", "arch=compute_120f,code=sm_120f"]


def _nvcc(nvcc: Path, source: Path, out: Path, *defines: str) -> Path:
    done = subprocess.run([str(nvcc), "-shared", "-Xcompiler", "-fPIC", *SM120F, *ZSTD, *defines, "-o", str(out),
                           str(source)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return out


def _gxx(source: Path, out: Path, *defines: str) -> Path:
    done = subprocess.run(["g++", "-shared", "-fPIC", "-O0", *defines, "-o", str(out), str(source)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return out


@pytest.fixture(scope="module")
def built(nvcc, tmp_path_factory) -> Dict[str, Path]:
    root = tmp_path_factory.mktemp("families")
    return {
        "c-full": _nvcc(nvcc, DATA / "vllm_c_families.cu", root / "c-full.so", "-DNVFP4_MOE"),
        "c-stub": _nvcc(nvcc, DATA / "vllm_c_families.cu", root / "c-stub.so"),
        "moe-c": _nvcc(nvcc, DATA / "vllm_moe_c_families.cu", root / "moe-c.so"),
        "dg-sm120": _gxx(DATA / "deep_gemm_dispatch.cc", root / "dg-sm120.so", "-DWITH_SM120"),
        "dg-no-sm120": _gxx(DATA / "deep_gemm_dispatch.cc", root / "dg-no-sm120.so"),
    }


def make_site(root: Path, built: Dict[str, Path], c: str = "c-full", deep_gemm: str = "dg-sm120") -> Path:
    """A site-packages holding the stand-ins where vLLM 0.33.0's wheel has them, and vLLM's dist-info."""
    site = root / "site"
    (site / "vllm" / "third_party" / "deep_gemm").mkdir(parents=True)
    shutil.copy(built[c], site / "vllm" / "_C_stable_libtorch.abi3.so")
    shutil.copy(built["moe-c"], site / "vllm" / "_moe_C_stable_libtorch.abi3.so")
    if deep_gemm:
        (site / "vllm" / "third_party" / "deep_gemm" / "__init__.py").write_text("")
        shutil.copy(built[deep_gemm], site / "vllm" / "third_party" / "deep_gemm" / "_C_extension.abi3.so")
    (site / "vllm-0.33.0.dist-info").mkdir()
    (site / "vllm-0.33.0.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm\nVersion: 0.33.0\n")
    return site


def judge(site: Path, decompress: bool = True) -> Tuple[dict, dict]:
    """(serving paths by path, checks by id) for sm120, as the probe's static run judges them: the census
    and the packages (vLLM's dist-info) of `site`."""
    rows = census_check.run(CAP, "12.0f", [str(site)], None, None)["libraries"]
    pkgs = {k: v for k, v in versions.packages([str(site)]).items() if k == "vllm"}
    entries, checks = providers.predict(CAP, pkgs, providers.index_rows(rows), None, toolchain=JIT_OK,
                                        site_packages=[str(site)],
                                        names_of=runner.library_reader([str(site)], decompress=decompress))
    return {p.path: p for p in providers.serving_paths(entries)}, {c.id: c for c in checks}


def test_every_family_present_passes_its_path(built, tmp_path):
    paths, checks = judge(make_site(tmp_path, built))
    for path, provider, family in (("linear.fp8", "CUTLASS", "cutlass-fp8-sm120"),
                                   ("linear.nvfp4", "CUTLASS", "cutlass-nvfp4-sm120"),
                                   ("moe.nvfp4", "VLLM_CUTLASS", "cutlass-nvfp4-moe-sm120"),
                                   ("linear.fp8-block", "DEEPGEMM", "deepgemm-fp8-sm120"),
                                   ("moe.fp8-block", "DEEPGEMM", "deepgemm-fp8-sm120")):
        p = paths[path]
        assert (p.provider, p.verdict) == (provider, "present"), (path, p.reason)
        assert [(f.name, f.present) for f in p.families] == [(family, True)], path
        # present; a warning only where vLLM's first choice (FlashInfer, not installed here) is unavailable
        assert checks[f"providers.{path}"].status in (PASS, WARN), checks[f"providers.{path}"].reason
    assert paths["moe.nvfp4"].families[0].code == ("sm_120f",)
    assert paths["moe.nvfp4"].line() == "NVFP4 MoE: VLLM_CUTLASS, kernels present"


def test_a_missing_family_fails_that_path_and_no_other(built, tmp_path):
    """The SM120 NVFP4 grouped GEMM guarded out of _C (vllm-project/vllm#24921's class): moe.nvfp4 fails,
    naming the family and the fallback; every other path's check is what it was."""
    full_paths, full = judge(make_site(tmp_path / "full", built))
    paths, checks = judge(make_site(tmp_path / "stub", built, c="c-stub"))
    changed = sorted(k for k in checks if checks[k].status != full[k].status)
    assert changed == ["providers.moe.nvfp4"], changed
    p = paths["moe.nvfp4"]
    assert (p.verdict, p.provider, p.runs) == ("missing", "VLLM_CUTLASS", "MARLIN")
    assert p.fallback.cli == "--moe-backend marlin" and "weight-only NVFP4" in p.fallback.note
    assert [(f.name, f.present) for f in p.families] == [("cutlass-nvfp4-moe-sm120", False)]
    check = checks["providers.moe.nvfp4"]
    assert check.status == FAIL and not check.required
    assert "CUTLASS NVFP4 grouped GEMM for SM120" in check.reason and "falls back to MARLIN" in check.reason
    assert p.line() == "NVFP4 MoE: VLLM_CUTLASS, kernels missing: falls back to MARLIN (--moe-backend marlin)"


def test_a_guarded_out_kernel_has_the_name_and_no_code(built):
    """A kernel another architecture's guard compiles to an immediate exit keeps its mangled name: the
    family reader counts only kernels with code (vLLM 0.33's sm_100f cubin: 384 bytes for an SM120 GEMM)."""
    scan = kernelnames.scan(str(built["c-stub"]))
    sizes = {name: size for e in scan.entries for name, size in (e.kernels or ())}
    stub = [s for n, s in sizes.items() if "MainloopSm120ArrayTmaWarpSpecializedBlockScaled" in n]
    real = [s for n, s in sizes.items() if "MainloopSm120TmaWarpSpecializedBlockScaled" in n]
    assert stub and real and max(stub) < 1024 <= min(real), (stub, real)


def test_kernels_that_cannot_be_read_are_unknown_never_a_pass(built, tmp_path):
    """No ZSTD decoder (an image whose probe has none staged): the families of _C are unknown; their paths are
    not-run, and no path whose pick has families passes."""
    paths, checks = judge(make_site(tmp_path, built), decompress=False)
    for path in ("linear.fp8", "linear.nvfp4", "moe.nvfp4"):
        assert paths[path].verdict == "unknown", (path, paths[path].reason)
        assert checks[f"providers.{path}"].status == NOT_RUN
        assert "could not be read" in paths[path].reason and "no decoder" in paths[path].reason
    assert all(f.present is None for f in paths["moe.nvfp4"].families)


@pytest.mark.parametrize("deep_gemm, verdict", [("dg-sm120", "present"), ("dg-no-sm120", "missing")])
def test_deepgemm_is_judged_by_its_dispatch_for_the_architecture(built, tmp_path, deep_gemm, verdict):
    """Issue 51 (deepseek-ai/DeepGEMM#317, vllm-project/vllm#47130): vLLM 0.33 routes block-FP8 GEMMs to
    DeepGEMM on the 12.x family; a DeepGEMM without an SM120 dispatch raises "Unsupported architecture"."""
    paths, checks = judge(make_site(tmp_path, built, deep_gemm=deep_gemm))
    for path in ("linear.fp8-block", "moe.fp8-block"):
        assert (paths[path].provider, paths[path].verdict) == ("DEEPGEMM", verdict), paths[path].reason
    if verdict == "missing":
        assert checks["providers.linear.fp8-block"].status == FAIL
        assert paths["linear.fp8-block"].runs == "CUTLASS"  # the SM120 block-FP8 CUTLASS GEMM is there
        assert "DeepGEMM's FP8 GEMM for SM120" in paths["linear.fp8-block"].reason


def test_without_deepgemm_vllm_does_not_pick_it(built, tmp_path):
    paths, _ = judge(make_site(tmp_path, built, deep_gemm=""))
    assert paths["linear.fp8-block"].provider == "CUTLASS" and paths["linear.fp8-block"].verdict == "present"


def test_the_probe_command_writes_the_paths_into_the_manifest(built, tmp_path):
    """The acceptance command: `qualify probe --only static --path <site>` for sm120, per-path verdicts naming
    kernel families in the manifest's serving_paths, and `show` printing them."""
    site = make_site(tmp_path, built, c="c-stub")
    out = tmp_path / "probe.json"
    done = subprocess.run([sys.executable, "-m", "qualify", "probe", "--target", "sm120", "--only", "static",
                           "--path", str(site), "--out", str(out)], cwd=REPO, capture_output=True, text=True,
                          timeout=600)
    assert out.exists(), done.stderr[-3000:]
    predicate = json.loads(out.read_text())["predicate"]
    by = {p["path"]: p for p in predicate["serving_paths"]}
    assert set(by) == set(p.key for p in providers.TABLES)
    assert by["moe.nvfp4"]["verdict"] == "missing"
    assert by["moe.nvfp4"]["families"] == [{"name": "cutlass-nvfp4-moe-sm120", "library": "vllm/_C_stable_libtorch.abi3.so",
                                            "present": False, "code": [],
                                            "what": "CUTLASS NVFP4 grouped GEMM for SM120 (cutlass_fp4_group_mm: CUTLASS MoE)"}]
    assert by["linear.fp8"]["verdict"] == "present" and by["linear.fp8"]["families"][0]["code"] == ["sm_120f"]
    shown = subprocess.run([sys.executable, "-m", "qualify", "show", str(out), "--width", "200"], cwd=REPO,
                           capture_output=True, text=True, timeout=120)
    assert "NVFP4 MoE: VLLM_CUTLASS, kernels missing: falls back to MARLIN (--moe-backend marlin)" in shown.stdout, \
        shown.stdout
