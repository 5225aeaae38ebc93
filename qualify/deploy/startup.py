"""The server's start, once compose started its container: the wait for /health, the canary and its figures.

What it says when the start goes wrong (issue 48): a server vLLM refused to start is "failed to start", with
vLLM's reason (the last error lines of its log), never "stopped (running, 3 restarts)"; a throughput figure
measured on a busy host says so (hostload.py). On unified memory (GB10) the pool is watched while this runs
(memwatch.py), and the server is stopped when the host runs short.
"""

from __future__ import annotations

import contextlib
import re
import time
from dataclasses import dataclass
from typing import Iterator, List, Optional

from qualify.deploy import api, compose, hostload, memwatch
from qualify.deploy.errors import DeployError
from qualify.deploy.preflight import HostPlan
from qualify.deploy.settings import Settings
from qualify.deploy.ui import EX_CHECK, EX_DEPLOY, EX_INTERRUPTED, Stop, Ui
from qualify.host import cmd

HEALTH_POLL_S = 2
PROGRESS_EVERY_S = 10
MAX_RESTARTS = 3
SETTLE_S = 15  # how long a restarted container's exit code is waited for
# A Python exception line as vLLM's log shows it: bare, after a logger's prefix, or after a process's tag
# ("(EngineCore_DP0 pid=42) ValueError: ..."); the exception's name ends in Error or Exception.
_EXCEPTION = re.compile(r"(?<![\w.])((?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?:Error|Exception))(?::\s*(.*))?$")
MAX_REASONS = 3


@dataclass(frozen=True)
class ContainerState:
    status: str  # the engine's: created, running, restarting, exited, dead; missing when it is gone
    restarts: int = 0
    exit_code: Optional[int] = None
    oom_killed: bool = False


def reasons(lines: List[str]) -> List[str]:
    """vLLM's reason in its log: the last distinct exception lines (the cause and what it became, e.g. the
    ValueError and the RuntimeError 'Engine core initialization failed' after it), oldest first."""
    found: List[str] = []
    for line in lines:
        m = _EXCEPTION.search(line.strip())
        if m and (m.group(2) is not None or m.end(1) == len(line.strip())):
            text = line.strip()[m.start(1):]
            if text in found:
                found.remove(text)
            found.append(text)
    return found[-MAX_REASONS:]


def _merged(stdout: str, stderr: str) -> List[str]:
    """`logs --timestamps` of both streams, in the order they were written, timestamps taken off."""
    rows = []
    for n, line in enumerate(stdout.splitlines() + stderr.splitlines()):
        stamp, _, text = line.partition(" ")
        whole, _, fraction = stamp.rstrip("Z").partition(".")
        rows.append(((whole, float("0." + fraction) if fraction.isdigit() else 0.0, n), text))
    return [text for _, text in sorted(rows)]


class Startup:
    def __init__(self, s: Settings, plan: HostPlan, ui: Ui, cid: str, url: str,
                 load_before: Optional[hostload.Load] = None) -> None:
        self.s, self.plan, self.ui, self.cid, self.url, self.load_before = s, plan, ui, cid, url, load_before
        self.watch: Optional[memwatch.Watch] = None

    # --- the container ---------------------------------------------------------------------

    def state(self) -> ContainerState:
        fmt = "{{.State.Status}} {{.RestartCount}} {{.State.ExitCode}} {{.State.OOMKilled}}"
        proc = cmd.ask([self.plan.engine.cli, "inspect", "--format", fmt, self.cid])
        parts = proc.stdout.split() if proc.returncode == 0 else []
        if len(parts) < 2 or not parts[1].isdigit():
            return ContainerState("missing")
        code = int(parts[2]) if len(parts) > 2 and parts[2].lstrip("-").isdigit() else None
        return ContainerState(parts[0], int(parts[1]), code, len(parts) > 3 and parts[3] == "true")

    def settled(self, st: ContainerState) -> ContainerState:
        """The state with its last exit code: the engine reads 0 while a restarted container runs again, so
        a busy host that polls then would report "vLLM exited" without the code. Restart back-off keeps it
        `restarting` (code kept) most of the time, so a short wait finds it."""
        deadline = time.monotonic() + SETTLE_S
        while st.status == "running" and st.restarts and not st.exit_code and time.monotonic() < deadline:
            time.sleep(HEALTH_POLL_S / 4)
            st = self.state()
        return st

    def log_tail(self) -> List[str]:
        n = self.s.log_tail_lines
        self.ui.say(f"last {n} log lines of {compose.SERVICE}:")
        proc = cmd.ask([self.plan.engine.cli, "logs", "--timestamps", "--tail", str(n), self.cid])
        lines = _merged(proc.stdout, proc.stderr) if proc.returncode == 0 else (proc.stdout + proc.stderr).splitlines()
        for line in lines:
            self.ui.raw(f"  | {line}")
        return lines

    def failed_to_start(self, st: ContainerState) -> Stop:
        lines = self.log_tail()
        if st.status == "missing":
            what = "the server container is gone (removed while it started)"
        else:
            code = f" with code {st.exit_code}" if st.exit_code not in (None, 0) or st.status == "exited" else ""
            how = "the kernel killed it for want of memory (OOM)" if st.oom_killed else f"vLLM exited{code}"
            again = f" and compose restarted it {st.restarts} time{'s' * (st.restarts != 1)}" if st.restarts else ""
            said = reasons(lines)
            why = (f"; vLLM's reason: {' / '.join(said)}" if said else
                   "; its log names no error (see its last lines above)")
            what = f"the server failed to start: {how}{again} before /health answered{why}"
        return Stop(EX_DEPLOY, what, f"read the log above; {self.s.hint('stop')} removes the container")

    # --- the unified pool (GB10) -----------------------------------------------------------

    @contextlib.contextmanager
    def watching_memory(self) -> Iterator[None]:
        """On unified memory: MemAvailable watched until the canary is done (memwatch.py); elsewhere nothing."""
        runtime = self.plan.target.runtime
        if not self.plan.fit.unified:
            yield
            return
        first = memwatch.read()
        if first is None:
            self.ui.warn("cannot read MemAvailable from /proc/meminfo: the unified pool is not watched while the "
                         "server starts")
            yield
            return
        self.ui.say(f"memory: watching MemAvailable (now {first.available_gib:.1f} GiB) every "
                    f"{memwatch.INTERVAL_S:g} s until the canary is done; below {runtime.host_reserve_gib} GiB "
                    "(host_reserve_gib) the server is stopped")
        with memwatch.Watch(runtime.host_reserve_gib, self._stop_for_memory) as watch:
            self.watch = watch
            try:
                yield
            finally:
                self.watch = None
        self._memory_check(watch)  # a reading in the last second before the watch stopped
        if watch.lowest is not None:
            self.ui.say(f"memory: MemAvailable stayed at or above {watch.lowest.available_gib:.1f} GiB "
                        f"({watch.readings} readings)")

    def _stop_for_memory(self, short: memwatch.Shortfall) -> None:
        self.ui.warn(f"MemAvailable {short.reading.available_gib:.1f} GiB is below the host's reserve of "
                     f"{short.reserve_gib:g} GiB {short.phase}: stopping the server now")
        cmd.ask([self.plan.engine.cli, "kill", self.cid], timeout=60)

    def _memory_check(self, watch: Optional[memwatch.Watch] = None) -> None:
        watch = watch or self.watch
        short = watch.tripped if watch else None
        if short is None:
            return
        fit, rt = self.plan.fit, self.plan.target.runtime
        fixes = memwatch.advice(short, fit.gpu_memory_utilization, fit.pool_gib, rt.min_gpu_memory_gib,
                                self.s.max_model_len, str(self.s.env_file))
        raise Stop(EX_DEPLOY, f"unified memory ran short {short.phase}: MemAvailable fell to "
                   f"{short.reading.available_gib:.1f} GiB of {short.reading.total_gib:.1f} GiB after "
                   f"{short.seconds:.0f} s, below the {short.reserve_gib:g} GiB the host keeps for itself "
                   "(host_reserve_gib in images/targets.toml); the server was stopped before the host stalls "
                   "(vllm-project/vllm#46307)", *fixes,
                   f"then ./start.sh again; {self.s.hint('stop')} removes the stopped container")

    # --- /health -------------------------------------------------------------------------------

    def wait_healthy(self) -> None:
        try:
            self._wait_healthy()
        except KeyboardInterrupt:
            # Ctrl-C stops this wait, not the server: the container goes on starting.
            raise Stop(EX_INTERRUPTED, f"interrupted while waiting for {self.url}/health; the server container "
                       f"{self.cid[:12]} (compose project {self.s.compose_project}) is still running and starting",
                       f"{self.s.hint('stop')} stops it",
                       f"or let it start: {self.s.hint('status')} says when it is healthy; ./start.sh again runs "
                       "its checks and waits for /health again (compose keeps the container when nothing changed)"
                       ) from None

    def _wait_healthy(self) -> None:
        limit = self.s.health_timeout_s
        self.ui.say(f"waiting up to {limit} s for {self.url}/health (a first start downloads the model)")
        start = time.monotonic()
        next_note = start
        while not api.health(self.url).ok:
            self._memory_check()
            st = self.state()
            elapsed = time.monotonic() - start
            if st.status in ("exited", "dead", "missing") or st.restarts >= MAX_RESTARTS:
                raise self.failed_to_start(self.settled(st))
            if elapsed >= limit:
                self.log_tail()
                raise Stop(EX_DEPLOY, f"the server did not become healthy within {limit} s (it is left running)",
                           f"read the log above; if it is still downloading, raise HEALTH_TIMEOUT_S in "
                           f"{self.s.env_file} or watch {self.s.hint('status')}", f"{self.s.hint('stop')} stops it")
            if time.monotonic() >= next_note:
                self.ui.say(f"  ... {int(elapsed)} s of {limit} s: container {st.status}, /health not ready yet")
                next_note = time.monotonic() + PROGRESS_EVERY_S
            time.sleep(HEALTH_POLL_S)
        self._memory_check()
        self.ui.say(f"healthy after {int(time.monotonic() - start)} s")

    # --- the canary ---------------------------------------------------------------------------

    def canary(self) -> Optional[api.Throughput]:
        if self.watch is not None:
            self.watch.phase = memwatch.CANARY
        model = self.s.served_model_name
        result = api.canary(self.url, model)
        self._memory_check()
        self.ui.raw(f"canary: {'ok' if result.ok else 'FAILED'}: {result.detail}")
        if not result.ok:
            self.log_tail()
            raise Stop(EX_CHECK, "the canary chat completion failed (see above)",
                       f"read the log above; {self.s.hint('verify', '--smoke')} repeats it")
        try:
            figures = api.throughput(self.url, model)
        except DeployError as exc:
            self._memory_check()
            self.ui.warn(f"canary figures not measured: {exc}")
            return None
        self._memory_check()
        self.ui.say(self.figures_line(figures, hostload.busy_note(self.load_before, hostload.sample())))
        return figures

    @staticmethod
    def figures_line(figures: api.Throughput, busy: str) -> str:
        over = "from the first to the last chunk" if figures.basis == "stream" else \
            "over the whole request: the stream came in a burst"
        return (f"canary figures: time to first token {figures.ttft_s:.3f} s, {figures.tokens_per_s:g} tokens/s "
                f"({figures.tokens} tokens in {figures.interval_s:.2f} s, {over})" + (f"; {busy}" if busy else ""))
