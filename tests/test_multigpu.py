"""Tensor parallelism across a node's GPUs (issue 44), tested on a machine that has no GPU at all.

TEST DOUBLES, each labelled where it is used:
- tests/standin/nvidia-smi gives preflight the GPUs a test describes (STANDIN_GPUS) and how they are joined
  (STANDIN_TOPO, for `nvidia-smi topo -m`);
- a stand-in `nvidia-container-runtime-hook` on PATH makes preflight find "the NVIDIA container runtime", so a
  dry run writes the compose file a GPU host would get (a dry run starts nothing);
- the probe's collectives run over gloo between CPU processes (BLACKWELL_COLLECTIVES_STANDIN=gloo): real
  torch.distributed, real comparisons with the single-GPU reference, no GPU;
- a stand-in NCCL result (the shape the probe's snippet prints, with a bandwidth the test chooses) drives the
  probe's floor and the deploy's all-reduce gate.
Nothing here was run on two GPUs; the command for a lent 2-GPU machine is scripts/allreduce-evidence.sh.
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path
from typing import Optional

import pytest
from conftest import REPO, require
from evidence_helpers import TF, Lab, gpu_check, gpu_checks
from multigpu_standins import NVLINK, probe_check, standin_result
from signing_helpers import DIGEST_A

from qualify.config import targets
from qualify.core import topology
from qualify.core.errors import ConfigError
from qualify.core.fsutil import canonical_json
from qualify.deploy import allreduce, collectives, compose, heads, settings
from qualify.probe import gpu, subproc
from qualify.release import evidence as ev
from qualify.release import rows
from qualify.signing import signer
from qualify.trust import folder, gpuconfig
from qualify.trust.verify import KeyAnchor

# --- how GPUs are joined: nvidia-smi topo -m ---------------------------------------------------------------

# What nvidia-smi prints on a two-socket PCIe host with a NIC: an underlined header (escape codes, also into a
# pipe), NIC rows and columns, the affinity columns and a legend (format of the committed h200x2/host.txt).
TWO_SOCKETS = ("\x1b[4m\tGPU0\tGPU1\tGPU2\tGPU3\tNIC0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\x1b[0m\n"
               "GPU0\t X \tPIX\tSYS\tSYS\tPHB\t0-15\t0\t\tN/A\n"
               "GPU1\tPIX\t X \tSYS\tSYS\tPHB\t0-15\t0\t\tN/A\n"
               "GPU2\tSYS\tSYS\t X \tNODE\tSYS\t16-31\t1\t\tN/A\n"
               "GPU3\tSYS\tSYS\tNODE\t X \tSYS\t16-31\t1\t\tN/A\n"
               "NIC0\tPHB\tPHB\tSYS\tSYS\t X \t\t\t\t\n\nLegend:\n\n  X    = Self\n  SYS  = ...\n\nNIC Legend:\n\n"
               "  NIC0: mlx5_0\n")


def test_the_committed_two_h200_topology_is_nvlink():
    text = (REPO / "manifests" / "evidence" / "h200x2" / "host.txt").read_text()
    joined = topology.for_gpus(topology.parse_matrix(text), [0, 1])
    assert joined.kind == topology.NVLINK and [lk.cell for lk in joined.links] == ["NV18"]


@pytest.mark.parametrize("indices, kind", [([0, 1], "pcie-switch"), ([2, 3], "host-bridge"), ([0, 2], "cross-socket"),
                                           ([0, 1, 2, 3], "cross-socket"), ([1], "single")])
def test_the_weakest_link_among_the_chosen_gpus_is_their_topology(indices, kind):
    assert topology.for_gpus(topology.parse_matrix(TWO_SOCKETS), indices).kind == kind


def test_an_unknown_link_or_a_missing_pair_is_never_guessed():
    odd = TWO_SOCKETS.replace("GPU0\t X \tPIX", "GPU0\t X \tC2C").replace("GPU1\tPIX", "GPU1\tC2C")
    assert topology.for_gpus(topology.parse_matrix(odd), [0, 1]).kind == topology.UNKNOWN
    with pytest.raises(topology.TopologyError, match="GPU 0 and GPU 7"):
        topology.for_gpus(topology.parse_matrix(TWO_SOCKETS), [0, 7])
    with pytest.raises(topology.TopologyError, match="no GPU columns"):
        topology.parse_matrix("No devices were found\n")
    with pytest.raises(topology.TopologyError, match="its links give"):
        topology.from_json({"kind": "nvlink", "links": [{"gpus": [0, 1], "link": "PHB", "kind": "nvlink"}]})


def test_a_floor_applies_from_its_gpu_count_up():
    floors = (topology.AllReduceFloor("nvlink", 2, 150.0), topology.AllReduceFloor("nvlink", 8, 400.0))
    assert topology.floor_for(floors, "nvlink", 4).min_bus_gbps == 150.0
    assert topology.floor_for(floors, "nvlink", 8).min_bus_gbps == 400.0
    assert topology.floor_for(floors, "nvlink", 16).min_bus_gbps == 400.0
    assert topology.floor_for(floors, "pcie-switch", 2) is None


# --- the floors, as data ------------------------------------------------------------------------------------


def test_the_floors_live_in_the_targets_file_and_the_nvlink_one_is_below_the_committed_measurement():
    tf = targets.load()
    assert {(f.topology, f.gpus) for f in tf.allreduce_floors} >= {(t, 2) for t in topology.TOPOLOGIES}
    probe = json.loads((REPO / "manifests" / "evidence" / "h200x2" / "probe-sm120.json").read_text())
    (check,) = [c for c in probe["predicate"]["checks"] if c["id"] == "gpu.nccl-allreduce"]
    measured = check["evidence"]["bandwidth"]["busbw_gbs"]  # 298.7 GB/s, 2 x H200 over NV18
    assert measured >= topology.floor_for(tf.allreduce_floors, "nvlink", 2).min_bus_gbps


@pytest.mark.parametrize("edit, message", [
    (lambda t: t.replace('  { topology = "cross-socket", gpus = 2, min_bus_gbps = 3.0 },\n', ""),
     "no floor for 2 GPUs of cross-socket"),
    (lambda t: t.replace('topology = "pcie-switch"', 'topology = "pcie"'), "'pcie' is not one of"),
    (lambda t: t.replace('min_bus_gbps = 150.0', 'min_bus_gbps = 0.0'), "outside 0 (exclusive)"),
    (lambda t: t.replace('{ topology = "nvlink", gpus = 2,', '{ topology = "nvlink", gpus = 1,'), "outside 2..1024"),
    (lambda t: t.replace('  { topology = "nvlink", gpus = 2, min_bus_gbps = 150.0 },\n',
                         '  { topology = "nvlink", gpus = 2, min_bus_gbps = 150.0 },\n'
                         '  { topology = "nvlink", gpus = 2, min_bus_gbps = 160.0 },\n'), "a second floor for nvlink"),
])
def test_a_broken_allreduce_table_is_refused_naming_the_entry(tmp_path, edit, message):
    text = (REPO / "images" / "targets.toml").read_text()
    changed = edit(text)
    assert changed != text
    path = tmp_path / "targets.toml"
    path.write_text(changed)
    with pytest.raises(ConfigError, match=re.escape(message)):
        targets.load(path)


# --- settings -----------------------------------------------------------------------------------------------


def _values(**kw: str) -> dict:
    return {"GPU_DEVICE": "0", "TENSOR_PARALLEL_SIZE": "", "EXTRA_SERVE_ARGS": "", **kw}


@pytest.mark.parametrize("devices, chosen", [("0", ("0",)), ("0,1", ("0", "1")), ("all", ()),
                                             ("GPU-a, GPU-b", ("GPU-a", "GPU-b"))])
def test_gpu_device_takes_an_index_a_uuid_a_list_or_all(devices, chosen):
    assert settings.gpu_problems(_values(GPU_DEVICE=devices)) == []
    assert settings.gpu_devices(devices) == chosen


@pytest.mark.parametrize("kw, message", [
    ({"GPU_DEVICE": "0,"}, "a comma-separated list"), ({"GPU_DEVICE": "0;1"}, "a comma-separated list"),
    ({"GPU_DEVICE": "0,1,0"}, "names 0 twice"), ({"TENSOR_PARALLEL_SIZE": "0"}, "from 1 to 64"),
    ({"TENSOR_PARALLEL_SIZE": "two"}, "from 1 to 64"),
    ({"EXTRA_SERVE_ARGS": "--enforce-eager --tensor-parallel-size=4"}, "--tensor-parallel-size: the deploy settles"),
    ({"EXTRA_SERVE_ARGS": "-pp 2"}, "-pp: the deploy settles"),
])
def test_bad_gpu_settings_are_refused_naming_the_key(kw, message):
    problems = settings.gpu_problems(_values(**kw))
    assert problems and message in problems[0][1], problems


# --- the compose project ------------------------------------------------------------------------------------


def spec(**kw) -> compose.ComposeSpec:
    base = dict(image=f"127.0.0.1:5555/blackwell/sm120@{DIGEST_A}", target="sm120", model="m", revision="r",
                served_model_name="m", gpu_memory_utilization=0.9, max_model_len=8192)
    return compose.ComposeSpec(**{**base, **kw})


@pytest.mark.parametrize("n", [1, 2, 8])
def test_compose_maps_exactly_the_chosen_gpus_with_the_nccl_settings(n):
    uuids = ",".join(f"GPU-b200-{i}" for i in range(n))
    service = compose.compose_document(spec(gpu_device=uuids, tensor_parallel_size=n))["services"]["vllm"]
    (devices,) = service["deploy"]["resources"]["reservations"]["devices"]
    assert devices["device_ids"] == uuids.split(",") and service["environment"]["NVIDIA_VISIBLE_DEVICES"] == uuids
    if n == 1:
        assert "--tensor-parallel-size" not in service["command"] and "ipc" not in service and "ulimits" not in service
        return
    assert service["command"][service["command"].index("--tensor-parallel-size") + 1] == str(n)
    assert service["ipc"] == "private" and service["shm_size"] == "8g"
    assert service["ulimits"] == {"memlock": -1, "stack": 67108864}
    cdi = compose.compose_document(spec(gpu_runtime="cdi", gpu_device=",".join(map(str, range(n))),
                                        tensor_parallel_size=n))["services"]["vllm"]
    assert cdi["devices"] == [f"nvidia.com/gpu={i}" for i in range(n)] and "deploy" not in cdi


def test_compose_refuses_a_tp_size_without_its_gpus_or_shared_memory():
    from qualify.deploy.errors import DeployError

    with pytest.raises(DeployError, match="needs as many GPUs; the container is given 1"):
        compose.compose_document(spec(gpu_device="GPU-a", tensor_parallel_size=2))
    with pytest.raises(DeployError, match="SHM_SIZE=512m is below 1g"):
        compose.compose_document(spec(gpu_device="GPU-a,GPU-b", tensor_parallel_size=2,
                                      collectives=collectives.ServerCollectives(shm_size="512m")))


# --- attention heads ----------------------------------------------------------------------------------------


def test_a_tp_size_must_split_the_attention_and_key_value_heads():
    qwen = heads.Heads(14, 2, Path("config.json"))  # Qwen2.5-0.5B
    assert qwen.problem(2) == "" and "does not divide the model's 14 attention heads" in qwen.problem(4)
    assert "does not split the model's 2 key-value heads" in qwen.problem(7)
    assert qwen.sizes(8) == [1, 2]
    nested = heads.heads_of({"model_type": "gemma3", "text_config": {"num_attention_heads": 8,
                                                                     "num_key_value_heads": 4}}, Path("c"))
    assert (nested.attention, nested.kv) == (8, 4)


# --- the probe's collectives: a real run over gloo (a TEST DOUBLE for NCCL on GPUs) --------------------------


def _torch_ok() -> bool:
    try:
        import torch.distributed  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.mark.parametrize("world", [2, 3])
def test_the_collectives_compare_with_the_single_gpu_reference_over_a_gloo_standin(world, monkeypatch):
    require(_torch_ok(), "torch is not installed (the test extra installs the CPU build)")
    monkeypatch.setenv("BLACKWELL_COLLECTIVES_STANDIN", "gloo")
    res = subproc.run_snippet("nccl_allreduce", [str(world), "4"], timeout=300)
    assert res.ok, res.failure()
    data = res.data
    assert (data["ok"], data["backend"], data["world_size"], data["exit_codes"]) == (True, "gloo", world, [0] * world)
    for r in data["ranks"]:
        ref = r["reference"]
        assert {x["dtype"] for x in ref["all_reduce"]} == {"float32", "bfloat16"}
        assert all(x["finite"] and x["within_tolerance"] and x["max_error_over_bound"] <= 1
                   for x in ref["all_reduce"] + ref["reduce_scatter"])
        assert all(x["slots_not_their_rank"] == [] and x["shape"] == [world * (1 << 17)] for x in ref["all_gather"])
    # The probe's check runs the same snippet and never passes a stand-in: it proves the checking, not a GPU.
    monkeypatch.setattr(gpu, "read_topology", lambda n: topology.Topology("nvlink", (topology.Link(0, 1, "NV18"),)))
    two = [{"index": str(i), "compute_cap": "12.0", "name": "stand-in"} for i in range(world)]
    check = gpu.nccl_allreduce(two, [], None, world, TF.allreduce_floors, required=True)
    assert check.status == "not-run" and check.required and "ran over 'gloo', not NCCL" in check.reason


def test_the_probe_judges_the_bandwidth_by_the_floor_for_the_topology_it_sees(monkeypatch):
    below = probe_check(monkeypatch, standin_result(busbw=40.0))
    assert below.status == "fail" and below.reason.startswith("busbw 40 GB/s is below the floor of 150 GB/s for 2 GPUs "
                                                              "joined by nvlink")
    assert probe_check(monkeypatch, standin_result(busbw=290.0)).status == "pass"
    pcie = topology.Topology("host-bridge", (topology.Link(0, 1, "PHB"),))
    assert probe_check(monkeypatch, standin_result(busbw=40.0), pcie).status == "pass"  # the PCIe floor is 5 GB/s
    unknown = probe_check(monkeypatch, standin_result(), topology.Topology(topology.UNKNOWN))
    assert unknown.status == "warn" and "the bandwidth is not judged" in unknown.reason
    wrong = probe_check(monkeypatch, standin_result(within_tolerance=False, max_error_over_bound=3.0))
    assert wrong.status == "fail" and "rank 1 bfloat16: error 1e-07 = 3.00 x the tolerance" in wrong.reason
    seen_three = gpu.nccl_allreduce([{"index": str(i)} for i in range(3)], [], None, 2, TF.allreduce_floors, True)
    assert seen_three.status == "not-run" and seen_three.required and "3 GPUs visible" in seen_three.reason


def test_the_deploys_gate_rechecks_what_the_probe_measured(monkeypatch):
    floor = topology.floor_for(TF.allreduce_floors, "nvlink", 2)

    def predicate(result, joined=NVLINK):
        return {"checks": [probe_check(monkeypatch, result, joined).to_dict()]}

    ok = allreduce.judge(predicate(standin_result(busbw=290.0)), 2, NVLINK, floor)
    assert ok.ok and "busbw 290 GB/s, floor 150 GB/s" in ok.reason
    low = allreduce.judge(predicate(standin_result(busbw=40.0)), 2, NVLINK, floor)
    assert not low.ok and "below the floor of 150 GB/s for 2 GPUs joined by nvlink" in low.reason
    # The probe passed it under the PCIe floor, but preflight read NVLink on the host: the container saw other GPUs.
    pcie = topology.Topology("host-bridge", (topology.Link(0, 1, "PHB"),))
    other = allreduce.judge(predicate(standin_result(busbw=40.0), pcie), 2, NVLINK, floor)
    assert not other.ok and "joined by host-bridge, but preflight read nvlink" in other.reason
    # A pass whose evidence does not hold up (ranks missing) is not a pass either.
    check = probe_check(monkeypatch, standin_result(busbw=290.0)).to_dict()
    check["evidence"]["ranks"] = check["evidence"]["ranks"][:1]
    assert "not ranks 0..1" in allreduce.judge({"checks": [check]}, 2, NVLINK, floor).reason
    assert not allreduce.judge({"checks": []}, 2, NVLINK, floor).ok


# --- evidence and promotion per configuration ----------------------------------------------------------------

TP2 = gpuconfig.Configuration(2, 2, "nvlink")


def multi_record(lab: Lab, n: int, busbw: float = 290.0, nccl: str = "pass") -> ev.Evidence:
    nccl_check = gpu_check("gpu.nccl-allreduce", nccl)
    nccl_check["evidence"] = {"bandwidth": {"busbw_gbs": busbw}, "topology": NVLINK.as_json()}
    checks = gpu_checks(ev.Outcome.PASS) + (nccl_check,)
    outcome = ev.outcome_of(checks, "12.0", "12.0", gpuconfig.required_checks(TP2))
    return lab.record(n, checks=checks, outcome=outcome.outcome, reason=outcome.reason, configuration=TP2,
                      gpu=ev.Gpu("NVIDIA RTX PRO 6000 Blackwell Workstation Edition", "12.0", ev.hashed("GPU-2"), "580.1"))


@pytest.fixture
def lab(tmp_path) -> Lab:
    return Lab(tmp_path)


def test_a_multi_gpu_record_carries_its_configuration_and_needs_the_nccl_check(lab, tmp_path):
    path = ev.write(tmp_path / "r.json", multi_record(lab, 1))
    assert json.loads(path.read_text())["configuration"] == {"gpus": 2, "tensor_parallel_size": 2, "topology": "nvlink"}
    assert ev.load(path).configuration == TP2
    single = ev.write(tmp_path / "s.json", lab.record(1))
    assert "configuration" not in json.loads(single.read_text())  # a 1-GPU record is as it was
    without = lab.record(2, configuration=TP2)  # the four single-GPU checks pass, no NCCL check
    with pytest.raises(ev.EvidenceError, match="required GPU checks missing: gpu.nccl-allreduce"):
        ev.load(ev.write(tmp_path / "w.json", without))
    bad = json.loads(path.read_text())
    bad["configuration"]["tensor_parallel_size"] = 4
    with pytest.raises(ev.EvidenceError, match="as many GPUs as the tensor-parallel size"):
        ev.parse(json.dumps(bad).encode(), "bad.json")


@pytest.mark.parametrize("release_format", [3, 2])
def test_promote_keeps_one_gpu_and_n_gpus_in_different_rows(lab, release_format):
    if release_format == 2:  # a release/v2 folder (issue 52): promote writes the rows into its manifest too
        lab.as_release_v2()
    done = lab.run([lab.record(i) for i in range(1, 7)] + [multi_record(lab, i) for i in range(7, 10)])
    assert done.standing.level == "experimental" and done.standing.consecutive_passes == 6  # multi runs do not count
    (row,) = done.configurations
    assert (row.configuration.key, row.level, row.consecutive_passes, row.runs) == ("2 GPUs tp2 nvlink",
                                                                                    "experimental", 3, 3)
    release = folder.read_release(lab.folder, KeyAnchor(trusted=lab.key))
    promotion = release.target("sm120").promotion
    assert promotion.configurations == done.configurations
    assert sorted(e.configuration for e in promotion.evidence) == ["1 GPU"] * 6 + ["2 GPUs tp2 nvlink"] * 3
    predicate = release.target("sm120").manifest.predicate
    if release_format == 3:  # the manifest stays as released: the rows are the signed promotion record's only
        assert "promotion" not in predicate and predicate["support_level"] == "unverified"
        assert lab.run([lab.record(7)]).standing.level == "baseline"  # the seventh 1-GPU pass
        return
    assert predicate["promotion"]["configurations"][0]["configuration"] == "2 GPUs tp2 nvlink"
    import jsonschema

    schema = json.loads((REPO / "manifests" / "manifest.schema.json").read_text())
    jsonschema.Draft202012Validator({"$defs": schema["$defs"], **schema["$defs"]["predicate"]["properties"][
        "promotion"]}).validate(predicate["promotion"])  # the schema carries the configuration rows
    assert lab.run([lab.record(7)]).standing.level == "baseline"  # the seventh 1-GPU pass


def test_a_multi_gpu_pass_below_the_floor_is_a_product_failure_of_its_row(lab):
    record = multi_record(lab, 1, busbw=40.0)  # a host that applied no floor (or an older one) declared it a pass
    assert record.outcome is ev.Outcome.PASS
    floors = folder.read_release(lab.folder).index.policy.allreduce_floors  # what the release signed
    outcome, reason = rows.by_floor(record, record.outcome, floors)
    assert outcome is ev.Outcome.PRODUCT_FAILURE and "below the release's floor of 150 GB/s for 2 GPUs tp2 nvlink" \
        in reason
    done = lab.run([multi_record(lab, i) for i in range(1, 4)] + [record.__class__(**{**record.__dict__,
                                                                                      "time": lab.when(5)})])
    (row,) = done.configurations
    assert row.consecutive_passes == 0 and done.standing.level == "unverified"
    (failed,) = [e for e in folder.read_release(lab.folder).target("sm120").promotion.evidence
                 if e.outcome == "product-failure"]
    assert "below the release's floor of 150 GB/s" in failed.reason  # the signed record says why


# --- the floors are the release's signed policy, never a targets file at promote time ------------------------


def targets_with_floors(tmp_path: Path, nvlink: Optional[float]) -> Path:
    """A copy of images/targets.toml whose [allreduce] nvlink floor is `nvlink` (None: no [allreduce] at all, as
    a checkout from before issue 44 had)."""
    text = (REPO / "images" / "targets.toml").read_text()
    line = '{ topology = "nvlink", gpus = 2, min_bus_gbps = 150.0 },'
    assert line in text
    if nvlink is None:
        start = text.index("[allreduce]")
        text = text[:start] + text[text.index("[build]"):]
    else:
        text = text.replace(line, f'{{ topology = "nvlink", gpus = 2, min_bus_gbps = {nvlink:.1f} }},')
    path = tmp_path / f"targets-{nvlink}.toml"
    path.write_text(text)
    return path


def test_release_signs_the_targets_files_floors_into_its_policy(lab):
    policy = folder.read_release(lab.folder).index.policy
    assert sorted(policy.allreduce_floors, key=lambda f: f.topology) == sorted(TF.allreduce_floors,
                                                                               key=lambda f: f.topology)
    doc = json.loads((lab.folder / "release.json").read_text())["policy"]["allreduce_floors"]
    assert {"topology": "nvlink", "gpus": 2, "min_bus_gbps": 150.0} in doc
    assert "all-reduce floors: cross-socket from 2 GPUs 3 GB/s" in lab.run([lab.record(1)]).rule.describe()


def test_a_floor_changed_in_a_targets_file_at_promote_time_changes_nothing(tmp_path, monkeypatch):
    """The release signed a 100 GB/s nvlink floor; at promote time the targets file says 250 (or 10): promote
    reads no targets file, so a run at 120 GB/s passes and one at 90 GB/s fails, as the release says."""
    lab = Lab(tmp_path, options={"targets_file": targets_with_floors(tmp_path, 100.0)})
    edited = targets.load(targets_with_floors(tmp_path, 250.0))
    monkeypatch.setattr(targets, "load", lambda *a, **k: edited)  # whatever a targets file would say now
    done = lab.run([multi_record(lab, 1, busbw=120.0)])
    (row,) = done.configurations
    assert (row.level, row.consecutive_passes) == ("experimental", 1)
    lowered = targets.load(targets_with_floors(tmp_path, 10.0))
    monkeypatch.setattr(targets, "load", lambda *a, **k: lowered)
    done = lab.run([multi_record(lab, 2, busbw=90.0)])
    (row,) = done.configurations
    assert (row.level, row.consecutive_passes) == ("unverified", 0)  # below the signed 100: a product failure


def test_without_a_signed_floor_a_multi_gpu_pass_proves_nothing(tmp_path):
    """A release whose targets file had no [allreduce] signs no floors: a multi-GPU run's bandwidth cannot be
    judged, so its pass is infrastructure (neither counts nor resets); the 1-GPU row is unaffected."""
    lab = Lab(tmp_path, options={"targets_file": targets_with_floors(tmp_path, None)})
    assert folder.read_release(lab.folder).index.policy.allreduce_floors == ()
    done = lab.run([lab.record(1), multi_record(lab, 2), multi_record(lab, 3)])
    (row,) = done.configurations
    assert (row.level, row.consecutive_passes, row.runs) == ("unverified", 0, 2)
    assert done.standing.level == "experimental"
    assert all(c.outcome is ev.Outcome.INFRASTRUCTURE and "signs no all-reduce floor for 2 GPUs tp2 nvlink" in c.reason
               for c in done.added if c.record.configuration.multi_gpu)


def test_a_release_signed_before_the_policy_has_no_floors(lab):
    index = json.loads((lab.folder / "release.json").read_text())
    del index["policy"]  # as releases were signed before issue 37
    path = lab.folder / "release.json"
    path.write_bytes(json.dumps(index, indent=2, sort_keys=True).encode() + b"\n")
    signer.write_signature(lab.sign, path)
    assert folder.read_release(lab.folder).rule("sm120").allreduce_floors == ()
    (row,) = lab.run([multi_record(lab, 1)]).configurations
    assert (row.level, row.consecutive_passes) == ("unverified", 0)


@pytest.mark.parametrize("floors, message", [
    ([{"topology": "nvlink", "gpus": 2, "min_bus_gbps": 1.0}] * 2, "names one topology and GPU count twice"),
    ([{"topology": "infiniband", "gpus": 2, "min_bus_gbps": 1.0}], "topology 'infiniband' is not one this toolkit"),
    ([{"topology": "nvlink", "gpus": 1, "min_bus_gbps": 1.0}], "gpus"),
    ([{"topology": "nvlink", "gpus": 2, "min_bus_gbps": 0}], "min_bus_gbps must be a positive number"),
])
def test_signed_floors_are_parsed_strictly(lab, floors, message):
    from qualify.core.errors import VerificationError
    from qualify.trust import records as rec

    data = json.loads((lab.folder / "release.json").read_text())
    data["policy"]["allreduce_floors"] = floors
    with pytest.raises(VerificationError, match=message):
        rec.ReleaseIndex.parse(canonical_json(data), "release.json")


def test_the_probe_gets_exactly_the_deployments_gpus():
    from qualify.deploy.preflight import GpuRuntime

    assert GpuRuntime("nvidia", "GPU-a", (), False).probe_gpus() == ("device=GPU-a", ())
    assert GpuRuntime("nvidia", "GPU-a,GPU-b", (), False).probe_gpus() == ('"device=GPU-a,GPU-b"', ())  # docker's CSV
    assert GpuRuntime("cdi", "0,1", (), False).probe_gpus() == (None, ("nvidia.com/gpu=0", "nvidia.com/gpu=1"))
    assert GpuRuntime("none", "", (), False).probe_gpus() == (None, ())


def test_the_two_gpu_evidence_script_runs_as_the_lead_would_run_it(tmp_path):
    """scripts/allreduce-evidence.sh, the command prepared for a lent 2-GPU machine, run here with TEST DOUBLES:
    the stand-in nvidia-smi (two H200s joined by NV18) and the gloo stand-in for NCCL. Everything it writes is
    there and signed, and the collectives count as not run, saying why: a stand-in proves nothing about GPUs, so
    the record is infrastructure, neither a pass nor a product failure."""
    import subprocess

    require(_torch_ok(), "torch is not installed (the test extra installs the CPU build)")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").symlink_to(REPO / "tests" / "standin" / "nvidia-smi")
    (bin_dir / "python3").write_text(f"#!/bin/sh\nexec {sys.executable} \"$@\"\n")  # this venv's, which has torch
    (bin_dir / "python3").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:/usr/bin:/bin", "STANDIN_TOPO": "NV18",
           "STANDIN_GPUS": "9.0|NVIDIA H200|143771 MiB|GPU-h200-0;9.0|NVIDIA H200|143771 MiB|GPU-h200-1",
           "BLACKWELL_COLLECTIVES_STANDIN": "gloo", "EVIDENCE_SIGNING_KEY": str(REPO / "tests/keys/test-gpu-host.key"),
           "COSIGN_PASSWORD": "test GPU host key: not a secret", "QUALIFY_PYTHON": sys.executable}
    out = tmp_path / "h200x2"
    done = subprocess.run(["bash", str(REPO / "scripts" / "allreduce-evidence.sh"), str(out), "2"], env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 3, done.stderr[-3000:]  # incomplete: the collectives did not run on GPUs
    assert sorted(p.name for p in out.iterdir()) == ["allreduce-tp2-host.txt", "allreduce-tp2.json",
                                                     "allreduce-tp2.json.sig", "allreduce-tp2.json.sigstore.json",
                                                     "allreduce-tp2.txt"]
    pred = json.loads((out / "allreduce-tp2.json").read_text())["predicate"]
    assert pred["gpu"]["tensor_parallel_size"] == 2 and pred["gpu"]["topology"]["kind"] == "nvlink"
    (check,) = [c for c in pred["checks"] if c["id"] == "gpu.nccl-allreduce"]
    assert check["status"] == "not-run" and "ran over 'gloo', not NCCL" in check["reason"]
    assert check["evidence"]["floor"] == {"topology": "nvlink", "gpus": 2, "min_bus_gbps": 150.0}
    assert "NV18" in (out / "allreduce-tp2-host.txt").read_text()
    record = ev.load_any(out / "allreduce-tp2.json", "")
    assert record.configuration == gpuconfig.Configuration(2, 2, "nvlink") and record.outcome is ev.Outcome.INFRASTRUCTURE
