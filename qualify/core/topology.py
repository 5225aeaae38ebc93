"""How a node's GPUs are joined (`nvidia-smi topo -m`), and the all-reduce floor that applies to them.

`nvidia-smi topo -m` prints one matrix cell per GPU pair: `NV<n>` (n bonded NVLinks), `PIX` / `PXB` (one or
several PCIe switches, not through the CPU), `PHB` (through a PCIe host bridge: the CPU), `NODE` (between host
bridges of one NUMA node), `SYS` (across the CPUs' SMP interconnect). A set of GPUs is as fast as its weakest
pair: a ring all-reduce waits for its slowest hop, so the set's topology is the weakest link among the chosen
GPUs. What the set measures is then judged against the floor for that topology and GPU count
(`images/targets.toml` [allreduce]; `floor_for`).

Standard library only, Python 3.9 compatible: the probe imports it inside images, preflight on the host.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

NVLINK, PCIE_SWITCH, HOST_BRIDGE, CROSS_SOCKET = "nvlink", "pcie-switch", "host-bridge", "cross-socket"
SINGLE, UNKNOWN = "single", "unknown"  # one GPU (nothing to join); a cell this module does not know
# Strongest first: the set's topology is the last of these that any of its pairs has.
TOPOLOGIES = (NVLINK, PCIE_SWITCH, HOST_BRIDGE, CROSS_SOCKET)
_RANK = {name: len(TOPOLOGIES) - i for i, name in enumerate(TOPOLOGIES)}
_ANSI = re.compile(r"\x1b\[[0-9;]*m")  # nvidia-smi underlines the header, also into a pipe
_GPU = re.compile(r"GPU([0-9]{1,3})")
_NV = re.compile(r"NV([0-9]{1,3})")
MAX_TEXT = 1 << 20


def link_kind(cell: str) -> str:
    """One matrix cell as a topology name (`X`, the GPU itself, is not a link)."""
    cell = cell.strip()
    if _NV.fullmatch(cell):
        return NVLINK
    return {"PIX": PCIE_SWITCH, "PXB": PCIE_SWITCH, "PHB": HOST_BRIDGE, "NODE": HOST_BRIDGE,
            "SYS": CROSS_SOCKET}.get(cell, UNKNOWN)


@dataclass(frozen=True)
class Link:
    a: int  # nvidia-smi indices
    b: int
    cell: str  # as nvidia-smi printed it: NV18, PIX, PHB, ...

    @property
    def kind(self) -> str:
        return link_kind(self.cell)

    def as_json(self) -> Dict[str, Any]:
        return {"gpus": [self.a, self.b], "link": self.cell, "kind": self.kind}


@dataclass(frozen=True)
class Topology:
    """The chosen GPUs' topology: the weakest pair's kind, and every pair as nvidia-smi printed it."""

    kind: str  # one of TOPOLOGIES, SINGLE or UNKNOWN
    links: Tuple[Link, ...] = ()

    @property
    def weakest(self) -> Optional[Link]:
        known = [lk for lk in self.links if lk.kind in _RANK]
        return min(known, key=lambda lk: _RANK[lk.kind]) if known and len(known) == len(self.links) else None

    def describe(self) -> str:
        if self.kind == SINGLE:
            return "one GPU"
        cells = sorted({lk.cell for lk in self.links})
        return f"{self.kind} ({', '.join(cells)} between {len(self.links)} GPU pair{'s' * (len(self.links) != 1)})"

    def as_json(self) -> Dict[str, Any]:
        return {"kind": self.kind, "links": [lk.as_json() for lk in self.links]}


class TopologyError(ValueError):
    """`nvidia-smi topo -m` output that does not say how the chosen GPUs are joined."""


def parse_matrix(text: str) -> Dict[Tuple[int, int], str]:
    """The GPU-to-GPU cells of `nvidia-smi topo -m`: {(row GPU, column GPU): cell}. NIC rows and columns, the
    affinity columns and the legend are left out."""
    if len(text) > MAX_TEXT:
        raise TopologyError(f"nvidia-smi topo -m printed {len(text)} characters; not a topology matrix")
    lines = [_ANSI.sub("", line.rstrip("\r\n")) for line in text.splitlines()]
    header_at = next((i for i, line in enumerate(lines) if _is_header(_cells(line))), None)
    if header_at is None:
        raise TopologyError("nvidia-smi topo -m printed no GPU columns")
    header = _cells(lines[header_at])
    columns = {i: int(m.group(1)) for i, c in enumerate(header) if (m := _GPU.fullmatch(c))}
    cells: Dict[Tuple[int, int], str] = {}
    for line in lines[header_at + 1:]:
        row = _cells(line)
        if not row or not row[0]:
            if line.strip().startswith("Legend") or not line.strip():
                break
            continue
        m = _GPU.fullmatch(row[0])
        if not m:
            continue  # NIC0, ...
        for i, gpu in columns.items():
            if i < len(row):
                cells[(int(m.group(1)), gpu)] = row[i]
    if not cells:
        raise TopologyError("nvidia-smi topo -m printed no GPU rows")
    return cells


def _is_header(cells: List[str]) -> bool:
    """The header row: no label of its own, then GPU0, GPU1, ..."""
    return len(cells) > 1 and not cells[0] and bool(_GPU.fullmatch(cells[1]))


def _cells(line: str) -> List[str]:
    """A matrix line's cells: tab-separated as nvidia-smi prints them (a cell may hold spaces: ' X ')."""
    if "\t" in line:
        return [c.strip() for c in line.split("\t")]
    return [""] + line.split() if line[:1].isspace() else line.split()


def for_gpus(matrix: Mapping[Tuple[int, int], str], indices: Sequence[int]) -> Topology:
    """The topology of the GPUs at `indices` (nvidia-smi's); a pair the matrix does not give is an error."""
    if len(indices) < 2:
        return Topology(SINGLE)
    links = []
    for n, a in enumerate(indices):
        for b in indices[n + 1:]:
            cell = matrix.get((a, b)) or matrix.get((b, a))
            if not cell:
                raise TopologyError(f"nvidia-smi topo -m does not say how GPU {a} and GPU {b} are joined")
            links.append(Link(a, b, cell))
    kinds = [lk.kind for lk in links]
    kind = UNKNOWN if UNKNOWN in kinds else min(kinds, key=lambda k: _RANK[k])
    return Topology(kind, tuple(links))


def from_json(doc: Any) -> Topology:
    """What `Topology.as_json` wrote (a probe's predicate, an evidence record); TopologyError otherwise."""
    if not isinstance(doc, Mapping) or not isinstance(doc.get("kind"), str) or not isinstance(doc.get("links"), list):
        raise TopologyError("a topology is an object with 'kind' and 'links'")
    links = []
    for item in doc["links"]:
        gpus = item.get("gpus") if isinstance(item, Mapping) else None
        if not (isinstance(gpus, list) and len(gpus) == 2 and all(isinstance(g, int) and not isinstance(g, bool)
                                                                  for g in gpus) and isinstance(item.get("link"), str)):
            raise TopologyError("a topology link is {'gpus': [a, b], 'link': 'NV18', 'kind': ...}")
        links.append(Link(gpus[0], gpus[1], item["link"]))
    kinds = [lk.kind for lk in links]
    computed = SINGLE if not links else UNKNOWN if UNKNOWN in kinds else min(kinds, key=lambda k: _RANK[k])
    if doc["kind"] != computed:
        raise TopologyError(f"the topology says {doc['kind']!r}, but its links give {computed!r}")
    return Topology(computed, tuple(links))


# --- the all-reduce floor ------------------------------------------------------------------------------


@dataclass(frozen=True)
class AllReduceFloor:
    """The lowest all-reduce bus bandwidth (nccl-tests' busbw, GB/s) a run on `gpus` or more GPUs joined by
    `topology` may measure and still pass; an entry for more GPUs of the same topology takes over from its
    count up. The shape of release.json's policy `allreduce_floors` (issue 37's extension point)."""

    topology: str
    gpus: int
    min_bus_gbps: float

    def as_json(self) -> Dict[str, Any]:
        return {"topology": self.topology, "gpus": self.gpus, "min_bus_gbps": self.min_bus_gbps}


def floor_for(floors: Iterable[Any], topology: str, gpus: int) -> Optional[Any]:
    """The floor for `gpus` GPUs of `topology`: of the entries for that topology with at most `gpus` GPUs, the
    one for the most. Any object with topology, gpus and min_bus_gbps (this module's, release policy's)."""
    fitting = [f for f in floors if f.topology == topology and f.gpus <= gpus]
    return max(fitting, key=lambda f: f.gpus) if fitting else None


def floors_from_json(items: Any) -> Tuple[AllReduceFloor, ...]:
    """The floors as the host passes them to the probe (a list of `as_json` objects); ValueError otherwise."""
    out = []
    for item in items or ():
        if not isinstance(item, Mapping) or set(item) != {"topology", "gpus", "min_bus_gbps"}:
            raise ValueError(f"an all-reduce floor is {{topology, gpus, min_bus_gbps}}, not {item!r}")
        topology, gpus, floor = item["topology"], item["gpus"], item["min_bus_gbps"]
        if topology not in TOPOLOGIES or not isinstance(gpus, int) or isinstance(gpus, bool) or gpus < 2 or \
                not isinstance(floor, (int, float)) or isinstance(floor, bool) or not floor > 0:
            raise ValueError(f"all-reduce floor {item!r}: a topology of {', '.join(TOPOLOGIES)}, gpus >= 2 and "
                             "min_bus_gbps > 0 expected")
        out.append(AllReduceFloor(topology, gpus, float(floor)))
    return tuple(out)
