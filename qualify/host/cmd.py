"""The one way the host side runs external commands: argument lists, never shell strings.

Echoes the quoted command, checks the program exists first, and raises
ExternalCommandError naming the command and the tail of its output. Every host-side module runs its
children through here (tests/test_house_rules.py fails on a `subprocess` import anywhere else outside the
allow-list): `call` (checked), `ask` (the exit status is the answer), `watched` (output to the user),
`streamed` (stderr line by line), `output` (bytes), `spawn` (a child whose pipes the caller reads, or a
daemon), `Pipe` (a conversation with one long-lived child, such as `git cat-file --batch`) and
`replace_process` (exec).
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
from qualify.core.report import emit

TimeoutExpired = subprocess.TimeoutExpired
PIPE, DEVNULL, STDOUT = subprocess.PIPE, subprocess.DEVNULL, subprocess.STDOUT


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
        emit(f"+ {quote(args)}")
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


def ask(args: Sequence[str], *, timeout: float = 60, env: Optional[Mapping[str, str]] = None,
        cwd: Optional[str] = None) -> Result:
    """A question to a tool whose failure is itself the answer (does Docker answer? is there a runtime?):
    never raises. A missing or unrunnable program is exit 127, a timeout 124, each with a message."""
    return _run(args, timeout, env, capture=True, cwd=cwd)


def watched(args: Sequence[str], *, timeout: float = 900, env: Optional[Mapping[str, str]] = None) -> Result:
    """A command whose output the user watches (a pull, compose up): it goes to our stderr, since our stdout
    is for what a command produces; the exit status is the caller's to judge (never raises)."""
    return _run(args, timeout, env, capture=False)


def _run(args: Sequence[str], timeout: float, env: Optional[Mapping[str, str]], capture: bool,
         cwd: Optional[str] = None) -> Result:
    args = [str(a) for a in args]
    full_env = None if env is None else {**os.environ, **env}
    try:
        proc = subprocess.run(args, stdin=subprocess.DEVNULL, text=True, timeout=timeout, env=full_env, cwd=cwd,
                              capture_output=capture, stdout=None if capture else sys.stderr.fileno())
    except subprocess.TimeoutExpired:
        return Result(args, 124, "", f"{args[0]} did not finish within {timeout:g} s")
    except OSError as exc:
        return Result(args, 127, "", f"{args[0]}: {exc.strerror or exc}")
    return Result(args, proc.returncode, proc.stdout or "", proc.stderr or "")


def streamed(argv: List[str], timeout: float, on_line: Callable[[str], None]) -> Result:
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
    return Result(argv, proc.returncode, "".join(out_chunks), "".join(err_lines))


def captured(args: Sequence[str], *, timeout: Optional[float] = None) -> Result:
    """Run a command for its text output, its status the caller's to judge; a timeout raises TimeoutExpired
    (the caller knows what to clean up: a container by name), a missing program OSError."""
    args = [str(a) for a in args]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    return Result(args, proc.returncode, proc.stdout or "", proc.stderr or "")


@dataclass(frozen=True)
class Output:
    """What `output` gives: the exit status and the raw bytes (None when the program could not run or timed out)."""

    returncode: int
    stdout: bytes
    stderr: bytes


def output(args: Sequence[str], *, timeout: float = 60, cwd: Optional[str] = None, input_bytes: Optional[bytes] = None,
           env: Optional[Mapping[str, str]] = None) -> Output:
    """Run a command for its bytes (git objects, a tool's raw output); never raises: a missing program is 127,
    a timeout 124."""
    args = [str(a) for a in args]
    full_env = None if env is None else {**os.environ, **env}
    try:
        proc = subprocess.run(args, input=input_bytes, stdin=None if input_bytes is not None else subprocess.DEVNULL,
                              capture_output=True, timeout=timeout, cwd=cwd, env=full_env)
    except subprocess.TimeoutExpired:
        return Output(124, b"", f"{args[0]} did not finish within {timeout:g} s".encode())
    except OSError as exc:
        return Output(127, b"", f"{args[0]}: {exc.strerror or exc}".encode())
    return Output(proc.returncode, proc.stdout or b"", proc.stderr or b"")


def spawn(args: Sequence[str], **kwargs) -> subprocess.Popen:
    """A child whose pipes the caller reads while it runs (an export stream, a build log, a daemon). stdin is
    closed unless the caller says otherwise; the caller waits for it (or, for a daemon, never)."""
    kwargs.setdefault("stdin", subprocess.DEVNULL)
    return subprocess.Popen([str(a) for a in args], **kwargs)


def replace_process(argv: Sequence[str]) -> None:
    """exec: this process becomes `argv` (python3 -m qualify moving into the toolkit's venv); never returns."""
    os.execv(str(argv[0]), [str(a) for a in argv])


class Pipe:
    """A conversation with one long-lived child over its stdin and stdout, in bytes (`git cat-file --batch`:
    many objects through one process). A watchdog kills the child after `timeout` seconds in all; stderr is
    kept for the message of a failure."""

    def __init__(self, args: Sequence[str], *, cwd: Optional[str] = None, timeout: float = 300) -> None:
        import tempfile
        import threading

        self.args = [str(a) for a in args]
        if which(self.args[0]) is None:
            raise ExternalCommandError(f"program not found: {self.args[0]}", hint="install it, or run scripts/setup-host.sh")
        self._err = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(self.args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._err, cwd=cwd)
        self._timer = threading.Timer(timeout, self.proc.kill)
        self._timer.daemon = True
        self._timer.start()

    def send(self, data: bytes) -> None:
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def readline(self, limit: int) -> bytes:
        return self.proc.stdout.readline(limit)

    def read(self, size: int) -> bytes:
        chunks, left = [], size
        while left > 0:
            block = self.proc.stdout.read(min(left, 1 << 20))
            if not block:
                break
            chunks.append(block)
            left -= len(block)
        return b"".join(chunks)

    def failure(self) -> str:
        """What the child said on stderr (its last lines), for an error message."""
        self._err.seek(0)
        return tail(self._err.read(64 * 1024).decode("utf-8", "replace"), 5)

    def close(self) -> None:
        self._timer.cancel()
        for stream in (self.proc.stdin, self.proc.stdout):
            try:
                stream.close()
            except OSError:
                pass
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._err.close()

    def __enter__(self) -> Pipe:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
