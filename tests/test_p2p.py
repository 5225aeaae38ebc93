"""Issue 51, item 1: the all-reduce gate and the server under one set of collective settings; P2P and vLLM's
custom all-reduce judged on the chosen GPUs; the host's IOMMU and PCIe ACS read in preflight.

No GPU, IOMMU or PCIe switch here: STAND-INS (tests/multigpu_standins.py, labelled there) give the probe's P2P
snippet's results and a sysfs tree; the snippet itself runs for real on this GPU-less host (it says so) and on
a lent H200 (docs/multi-gpu.md)."""

from __future__ import annotations

import json

import pytest
from conftest import require
from multigpu_standins import ACS_OFF, NVLINK, standin_p2p, standin_sysfs

from qualify.core import ncclenv, topology
from qualify.deploy import collectives, iommu, p2p
from qualify.probe import p2p as probe_p2p
from qualify.probe import subproc

PIX = topology.Topology("pcie-switch", (topology.Link(0, 1, "PIX"),))
PHB = topology.Topology("host-bridge", (topology.Link(0, 1, "PHB"),))
BUS = ["00000000:18:00.0", "00000000:19:00.0"]


# --- one value: the collective environment ----------------------------------------------------------------


def test_the_collectives_are_the_defaults_plus_the_users_collective_variables_only():
    made = collectives.for_server((("NCCL_DEBUG", "INFO"), ("NCCL_NVLS_ENABLE", "1"), ("VLLM_LOGGING_LEVEL", "DEBUG")),
                                  "16g", ("--enforce-eager", "--disable-custom-all-reduce"))
    env = made.env.as_dict()
    assert env["NCCL_DEBUG"] == "INFO" and env["NCCL_NVLS_ENABLE"] == "1"  # the user's, for the gate too
    assert "VLLM_LOGGING_LEVEL" not in env and env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert made.shm_size == "16g" and not made.custom_all_reduce
    assert made.run_args(2) == ("--shm-size", "16g", "--ipc", "private", "--ulimit", "memlock=-1:-1",
                                "--ulimit", "stack=67108864:67108864")
    assert made.compose_fields(2) == {"shm_size": "16g", "ipc": "private", "ulimits": {"memlock": -1,
                                                                                        "stack": 67108864}}
    assert made.compose_fields(1) == {"shm_size": "16g"} and made.run_args(1) == ("--shm-size", "16g")
    with pytest.raises(ValueError, match="is not a collective setting"):
        ncclenv.CollectiveEnv((("PATH", "/bin"),))
    assert ncclenv.DEFAULT.differences({**ncclenv.DEFAULT.as_dict(), "NCCL_NVLS_ENABLE": "1"}) == [
        "NCCL_NVLS_ENABLE=1, not 0"]


def test_the_probe_target_carries_the_collectives_to_the_image(tmp_path):
    from qualify.config import targets
    from qualify.probe.runner import ProbeTarget
    from qualify.qualification import container

    env = ncclenv.CollectiveEnv.with_overrides([("NCCL_P2P_LEVEL", "NVL")])
    target = container.probe_target(targets.load().get("sm120"), "vllm", tensor_parallel_size=2,
                                    collective_env=env.as_dict())
    back = ProbeTarget.from_json(target.to_json())
    assert back.collectives == env and back.collective_env["NCCL_P2P_LEVEL"] == "NVL"
    assert ProbeTarget.from_json(container.probe_target(targets.load().get("sm120"), "vllm").to_json()).collectives \
        == ncclenv.DEFAULT  # nothing passed: the defaults, never an empty environment
    with pytest.raises(ValueError, match="not a collective setting"):
        ProbeTarget.from_json(json.dumps({**json.loads(target.to_json()), "collective_env": {"LD_PRELOAD": "x"}}))


def test_the_real_nccl_snippet_runs_every_rank_under_the_environment_it_is_given(monkeypatch):
    """The image-side snippet (standard library until torch), over gloo between CPU processes (the TEST DOUBLE
    for NCCL on GPUs that test_multigpu.py uses): each rank reports what its process saw."""
    try:
        import torch.distributed  # noqa: F401
    except ImportError:
        require(False, "torch is not installed (the test extra installs the CPU build)")
    monkeypatch.setenv("BLACKWELL_COLLECTIVES_STANDIN", "gloo")
    monkeypatch.setenv("NCCL_NVLS_ENABLE", "1")  # the caller's own environment says otherwise: the given value wins
    env = ncclenv.CollectiveEnv.with_overrides([("NCCL_DEBUG", "WARN")])
    res = subproc.run_snippet("nccl_allreduce", ["2", "1", json.dumps(env.as_dict())], timeout=300)
    assert res.ok, res.failure()
    assert res.data["env"] == env.as_dict()
    assert [r["env"] for r in res.data["ranks"]] == [env.as_dict()] * 2


# --- the P2P check, image side: vLLM's rule ---------------------------------------------------------------


@pytest.mark.parametrize("world, joined, on, said", [
    (2, NVLINK, True, "2 GPUs, NVLink between every pair, P2P proven by a transfer between every pair"),
    (2, PIX, True, "2 GPUs, P2P over PCIe"),
    (3, NVLINK, False, "world size 3 is not one vLLM's custom all-reduce supports (2, 4, 6, 8)"),
    (4, PIX, False, "4 GPUs not all joined by NVLink"),
])
def test_vllms_custom_all_reduce_rule(world, joined, on, said):
    status, reason, evidence = probe_p2p.judge(standin_p2p(world), world, joined, ncclenv.DEFAULT)
    assert status == "pass" and evidence["custom_all_reduce"]["enabled"] is on and said in reason, reason


def test_no_p2p_at_all_is_consistent_and_turns_the_custom_all_reduce_off():
    """GeForce cards: the driver reports no P2P; vLLM then all-reduces through NCCL. Not wrong, not a failure."""
    status, reason, evidence = probe_p2p.judge(standin_p2p(2, peer=False, transfer=False), 2, PIX, ncclenv.DEFAULT)
    assert status == "pass" and "no P2P between any pair" in reason and "custom all-reduce off" in reason
    assert evidence["custom_all_reduce"]["enabled"] is False


def test_p2p_the_driver_reports_but_a_transfer_does_not_bear_out_fails():
    status, reason, evidence = probe_p2p.judge(standin_p2p(2, transfer=False), 2, PIX, ncclenv.DEFAULT)
    assert status == "fail" and evidence["broken_pairs"] == [[0, 1], [1, 0]]
    assert "the driver reports P2P between GPU 0 -> 1, GPU 1 -> 0, but a transfer through it failed" in reason
    # VLLM_SKIP_P2P_CHECK=1: vLLM takes the driver's word, and turns its kernels on over P2P that does not work.
    skip = ncclenv.CollectiveEnv.with_overrides([("VLLM_SKIP_P2P_CHECK", "1")])
    status, reason, _ = probe_p2p.judge(standin_p2p(2, transfer=False, env=skip.as_dict()), 2, PIX, skip)
    assert status == "fail" and "custom all-reduce on" in reason and "VLLM_SKIP_P2P_CHECK=1" in reason
    ipc = probe_p2p.judge(standin_p2p(2, ipc=False), 2, NVLINK, ncclenv.DEFAULT)
    assert ipc[0] == "fail" and "CUDA IPC does not work on GPU 0 in this container" in ipc[1]
    short = dict(standin_p2p(2), transfer=[])
    assert probe_p2p.judge(short, 2, NVLINK, ncclenv.DEFAULT)[0] == "fail"  # a result that lacks pairs


def test_the_real_p2p_snippet_on_a_host_without_a_gpu_says_so():
    res = subproc.run_snippet("p2p_access", ["2", json.dumps(ncclenv.DEFAULT.as_dict())], timeout=300)
    if not res.ok and "No module named 'torch'" in res.stderr_tail:
        require(False, "torch is not installed (the test extra installs the CPU build)")
    assert res.ok, res.failure()
    assert res.data["ok"] is False and res.data["visible"] == 0 and "0 GPU(s) visible" in res.data["skipped"]


# --- the gate, host side: against the server's settings -----------------------------------------------------


def _predicate(data, world=2, joined=PIX, env=ncclenv.DEFAULT):
    status, reason, evidence = probe_p2p.judge(data, world, joined, env)
    return {"checks": [{"id": "gpu.p2p", "status": status, "reason": reason, "required": False,
                        "evidence": {**evidence, "env": data["child_env"]}}]}


def test_the_gate_passes_consistent_p2p_and_says_what_the_custom_all_reduce_does():
    ok = p2p.judge(_predicate(standin_p2p(2), joined=NVLINK), collectives.ServerCollectives(), None)
    assert ok.ok and "vLLM's custom all-reduce on (2 GPUs, NVLink between every pair" in ok.reason
    off = p2p.judge(_predicate(standin_p2p(2), joined=NVLINK),
                    collectives.for_server((), "8g", ("--disable-custom-all-reduce",)), None)
    assert off.ok and "off (--disable-custom-all-reduce in EXTRA_SERVE_ARGS)" in off.reason


def test_the_gate_refuses_broken_p2p_naming_preflights_finding_and_both_fixes():
    host = iommu.P2pHost(iommu.IommuMode(iommu.TRANSLATED, "stand-in"), ("0000:11:00.0",), (),
                         "IOMMU in translated mode (stand-in) with ACS redirect", "boot with iommu=pt")
    refused = p2p.judge(_predicate(standin_p2p(2, transfer=False)), collectives.ServerCollectives(), host)
    assert not refused.ok and "a transfer through it failed" in refused.reason
    assert "preflight found: IOMMU in translated mode (stand-in) with ACS redirect" in refused.reason
    assert refused.fix.startswith("boot with iommu=pt; or serve without P2P (slower): CONTAINER_ENV_NCCL_P2P_DISABLE=1 "
                                  "and --disable-custom-all-reduce in EXTRA_SERVE_ARGS")
    # A server that uses P2P in neither NCCL nor its own all-reduce: a pass, with the warning.
    safe = collectives.for_server((("NCCL_P2P_DISABLE", "1"),), "8g", ("--disable-custom-all-reduce",))
    env = safe.env.as_dict()
    passed = p2p.judge(_predicate(standin_p2p(2, transfer=False, env=env), env=safe.env), safe, host)
    assert passed.ok and "the server does not use P2P (NCCL_P2P_DISABLE=1, --disable-custom-all-reduce)" in \
        passed.reason and "P2P does not work on this host" in passed.warning


def test_a_p2p_check_under_other_settings_than_the_servers_is_refused():
    other = {**ncclenv.DEFAULT.as_dict(), "NCCL_NVLS_ENABLE": "1"}
    refused = p2p.judge(_predicate(standin_p2p(2, env=other)), collectives.ServerCollectives(), None)
    assert not refused.ok and "ran under NCCL_NVLS_ENABLE=1, not 0 (the server's)" in refused.reason
    assert not p2p.judge({"checks": []}, collectives.ServerCollectives(), None).ok


# --- preflight: the IOMMU and ACS, from a stand-in sysfs ----------------------------------------------------


@pytest.fixture
def sysfs(tmp_path, monkeypatch):
    def make(**kw):
        root = standin_sysfs(tmp_path / "host", **kw)
        monkeypatch.setenv("BLACKWELL_STANDIN_HOST_ROOT", str(root))
        return root
    return make


def test_translated_iommu_with_acs_redirect_on_the_switch_breaks_p2p(sysfs):
    sysfs()
    found = iommu.inspect(BUS, PIX)
    assert found.iommu.mode == "translated" and "0000:18:00.0's IOMMU group type DMA-FQ" in found.iommu.source
    assert found.redirecting == ("0000:11:00.0", "0000:11:01.0")
    assert found.problem.startswith("IOMMU in translated mode (0000:18:00.0's IOMMU group type DMA-FQ) with ACS "
                                    "redirect on the GPUs' bridges (0000:11:00.0, 0000:11:01.0): P2P between the GPUs "
                                    "goes through the root complex, where the IOMMU translates it, or fails")
    assert "iommu=pt" in found.fix and "setpci -s BDF ECAP_ACS+0x6.w=0000" in found.fix


def test_acs_redirect_without_a_translating_iommu_is_the_slow_path(sysfs):
    sysfs(group_type="identity")
    found = iommu.inspect(BUS, PIX)
    assert found.iommu.mode == "passthrough" and found.redirecting
    assert "goes up through the root complex instead of across their switch" in found.problem
    assert found.fix.startswith("disable ACS on those bridges") and "iommu=pt" not in found.fix


def test_a_switch_without_acs_redirect_and_nvlink_break_nothing(sysfs):
    sysfs(acs_ctrl=ACS_OFF)
    found = iommu.inspect(BUS, PIX)
    assert not found.problem and "no ACS redirect between the GPUs" in found.note
    assert not iommu.inspect(BUS, NVLINK).problem and "NVLink" in iommu.inspect(BUS, NVLINK).note


def test_gpus_meeting_at_the_cpu_behind_a_translating_iommu(sysfs):
    sysfs(switch=False, group_type="DMA")
    found = iommu.inspect(BUS, PHB)
    assert "the GPUs meet at the CPU (host-bridge): P2P between them is translated by the IOMMU" in found.problem
    assert found.fix.startswith("boot with iommu=pt")


def test_acs_bits_a_user_cannot_read_are_said_so_never_guessed(sysfs):
    sysfs(config_size=64, group_type="identity")
    found = iommu.inspect(BUS, PIX)
    assert not found.problem and found.unreadable == ("0000:11:00.0", "0000:11:01.0")
    assert "could not be read" in found.note and "sudo lspci -vvv | grep ACSCtl" in found.note


@pytest.mark.parametrize("cmdline, mode", [("intel_iommu=on iommu=pt", "passthrough"), ("amd_iommu=off", "off"),
                                           ("intel_iommu=on", "translated"), ("quiet", "translated")])
def test_the_boot_options_decide_where_the_groups_do_not_say(sysfs, cmdline, mode):
    root = sysfs(cmdline=cmdline)
    for group in (root / "sys" / "kernel" / "iommu_groups").iterdir():
        (group / "type").unlink()  # a kernel before 5.11: no group type
    assert iommu.inspect(BUS, PIX).iommu.mode == mode


def test_no_iommu_at_all(sysfs):
    sysfs(group_type=None, acs_ctrl=ACS_OFF)
    assert iommu.inspect(BUS, PIX).iommu.mode == "off"


def test_acs_control_is_found_by_walking_the_extended_capabilities():
    from multigpu_standins import config_space

    assert iommu.acs_control(config_space(0x1D)) == 0x1D and iommu.acs_control(config_space(None)) is None
    with pytest.raises(ValueError):
        iommu.acs_control(config_space(0x1D, 64))
    looped = bytearray(config_space(None))
    looped[0x100:0x104] = (0x0001 | 0x100 << 20).to_bytes(4, "little")  # a capability that points at itself
    assert iommu.acs_control(bytes(looped)) is None
