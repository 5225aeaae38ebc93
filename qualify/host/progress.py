"""Progress of a long transfer, from the engine's own output lines: a 12 GB push takes minutes, and a
silent one looks hung."""

from __future__ import annotations

import sys
import threading
import time
from typing import Dict


class PushProgress:
    """Progress of one push from the engine's per-layer lines: layers done, time, and at the end the rate.
    A 12 GB image takes minutes; a silent push looks hung."""

    def __init__(self, ref: str, size: int, every_s: float = 10.0, heartbeat: bool = True) -> None:
        self.ref, self.size = ref, size  # size: the image's, 0 when unknown
        self.start = self.last = time.monotonic()
        self.every_s = every_s
        self.layers: Dict[str, str] = {}
        self._stop = threading.Event()
        # A 12 GB layer is one line at its start and one at its end, minutes apart: a heartbeat says it goes on.
        self._beat = threading.Thread(target=self._heartbeat, daemon=True) if heartbeat else None
        if self._beat is not None:
            self._beat.start()

    def _heartbeat(self) -> None:
        while not self._stop.wait(self.every_s):
            now = time.monotonic()
            if now - self.last >= self.every_s:
                self.last = now
                pushing = sum(1 for s in self.layers.values() if s == "Pushing")
                state = f"{self._counts()}, {pushing} pushing" if self.layers else "starting"
                print(f"[push] {self.ref}: still pushing: {state}, {now - self.start:.0f} s", file=sys.stderr,
                      flush=True)

    def line(self, text: str) -> None:
        layer, _, state = text.partition(": ")
        if state in ("Preparing", "Waiting", "Pushing", "Pushed", "Layer already exists"):
            self.layers[layer] = state
        elif state.startswith("Mounted from"):
            self.layers[layer] = "Layer already exists"
        else:
            return
        now = time.monotonic()
        if now - self.last >= self.every_s or state in ("Pushed", "Layer already exists"):
            self.last = now
            print(f"[push] {self.ref}: {self._counts()}, {now - self.start:.0f} s", file=sys.stderr, flush=True)

    def _counts(self) -> str:
        pushed = sum(1 for s in self.layers.values() if s == "Pushed")
        present = sum(1 for s in self.layers.values() if s == "Layer already exists")
        return f"{pushed + present}/{len(self.layers)} layers done ({present} already in the registry)"

    def done(self) -> None:
        self._stop.set()
        seconds = max(time.monotonic() - self.start, 1e-3)
        present = sum(1 for s in self.layers.values() if s == "Layer already exists")
        size = f"; image {self.size / 1e9:.2f} GB" if self.size else ""
        # A rate means something only when every layer travelled (the engine reports no per-layer bytes).
        rate = f", {self.size / seconds / 1e6:.0f} MB/s" if self.size and self.layers and not present else ""
        counts = f": {self._counts()}" if self.layers else ""
        print(f"[push] {self.ref}: done in {seconds:.1f} s{counts}{size}{rate}", file=sys.stderr, flush=True)
