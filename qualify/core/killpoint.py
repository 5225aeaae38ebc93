"""Named points where a run may be killed on purpose, for the interruption tests (issue 30: "an
environment variable naming the step at which the run kills itself"). With QUALIFY_KILL_AT=<name> the
process sends itself SIGKILL when it reaches that point: no clean-up runs, exactly as a kill -9 or a
power cut. Unset (always, outside those tests), `reached` does nothing. Standard library only."""

from __future__ import annotations

import os
import signal

ENV = "QUALIFY_KILL_AT"  # <name>, or <name>#<n>: the n-th time the point is reached (a point inside a loop)
SIGNAL_ENV = "QUALIFY_KILL_WITH"  # INT: Ctrl-C (SIGINT, Python's KeyboardInterrupt) instead of SIGKILL

_seen: dict = {}


def reached(name: str) -> None:
    want = os.environ.get(ENV)
    if not want:
        return
    point, _, nth = want.partition("#")
    if point != name:
        return
    _seen[name] = _seen.get(name, 0) + 1
    if _seen[name] == (int(nth) if nth.isdigit() else 1):
        os.kill(os.getpid(), signal.SIGINT if os.environ.get(SIGNAL_ENV) == "INT" else signal.SIGKILL)
