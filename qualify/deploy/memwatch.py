"""The unified memory pool while the server starts (GB10; issue 51).

Preflight sizes the server's share of the pool once (memory.py). On unified memory the GPU's allocations are
the host's, and loading the weights, compiling, and the first long request take more than the fraction
(CUDA contexts, the page cache of the weights, activations): MemAvailable falls under the host's reserve and
the machine stalls before vLLM notices (vllm-project/vllm#46307, #56824, NVIDIA/dgx-spark-playbooks#97). So
while start.sh waits for /health and runs the canary, `Watch` reads MemAvailable once a second (a thread that
sleeps on an event between readings, never a busy loop); the first reading below `host_reserve_gib` (the
targets file's runtime) stops the server at once, from the thread, and the deploy then exits 5 (EX_DEPLOY)
saying what to lower (`advice`).

Where MemAvailable comes from: /proc/meminfo through hostfiles.py (a stand-in root in tests).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Callable, Optional, Tuple

from qualify.deploy import hostfiles, memory

INTERVAL_S = 1.0
GIB = 1 << 30
LOADING, CANARY = "while the server loaded", "during the canary and the first long request"


@dataclass(frozen=True)
class Reading:
    available_gib: float
    total_gib: float


def read() -> Optional[Reading]:
    info = memory.parse_meminfo(hostfiles.read_text("/proc/meminfo") or "")
    if "MemAvailable" not in info or "MemTotal" not in info:
        return None
    return Reading(info["MemAvailable"] / GIB, info["MemTotal"] / GIB)


@dataclass(frozen=True)
class Shortfall:
    phase: str  # LOADING or CANARY
    reading: Reading  # the one below the reserve
    reserve_gib: float
    seconds: float  # since the watch started


class Watch:
    """Reads MemAvailable every `interval` seconds until stopped, or until one reading is below `reserve_gib`:
    then `on_short` runs (in the watch's thread: it stops the server) and `tripped` holds what was read."""

    def __init__(self, reserve_gib: float, on_short: Callable[[Shortfall], None], interval: float = INTERVAL_S,
                 reader: Callable[[], Optional[Reading]] = read) -> None:
        self.reserve_gib, self.on_short, self.interval, self.reader = reserve_gib, on_short, interval, reader
        self.phase = LOADING
        self.tripped: Optional[Shortfall] = None
        self.readings = 0
        self.lowest: Optional[Reading] = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="memwatch", daemon=True)
        self._started = 0.0

    def __enter__(self) -> Watch:
        self._started = time.monotonic()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=self.interval * 5 + 30)  # on_short may be stopping the server

    def _run(self) -> None:
        while True:
            reading = self.reader()
            if reading is not None:
                self.readings += 1
                if self.lowest is None or reading.available_gib < self.lowest.available_gib:
                    self.lowest = reading
                if reading.available_gib < self.reserve_gib:
                    self.tripped = Shortfall(self.phase, reading, self.reserve_gib, time.monotonic() - self._started)
                    self.on_short(self.tripped)
                    return
            if self._stop.wait(self.interval):
                return


def advice(short: Shortfall, fraction: float, pool_gib: float, min_gib: float, max_model_len: int,
           env_file: str) -> Tuple[str, ...]:
    """What to lower: the fraction by what the host was short of its reserve, and the context length."""
    deficit = short.reserve_gib - short.reading.available_gib
    lower = int((fraction * pool_gib - deficit) / pool_gib * 100) / 100
    context = (f"or lower MAX_MODEL_LEN in {env_file} (now {max_model_len}): the first long request's activations "
               "grow with the context, and --max-num-batched-tokens in EXTRA_SERVE_ARGS bounds its prefill")
    if lower < 0.05 or lower * pool_gib < min_gib:
        return (f"free memory on this host first (other programs; the page cache: sync; echo 3 | sudo tee "
                f"/proc/sys/vm/drop_caches): below gpu_memory_utilization {fraction:g} the server does not keep this "
                f"target's minimum of {min_gib:g} GiB", context)
    return (f"set GPU_MEMORY_UTILIZATION={lower:.2f} in {env_file} (the server had {fraction:g} of the {pool_gib:.1f} "
            f"GiB pool; the host was {deficit:.1f} GiB short of its {short.reserve_gib:g} GiB reserve when the "
            "server was stopped, still starting: go lower if it runs short again)", context)
