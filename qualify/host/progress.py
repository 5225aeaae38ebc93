"""Progress of a long push: a 12 GB image takes minutes, and a silent one looks hung.

From the Engine API's push stream (host/engine.py) a push reports bytes per layer (`progressDetail`:
current and total, in bytes of the layer as it is read), so the lines say how much went, how fast, and
how long is left. The docker CLI prints none of that when not on a terminal, podman nothing at all: there
the heartbeat alone says the push goes on.
"""

from __future__ import annotations

import re
import threading
import time
from dataclasses import dataclass
from typing import Dict, Optional, Set

from qualify.core.report import Reporter

REPORT = Reporter("push")

_DONE = ("Pushed", "Layer already exists")


@dataclass
class _Layer:
    state: str
    current: int = 0
    total: int = 0


class PushProgress:
    """Progress of one push: layers done, bytes sent per layer, rate and time left; a line every `every_s`
    seconds while anything moves, a heartbeat while nothing does, and a summary at the end."""

    def __init__(self, ref: str, size: int, every_s: float = 10.0, heartbeat: bool = True) -> None:
        self.ref, self.size = ref, size  # size: the image's, 0 when unknown
        self.start = self.last = self.last_event = time.monotonic()
        self.first_byte: Optional[float] = None
        self.every_s = every_s
        self.layers: Dict[str, _Layer] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._beat = threading.Thread(target=self._heartbeat, daemon=True) if heartbeat else None
        if self._beat is not None:
            self._beat.start()

    # --- input -------------------------------------------------------------------

    def event(self, layer: str, status: str, current: Optional[int] = None, total: Optional[int] = None) -> None:
        """One message of the Engine API's push stream (`id`, `status`, `progressDetail`)."""
        if not layer:
            return
        if status.startswith("Mounted from"):
            status = "Layer already exists"
        if status not in ("Preparing", "Waiting", "Pushing") + _DONE:
            return
        with self._lock:
            entry = self.layers.setdefault(layer, _Layer(status))
            entry.state = status
            if status == "Pushing" and total:
                entry.current, entry.total = int(current or 0), int(total)
                if self.first_byte is None:
                    self.first_byte = time.monotonic()
            elif status == "Pushed" and entry.total:
                entry.current = entry.total
        now = self.last_event = time.monotonic()
        if now - self.last >= self.every_s or status in _DONE:
            self._say(now)

    def line(self, text: str) -> None:
        """A line of the docker CLI's own output ('<layer>: Pushing'), which carries no bytes."""
        layer, _, state = text.partition(": ")
        self.event(layer, state)

    # --- output ------------------------------------------------------------------

    def _heartbeat(self) -> None:
        while not self._stop.wait(min(self.every_s, 5.0)):
            now = time.monotonic()
            if now - self.last >= self.every_s:
                self._say(now, still=now - self.last_event >= self.every_s)

    def _say(self, now: float, still: bool = False) -> None:
        self.last = now
        with self._lock:
            text = self.status(now) if self.layers else "starting"
        lead = "still pushing: " if still else ""
        REPORT.say(f"{self.ref}: {lead}{text}, {now - self.start:.0f} s")

    def status(self, now: Optional[float] = None) -> str:
        now = time.monotonic() if now is None else now
        parts = [self._counts()]
        sent, total = self.sent(), sum(layer.total for layer in self.layers.values())
        if total:
            parts.append(f"{_gb(sent)} of {_gb(total)} GB sent")
            rate = self.rate(now)
            if rate:
                waiting = any(layer.state in ("Preparing", "Waiting") for layer in self.layers.values())
                left = (total - sent) / rate
                parts.append(f"{rate / 1e6:.0f} MB/s, {'at least ' if waiting else ''}{_duration(left)} left")
        pushing = [f"{name[:12]} {_gb(layer.current)}/{_gb(layer.total)} GB"
                   for name, layer in sorted(self.layers.items()) if layer.state == "Pushing" and layer.total]
        if pushing:
            parts.append("pushing " + ", ".join(pushing))
        return "; ".join(parts)

    def sent(self) -> int:
        return sum(layer.current for layer in self.layers.values())

    def rate(self, now: Optional[float] = None) -> float:
        """Bytes per second since the first byte went (0 before that)."""
        if self.first_byte is None:
            return 0.0
        seconds = (time.monotonic() if now is None else now) - self.first_byte
        return self.sent() / seconds if seconds > 0.5 else 0.0

    def _counts(self) -> str:
        pushed = sum(1 for layer in self.layers.values() if layer.state == "Pushed")
        present = sum(1 for layer in self.layers.values() if layer.state == "Layer already exists")
        return f"{pushed + present}/{len(self.layers)} layers done ({present} already in the registry)"

    def stopped(self) -> None:
        """The push ended without finishing (Ctrl-C, an error): the heartbeat stops, and the line says so;
        the error or 'interrupted' follows from the caller."""
        self._stop.set()
        sent = self.sent()
        moved = f", {_gb(sent)} GB sent" if sent else ""
        REPORT.say(f"{self.ref}: push stopped after {time.monotonic() - self.start:.1f} s{moved}; pushing again "
                   "sends only the layers the registry lacks")

    def done(self) -> None:
        self._stop.set()
        seconds = max(time.monotonic() - self.start, 1e-3)
        size = f"; image {self.size / 1e9:.2f} GB" if self.size else ""
        sent = self.sent()
        moved = f", {_gb(sent)} GB sent at {sent / seconds / 1e6:.0f} MB/s" if sent else ""
        counts = f": {self._counts()}" if self.layers else ""
        REPORT.say(f"{self.ref}: done in {seconds:.1f} s{counts}{moved}{size}")


def _gb(n: float) -> str:
    return f"{n / 1e9:.2f}"


def _duration(seconds: float) -> str:
    seconds = max(0, int(seconds))
    return f"{seconds // 60} min {seconds % 60} s" if seconds >= 60 else f"{seconds} s"


_CACHE_HIT = re.compile(r"--> Using cache ([0-9a-f]{64})")


class BuildSteps:
    """Seconds of BuildKit's named steps from its plain progress ('#12 exporting to image' ... '#12 DONE 4.1s'),
    so a build can say how long its export took apart from its RUN steps; and the images podman/buildah served
    steps from ('--> Using cache <id>'), so the build keeps them as its cache (imagebuild/buildcache.py)."""

    def __init__(self) -> None:
        self.names: Dict[str, str] = {}
        self.seconds: Dict[str, float] = {}
        self.cache_hits: Set[str] = set()

    def feed(self, line: str) -> None:
        hit = _CACHE_HIT.search(line)
        if hit:
            self.cache_hits.add(f"sha256:{hit.group(1)}")
            return
        number, _, rest = line.partition(" ")
        if not number.startswith("#") or not number[1:].isdigit():
            return
        if rest.startswith("DONE ") and rest.endswith("s") and number in self.names:
            try:
                self.seconds[self.names[number]] = self.seconds.get(self.names[number], 0.0) + float(rest[5:-1])
            except ValueError:
                pass
        elif number not in self.names and rest and not rest[:1].isdigit() and not rest.startswith("sha256:"):
            self.names[number] = rest
