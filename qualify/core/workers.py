"""Reading many files at once, in worker processes.

The census is Python walking headers plus C decoders, one library (cuFFT)
alone takes a quarter of a second, and a threaded reader would share one
interpreter lock: so `qualify inspect` reads files in a pool of processes,
the largest first, each worker handing back a small summary (core/summary.py).
The probe inside an image does not use this: it keeps to one process (the
image-side boundary in ARCHITECTURE.md), so `census.scan` defaults to jobs=1.

Nothing is lost to a failing pool. If the pool cannot start (a sandbox
without a working sem_open, say), the files are read in this process. If a
worker dies (a decoder crashing on a hostile file, the OOM killer), the files
in flight are read again, each in a fresh process of its own; a file whose
reader dies twice becomes `on_crash`'s answer (an error row), so one bad
file never ends the census or hides the others.

Standard library only, Python 3.9 compatible.
"""

from __future__ import annotations

import os
from typing import Callable, List, Optional, Sequence, TypeVar

T = TypeVar("T")
R = TypeVar("R")

# Beyond this many processes the census gains little (the largest library is
# the critical path) while memory grows by ~60-90 MB per worker.
MAX_DEFAULT_JOBS = 8


def default_jobs() -> int:
    """The CPUs this process may run on, at most MAX_DEFAULT_JOBS."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    return max(1, min(cpus, MAX_DEFAULT_JOBS))


def _context():
    import multiprocessing  # here, not at the top: the probe imports this module and never forks

    # fork: a worker starts in milliseconds with the modules already imported;
    # spawn would re-import the toolkit in every worker (~50 ms each).
    methods = multiprocessing.get_all_start_methods()
    return multiprocessing.get_context("fork" if "fork" in methods else methods[0])


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
    if jobs <= 1 or len(items) <= 1:
        return [_guarded(fn, item, on_crash) for item in items]
    from concurrent.futures import ProcessPoolExecutor, as_completed
    from concurrent.futures.process import BrokenProcessPool

    try:
        pool = ProcessPoolExecutor(max_workers=min(jobs, len(items)), mp_context=_context())
    except (OSError, ImportError, NotImplementedError, ValueError):
        return [_guarded(fn, item, on_crash) for item in items]
    results: List[Optional[R]] = [None] * len(items)
    lost: List[int] = []
    order = sorted(range(len(items)), key=lambda k: -cost(items[k]))
    with pool:
        try:
            futures = {pool.submit(fn, items[k]): k for k in order}
        except BrokenProcessPool:
            futures = {}
            lost = list(order)
        for future in as_completed(futures):
            k = futures[future]
            try:
                results[k] = future.result()
            except BrokenProcessPool:
                lost.append(k)
            except Exception as exc:  # a bug in fn: that file's row says so
                results[k] = on_crash(items[k], f"internal error while reading ({type(exc).__name__}: {exc})")
    for k in sorted(lost):
        results[k] = run_alone(fn, items[k], on_crash)
    return results  # type: ignore[return-value]


def _guarded(fn: Callable[[T], R], item: T, on_crash: Callable[[T, str], R]) -> R:
    try:
        return fn(item)
    except Exception as exc:
        return on_crash(item, f"internal error while reading ({type(exc).__name__}: {exc})")


def run_alone(fn: Callable[[T], R], item: T, on_crash: Callable[[T, str], R]) -> R:
    """`item` again, in a process of its own: did it kill the worker, or was it
    a neighbour's victim?"""
    from concurrent.futures import ProcessPoolExecutor
    from concurrent.futures.process import BrokenProcessPool

    try:
        with ProcessPoolExecutor(max_workers=1, mp_context=_context()) as pool:
            return pool.submit(fn, item).result()
    except BrokenProcessPool:
        return on_crash(item, "the process reading this file died (a crash or the memory limit); it was read twice")
    except Exception as exc:
        return on_crash(item, f"internal error while reading ({type(exc).__name__}: {exc})")
