"""Committed evidence manifests stay valid and say what they claim."""

import json
from pathlib import Path

import jsonschema
import pytest

from qualify.core import manifest

REPO = Path(__file__).resolve().parent.parent
SCHEMA = json.loads((REPO / "manifests" / "manifest.schema.json").read_text())
EVIDENCE = sorted(p for p in (REPO / "manifests" / "evidence").rglob("*.json")
                  if not p.name.endswith(".sigstore.json"))  # the bundles of signed evidence


def test_there_is_evidence():
    assert EVIDENCE


@pytest.mark.parametrize("path", EVIDENCE, ids=lambda p: str(p.relative_to(REPO)))
def test_evidence_validates_against_the_schema(path):
    doc = manifest.load(path)
    jsonschema.validate(doc, SCHEMA)
    p = manifest.predicate(doc)
    assert p["verdict"] == manifest.verdict(p["checks"])


def test_h200_evidence_shows_the_allocator_failure_and_fix_and_blackwell_cross_compiles():
    doc = manifest.load(REPO / "manifests" / "evidence" / "h200" / "probe-sm120.json")
    p = manifest.predicate(doc)
    checks = {c["id"]: c for c in p["checks"]}
    scratch = checks["gpu.triton-scratch"]
    assert scratch["status"] == "pass" and "no allocator was set" in scratch["evidence"]["hook_off"]["error"]
    assert all(scratch["evidence"][w]["ok"] for w in ("main", "thread", "spawn"))
    for cid, arch in (("triton.cross-compile.100", "sm_100a"), ("triton.cross-compile", "sm_120a"),
                      ("triton.cross-compile.121", "sm_121a")):
        assert checks[cid]["status"] == "pass" and checks[cid]["evidence"]["cubin_arches"] == [arch]
    wiring = checks["triton.ptxas-wiring"]
    assert wiring["status"] == "pass" and wiring["evidence"]["expected_knob"] == "ptxas_blackwell"
    assert wiring["evidence"]["triton"].startswith("3.6")
    assert checks["gpu.device"]["status"] == "warn" and "outside the Blackwell targets" in checks["gpu.device"]["reason"]
    assert p["support_level"] == "unverified" and p["gpu"]["devices"][0]["compute_cap"] == "9.0"
    for cid in ("gpu.memory", "gpu.bf16-matmul", "gpu.torch-compile"):
        assert checks[cid]["status"] == "pass"


def test_two_gpu_evidence_shows_a_passing_allreduce_with_every_rank_and_bandwidth():
    doc = manifest.load(REPO / "manifests" / "evidence" / "h200x2" / "probe-sm120.json")
    check = {c["id"]: c for c in manifest.predicate(doc)["checks"]}["gpu.nccl-allreduce"]
    ev = check["evidence"]
    assert check["status"] == "pass" and ev["ok"] is True and ev["world_size"] == 2
    assert [r["rank"] for r in ev["ranks"]] == [0, 1] and ev["exit_codes"] == [0, 0]
    assert all(r["all_equal"] and r["value"] == 3.0 for r in ev["ranks"])
    assert ev["nccl"].startswith("2.") and ev["env"]["NCCL_NVLS_ENABLE"] == "0"
    bw = ev["bandwidth"]
    assert bw["bytes"] == 256 << 20
    # busbw follows from the measured time (nccl-tests' definition), not typed in.
    algbw = bw["bytes"] / (bw["time_us"] / 1e6) / 1e9
    assert abs(bw["algbw_gbs"] - algbw) / algbw < 1e-3 and bw["busbw_gbs"] == bw["algbw_gbs"]
    assert f"busbw {bw['busbw_gbs']:g} GB/s" in check["reason"]


def _census_row(name: str, library: str) -> str:
    text = (REPO / "manifests" / "evidence" / "vllm" / name).read_text()
    return next(line for line in text.splitlines() if line.startswith(library))


def test_vllm_wheel_census_leaves_kernel_less_containers_out_and_says_unknown_without_a_decoder():
    """Issue 15, item 1, on the real vLLM 0.33.0 wheel: 11 kernel-less containers of `_C` are not units."""
    c = "vllm/_C_stable_libtorch.abi3.so"
    assert "25/107" in _census_row("census-wheel-sm120.txt", c).split()
    assert "none" in _census_row("census-wheel-sm120.txt", "vllm/_deepselect_C.abi3.so").split()
    undecided = _census_row("census-wheel-sm120-no-decoder.txt", c).split()
    assert "unknown" in undecided and "none" not in undecided and "0/118" in undecided
    assert "compatible" in _census_row("census-wheel-sm121.txt", c).split()  # best on 12.1: sm_120 code


def test_h200_evidence_records_the_bf16_rate_and_names_its_probe():
    doc = manifest.load(REPO / "manifests" / "evidence" / "h200" / "probe-sm120.json")
    p = manifest.predicate(doc)
    bf16 = {c["id"]: c for c in p["checks"]}["gpu.bf16-matmul"]
    assert bf16["status"] == "pass" and 100 < bf16["evidence"]["tflops"] < 2000
    assert p["toolkit"]["probe_sha256"].startswith("sha256:")


def test_the_manifest_schema_knows_every_compatibility_class():
    from qualify.core.arch import Compat

    library = SCHEMA["$defs"]["library"]
    for key in ("class", "best"):
        assert set(library["properties"][key]["enum"]) - {None} == {c.value for c in Compat}


def test_sm121_vllm_evidence_ran_every_check_but_the_gpu_ones():
    """Issue 31: under qemu-user 10 torch imports in the arm64 image, so only GPU checks are not-run."""
    p = manifest.predicate(manifest.load(REPO / "manifests" / "evidence" / "vllm" / "sm121.json"))
    not_run = [c["id"] for c in p["checks"] if c["status"] == "not-run"]
    assert not_run and all(cid.startswith("gpu.") for cid in not_run), not_run
    assert p["verdict"] != "incomplete" and p["host"]["emulated"] and p["target"]["profile"] == "vllm"
    torch = p["versions"]["torch"]
    assert torch["status"] == "pass" and torch["torch"].startswith("2.14.0") and torch["arch_list"]
    checks = {c["id"]: c for c in p["checks"]}
    assert checks["triton.cross-compile"]["evidence"]["cubin_arches"] == ["sm_121a"]
    assert not p["toolkit"]["source_revision"].endswith("-dirty")


def test_sm120_vllm_evidence_reads_every_container_and_names_what_cannot_run():
    """Issue 29, item 3: the sm120 vLLM image re-qualified by the probe that decodes inside the image."""
    p = manifest.predicate(manifest.load(REPO / "manifests" / "evidence" / "vllm" / "sm120.json"))
    assert p["census"]["decoders"] == {"zstd": True, "lz4": True}
    libs = {lib["short"]: lib for lib in p["census"]["libraries"]}
    assert not [s for s, lib in libs.items() if lib["counts"].get("unknown")], "a container stayed undecoded"
    checks = {c["id"]: c for c in p["checks"]}
    gaps = checks["census.unit-gaps"]
    assert gaps["status"] == "warn" and gaps["evidence"]["libraries"]["vllm/_C_stable_libtorch.abi3.so"] == 7
    assert "7 of 107 units" in gaps["reason"]
    for name in ("vllm/_deepselect_C.abi3.so", "vllm/_qutlass_C.abi3.so", "vllm/_flashmla_C.abi3.so"):
        assert libs[name]["class"] == "none" and libs[name]["best"] == "none", name
        assert f"{name} (" in checks["census.arch-specific"]["reason"]
    assert [c for c in checks.values() if c["status"] == "not-run"] and all(
        cid.startswith("gpu.") for cid, c in checks.items() if c["status"] == "not-run")
    assert p["verdict"] == "warn" and p["support_level"] == "unverified"  # not-run is never pass
    assert not p["toolkit"]["source_revision"].endswith("-dirty")
    shown = (REPO / "manifests" / "evidence" / "vllm" / "sm120.txt").read_text()
    assert "None" not in shown.split("libraries (")[1] and "link input" in shown  # archives say what they are


def test_sm120_vllm_evidence_of_the_current_probe_keeps_the_offline_claim_with_no_cubin_user_on_12_0():
    """Issue 51, item 5: runtime.downloads is pass or a failure that withholds the offline claim, never a
    warning beside it; on 12.0 no provider vLLM 0.33 selects runs FlashInfer's downloaded cubins."""
    p = manifest.predicate(manifest.load(REPO / "manifests" / "evidence" / "vllm" / "sm120.probe-a7f2cd5.json"))
    checks = {c["id"]: c for c in p["checks"]}
    downloads = checks["runtime.downloads"]
    assert downloads["status"] == "pass" and downloads["evidence"]["offline"] is True
    assert "no provider" in downloads["reason"]
    paths = {sp["path"]: sp["verdict"] for sp in p["serving_paths"]}
    assert len(paths) == 12 and paths["moe.mxfp4"] == "fallback"
    assert all(v == "present" for k, v in paths.items() if k != "moe.mxfp4")
    assert p["toolkit"]["source_revision"].startswith("a7f2cd5") and not p["toolkit"]["source_revision"].endswith("-dirty")
