"""Reading many files at once, in worker processes.

The census is Python walking headers plus C decoders, one library (cuFFT)
alone takes a sixth of a second, and a threaded reader would share one
interpreter lock: so `qualify inspect` reads files in worker processes, the
largest first, each worker handing back a small summary (core/summary.py).
The probe inside an image does not use this: it keeps to one process (the
image-side boundary in ARCHITECTURE.md), so `census.scan` defaults to jobs=1.

The workers are forked here rather than by concurrent.futures: importing
concurrent.futures.process and multiprocessing took 12 ms and shutting them
down 5 ms, 6-8% of a whole census on the 2-core build host (0.36 -> 0.34 s),
and the census needs none of what they add. A worker is a fork of this
process (the tasks are already in its memory), one pipe that hands it task
numbers and one that brings back pickled, length-prefixed results.

Nothing is lost to a failing worker. If no process can be forked, the files
are read in this process. If a worker dies (a decoder crashing on a hostile
file, the OOM killer), the file it was reading is read again in a process of
its own, and a file whose reader dies twice becomes `on_crash`'s answer (an
error row): one bad file never ends the census or hides the others.

Standard library only, Python 3.9 compatible.
"""

from __future__ import annotations

import contextlib
import gc
import os
import struct

from qualify.core.errors import internal_error
from qualify.core.record import field, record

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: typing is not imported at run time (the census's start-up)
    from typing import Callable, Dict, Iterator, List, Optional, Sequence, Tuple, TypeVar

    T = TypeVar("T")
    R = TypeVar("R")

# Beyond this many processes the census gains little (the largest library is
# the critical path) while memory grows by ~60-90 MB per worker.
MAX_DEFAULT_JOBS = 8

DIED = "the process reading this file died (a crash or the memory limit); it was read twice"


def default_jobs() -> int:
    """The CPUs this process may run on, less one for each CPU's worth of other work (the 1-minute load
    average, whole CPUs only, as `make -l` counts it), at least 1 and at most MAX_DEFAULT_JOBS.

    Workers pay only on CPUs that are free: on the 2-core build host, with other jobs keeping its load
    above 2, two workers read the bench's corpus slower than one process (their CPU time grew by half,
    and forking, pickling and waiting came on top), while on an idle host they read it faster
    (docs/performance.md; ARCHITECTURE.md, "Where we wrote our own code")."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    try:
        busy = int(os.getloadavg()[0])
    except (AttributeError, OSError):  # no load average (some platforms): every CPU counts
        busy = 0
    return max(1, min(cpus - busy, cpus, MAX_DEFAULT_JOBS))


def run_all(
    fn: Callable[[T], R],
    items: Sequence[T],
    jobs: int,
    cost: Callable[[T], int],
    on_crash: Callable[[T, str], R],
) -> List[R]:
    """[fn(item) for item in items], computed by up to `jobs` processes.

    `cost` orders the work (largest first, so the longest task does not start
    last); the results keep the order of `items`. `fn` must not raise: an
    exception it raises anyway is turned into on_crash(item, reason)."""
    if jobs <= 1 or len(items) <= 1 or not hasattr(os, "fork"):
        return [_guarded(fn, item, on_crash) for item in items]
    order = sorted(range(len(items)), key=lambda k: -cost(items[k]))
    with _frozen_heap():
        outcome = _Pool(fn, items, min(jobs, len(items))).run(order)
    results: List[Optional[R]] = [None] * len(items)
    for k, (ok, value) in outcome.done.items():
        results[k] = value if ok else on_crash(items[k], value)
    for k in sorted(outcome.lost):
        results[k] = run_alone(fn, items[k], on_crash)
    for k in outcome.untaken:  # no process could be forked: read here, as with jobs=1
        results[k] = _guarded(fn, items[k], on_crash)
    return results  # type: ignore[return-value]


def run_alone(fn: Callable[[T], R], item: T, on_crash: Callable[[T, str], R]) -> R:
    """`item` again, in a process of its own: did it kill the worker, or was it
    a neighbour's victim? (In this process when none can be forked.)"""
    if not hasattr(os, "fork"):
        return _guarded(fn, item, on_crash)
    outcome = _Pool(fn, [item], 1).run([0])
    if outcome.lost:
        return on_crash(item, DIED)
    if outcome.untaken:
        return _guarded(fn, item, on_crash)
    ok, value = outcome.done[0]
    return value if ok else on_crash(item, value)


@contextlib.contextmanager
def _frozen_heap() -> Iterator[None]:
    """The objects that exist when the workers fork are left out of garbage
    collection until they are done (gc.freeze, as the gc module's
    documentation advises before fork): a collection in a worker would
    otherwise write to every inherited object and copy its page."""
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


_TASK = struct.Struct("<I")  # a task number, parent -> worker
_LENGTH = struct.Struct("<Q")  # a result's length, worker -> parent


class _Worker:
    def __init__(self, pid: int, tasks: int, results: int) -> None:
        self.pid, self.tasks, self.results = pid, tasks, results
        self.current: Optional[int] = None  # the task it is working on


@record
class _Outcome:
    done: Dict[int, Tuple[bool, object]] = field(default_factory=dict)  # task -> (ok, result or reason)
    lost: List[int] = field(default_factory=list)  # its worker died while reading it
    untaken: List[int] = field(default_factory=list)  # no worker could be forked to read it


class _Pool:
    """Forked workers over `items`: run(order) hands the tasks out in that
    order, each to the next free worker. A worker that dies is replaced while
    tasks remain."""

    def __init__(self, fn: Callable, items: Sequence, jobs: int) -> None:
        self.fn, self.items, self.jobs = fn, items, jobs
        self.workers: Dict[int, _Worker] = {}  # by results pipe
        self.pending: List[int] = []
        self.outcome = _Outcome()

    def run(self, order: List[int]) -> _Outcome:
        import pickle  # noqa: F401  (before forking: each worker would import it again)

        self.pending = list(reversed(order))  # popped from the end: largest first
        try:
            for _ in range(self.jobs):
                if not self._start():
                    break
            busy = self._busy()
            while busy:
                for fd in _readable(busy):
                    self._collect(self.workers[fd])
                busy = self._busy()
        finally:
            self._stop_all()
        self.outcome.untaken = self.pending[::-1]
        return self.outcome

    def _busy(self) -> List[int]:
        return [fd for fd, w in self.workers.items() if w.current is not None]

    def _start(self) -> bool:
        """A new worker with the next task; False when none can be forked."""
        if not self.pending:
            return True
        try:
            worker = self._fork()
        except OSError:
            return False
        self._hand_out(worker)
        return True

    def _collect(self, worker: _Worker) -> None:
        task, result = worker.current, _receive(worker.results)
        if result is None:  # it died: the task is read again alone, and a new worker takes over
            self.outcome.lost.append(task)  # type: ignore[arg-type]
            worker.current = None
            self._retire(worker)
            self._start()
            return
        self.outcome.done[task] = result  # type: ignore[index]
        self._hand_out(worker)

    def _fork(self) -> _Worker:
        task_r, task_w = os.pipe()
        result_r, result_w = os.pipe()
        try:
            pid = os.fork()
        except OSError:
            for fd in (task_r, task_w, result_r, result_w):
                os.close(fd)
            raise
        if pid == 0:  # the worker: never returns
            for other in self.workers.values():  # its siblings' pipes: EOF must reach them
                _close(other.tasks)
                _close(other.results)
            os.close(task_w)
            os.close(result_r)
            _serve(self.fn, self.items, task_r, result_w)
        os.close(task_r)
        os.close(result_w)
        worker = self.workers[result_r] = _Worker(pid, task_w, result_r)
        return worker

    def _hand_out(self, worker: _Worker) -> None:
        if not self.pending:
            worker.current = None
            self._retire(worker)
            return
        worker.current = self.pending.pop()
        try:
            os.write(worker.tasks, _TASK.pack(worker.current))
        except OSError:  # it died before taking the task: its result pipe will say so
            pass

    def _retire(self, worker: _Worker) -> None:
        """No more tasks for it: closing its task pipe ends it."""
        if worker.tasks >= 0:
            _close(worker.tasks)
            worker.tasks = -1

    def _stop_all(self) -> None:
        """Every worker ends and is reaped; after an error or an interrupt
        here, the ones still busy are killed."""
        import signal

        for worker in self.workers.values():
            if worker.current is not None:
                with contextlib.suppress(OSError):
                    os.kill(worker.pid, signal.SIGKILL)
            self._retire(worker)
            _close(worker.results)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(worker.pid, 0)
        self.workers.clear()


def _readable(fds: List[int]) -> List[int]:
    """The pipes with something to read (or closed), waiting for at least one.
    poll has no FD_SETSIZE limit; select where there is no poll."""
    import select  # here, as pickle: only when workers run (a one-file census forks none)

    if hasattr(select, "poll"):
        poller = select.poll()
        for fd in fds:
            poller.register(fd, select.POLLIN)
        return [fd for fd, _event in poller.poll()]
    return select.select(fds, [], [])[0]


def _serve(fn: Callable, items: Sequence, tasks: int, results: int) -> None:
    """A worker's life: task numbers in, (ok, value) out, until its task pipe
    closes. It leaves by os._exit: the parent's atexit handlers and buffered
    output are the parent's alone."""
    import pickle  # the parent imported it before forking (_Pool.run): a lookup here

    code = 0
    try:
        while True:
            head = _read_exactly(tasks, _TASK.size)
            if head is None:
                break
            item = items[_TASK.unpack(head)[0]]
            try:
                payload = pickle.dumps((True, fn(item)), protocol=pickle.HIGHEST_PROTOCOL)
            except Exception as exc:  # a bug in fn, or a result that cannot be pickled: that file's row says so
                payload = pickle.dumps((False, internal_error(exc)))
            _write_all(results, _LENGTH.pack(len(payload)) + payload)
    except BaseException:  # an interrupt, a broken pipe: the parent sees the pipe close
        code = 1
    finally:
        os._exit(code)


def _receive(fd: int) -> Optional[tuple]:
    """One result, or None when the worker died before sending all of it."""
    import pickle

    head = _read_exactly(fd, _LENGTH.size)
    if head is None:
        return None
    body = _read_exactly(fd, _LENGTH.unpack(head)[0])
    return pickle.loads(body) if body is not None else None


def _read_exactly(fd: int, size: int) -> Optional[bytes]:
    chunks, got = [], 0
    while got < size:
        chunk = os.read(fd, min(size - got, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _close(fd: int) -> None:
    with contextlib.suppress(OSError):
        os.close(fd)


def _guarded(fn: Callable[[T], R], item: T, on_crash: Callable[[T, str], R]) -> R:
    try:
        return fn(item)
    except Exception as exc:
        return on_crash(item, internal_error(exc))

