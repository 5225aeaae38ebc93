"""One way to run external commands: argument lists, never shell strings.

Echoes the quoted command, checks the program exists first, and raises
ExternalCommandError naming the command and the tail of its output.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from typing import Callable, List, Mapping, Optional, Sequence

from qualify.core.errors import ExternalCommandError


@dataclass(frozen=True)
class Result:
    args: Sequence[str]
    returncode: int
    stdout: str
    stderr: str


def quote(args: Sequence[str]) -> str:
    return " ".join(shlex.quote(str(a)) for a in args)


def tail(text: str, lines: int = 20) -> str:
    return "\n".join(text.rstrip().splitlines()[-lines:])


def which(program: str) -> Optional[str]:
    return program if os.path.isabs(program) and os.access(program, os.X_OK) else shutil.which(program)


def call(
    args: Sequence[str],
    *,
    check: bool = True,
    capture: bool = True,
    env: Optional[Mapping[str, str]] = None,
    cwd: Optional[str] = None,
    timeout: Optional[float] = None,
    echo: bool = False,
    input_text: Optional[str] = None,
) -> Result:
    """Run a command. stdin is closed unless `input_text` is given."""
    args = [str(a) for a in args]
    if which(args[0]) is None:
        raise ExternalCommandError(
            f"program not found: {args[0]}", hint="install it, or run scripts/setup-host.sh"
        )
    if echo:
        print(f"+ {quote(args)}", file=sys.stderr, flush=True)
    full_env = None if env is None else {**os.environ, **env}
    try:
        proc = subprocess.run(
            args,
            input=input_text,
            stdin=None if input_text is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE if capture else None,
            stderr=subprocess.PIPE if capture else None,
            text=True,
            env=full_env,
            cwd=cwd,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired as exc:
        raise ExternalCommandError(f"command timed out after {timeout} s: {quote(args)}") from exc
    result = Result(args, proc.returncode, proc.stdout or "", proc.stderr or "")
    if check and proc.returncode != 0:
        raise ExternalCommandError(
            f"command failed (exit {proc.returncode}): {quote(args)}\n"
            + tail(result.stderr or result.stdout)
        )
    return result


def ask(args: Sequence[str], *, timeout: float = 60, env: Optional[Mapping[str, str]] = None) -> Result:
    """A question to a tool whose failure is itself the answer (does Docker answer? is there a runtime?):
    never raises. A missing or unrunnable program is exit 127, a timeout 124, each with a message."""
    return _run(args, timeout, env, capture=True)


def watched(args: Sequence[str], *, timeout: float = 900, env: Optional[Mapping[str, str]] = None) -> Result:
    """A command whose output the user watches (a pull, compose up): it goes to our stderr, since our stdout
    is for what a command produces; the exit status is the caller's to judge (never raises)."""
    return _run(args, timeout, env, capture=False)


def _run(args: Sequence[str], timeout: float, env: Optional[Mapping[str, str]], capture: bool) -> Result:
    args = [str(a) for a in args]
    full_env = None if env is None else {**os.environ, **env}
    try:
        proc = subprocess.run(args, stdin=subprocess.DEVNULL, text=True, timeout=timeout, env=full_env,
                              capture_output=capture, stdout=None if capture else sys.stderr.fileno())
    except subprocess.TimeoutExpired:
        return Result(args, 124, "", f"{args[0]} did not finish within {timeout:g} s")
    except OSError as exc:
        return Result(args, 127, "", f"{args[0]}: {exc.strerror or exc}")
    return Result(args, proc.returncode, proc.stdout or "", proc.stderr or "")


def streamed(argv: List[str], timeout: float, on_line: Callable[[str], None]) -> subprocess.CompletedProcess:
    """subprocess.run with stderr handed to `on_line` line by line while the command runs."""
    import threading

    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, bufsize=1)
    err_lines: List[str] = []
    out_chunks: List[str] = []

    def pump_err() -> None:
        for line in proc.stderr:
            err_lines.append(line)
            on_line(line.rstrip("\n"))

    threads = [threading.Thread(target=pump_err, daemon=True),
               threading.Thread(target=lambda: out_chunks.append(proc.stdout.read()), daemon=True)]
    for t in threads:
        t.start()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise
    for t in threads:
        t.join(timeout=10)
    return subprocess.CompletedProcess(argv, proc.returncode, "".join(out_chunks), "".join(err_lines))
