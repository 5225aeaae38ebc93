"""GPU checks without a GPU: what runs, what is not-run and why.

The GPU facts below are written out by hand: they stand in for nvidia-smi's
answers on hardware this machine lacks (real runs: manifests/evidence/h200/).
"""

from qualify.core import arch
from qualify.probe import gpu

H200 = {"index": "0", "name": "NVIDIA H200", "uuid": "GPU-x", "compute_cap": "9.0", "driver_version": "580.159.04",
        "memory.total": "143771", "memory.used": "0", "pci.bus_id": "00000000:00:06.0"}
GB10 = {**H200, "name": "NVIDIA GB10", "compute_cap": "12.1", "memory.total": "[N/A]"}


def test_no_gpu_means_not_run_never_pass():
    for check in (gpu.device_check(None, arch.Capability(12, 0)), gpu.memory_check(None, False, 0.9, 16),
                  gpu.allocator_on_gpu(False, "3.8.0"), gpu.simple("gpu.bf16-matmul", "t", "matmul", False, None)):
        assert check.status == "not-run" and "no GPU" in check.reason


def test_nccl_needs_two_gpus_and_records_the_nccl_census():
    rows = [{"short": "nvidia/nccl/lib/libnccl.so.2", "class": "none", "best": "compatible",
             "sass": ["sm_100", "sm_120"], "ptx": []}]
    for gpus, seen in ((None, "no GPU visible"), ([H200], "1 GPU visible")):
        check = gpu.nccl_allreduce(gpus, rows, None)
        assert check.status == "not-run" and seen in check.reason and "at least 2" in check.reason
        assert not check.required
        assert check.evidence["nccl_census"][0]["library"] == "nvidia/nccl/lib/libnccl.so.2"


def test_a_hopper_device_is_not_evidence_for_blackwell():
    check = gpu.device_check([H200], arch.Capability(12, 0))
    assert check.status == "warn" and "outside the Blackwell targets" in check.reason and not check.required
    assert gpu.device_check([GB10], arch.Capability(12, 1)).status == "pass"


def test_gb10_unified_memory_comes_from_meminfo():
    check = gpu.memory_check([GB10], True, 0.5, 16)
    assert "meminfo" in check.evidence["source"] and check.evidence["fraction"] == 0.5
    assert check.evidence["total_gib"] > 0
