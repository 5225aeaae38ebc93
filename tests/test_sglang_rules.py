"""Issue 51 item 6: an image with SGLang is judged by SGLang's rules (qualify/probe/rules/sglang-0.5.23.json),
not vLLM's: the serving path is the sgl_kernel library SGLang's loader takes on the target, and one check per
serving path follows SGLang's own selection (providers.sglang.<kind>.<variant>).

The libraries are real nvcc builds standing in for sgl_kernel's common_ops (tests/data/sgl_common_ops.cu),
built for SM100 only (what sgl-project/sglang#12178 ran into on an RTX PRO 6000), for the Blackwell targets
the 0.4.10 wheel carries (sm_100f, sm_120a), and for SM90. The real wheels: test_sglang_wheel_paths.py; a
real image: test_external_sglang.py.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Dict, Optional

import jsonschema
import pytest

from qualify.core.arch import Capability, Compat
from qualify.core.servingpaths import ServingPaths
from qualify.probe import census_check, providers, runner
from qualify.probe.model import FAIL, NOT_RUN, PASS, WARN
from qualify.probe.providers import rules

REPO = Path(__file__).resolve().parent.parent
DATA = REPO / "tests" / "data"
SGLANG = rules.for_engine("sglang")
SCHEMA = json.loads((REPO / "manifests" / "manifest.schema.json").read_text())
JIT_OK = {"nvcc": "/usr/local/cuda/bin/nvcc", "nvcc_version": "13.0", "ninja": "/usr/bin/ninja",
          "nvcc_targets": ["sm_90", "sm_100", "sm_103", "sm_110", "sm_120", "sm_121"]}
# sglang 0.5.23's pins of what its selectors import (flashinfer_python 0.7.2, sglang-kernel 0.4.10, ...)
PINS = {"sglang": "0.5.23", "sglang-kernel": "0.4.10", "flashinfer-python": "0.7.2", "triton": "3.8.0",
        "sgl-deep-gemm": "0.2.3.post2", "nvidia-cutlass-dsl": "4.8.0"}
GENCODES = {"sm100-only": ["arch=compute_100a,code=sm_100a"],
            "blackwell": ["arch=compute_100f,code=sm_100f", "arch=compute_120a,code=sm_120a"],
            "sm90": ["arch=compute_90a,code=sm_90a"]}


def test_the_engines_are_chosen_by_what_the_image_has_installed():
    assert [r.engine for r in rules.engines_in({"sglang": "0.5.23", "sglang-kernel": "0.4.10"})] == ["sglang"]
    assert [r.engine for r in rules.engines_in({"vllm": "0.33.0", "sglang": "0.5.23"})] == ["vllm", "sglang"]
    assert rules.engines_in({"sglang-kernel": "0.4.10", "triton": "3.8.0"}) == []  # the kernels alone serve nothing
    assert (SGLANG.name, SGLANG.version, SGLANG.check_prefix) == ("SGLang", "0.5.23", "providers.sglang.")
    assert (rules.default().name, rules.default().check_prefix) == ("vLLM", "providers.")


def test_sgl_kernel_is_the_library_its_loader_takes_on_each_capability():
    """sgl_kernel/load_utils.py: sm90/ on capability 9.0 exactly, sm100/ everywhere else (the real loader is run
    in test_sglang_wheel_paths.py); the flat common_ops of older wheels as its fallback."""
    (lib,) = SGLANG.serving
    assert SGLANG.coverage == ("sgl_kernel",)
    want = {"9.0": "sgl_kernel/sm90/common_ops.abi3.so", "8.9": "sgl_kernel/sm100/common_ops.abi3.so",
            "10.0": "sgl_kernel/sm100/common_ops.abi3.so", "10.3": "sgl_kernel/sm100/common_ops.abi3.so",
            "12.0": "sgl_kernel/sm100/common_ops.abi3.so", "12.1": "sgl_kernel/sm100/common_ops.abi3.so"}
    for cap, first in want.items():
        assert lib.paths_for(Capability.parse(cap)) == (first, "sgl_kernel/common_ops.abi3.so"), cap


def predicted(cap: str, packages: Dict[str, str] = PINS, census: Optional[dict] = None):
    entries, checks = providers.predict(Capability.parse(cap), packages, census or {"sgl_kernel/x.so": None},
                                        None, toolchain=JIT_OK, rules=SGLANG)
    return {e.key: e for e in entries}, {c.id: c for c in checks}


@pytest.mark.parametrize("cap", sorted(SGLANG.selections))
def test_sglang_would_select_what_its_own_code_chose(cap):
    """`selections`: SGLang 0.5.23's selector functions run on their own code (tests/sglang_source.py)."""
    entries, _ = predicted(cap)
    got = {key: entries[key].vllm_would_select for key in SGLANG.selections[cap]}
    assert got == SGLANG.selections[cap]


def test_without_flashinfer_sglang_still_picks_trtllm_mha_on_b200_and_it_cannot_run():
    """SGLang picks by capability (get_default_attn_backend): on 10.x trtllm_mha whether or not FlashInfer is
    there; on 12.x it looks for flashinfer and takes triton without it."""
    bare = {k: v for k, v in PINS.items() if k != "flashinfer-python"}
    entries, checks = predicted("10.0", bare)
    e = entries["attention.bf16"]
    assert (e.vllm_would_select, e.selected) == ("trtllm_mha", "triton")
    assert "flashinfer-python is not installed: SGLang imports it for trtllm_mha" in e.candidate("trtllm_mha").reason
    check = checks["providers.sglang.attention.bf16"]
    assert check.status == FAIL and check.required
    assert "SGLang selects trtllm_mha, which cannot run here" in check.reason and "--attention-backend triton" in check.reason
    entries, checks = predicted("12.0", bare)
    assert (entries["attention.bf16"].vllm_would_select, entries["attention.bf16"].selected) == ("triton", "triton")
    check = checks["providers.sglang.attention.bf16"]  # it runs; SGLang's first choice there is not installed
    assert check.status == WARN and "flashinfer unavailable (flashinfer-python is not installed); using triton" \
        in check.reason


def test_an_engine_that_is_not_installed_is_not_run():
    _, checks = predicted("12.0", {"vllm": "0.33.0"})
    assert {c.status for c in checks.values()} == {NOT_RUN} and len(checks) == len(SGLANG.tables)
    assert checks["providers.sglang.attention.bf16"].reason == "SGLang is not installed in this image"


def test_sglang_entries_and_paths_say_whose_they_are():
    entries, checks = predicted("12.0")
    e = entries["linear.fp8-block"]
    assert e.to_json()["engine"] == "sglang" and e.vllm_would_select == "cutlass"
    assert "engine" not in providers.predict(Capability.parse("12.0"), {"vllm": "0.33.0"}, {})[0][0].to_json()
    ev = checks["providers.sglang.linear.fp8-block"].evidence
    assert (ev["engine"], ev["sglang"], ev["rules_from_sglang"]) == ("sglang", "0.5.23", "0.5.23")
    assert ev["serving_path"]["engine"] == "sglang" and "vllm" not in ev
    older = dict(PINS, sglang="0.5.9")
    assert "rules are SGLang 0.5.23's; the image has SGLang 0.5.9" in predicted("12.0", older)[1][
        "providers.sglang.attention.bf16"].reason


@pytest.mark.parametrize("edit,message", [
    (lambda d: d.update(engine="tgi"), "engine: \"tgi\" is not one of vllm, sglang"),
    (lambda d: d.pop("sglang"), "missing key(s) sglang"),
    (lambda d: d["libraries"]["sgl-common-ops"].update(paths={"9.0": []}), "a capability's paths are empty"),
    (lambda d: d["libraries"]["sgl-common-ops"].update(paths={"nine": ["x.so"]}), "paths.nine: expected a capability"),
    (lambda d: d["serving_path"].update(libraries=["nope"]), "serving_path.libraries[0]: \"nope\" is not one of"),
    (lambda d: d["tables"][0]["providers"][1].update(imports="flashinfer-python"), "imports: expected a list"),
])
def test_rule_file_errors_say_where(edit, message):
    data = json.loads(Path(rules.ENGINES["sglang"][2]).read_text())
    assert rules.parse(json.loads(json.dumps(data)), "s.json") == dataclasses.replace(SGLANG, path="s.json")
    edit(data)
    with pytest.raises(rules.RulesError) as err:
        rules.parse(data, "sglang-x.json")
    assert str(err.value).startswith("sglang-x.json: ") and message in str(err.value), str(err.value)


# --- nvcc-built stand-ins at sgl_kernel's own paths ------------------------------------------------------------


def _build(nvcc: Path, out: Path, gencodes, *defines: str) -> Path:
    flags = [a for g in gencodes for a in ("-gencode", g)]
    done = subprocess.run([str(nvcc), "-shared", "-Xcompiler", "-fPIC", *flags, "-Xfatbin", "-compress-all",
                           *defines, "-o", str(out), str(DATA / "sgl_common_ops.cu")],
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return out


@pytest.fixture(scope="module")
def built(nvcc, tmp_path_factory) -> Dict[str, Path]:
    root = tmp_path_factory.mktemp("sgl-common-ops")
    out = {name: _build(nvcc, root / f"{name}.so", gen, "-DSM100_FP8") for name, gen in GENCODES.items()}
    out["blackwell-no-fp8"] = _build(nvcc, root / "blackwell-no-fp8.so", GENCODES["blackwell"])
    return out


def sglang_site(root: Path, built: Dict[str, Path], sm100: Optional[str] = "blackwell", vllm: bool = False) -> Path:
    """A site-packages with sglang's and sglang-kernel's dist-info and the stand-ins where 0.4.10 has them."""
    site = root / "site"
    for dist, version in (("sglang", "0.5.23"), ("sglang_kernel", "0.4.10")) + ((("vllm", "0.33.0"),) if vllm else ()):
        info = site / f"{dist}-{version}.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist.replace('_', '-')}\nVersion: {version}\n")
    if sm100:
        (site / "sgl_kernel" / "sm100").mkdir(parents=True)
        shutil.copy(built[sm100], site / "sgl_kernel" / "sm100" / "common_ops.abi3.so")
        (site / "sgl_kernel" / "sm90").mkdir(parents=True)
        shutil.copy(built["sm90"], site / "sgl_kernel" / "sm90" / "common_ops.abi3.so")
    return site


def judge(site: Path, cap: str):
    """(census.serving-path, SGLang's serving paths by path, checks by id) as the probe's static run judges them:
    the site's distributions, and Triton (so that a path's fallback does not depend on this host's venv)."""
    c = Capability.parse(cap)
    pkgs = {d.metadata["Name"]: d.version for d in metadata.distributions(path=[str(site)])}
    pkgs["triton"] = "3.8.0"
    engines = providers.engines_in(pkgs)
    census = census_check.run(c, "", [str(site)], None, None, engine_libraries=runner.engine_libraries(engines, pkgs, c),
                              coverage=["sgl_kernel"])
    serving = next(x for x in census["checks"] if x.id == "census.serving-path")
    entries, checks = providers.predict(c, pkgs, providers.index_rows(census["libraries"]), None, toolchain=JIT_OK,
                                        site_packages=[str(site)], names_of=runner.library_reader([str(site)]),
                                        rules=SGLANG)
    return serving, {p.path: p for p in providers.serving_paths(entries, SGLANG)}, {x.id: x for x in checks}


def test_an_sgl_kernel_built_for_sm100_only_fails_the_serving_path_on_sm120_and_passes_on_sm100(built, tmp_path):
    """sgl-project/sglang#12178's class: what SGLang loads on an RTX PRO 6000 (sgl_kernel/sm100/) has no code
    for 12.0. Judged by vLLM's serving path (the probe before issue 51 item 6) it was not even looked at."""
    site = sglang_site(tmp_path, built, sm100="sm100-only")
    serving, _, _ = judge(site, "12.0")
    assert serving.status == FAIL and serving.required
    assert ("sgl_kernel/sm100/common_ops.abi3.so (what SGLang 0.5.23 loads on 12.0): no runnable code at all "
            "(SASS sm_100a; PTX -)") in serving.reason
    assert serving.evidence["coverage"]["sgl_kernel/sm100/common_ops.abi3.so"] == {
        "10.0": "native", "10.3": "none", "11.0": "none", "12.0": "none", "12.1": "none"}
    assert "sgl_kernel/sm100/common_ops.abi3.so: 10.0 (none for 10.3, 11.0, 12.0, 12.1)" in serving.reason
    ok, _, _ = judge(site, "10.0")
    assert ok.status == PASS and "sgl_kernel/sm100/common_ops.abi3.so native (what SGLang 0.5.23 loads on 10.0)" in ok.reason
    assert [e["loads"] for e in ok.evidence["engines"]] == ["sgl_kernel/sm100/common_ops.abi3.so"]


def test_the_wheels_arch_list_passes_on_b200_b300_and_the_rtx_5090_not_on_gb10(built, tmp_path):
    """sm_100f and sm_120a, as sglang-kernel 0.4.10's x86_64 wheel carries them: 12.1 has nothing (`a` code is
    for exactly 12.0)."""
    site = sglang_site(tmp_path, built)
    for cap, klass in (("10.0", Compat.NATIVE), ("10.3", Compat.COMPATIBLE), ("12.0", Compat.NATIVE)):
        serving, _, _ = judge(site, cap)
        assert serving.status == PASS and f"common_ops.abi3.so {klass.value}" in serving.reason, serving.reason
    gb10, _, _ = judge(site, "12.1")
    assert gb10.status == FAIL and "no runnable code at all (SASS sm_100f, sm_120a" in gb10.reason


def test_hopper_loads_the_sm90_build(built, tmp_path):
    site = sglang_site(tmp_path, built, sm100="sm100-only")
    serving, _, _ = judge(site, "9.0")
    assert serving.status == PASS and "sgl_kernel/sm90/common_ops.abi3.so native (what SGLang 0.5.23 loads on 9.0)" \
        in serving.reason


def test_sglang_without_sgl_kernel_fails_at_start_up(built, tmp_path):
    serving, _, _ = judge(sglang_site(tmp_path, built, sm100=None), "12.0")
    assert serving.status == FAIL
    assert ("SGLang 0.5.23 loads sgl_kernel's common_ops" in serving.reason and
            "sgl_kernel/sm100/common_ops.abi3.so or sgl_kernel/common_ops.abi3.so is not in the image" in serving.reason)


@pytest.mark.parametrize("variant, verdict", [("blackwell", "present"), ("blackwell-no-fp8", "missing")])
def test_sgl_kernels_fp8_gemm_is_judged_by_its_kernel_family(built, tmp_path, variant, verdict):
    """linear.fp8 on a B200: SGLang runs sgl_kernel's fp8_scaled_mm (CUTLASS, SM100 mainloop); a common_ops with
    sm_100f code but the GEMM guarded out has the kernel's name and no code: missing, with Triton named."""
    _, paths, checks = judge(sglang_site(tmp_path, built, sm100=variant), "10.0")
    p = paths["linear.fp8"]
    assert (p.provider, p.verdict) == ("cutlass", verdict), p.reason
    assert [(f.name, f.present) for f in p.families] == [("sgl-fp8-sm100", verdict == "present")]
    if verdict == "missing":
        assert p.runs == "triton" and p.fallback.cli == "USE_TRITON_W8A8_FP8_KERNEL=1"
        assert checks["providers.sglang.linear.fp8"].status == FAIL
        assert "sgl_kernel's CUTLASS FP8 GEMM for SM100 (fp8_scaled_mm): missing from sgl_kernel/sm100" in p.reason
    else:
        assert p.families[0].code == ("sm_100f",)


def test_the_probe_judges_an_image_with_both_engines_by_both(built, tmp_path):
    """`qualify probe --path SITE`: vLLM's checks and SGLang's side by side, the census path naming what SGLang
    loads, and the manifest's serving paths marked by engine (the deploy reads vLLM's)."""
    site = sglang_site(tmp_path, built, sm100="sm100-only", vllm=True)
    out = tmp_path / "probe.json"
    subprocess.run([sys.executable, "-m", "qualify", "probe", "--target", "sm120", "--only", "static", "--path",
                    str(site), "--out", str(out)], cwd=REPO, capture_output=True, text=True, timeout=900)
    doc = json.loads(out.read_text())
    jsonschema.validate(doc, SCHEMA)
    p = doc["predicate"]
    checks = {c["id"]: c for c in p["checks"]}
    assert checks["census.serving-path"]["status"] == "fail"
    assert "what SGLang 0.5.23 loads on 12.0" in checks["census.serving-path"]["reason"]
    for key in (t.key for t in SGLANG.tables):
        assert f"providers.sglang.{key}" in checks
    assert "providers.attention.bf16" in checks and checks["providers.sglang.attention.bf16"]["required"]
    assert checks["providers.sglang.attention.bf16"]["title"] == "Attention provider SGLang would use: bf16 attention"
    paths = ServingPaths.of_predicate(p)
    assert {sp.engine for sp in paths.paths} == {"vllm", "sglang"} and not paths.problems
    assert paths.get("attention.bf16").engine == "vllm"
    assert paths.get("attention.bf16", "sglang").provider == "triton"  # no flashinfer in the site: SGLang's else branch
    assert {e.get("engine", "vllm") for e in p["providers"]} == {"vllm", "sglang"}
