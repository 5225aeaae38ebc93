"""Named steps: what release, promote and deploy do, in order (issue 52).

Each step ends done or skipped (with the reason); it keeps what it recovered of an earlier, interrupted
run. The progress lines and a dry run's listing come from here, so
the three commands report alike (as goreleaser's pipes and cibuildwheel's logger do):

    - tag: check the tag name v1.2.0 ...
      done: tag (0.1 s): v1.2.0
    - push: skipped (--dry-run)

Standard library only, Python 3.9 compatible (core is the image side's too).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Callable, List, Optional, Tuple


class Status(str, Enum):
    DONE = "done"
    SKIPPED = "skipped"


@dataclass(frozen=True)
class Step:
    name: str
    status: Status
    detail: str = ""  # what it did, or why it was skipped
    seconds: float = 0.0
    recovered: Tuple[str, ...] = ()  # what an earlier, interrupted run had done that this step took over


def _silent(_line: str) -> None:
    pass


@dataclass
class Steps:
    """Runs steps in order and records each; `progress` gets the lines (None: recorded only)."""

    progress: Optional[Callable[[str], None]] = None
    done: List[Step] = field(default_factory=list)
    _recovered: Optional[List[str]] = field(default=None, init=False, repr=False)

    def _say(self, line: str) -> None:
        (self.progress or _silent)(line)

    def run(self, name: str, what: str, fn: Callable[[], Any], detail: Callable[[Any], str] = str) -> Any:
        """`fn()` as step `name`; `detail(result)` says what it did. An exception ends the step unrecorded."""
        start = time.monotonic()
        self._say(f"- {name}: {what} ...")
        outer, self._recovered = self._recovered, []
        try:
            result = fn()
            recovered = tuple(self._recovered)
        finally:
            self._recovered = outer
        text = detail(result)
        seconds = time.monotonic() - start
        self.done.append(Step(name, Status.DONE, text, seconds, recovered))
        self._say(f"  done: {name} ({seconds:.1f} s){': ' + text if text else ''}")
        return result

    def skip(self, name: str, reason: str) -> None:
        self.done.append(Step(name, Status.SKIPPED, reason))
        self._say(f"- {name}: skipped ({reason})")

    def recover(self, note: str) -> None:
        """What an earlier run left that this one takes over: kept by the running step (else the last one)."""
        if self._recovered is not None:
            self._recovered.append(note)
        elif self.done:
            last = self.done[-1]
            self.done[-1] = Step(last.name, last.status, last.detail, last.seconds, (*last.recovered, note))
