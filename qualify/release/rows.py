"""Promotion rows per GPU configuration (the Blackwell support RFC's matrix: 1 GPU and N GPUs are different rows), and the
release's signed all-reduce floor applied again to what a multi-GPU run measured."""

from __future__ import annotations

from typing import Any, Dict, List, Sequence, Tuple, TypeVar

from qualify.core import topology
from qualify.probe.gpu import ALLREDUCE_CHECK
from qualify.release.evidence import Evidence, Outcome
from qualify.trust.gpuconfig import SINGLE_GPU, bus_bandwidth

T = TypeVar("T")


def by_floor(record: Evidence, outcome: Outcome, floors: Sequence[Any]) -> Tuple[Outcome, str]:
    """A multi-GPU run's outcome (recomputed from its checks) judged again by `floors`, the release's signed
    policy `allreduce_floors` (never a targets file): a pass whose bus bandwidth is below the floor for its
    configuration is a product failure, whatever floor the GPU host applied; a pass with no signed floor for
    its configuration (a release signed before floors, or floors naming no such topology), or with no bandwidth
    measured, proves nothing and is infrastructure (fail closed). Other runs keep `outcome`; the reason is ""
    unless the floor changed it."""
    c = record.configuration
    if not c.multi_gpu or outcome is not Outcome.PASS:
        return outcome, ""
    floor = topology.floor_for(floors, c.topology, c.tensor_parallel_size)
    busbw = bus_bandwidth(record.checks)
    if floor is None:
        return Outcome.INFRASTRUCTURE, (f"the release signs no all-reduce floor for {c.key}: its bus bandwidth "
                                        "cannot be judged, so the run counts as not run")
    if busbw is None:
        return Outcome.INFRASTRUCTURE, f"{ALLREDUCE_CHECK} passed without a bus bandwidth to judge against the floor"
    if busbw < floor.min_bus_gbps:
        return Outcome.PRODUCT_FAILURE, (f"{ALLREDUCE_CHECK}: busbw {busbw:g} GB/s is below the release's floor of "
                                         f"{floor.min_bus_gbps:g} GB/s for {c.key}")
    return outcome, ""


def by_configuration(counted: Sequence[T], record=lambda c: c.record) -> Dict[str, List[T]]:
    """The runs per configuration row, the 1-GPU row first (always there, perhaps empty)."""
    rows: Dict[str, List[T]] = {SINGLE_GPU.key: []}
    for c in counted:
        rows.setdefault(record(c).configuration.key, []).append(c)
    return rows
