"""Issue 29: the image's manifest never claims more than the probe saw.

A site-packages of real nvcc-built libraries, laid out where the probe's serving-path rules look
(`vllm/_C.abi3.so`), read by the probe's census checks in a child interpreter as the image runs them:
once with the decoders, once with zstandard and lz4 unimportable (the image side without decoders).

- `vllm/_C.abi3.so`: a unit with an sm_120 kernel and an sm_75-only unit that holds a real kernel, both
  ZSTD-compressed (vLLM 0.33's `_C_stable_libtorch`: 7 sm_75-only units with 15-60 kernels each);
- `vllm/_flashmla_C.abi3.so`: sm_90a and sm_100f code only, compressed (nothing in it runs on 12.0, whether
  or not its containers hold kernels);
- `libk.a`: a static archive with device code (sgl-kernel ships two);
- `librdc.so`: relocatable device code kept in `__nv_relfatbin` (bitsandbytes' 12.0 PTX that is never loaded).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
KERNEL = "__global__ void k{name}(float *x) {{ x[threadIdx.x] = {value}.0f; }}\n"
ZSTD = ["-Xfatbin", "-compress-all"]


def _nvcc(nvcc: Path, cwd: Path, *args: str) -> None:
    done = subprocess.run([str(nvcc), *args], cwd=cwd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr


@pytest.fixture(scope="module")
def site(nvcc, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("honest-census")
    work, out = root / "work", root / "site"
    (out / "vllm").mkdir(parents=True)
    work.mkdir()
    for name, value in (("75", 1), ("120", 2), ("fmla", 3)):
        (work / f"k{name}.cu").write_text(KERNEL.format(name=name, value=value))
    _nvcc(nvcc, work, "-Xcompiler", "-fPIC", "-c", "-gencode", "arch=compute_75,code=sm_75", *ZSTD, "-o", "k75.o", "k75.cu")
    _nvcc(nvcc, work, "-Xcompiler", "-fPIC", "-c", "-gencode", "arch=compute_120,code=sm_120", *ZSTD, "-o", "k120.o",
          "k120.cu")
    _nvcc(nvcc, work, "-shared", "-o", str(out / "vllm" / "_C.abi3.so"), "k75.o", "k120.o")
    _nvcc(nvcc, work, "-shared", "-Xcompiler", "-fPIC", "-gencode", "arch=compute_90a,code=sm_90a",
          "-gencode", "arch=compute_100f,code=sm_100f", *ZSTD, "-o", str(out / "vllm" / "_flashmla_C.abi3.so"), "kfmla.cu")
    _nvcc(nvcc, work, "-lib", "-Xcompiler", "-fPIC", "-gencode", "arch=compute_120,code=sm_120", "-o",
          str(out / "libk.a"), "k120.cu")
    _nvcc(nvcc, work, "-shared", "-Xcompiler", "-fPIC", "-rdc=true", "-gencode", "arch=compute_100,code=sm_100",
          "-gencode", "arch=compute_120,code=compute_120", "-o", str(out / "librdc.so"), "k120.cu")
    return out


_PROBE = """
import json, sys
if sys.argv[2] == "no-decoders":  # as in an image: neither zstandard nor lz4 can be imported
    sys.modules["zstandard"] = None; sys.modules["lz4"] = None; sys.modules["lz4.block"] = None
from qualify.core import arch
from qualify.probe import census_check
r = census_check.run(arch.Capability.parse("12.0"), "12.0;12.0a", [sys.argv[1]], None, None)
print(json.dumps({"libraries": r["libraries"], "checks": {c.id: c.to_dict() for c in r["checks"]}}))
"""


def probe(site: Path, decoders: bool) -> dict:
    done = subprocess.run([sys.executable, "-c", _PROBE, str(site), "decoders" if decoders else "no-decoders"],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    result["rows"] = {r["short"]: r for r in result["libraries"]}
    return result


@pytest.fixture(scope="module")
def decoded(site):
    return probe(site, decoders=True)


@pytest.fixture(scope="module")
def undecoded(site):
    return probe(site, decoders=False)


def test_with_decoders_the_sm75_only_unit_is_a_gap(decoded):
    row = decoded["rows"]["vllm/_C.abi3.so"]
    assert (row["best"], row["no_code_units"], row["unknown_units"]) == ("native", 1, 0)
    gaps = decoded["checks"]["census.unit-gaps"]
    assert gaps["status"] == "warn" and "vllm/_C.abi3.so (1 of 2 units)" in gaps["reason"]


def test_without_decoders_unit_gaps_is_unknown_never_pass(undecoded):
    """Today's bug: `{native, unknown}` with `no_code_units 0` passed: every unit has code, it said."""
    row = undecoded["rows"]["vllm/_C.abi3.so"]
    assert (row["best"], row["no_code_units"], row["unknown_units"]) == ("native", 0, 1)
    gaps = undecoded["checks"]["census.unit-gaps"]
    assert gaps["status"] == "warn", gaps
    assert "could not tell whether these units hold kernels" in gaps["reason"] and "(1 of 2 units)" in gaps["reason"]


@pytest.mark.parametrize("which", ["decoded", "undecoded"])
def test_a_library_of_other_architectures_code_only_is_none_and_named(request, which):
    """`_flashmla_C`, `_deepselect_C`, `_qutlass_C`: sm_90a/sm_100f only. Nothing in them can run on 12.0, so
    they are `none` and census.arch-specific names them, decoder or not (they used to read `unknown`)."""
    result = request.getfixturevalue(which)
    row = result["rows"]["vllm/_flashmla_C.abi3.so"]
    assert row["best"] == "none"
    check = result["checks"]["census.arch-specific"]
    assert check["status"] == "warn" and "vllm/_flashmla_C.abi3.so" in check["reason"]
    assert "nothing in it runs here" in check["reason"]


def test_a_serving_path_library_the_census_cannot_judge_fails_the_required_check():
    from qualify.core import arch
    from qualify.probe import census_check

    rows = [{"short": "vllm/_C.abi3.so", "path": "/x/vllm/_C.abi3.so", "serving_path": True, "best": "unknown",
             "class": "unknown", "sass": ["sm_120"], "ptx": []}]
    check = census_check.serving_path(rows, arch.Capability.parse("12.0"))
    assert check.status == "fail" and check.required and "could not tell" in check.reason


def test_link_only_code_is_reported_apart_from_what_can_load(decoded):
    """bitsandbytes' case: PTX 12.0 only in `__nv_relfatbin` read like a JIT fallback that does not exist."""
    row = decoded["rows"]["librdc.so"]
    assert "compute_120" in row["link_only"]["ptx"]
    assert "compute_120" not in row["ptx"]


def test_a_static_archive_is_listed_as_a_link_input(decoded, site):
    row = decoded["rows"]["libk.a"]
    assert row["format"] == "archive" and row["archive"]["members"] >= 1 and row["archive"]["with_device_code"] >= 1
    assert row["archive"]["read"] is False and row["best"] is None and not row["errors"]
    from qualify.core import census

    (lib,) = census.scan([str(site / "libk.a")]).libraries  # given explicitly: no longer an error row
    assert lib.summary.format == "archive" and not lib.summary.errors
