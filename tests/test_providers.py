"""qualify.probe.providers: vLLM 0.33.0's selection rules combined with the census,
and the vllm_providers snippet in a child interpreter."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path
from typing import Dict, Optional

import pytest

from qualify.core.arch import Capability, Compat
from qualify.probe import providers as P
from qualify.probe.model import FAIL, NOT_RUN, PASS, WARN
from qualify.probe.subproc import run_python, run_snippet

REPO = Path(__file__).resolve().parent.parent
MINE = sorted((REPO / "qualify/probe/providers").glob("*.py")) + [
    REPO / "qualify/probe/selfsufficiency.py", REPO / "qualify/probe/snippets/vllm_providers.py"]

# vLLM 0.33.0's pins plus what its wheel pulls in (torch 2.14.0, triton 3.8.0, ...). The
# PyPI-latest flashinfer-cubin (0.6.13) beside flashinfer-python 0.7.2.post1 is the mismatch
# an unpinned `pip install flashinfer-cubin` gives.
PINS = {"vllm": "0.33.0", "torch": "2.14.0", "triton": "3.8.0", "flashinfer-python": "0.7.2.post1",
        "nvidia-cutlass-dsl": "4.8.0", "humming-kernels": "0.1.19"}
CUBIN_MISMATCH = dict(PINS, **{"flashinfer-cubin": "0.6.13"})
CUBIN_MATCH = dict(PINS, **{"flashinfer-cubin": "0.7.2.post1"})

JIT_OK = {"nvcc": "/usr/local/cuda/bin/nvcc", "nvcc_version": "13.0", "ninja": "/usr/bin/ninja",
          "nvcc_targets": ["sm_75", "sm_80", "sm_90", "sm_100", "sm_103", "sm_110", "sm_120", "sm_121"]}
NO_JIT = {"nvcc": None, "nvcc_version": None, "nvcc_targets": None, "ninja": "/usr/bin/ninja"}


def lib(sass, ptx=(), worst: Optional[str] = None, cross: bool = False) -> P.CensusRecord:
    return P.CensusRecord(worst=Compat(worst) if worst else None, sass=tuple(sass), ptx=tuple(ptx),
                          cross_generation_ptx=cross)


def census(cap: str, **override) -> Dict[str, P.CensusRecord]:
    """What vLLM 0.33.0's x86_64 wheel carries (measured with qualify.core.census): FA2 sm_80 +
    compute_80, FA3 sm_90a only, FlashMLA sm_90a + sm_100f, _C up to sm_120f."""
    c = Capability.parse(cap)
    fa2_class = "ptx-jit"
    out = {
        "vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so": lib(["sm_80"], ["compute_80"], fa2_class, cross=c.major != 8),
        "vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so": lib(["sm_90a"], (), "native" if cap == "9.0" else "none"),
        "vllm/_flashmla_C.abi3.so": lib(["sm_90a", "sm_100f"], (), "native" if c.major in (9, 10) else "none"),
        "vllm/_C_stable_libtorch.abi3.so": lib(["sm_80", "sm_90", "sm_90a", "sm_100", "sm_100f", "sm_120", "sm_120f"],
                                               ["compute_80", "compute_90"], "none"),
        "vllm/_moe_C_stable_libtorch.abi3.so": lib(["sm_80", "sm_90", "sm_100", "sm_120", "sm_120f"], ["compute_80"],
                                                   "none"),
        "torch/lib/libtorch_cuda.so": lib(["sm_80", "sm_90", "sm_100", "sm_120"], [], "none"),
    }
    out.update(override)
    return out


def run(cap: str, packages=PINS, cen=None, toolchain=JIT_OK, **kw):
    entries, checks = P.predict(Capability.parse(cap), packages, census(cap) if cen is None else cen, None,
                                toolchain=toolchain, **kw)
    return {e.key: e.to_json() for e in entries}, {c.id: c for c in checks}


VLLM_CHOICES = P.VLLM_0_33_SELECTIONS


@pytest.mark.parametrize("cap", sorted(VLLM_CHOICES))
def test_vllm_would_select_matches_vllm_0_33(cap):
    entries, _ = run(cap)
    got = {k: e["vllm_would_select"] for k, e in entries.items() if k in VLLM_CHOICES[cap]}
    assert got == VLLM_CHOICES[cap]


# (capability, kind.variant) -> what can really run in vLLM 0.33.0's wheel with nvcc but no
# flashinfer-cubin: the census and the cubin download change four answers.
SELECTED = {
    ("9.0", "attention.bf16"): "FLASH_ATTN(FA3)",
    ("10.0", "attention.mla"): "CUTLASS_MLA",  # FLASHINFER_MLA needs trtllm-gen cubins
    ("10.0", "moe.bf16"): "FLASHINFER_CUTLASS",  # FLASHINFER_TRTLLM likewise
    ("10.3", "moe.bf16"): "FLASHINFER_CUTLASS",
    ("12.1", "attention.bf16"): "FLASH_ATTN(FA2)",  # through sm_80 PTX
    ("13.0", "linear.fp8"): "MARLIN",  # CUTLASS FP8 has no code beyond sm_120f
}


@pytest.mark.parametrize("cap,key", sorted(SELECTED))
def test_selected_is_what_can_run(cap, key):
    entries, _ = run(cap)
    assert entries[key]["selected"] == SELECTED[(cap, key)]
    assert entries[key]["mode"] == "predicted"


def test_provider_dict_shape():
    entries, _ = run("12.1")
    e = entries["attention.bf16"]
    assert {"kind", "variant", "selected", "mode", "candidates", "reason"} <= set(e)
    assert (e["kind"], e["variant"]) == ("attention", "bf16")
    for c in e["candidates"]:
        assert {"name", "available", "reason"} <= set(c) and isinstance(c["available"], bool)


def test_fa2_cross_generation_ptx_is_available_with_a_warning():
    entries, checks = run("12.1")
    fa2 = entries["attention.bf16"]["candidates"][0]
    assert fa2["name"] == "FLASH_ATTN(FA2)" and fa2["available"]
    assert "cross-generation PTX" in fa2["warning"]
    assert checks["providers.attention.bf16"].status == WARN
    assert "cross-generation" in checks["providers.attention.bf16"].reason
    assert checks["providers.attention.bf16"].required  # every model serves through it


def test_fa2_without_any_code_is_not_available_however_well_it_imports():
    cen = census("12.1", **{"vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so": lib(["sm_80"], (), "none")})
    entries, checks = run("12.1", cen=cen)
    e = entries["attention.bf16"]
    assert e["vllm_would_select"] == "FLASH_ATTN(FA2)"  # vLLM imports it and picks it
    assert e["selected"] == "FLASHINFER"
    assert not e["candidates"][0]["available"] and "no code that runs on 12.1" in e["candidates"][0]["reason"]
    # vLLM's gate is import-only: it picks FA2 and fails at its first launch. A path whose pick cannot run is a
    # failure (issue 50), naming what runs and the flag that selects it.
    check = checks["providers.attention.bf16"]
    assert check.status == FAIL
    assert "fails at its first kernel launch" in check.reason and "--attention-backend FLASHINFER" in check.reason
    assert check.evidence["serving_path"]["verdict"] == "missing"
    assert check.evidence["serving_path"]["fallback"]["provider"] == "FLASHINFER"


def test_fa3_sm90a_only_counts_on_hopper_and_nowhere_else():
    entries, checks = run("9.0")
    assert entries["attention.bf16"]["selected"] == "FLASH_ATTN(FA3)"
    assert checks["providers.attention.bf16"].status == PASS
    cen = census("9.0", **{"vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so": lib(["sm_90"], (), "none")})
    entries, _ = run("9.0", cen=cen)
    assert entries["attention.bf16"]["vllm_would_select"] == "FLASH_ATTN(FA3)"
    assert entries["attention.bf16"]["selected"] == "FLASH_ATTN(FA2)"


def test_nothing_runs_is_a_failure():
    cen = census("12.1", **{"vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so": lib(["sm_80"], (), "none")})
    pkgs = {k: v for k, v in PINS.items() if k not in ("triton", "flashinfer-python")}
    _, checks = run("12.1", packages=pkgs, cen=cen)
    assert checks["providers.attention.bf16"].status == FAIL
    assert "no provider can run" in checks["providers.attention.bf16"].reason


def test_missing_cubins_make_trtllm_moe_unavailable_on_10x():
    entries, checks = run("10.0")
    moe = entries["moe.bf16"]
    trtllm = moe["candidates"][0]
    assert trtllm["name"] == "FLASHINFER_TRTLLM" and not trtllm["available"]
    assert "flashinfer-cubin is not installed" in trtllm["reason"]
    check = checks["providers.moe.bf16"]
    assert check.status == FAIL and "--moe-backend flashinfer_cutlass" in check.reason  # vLLM picks TRTLLM
    assert not check.required  # a dense model never takes it: the deploy judges the model's paths


def test_cubin_mismatch_of_vllm_0_33_pins_breaks_trtllm_attention_on_10x():
    entries, _ = run("10.0", packages=CUBIN_MISMATCH)
    att = entries["attention.bf16"]
    assert att["vllm_would_select"] == "FLASHINFER"
    fi = att["candidates"][0]
    assert not fi["available"] and "0.6.13" in fi["reason"] and "0.7.2.post1" in fi["reason"]
    assert att["selected"] == "FLASH_ATTN(FA4)"


def test_matching_cubins_make_everything_first_choice_on_10x():
    entries, checks = run("10.0", packages=CUBIN_MATCH)
    assert entries["moe.bf16"]["selected"] == "FLASHINFER_TRTLLM"
    assert entries["attention.bf16"]["selected"] == "FLASHINFER"
    assert checks["providers.moe.bf16"].status == PASS


def test_no_jit_toolchain_turns_flashinfer_off_in_vllm_and_in_reality():
    entries, checks = run("12.1", toolchain=NO_JIT)
    moe = entries["moe.bf16"]
    assert moe["vllm_would_select"] == "TRITON" == moe["selected"]  # vLLM's has_flashinfer() is False
    assert moe["preferred"] == "FLASHINFER_CUTLASS"
    assert checks["providers.moe.bf16"].status == WARN
    assert "FLASHINFER_CUTLASS unavailable" in checks["providers.moe.bf16"].reason


def test_flashinfer_attention_import_only_on_10x_without_nvcc():
    entries, _ = run("10.0", toolchain=NO_JIT)
    att = entries["attention.bf16"]
    assert att["vllm_would_select"] == "FLASHINFER"  # the attention backend only imports flashinfer
    assert att["selected"] == "FLASH_ATTN(FA4)"


def test_flashinfer_jit_cache_replaces_nvcc():
    pkgs = dict(PINS, **{"flashinfer-jit-cache": "0.7.2.post1+cu130", "flashinfer-cubin": "0.7.2.post1"})
    entries, _ = run("12.1", packages=pkgs, toolchain=NO_JIT)
    assert entries["moe.bf16"]["selected"] == "FLASHINFER_CUTLASS"
    assert "flashinfer-jit-cache 0.7.2.post1+cu130" in entries["moe.bf16"]["candidates"][1]["reason"]


@pytest.mark.parametrize("cap,expect", [("9.0", "MACHETE"), ("10.0", "MARLIN"), ("10.3", "MARLIN"),
                                        ("12.0", "MARLIN"), ("12.1", "MARLIN")])
def test_w4a16(cap, expect):
    entries, _ = run(cap)
    assert entries["linear.w4a16"]["selected"] == expect


def test_cutlass_needs_sass_for_the_family():
    # A _C built for 12.0a only (the arch list that maps 12.1 to 12.0) has no CUTLASS code for 12.1.
    cen = census("12.1", **{"vllm/_C_stable_libtorch.abi3.so": lib(["sm_90a", "sm_100a", "sm_120a"], ["compute_90"])})
    entries, checks = run("12.1", cen=cen)
    fp8 = entries["linear.fp8"]
    assert fp8["vllm_would_select"] == "CUTLASS" and fp8["selected"] == "TORCH"
    assert checks["providers.linear.fp8"].status == FAIL  # vLLM picks CUTLASS, which has no code for 12.1


def test_nvfp4_on_hopper_is_a_weight_only_fallback():
    entries, checks = run("9.0")
    assert entries["linear.nvfp4"]["selected"] == "HUMMING"
    assert "slow path" in entries["linear.nvfp4"]["candidates"][4]["warning"]
    assert checks["providers.linear.nvfp4"].status == WARN
    assert checks["providers.linear.nvfp4"].evidence["serving_path"]["verdict"] == "fallback"


def test_unknown_capability_warns():
    entries, checks = run("13.0")
    for check in checks.values():
        assert check.status in (WARN, FAIL)
        assert "13.0 is not a recognised capability" in check.reason


def test_not_installed_is_not_run_and_not_required():
    entries, checks = P.predict(Capability.parse("12.1"), {"torch": "2.14.0"}, {}, None)
    assert entries == []
    assert [c.id for c in checks] == [f"providers.{t.key}" for t in P.TABLES]
    assert len(checks) == 12
    for c in checks:
        assert c.status == NOT_RUN and not c.required and c.reason == "vLLM is not installed in this image"


def test_no_census_means_unverified_not_unavailable():
    entries, _ = run("12.1", cen={})
    fa2 = entries["attention.bf16"]["candidates"][0]
    assert fa2["available"] and "no census" in fa2["warning"]


def test_other_vllm_versions_are_flagged():
    _, checks = run("9.0", packages=dict(PINS, vllm="0.34.1"))
    assert checks["providers.attention.bf16"].status == WARN and "0.34.1" in checks["providers.attention.bf16"].reason


def test_absolute_census_keys_and_site_packages(tmp_path):
    sp = tmp_path / "site-packages"
    (sp / "vllm/vllm_flash_attn").mkdir(parents=True)
    (sp / "vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so").write_bytes(b"")
    cen = {str(sp / k): v for k, v in census("12.1").items()}
    entries, _ = run("12.1", cen=cen, site_packages=[str(sp)])
    assert entries["attention.bf16"]["selected"] == "FLASH_ATTN(FA2)"
    # FA3/FlashMLA files are absent from this site-packages: vLLM's import gate fails.
    entries, _ = run("9.0", cen={str(sp / k): v for k, v in census("9.0").items()}, site_packages=[str(sp)])
    assert entries["attention.bf16"]["vllm_would_select"] == "FLASH_ATTN(FA2)"


def test_census_index_from_a_census_report():
    report = {"libraries": [{"path": "/x/site-packages/vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so",
                             "sass": ["sm_80"], "ptx": ["compute_80"],
                             "verdict": {"class": "ptx-jit", "best": "ptx-jit", "cross_generation_jit": True}}],
              "without_device_code": ["/x/site-packages/vllm/_flashmla_C.abi3.so"]}
    idx = P.census_index(report)
    rec = P.census_entry(idx, "vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so")
    assert rec.worst == "ptx-jit" and rec.cross_generation_ptx
    assert P.census_entry(idx, "vllm/_flashmla_C.abi3.so").worst == "none"


def test_runner_shape_class_best_worst():
    # A census row carries the worst unit's class and the best one's; worst must decide for "all".
    rec = P.CensusRecord.from_row({"class": "none", "best": "native", "sass": ["sm_80"], "ptx": [],
                                   "cross_generation_jit": False})
    cen = census("12.1", **{"vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so": rec})
    entries, _ = run("12.1", cen=cen)
    assert not entries["attention.bf16"]["candidates"][0]["available"]


def test_tables_name_their_vllm_sources_and_known_providers():
    for table in P.TABLES:
        assert table.source.startswith("vllm/")
        names = {p.name for p in table.providers}
        for _, order in table.priority:
            assert set(order) <= names


# --- observation ---------------------------------------------------------------


def snippet_json(**sections):
    return {"status": "ok", "mode": "observed", "vllm": "0.33.0", "capability": "12.1", "gpu": "NVIDIA GB10",
            "target": "12.1", "sections": sections}


def test_observed_providers_use_vllm_names_and_census_judgement():
    predicted, _ = P.predict(Capability.parse("12.1"), PINS,
                             census("12.1", **{"vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so": lib(["sm_80"], (), "none")}),
                             None, toolchain=JIT_OK)
    data = snippet_json(**{
        "attention.bf16": {"selected": "FLASH_ATTN", "flash_attn_version": 2, "order": ["FLASH_ATTN", "FLASHINFER"],
                           "rejected": {}},
        "linear.fp8": {"selected": "CutlassFP8ScaledMMLinearKernel", "chosen_by_vllm": "CutlassFP8ScaledMMLinearKernel",
                       "order": ["CutlassFP8ScaledMMLinearKernel"], "rejected": {}}})
    observed = P.observed_providers(data, predicted)
    by = {o.key: o.to_json() for o in observed}
    assert by["attention.bf16"]["selected"] == "FLASH_ATTN(FA2)" and by["attention.bf16"]["mode"] == "observed"
    assert by["linear.fp8"]["selected"] == "CUTLASS"
    merged = P.merge(predicted, observed)
    assert [m.to_json()["mode"] for m in merged].count("observed") == 2
    checks = {c.id: c for c in P.provider_checks(merged, Capability.parse("12.1"), "0.33.0",
                                                 paths=P.serving_paths(predicted))}
    assert checks["providers.attention.bf16"].status == FAIL  # the kernels are not in the files, whatever vLLM says
    assert "vLLM selected FLASH_ATTN(FA2) but it cannot run" in checks["providers.attention.bf16"].reason


@pytest.mark.parametrize("data", [{"status": "no-gpu"}, {"status": "not-installed"},
                                  {"status": "ok", "mode": "evaluated", "sections": {"moe.bf16": {"selected": "X"}}}])
def test_no_observation_without_a_gpu(data):
    assert P.observed_providers(data) == []


# --- the snippet in a child interpreter ---------------------------------------


def test_snippet_reports_vllm_not_installed():
    # The dev venv has no vLLM: the snippet says so and exits 0.
    child = run_python(["-S", str(Path(P.__file__).parent.parent / "snippets/vllm_providers.py")], timeout=60)
    assert child.ok, child.failure()
    assert child.data["status"] == "not-installed"
    assert child.data["reason"] == "vLLM is not installed in this image"
    assert P.observation_failure(child) == "vLLM is not installed in this image"


def fake_stack(root: Path, cuda_available: bool) -> Path:
    """A site dir where `vllm` exists and `torch` sees no GPU (no real torch needed)."""
    (root / "vllm").mkdir(parents=True)
    (root / "vllm/__init__.py").write_text("__version__ = '0.33.0'\n")
    (root / "torch").mkdir()
    (root / "torch/__init__.py").write_text(
        "class cuda:\n"
        f"    is_available = staticmethod(lambda: {cuda_available})\n"
        "    device_count = staticmethod(lambda: 0)\n")
    return root


def test_snippet_reports_no_gpu(tmp_path):
    site = fake_stack(tmp_path / "site", cuda_available=False)
    child = run_snippet("vllm_providers", ["--target", "12.1"], timeout=60, env={"PYTHONPATH": str(site)})
    assert child.ok, child.failure()
    assert child.data["status"] == "no-gpu" and child.data["target"] == "12.1"
    assert P.observed_providers(child.data) == []
    assert "no CUDA GPU" in P.observation_failure(child)


def test_snippet_reports_a_broken_torch(tmp_path):
    site = tmp_path / "site"
    (site / "vllm").mkdir(parents=True)
    (site / "vllm/__init__.py").write_text("")
    (site / "torch").mkdir()
    (site / "torch/__init__.py").write_text("raise OSError('libcudart.so.13: cannot open shared object file')\n")
    child = run_snippet("vllm_providers", [], timeout=60, env={"PYTHONPATH": str(site)})
    assert child.ok and child.data["status"] == "error" and "libcudart" in child.data["reason"]


# --- hygiene -------------------------------------------------------------------


def test_modules_import_nothing_outside_the_standard_library():
    # -S: no site-packages at all, so a non-stdlib import would fail outright; the
    # module list then shows nothing else came in either.
    code = ("import sys, json; before = set(sys.modules); "
            "import qualify.probe.providers, qualify.probe.selfsufficiency; "
            "import importlib.util as u; "
            "s = u.spec_from_file_location('snip', 'qualify/probe/snippets/vllm_providers.py'); "
            "m = u.module_from_spec(s); s.loader.exec_module(m); "
            "print(json.dumps(sorted({n.split('.')[0] for n in set(sys.modules) - before})))")
    out = subprocess.run([sys.executable, "-S", "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    new = set(json.loads(out.stdout.strip().splitlines()[-1]))
    foreign = {n for n in new if n not in sys.stdlib_module_names and n not in ("qualify", "snip")}
    assert not foreign, foreign


def test_cubin_package_without_code_for_the_target():
    cen = census("10.0", **{"flashinfer_cubin/cubins/fmha.cubin": lib(["sm_90a"], (), "none")})
    entries, _ = run("10.0", packages=CUBIN_MATCH, cen=cen)
    fi = entries["attention.bf16"]["candidates"][0]
    assert not fi["available"] and "have no code for 10.0" in fi["reason"]
    assert entries["moe.bf16"]["selected"] == "FLASHINFER_CUTLASS"


# --- census classes this probe does not know, and the rule data file -----------


def test_an_undecided_census_class_is_never_a_pass():
    # A newer census marks damaged or undecodable libraries with a class of its own.
    rec = P.CensusRecord.from_row({"class": "unknown", "best": "unknown", "sass": [], "ptx": [],
                                   "cross_generation_jit": False})
    assert not rec.decided and rec.worst is None
    entries, checks = run("9.0", cen=census("9.0", **{"vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so": rec}))
    fa3 = entries["attention.bf16"]["candidates"][0]
    assert fa3["name"] == "FLASH_ATTN(FA3)" and fa3["available"] and "could not" in fa3["warning"]
    assert checks["providers.attention.bf16"].status == WARN


def test_undecided_cubins_are_not_verified():
    rec = P.CensusRecord.from_row({"class": "unknown", "best": None, "sass": [], "ptx": []})
    entries, _ = run("10.0", packages=CUBIN_MATCH, cen=census("10.0", **{"flashinfer_cubin/cubins/fmha.cubin": rec}))
    fi = entries["attention.bf16"]["candidates"][0]
    assert fi["available"] and "not verified" in fi["warning"]


def rules_json() -> dict:
    return json.loads(Path(P.rules.DEFAULT_FILE).read_text())


def test_rule_data_is_the_tables():
    assert P.rules.parse(rules_json(), "x.json") == dataclasses.replace(P.RULES, path="x.json")


@pytest.mark.parametrize("edit,message", [
    (lambda d: d["tables"][0]["providers"][0].update(caps={"lo": "eight"}),
     "tables[0].providers[0].caps.lo: expected a capability"),
    (lambda d: d["tables"][1]["priority"]["*"].append("NO_SUCH"), "tables[1].priority.*[4]: \"NO_SUCH\" is not one of"),
    (lambda d: d["tables"][2]["providers"][0].update(needs=["nvcc"]), "tables[2].providers[0].needs[0]"),
    (lambda d: d["tables"][0]["providers"][0].update(libs=["fa9"]), "tables[0].providers[0].libs[0]"),
    (lambda d: d["tables"][0]["providers"][0].update(colour="red"), "unknown key(s) colour"),
    (lambda d: d["selections"]["by_capability"]["12.1"].update({"moe.bf16": "FA2"}),
     "selections.by_capability.12.1.moe.bf16"),
    (lambda d: d.update(schema_version=2), "schema_version: this probe reads version 1"),
])
def test_rule_data_errors_say_where(edit, message):
    data = rules_json()
    edit(data)
    with pytest.raises(P.RulesError) as err:
        P.rules.parse(data, "vllm-x.json")
    assert str(err.value).startswith("vllm-x.json: ") and message in str(err.value), str(err.value)


def test_rule_data_file_errors(tmp_path):
    bad = tmp_path / "r.json"
    bad.write_text('{"vllm": "1", "vllm": "2"}')
    with pytest.raises(P.RulesError, match="duplicate JSON key 'vllm'"):
        P.rules.load(str(bad))
    bad.write_text("{")
    with pytest.raises(P.RulesError, match="not JSON"):
        P.rules.load(str(bad))
