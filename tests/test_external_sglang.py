"""`qualify qualify --image` on an SGLang image (issue 51 item 6): judged by SGLang's rules, not vLLM's.

The image is sglang 0.5.23, sglang-kernel 0.4.10 and sgl-deep-gemm 0.2.3.post2 from PyPI, `pip install
--no-deps` into the plain Triton 3.8.0 image of test_external.py (tests/images.py: sglang); its variant
replaces what SGLang loads on every Blackwell GPU, sgl_kernel/sm100/common_ops.abi3.so, with an nvcc-built
library for SM100 only (tests/data/sgl_common_ops.cu), the build sgl-project/sglang#12178 found on an RTX PRO
6000. Real images, a real engine, the loopback registry.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
from conftest import REPO
from test_sglang_rules import GENCODES, _build

import images
from qualify.config import targets
from qualify.core import manifest
from qualify.core.servingpaths import ServingPaths
from qualify.host.engine import Engine
from qualify.host.registry import Registry

SCHEMA = json.loads((REPO / "manifests" / "manifest.schema.json").read_text())
pytestmark = pytest.mark.engine


def cli(*args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "qualify", *args], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)


@pytest.fixture(scope="module")
def sglang_images(docker_engine, loopback_registry, nvcc, tmp_path_factory):
    """{"wheel": the SGLang image (pushed), "sm100-only": its variant (local only)}."""
    Engine("docker").check()
    work = tmp_path_factory.mktemp("sglang-image")
    tag = images.sglang("sm120", work, Registry.from_env().address)
    lib = _build(nvcc, work / "sm100-only.so", GENCODES["sm100-only"], "-DSM100_FP8")
    tf = targets.load()
    site = images.SGLANG_SITE.format(python=tf.get("sm120").python_for("hermetic", tf.hermetic))
    variant = images.derived(docker_engine, tag, f"qualify-test/external-sglang-sm100-only:{images.CHECKOUT}",
                             f"COPY common_ops.abi3.so {site}/sgl_kernel/sm100/common_ops.abi3.so",
                             {"common_ops.abi3.so": lib.read_bytes()}, work, "linux/amd64")
    try:
        yield {"wheel": tag, "sm100-only": variant}
    finally:
        subprocess.run([docker_engine, "rmi", variant], capture_output=True)


@pytest.fixture(scope="module")
def qualified(sglang_images, tmp_path_factory):
    """(image, target) -> (CLI result, manifest), each through `qualify qualify --image`."""
    out = tmp_path_factory.mktemp("sglang-manifests")
    done = {}
    for name, ref in sglang_images.items():
        for target in ("sm120", "sm100"):
            path = out / f"{name}-{target}.json"
            result = cli("qualify", "--image", ref, "--target", target, "--out", str(path))
            done[(name, target)] = (result, path)
    return done


def checks(path: Path) -> dict:
    return {c["id"]: c for c in manifest.predicate(manifest.load(path))["checks"]}


def test_an_sglang_image_is_judged_by_sglangs_rules(qualified):
    result, path = qualified[("wheel", "sm120")]
    assert path.exists(), result.stderr[-3000:]
    assert "profile smoke (detected: no vLLM installed; SGLang is: judged by SGLang's rules)" in result.stderr
    doc = manifest.load(path)
    jsonschema.validate(doc, SCHEMA)
    p = manifest.predicate(doc)
    assert p["image"]["origin"] == "external" and p["versions"]["packages"]["sglang"] == "0.5.23"
    found = checks(path)
    serving = found["census.serving-path"]
    assert serving["status"] == "pass", serving["reason"]
    assert "sgl_kernel/sm100/common_ops.abi3.so native (what SGLang 0.5.23 loads on 12.0)" in serving["reason"]
    assert serving["evidence"]["coverage"]["sgl_kernel/sm100/common_ops.abi3.so"] == {
        "10.0": "native", "10.3": "compatible", "11.0": "none", "12.0": "native", "12.1": "none"}
    assert "12.1" in serving["reason"]  # which Blackwell targets it has nothing for, said
    # SGLang's checks, not vLLM's (vLLM is not installed: its checks are not even listed)
    assert not [c for c in found if c.startswith("providers.") and not c.startswith("providers.sglang.")]
    bf16 = found["providers.sglang.attention.bf16"]
    assert bf16["required"] and bf16["title"] == "Attention provider SGLang would use: bf16 attention"
    # no flashinfer in the image: SGLang's else branch takes Triton (3.8.0 is there), which runs
    assert bf16["status"] == "warn" and "triton" in bf16["reason"] and "flashinfer-python is not installed" in bf16["reason"]
    paths = ServingPaths.of_predicate(p)
    assert {sp.engine for sp in paths.paths} == {"sglang"} and paths.get("attention.bf16") is None
    block = paths.get("linear.fp8-block", "sglang")  # SGLang JIT-compiles its SM120 CUTLASS GEMM: nvcc + ninja
    assert (block.provider, block.verdict) == ("cutlass", "present"), block.reason
    assert not [c for c in found.values() if "Traceback" in c["reason"]]


def test_on_a_b200_sglang_picks_trtllm_mha_and_the_image_cannot_run_it(qualified):
    """The same image for sm100: SGLang's default there needs FlashInfer's trtllm-gen cubins, absent here; the
    check names the flag that selects what runs."""
    result, path = qualified[("wheel", "sm100")]
    found = checks(path)
    assert found["census.serving-path"]["status"] == "pass"
    assert "sgl_kernel/sm100/common_ops.abi3.so native (what SGLang 0.5.23 loads on 10.0)" in \
        found["census.serving-path"]["reason"]
    bf16 = found["providers.sglang.attention.bf16"]
    assert bf16["status"] == "fail"
    assert "SGLang selects trtllm_mha, which cannot run here" in bf16["reason"]
    assert "--attention-backend triton" in bf16["reason"]
    fp8 = ServingPaths.of(manifest.Manifest.from_statement(manifest.load(path), str(path))).get("linear.fp8", "sglang")
    assert (fp8.provider, fp8.verdict) == ("cutlass", "present") and fp8.families[0].code == ("sm_100f",)


def test_an_sgl_kernel_built_for_sm100_only_fails_for_sm120_and_passes_for_sm100(qualified):
    result, path = qualified[("sm100-only", "sm120")]
    assert result.returncode == 1, result.stderr[-3000:]
    serving = checks(path)["census.serving-path"]
    assert serving["status"] == "fail" and serving["required"]
    assert ("sgl_kernel/sm100/common_ops.abi3.so (what SGLang 0.5.23 loads on 12.0): no runnable code at all "
            "(SASS sm_100a; PTX -)") in serving["reason"]
    assert manifest.predicate(manifest.load(path))["verdict"] == "fail"
    result, path = qualified[("sm100-only", "sm100")]
    assert checks(path)["census.serving-path"]["status"] == "pass"


def test_compare_shows_what_sglang_loads_side_by_side(qualified):
    paths = [str(qualified[(name, "sm120")][1]) for name in ("wheel", "sm100-only")]
    done = cli("compare", *paths, "--json")
    rows = {(r["section"], r["name"]): r for r in json.loads(done.stdout)["rows"]}
    assert rows[("check", "census.serving-path")]["values"] == ["pass", "fail"]
    assert rows[("library", "sgl_kernel/sm100/common_ops.abi3.so")]["values"] == ["native", "none"]
    assert rows[("package", "sglang")]["values"] == ["0.5.23", "0.5.23"]
    assert rows[("provider", "sglang attention bf16")]["values"] == ["triton", "triton"]
    shown = cli("show", paths[0], "--width", "220")
    assert "attention.bf16 (sglang)" in shown.stdout and "sglang 0.5.23" in shown.stdout
