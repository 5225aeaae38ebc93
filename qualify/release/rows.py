"""Promotion rows per GPU configuration (seed 000's matrix: 1 GPU and N GPUs are different rows), and the
all-reduce floor applied again to what a multi-GPU run measured."""

from __future__ import annotations

from typing import Any, Dict, List, Sequence, TypeVar

from qualify.core import topology
from qualify.probe.gpu import ALLREDUCE_CHECK
from qualify.release.evidence import Evidence, Outcome
from qualify.release.gpuconfig import SINGLE_GPU, bus_bandwidth

T = TypeVar("T")


def under_floor(record: Evidence, floors: Sequence[Any]) -> Evidence:
    """A multi-GPU run judged again by `floors` (the targets file's; once releases sign them, the release's
    policy `allreduce_floors`): a run whose NCCL check passed with a bus bandwidth below the floor for its
    configuration is a product failure, whatever floor the deploy host applied. Other records are unchanged."""
    c = record.configuration
    busbw = bus_bandwidth(record.checks)
    floor = topology.floor_for(floors, c.topology, c.tensor_parallel_size) if c.multi_gpu else None
    if floor is None or busbw is None or busbw >= floor.min_bus_gbps or record.outcome is not Outcome.PASS:
        return record
    return Evidence(**{**record.__dict__, "outcome": Outcome.PRODUCT_FAILURE,
                       "reason": f"{ALLREDUCE_CHECK}: busbw {busbw:g} GB/s is below the floor of "
                                 f"{floor.min_bus_gbps:g} GB/s for {c.key}"})


def by_configuration(counted: Sequence[T], record=lambda c: c.record) -> Dict[str, List[T]]:
    """The runs per configuration row, the 1-GPU row first (always there, perhaps empty)."""
    rows: Dict[str, List[T]] = {SINGLE_GPU.key: []}
    for c in counted:
        rows.setdefault(record(c).configuration.key, []).append(c)
    return rows
