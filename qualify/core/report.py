"""One reporter for progress and step timing, used by every stage (issue 28).

Progress goes to stderr as `[stage] message`, flushed at once (a long step is not silence, and stdout stays
for what a command produces: JSON, a compose file, a table). Names from files and images reach these lines,
so control characters are escaped (core.errors.printable). `step()` times a step and says how it ended, as
cibuildwheel's logger and goreleaser's logging middleware do. The deploy's scripts keep their own `Ui`
(deploy/ui.py: `[start.sh]`-style lines with fixes), built on the same printable().

Standard library only, Python 3.9 compatible (the probe reports from inside images).
"""

from __future__ import annotations

import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterator

from qualify.core.errors import printable

# What a long operation is handed to say how it is going: a Reporter is one, so is any function of a line.
Progress = Callable[[str], None]


def emit(text: str, escape: bool = True, end: str = "\n") -> None:
    """The one writer of stderr (tests/test_house_rules.py: no other module prints there): a message, an error,
    a command's echo, its control characters escaped unless `escape` is False (a child's own output passed on)."""
    sys.stderr.write((printable(text, newlines=True) if escape else text) + end)
    sys.stderr.flush()


@dataclass(frozen=True)
class Reporter:
    stage: str  # build, qualify, probe, release, publish, ...

    def say(self, message: str) -> None:
        emit(f"[{self.stage}] {message}")

    def __call__(self, message: str) -> None:
        self.say(message)

    def warn(self, message: str) -> None:
        self.say(f"warning: {message}")

    @contextmanager
    def step(self, what: str) -> Iterator[None]:
        """`what ...`, then `what: done in N s` or `what: failed after N s` (the error itself is the caller's)."""
        start = time.monotonic()
        self.say(f"{what} ...")
        try:
            yield
        except BaseException:
            self.say(f"{what}: failed after {time.monotonic() - start:.1f} s")
            raise
        self.say(f"{what}: done in {time.monotonic() - start:.1f} s")
