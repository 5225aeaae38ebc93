"""Where the deploy reads this host's kernel files: /proc (meminfo, loadavg, cmdline) and /sys (the IOMMU, PCI).

TEST DOUBLE: BLACKWELL_STANDIN_HOST_ROOT=DIR makes every read of /proc/... and /sys/... read DIR/proc/... and
DIR/sys/... instead. Only tests set it: they stand in for what this machine lacks (a unified-memory pool that
runs short while a server starts, a host whose cores are busy, an IOMMU and PCIe switches). A deploy that
reads stand-ins says so, loudly (`announce`): none of its figures are then this host's.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

STANDIN_ENV = "BLACKWELL_STANDIN_HOST_ROOT"
MAX_BYTES = 1 << 20


def standin_root() -> Optional[Path]:
    value = os.environ.get(STANDIN_ENV, "")  # read when used, never at import
    return Path(value) if value else None


def path(system_path: str) -> Path:
    """`/proc/meminfo` as this deploy reads it: the real one, or the stand-in root's."""
    root = standin_root()
    return root / system_path.lstrip("/") if root else Path(system_path)


def read_text(system_path: str) -> Optional[str]:
    """The file's text (bounded), or None when it is not there or cannot be read."""
    try:
        with open(path(system_path), encoding="utf-8", errors="replace") as fh:
            return fh.read(MAX_BYTES)
    except OSError:
        return None


def announce(ui) -> None:
    root = standin_root()
    if root is not None:
        ui.banner([f"{STANDIN_ENV}={root}: THIS DEPLOY READS STAND-IN HOST FILES (a test double),",
                   f"{root}/proc and {root}/sys instead of /proc and /sys: memory, load, IOMMU and PCI",
                   "figures below are the stand-in's, not this host's."])
