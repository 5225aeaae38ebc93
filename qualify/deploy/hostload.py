"""Was the host busy when start.sh measured the server's throughput (issue 48)?

A tokens/s figure from a host whose cores other work keeps busy is low, and says nothing about the image:
on the 2-core build host at load 4 the canary read 195 tokens/s where vLLM's own benchmark measured 423-476
on a quiet one. The 1-minute load average (/proc/loadavg, through hostfiles.py) is read before the server
starts and again once the figure is measured. The server's own work raises the second, never the first, so
the host counts as busy only when both are at least its number of cores: other work had a runnable task for
every core before the server ran, and still does.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional

from qualify.deploy import hostfiles


@dataclass(frozen=True)
class Load:
    one_minute: float
    cores: int


def sample() -> Optional[Load]:
    text = hostfiles.read_text("/proc/loadavg") or ""
    try:
        one = float(text.split()[0])
    except (IndexError, ValueError):
        return None
    return Load(one, os.cpu_count() or 1)


def busy_note(before: Optional[Load], after: Optional[Load]) -> str:
    """'' on a quiet host (or when the load cannot be read); else what the throughput line must add."""
    if before is None or after is None or min(before.one_minute, after.one_minute) < after.cores:
        return ""
    cores = f"{after.cores} core{'s' * (after.cores != 1)}"
    return (f"host busy: load {after.one_minute:.1f} on {cores} ({before.one_minute:.1f} before the server started: "
            "other work keeps every core busy); the figure is low")
