"""Run the parts that import torch, triton or vllm in a child interpreter.

The probe never imports them itself: a segfault, a hang or a missing kernel
in the child becomes a recorded failure with its output, not a dead probe.
Each snippet in qualify/probe/snippets/ prints one JSON object as the last
line of its stdout.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence

from qualify.core.errors import ConfigError
from qualify.core.readlimit import strict_json

SNIPPETS = Path(__file__).resolve().parent / "snippets"


@dataclass
class ChildResult:
    ok: bool  # exited 0 and printed a JSON object
    data: Dict[str, Any] = field(default_factory=dict)
    returncode: Optional[int] = None
    timed_out: bool = False
    seconds: float = 0.0
    stdout_tail: str = ""
    stderr_tail: str = ""

    def failure(self) -> str:
        """One line saying how the child failed."""
        if self.timed_out:
            return f"timed out after {self.seconds:.0f} s"
        if self.returncode is not None and self.returncode < 0:
            try:
                name = signal.Signals(-self.returncode).name
            except ValueError:
                name = str(-self.returncode)
            return f"killed by signal {name}"
        last = (self.stderr_tail or self.stdout_tail).strip().splitlines()
        return f"exit {self.returncode}: {last[-1] if last else 'no output'}"

    def evidence(self) -> Dict[str, Any]:
        return {"returncode": self.returncode, "timed_out": self.timed_out, "seconds": round(self.seconds, 2),
                "stderr_tail": self.stderr_tail[-2000:]}


def tail(text: str, lines: int = 25) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def run_snippet(name: str, args: Sequence[str] = (), *, timeout: float = 120,
                env: Optional[Mapping[str, str]] = None, python: Optional[str] = None) -> ChildResult:
    """Run snippets/<name>.py with the image's interpreter; parse its last stdout line."""
    return run_python([str(SNIPPETS / f"{name}.py"), *args], timeout=timeout, env=env, python=python)


def run_python(argv: Sequence[str], *, timeout: float = 120, env: Optional[Mapping[str, str]] = None,
               python: Optional[str] = None) -> ChildResult:
    full_env = dict(os.environ)
    full_env.update(env or {})
    full_env.setdefault("PYTHONUNBUFFERED", "1")
    return run_command([python or sys.executable, *argv], timeout=timeout, env=full_env)


def run_command(argv: List[str], *, timeout: float, env: Optional[Mapping[str, str]] = None) -> ChildResult:
    start = time.monotonic()
    try:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                                env=dict(env) if env is not None else None, start_new_session=True)
    except OSError as exc:
        return ChildResult(False, returncode=None, stderr_tail=str(exc))
    try:
        out, err = proc.communicate(timeout=timeout)
        timed_out = False
    except subprocess.TimeoutExpired:
        # The whole process group: compilers and workers the child started too.
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass
        out, err = proc.communicate()
        timed_out = True
    seconds = time.monotonic() - start
    stdout = out.decode("utf-8", "replace")
    stderr = err.decode("utf-8", "replace")
    data: Dict[str, Any] = {}
    for line in reversed(stdout.strip().splitlines()):
        try:
            # nonfinite: a measurement that came out NaN is the child's result, not a broken report
            parsed = strict_json(line, "the child's report", ConfigError, nonfinite=True)
        except ConfigError:
            continue
        if isinstance(parsed, dict):
            data = parsed
        break
    ok = (not timed_out) and proc.returncode == 0 and bool(data)
    return ChildResult(ok, data, proc.returncode, timed_out, seconds, tail(stdout), tail(stderr))
