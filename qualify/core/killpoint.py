"""Named points where a run may be killed on purpose, for the interruption tests (issue 30: "an
environment variable naming the step at which the run kills itself"). With QUALIFY_KILL_AT=<name> the
process sends itself SIGKILL when it reaches that point: no clean-up runs, exactly as a kill -9 or a
power cut. Unset (always, outside those tests), `reached` does nothing. Standard library only."""

from __future__ import annotations

import os
import signal

ENV = "QUALIFY_KILL_AT"


def reached(name: str) -> None:
    if os.environ.get(ENV) == name:
        os.kill(os.getpid(), signal.SIGKILL)
