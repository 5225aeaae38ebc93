"""A run's GPU configuration: one GPU, or several serving one model with tensor parallelism, and how they are
joined. The Blackwell support RFC keeps a row per configuration, so evidence from one GPU and from N GPUs count apart
(release/rows.py, `promote`); a run on several GPUs must also pass the NCCL collectives (`required_checks`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple, Type

from qualify.core import topology
from qualify.core.errors import QualifyError
from qualify.probe.gpu import ALLREDUCE_CHECK, REQUIRED_GPU_CHECKS


@dataclass(frozen=True)
class Configuration:
    """How many GPUs a run used and how they were joined: the Blackwell support RFC keeps a row per configuration, so a run on
    one GPU and a tensor-parallel run on several count apart (`promote`). A record without one is one GPU."""

    gpus: int = 1
    tensor_parallel_size: int = 1
    topology: str = topology.SINGLE

    @property
    def multi_gpu(self) -> bool:
        return self.tensor_parallel_size > 1

    @property
    def key(self) -> str:
        """The row's name: `1 GPU`, `2 GPUs tp2 nvlink`."""
        if not self.multi_gpu:
            return "1 GPU"
        return f"{self.gpus} GPUs tp{self.tensor_parallel_size} {self.topology}"

    def as_json(self) -> Dict[str, Any]:
        return {"gpus": self.gpus, "tensor_parallel_size": self.tensor_parallel_size, "topology": self.topology}

    @classmethod
    def parse(cls, doc: Any, where: str, error: Type[QualifyError]) -> Configuration:
        if not isinstance(doc, dict) or set(doc) != {"gpus", "tensor_parallel_size", "topology"}:
            raise error(f"{where}: field 'configuration' must be {{gpus, tensor_parallel_size, topology}}")
        gpus, tp, joined = doc["gpus"], doc["tensor_parallel_size"], doc["topology"]
        whole = all(isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= 1024 for v in (gpus, tp))
        kinds = (topology.SINGLE,) if whole and tp == 1 else (*topology.TOPOLOGIES, topology.UNKNOWN)
        if not whole or tp != gpus or joined not in kinds:
            raise error(f"{where}: field 'configuration' {doc!r}: as many GPUs as the tensor-parallel size, "
                        f"and a topology of {', '.join(kinds)}")
        return cls(gpus, tp, joined)

    @classmethod
    def of_predicate(cls, predicate: Mapping[str, Any]) -> Configuration:
        """What a probe run recorded (predicate.gpu.tensor_parallel_size and .topology)."""
        g = predicate.get("gpu") if isinstance(predicate.get("gpu"), Mapping) else {}
        tp = g.get("tensor_parallel_size")
        if not isinstance(tp, int) or isinstance(tp, bool) or tp < 2:
            return cls()
        joined = g.get("topology") if isinstance(g.get("topology"), Mapping) else {}
        kind = joined.get("kind")
        return cls(tp, tp, kind if kind in topology.TOPOLOGIES else topology.UNKNOWN)


SINGLE_GPU = Configuration()
ROW_KEY = re.compile(r"[0-9]{1,4} GPUs tp[0-9]{1,4} [a-z][a-z-]{0,31}")  # Configuration.key of several GPUs


def required_checks(configuration: Configuration, base: Sequence[str] = REQUIRED_GPU_CHECKS) -> Tuple[str, ...]:
    """The GPU checks a run of `configuration` must pass to count: the single-GPU ones, and for several GPUs the
    NCCL collectives (the Blackwell support RFC's two-rank test) as well."""
    return tuple(base) + ((ALLREDUCE_CHECK,) if configuration.multi_gpu and ALLREDUCE_CHECK not in base else ())


def bus_bandwidth(checks: Sequence[Mapping[str, Any]]) -> Optional[float]:
    """The all-reduce bus bandwidth (GB/s) a run's NCCL check measured, when it did."""
    check = next((c for c in checks if c.get("id") == ALLREDUCE_CHECK), None)
    evidence = check.get("evidence") if isinstance(check, Mapping) else None
    bandwidth = evidence.get("bandwidth") if isinstance(evidence, Mapping) else None
    value = bandwidth.get("busbw_gbs") if isinstance(bandwidth, Mapping) else None
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


@dataclass(frozen=True)
class ConfigurationRow:
    """One row of a target's promotion besides its 1-GPU row (which is the target's level): the standing of
    the runs of one multi-GPU configuration, in the signed promotion record and the rewritten manifest."""

    configuration: Configuration
    level: str
    consecutive_passes: int
    required_consecutive_passes: int
    runs: int
    note: str = ""

    def as_json(self) -> Dict[str, Any]:
        return {"configuration": self.configuration.key, **self.configuration.as_json(), "level": self.level,
                "consecutive_passes": self.consecutive_passes,
                "required_consecutive_passes": self.required_consecutive_passes, "runs": self.runs,
                "note": self.note}

    @classmethod
    def parse(cls, f: Any) -> ConfigurationRow:
        """From records.Fields (strict: these keys only)."""
        f.only("configuration", "gpus", "tensor_parallel_size", "topology", "level", "consecutive_passes",
               "required_consecutive_passes", "runs", "note")
        c = Configuration.parse({k: f.doc.get(k) for k in ("gpus", "tensor_parallel_size", "topology")}, f.where,
                                f.error)
        if f.text("configuration") != c.key or not c.multi_gpu:
            raise f.error(f"{f.where}: 'configuration' is not the row of {c.as_json()} ({c.key})")
        return cls(c, f.text("level"), f.integer("consecutive_passes"), f.integer("required_consecutive_passes", 1),
                   f.integer("runs"), f.text("note", empty=True))


# The optional fields of the signed promotion records (release/records.py), written only for several GPUs so a
# 1-GPU record is byte for byte what it was; kept here so records.py stays the size it was.


def row_field(key: str) -> Dict[str, Any]:
    """CountedEvidence's `configuration` (a row's key), absent for the 1-GPU row."""
    return {"configuration": key} if key != SINGLE_GPU.key else {}


def row_of(f: Any) -> str:
    """The row a counted record names (records.Fields), the 1-GPU row when it names none."""
    return f.text("configuration", ROW_KEY) if "configuration" in f.doc else SINGLE_GPU.key


def rows_field(configurations: Sequence[ConfigurationRow]) -> Dict[str, Any]:
    """PromotionRecord's `configurations`, absent when there are no multi-GPU rows."""
    return {"configurations": [r.as_json() for r in configurations]} if configurations else {}


def rows_of(f: Any) -> Tuple[ConfigurationRow, ...]:
    return tuple(ConfigurationRow.parse(r) for r in f.items("configurations")) if "configurations" in f.doc else ()
