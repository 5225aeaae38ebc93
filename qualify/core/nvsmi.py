"""`nvidia-smi --query-gpu`: the one place its fields are named, its CSV is read and its values are parsed
(issue 52; a house rule), for the probe inside an image (probe/versions.py, probe/gpu.py) and for the deploy's
preflight and status (deploy/gpus.py, deploy/memory.py, deploy/iommu.py, deploy/ops.py).
Running it is the caller's: the host side through host/cmd.py, the image side through a child process.

Standard library only, Python 3.9 compatible (runs inside images).
"""

from __future__ import annotations

import re
from typing import Dict, List, Optional, Sequence, Tuple

# What the probe records of each GPU (predicate.gpu.devices keeps these names), and what preflight reads.
PROBE_FIELDS = ("index", "name", "uuid", "compute_cap", "driver_version", "memory.total", "memory.used", "pci.bus_id")
DEPLOY_FIELDS = ("index", "compute_cap", "name", "memory.total", "memory.free", "uuid", "driver_version", "pci.bus_id")
STATUS_FIELDS = ("index", "name", "uuid", "temperature.gpu", "utilization.gpu", "memory.used", "memory.total")
MAX_ROWS = 1024
_MIB = re.compile(r"\s*(\d+(?:\.\d+)?)\s*(?:MiB)?\s*")


def query_args(fields: Sequence[str], units: bool = True, header: bool = False) -> List[str]:
    """nvidia-smi's arguments (without the program) for one CSV row per GPU of `fields`."""
    fmt = ",".join(["csv", *([] if header else ["noheader"]), *([] if units else ["nounits"])])
    return [f"--query-gpu={','.join(fields)}", f"--format={fmt}"]


def not_available(value: str) -> bool:
    """nvidia-smi's "[N/A]", "[Not Supported]": a field the driver does not report for this GPU."""
    return value.startswith("[")


def mib(value: str) -> Optional[float]:
    """A memory field in MiB: `32607 MiB` (csv) or `32607` (csv,nounits) -> 32607.0; `[N/A]`,
    `[Not Supported]` (GB10's unified memory), "" or anything else -> None."""
    m = _MIB.fullmatch(value or "")
    return float(m.group(1)) if m else None


def pci_name(bus_id: str) -> str:
    """The `pci.bus_id` field, `00000000:18:00.0` (a 32-bit PCI domain), as sysfs names the device,
    `0000:18:00.0`; anything else lower-cased as it is."""
    parts = bus_id.strip().lower().split(":")
    if len(parts) == 3 and all(parts):
        try:
            return f"{int(parts[0], 16):04x}:{parts[1]}:{parts[2]}"
        except ValueError:  # not hex: no such device in sysfs, which the caller reports
            pass
    return bus_id.strip().lower()


def parse(text: str, fields: Sequence[str], pad: bool = False) -> Tuple[Dict[str, str], ...]:
    """One dict per GPU row (values stripped, as printed). A row with more values than fields is not read
    (a name with a comma would shift every field after it); with `pad`, a row with fewer gets "" for the rest
    (an older driver that lacks a field), else it is not read either."""
    out = []
    for line in [ln for ln in text.splitlines() if ln.strip()][:MAX_ROWS]:
        values = [v.strip() for v in line.split(",")]
        if len(values) > len(fields) or (len(values) < len(fields) and not pad):
            continue
        values += [""] * (len(fields) - len(values))
        out.append(dict(zip(fields, values)))
    return tuple(out)
