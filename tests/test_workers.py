"""The census read by worker processes (qualify/core/workers.py): the same
report as one process, on real nvcc output; nothing lost when a worker dies."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest
from conftest import REPO

from qualify.core import census, workers
from qualify.core.arch import Capability


def canonical(report: census.CensusReport) -> str:
    return json.dumps(report.to_json(), sort_keys=True)


@pytest.mark.parametrize("detail", [False, True])
def test_workers_give_the_same_report_as_one_process(fx, tmp_path, detail):
    """Every fixture, a walked directory with a text file and a damaged copy,
    judged and not judged: byte-identical JSON for 1, 2 and 5 processes."""
    (tmp_path / "notes.txt").write_text("not a binary")
    damaged = tmp_path / "damaged.so"
    data = bytearray(fx.lib("plain", "zstd").read_bytes())
    data[len(data) // 2 : len(data) // 2 + 4096] = b"\xff" * 4096
    damaged.write_bytes(bytes(data))
    paths = [str(p) for p in fx.all_paths()] + [str(tmp_path)]
    for target in (None, Capability.parse("12.1")):
        reports = [canonical(census.scan(paths, target, detail=detail, jobs=jobs)) for jobs in (1, 2, 5)]
        assert reports[0] == reports[1] == reports[2]
        assert str(damaged) in reports[0]


def poison_or_echo(item: str) -> str:
    """A worker function that dies (SIGKILL) on one input, as a decoder crash would."""
    if item == "poison":
        os.kill(os.getpid(), signal.SIGKILL)
    return item.upper()


def crashed(item: str, reason: str) -> str:
    return f"crashed {item}: {reason}"


def test_a_dying_worker_costs_only_its_own_file():
    items = ["a", "b", "poison", "c", "d", "e"]
    out = workers.run_all(poison_or_echo, items, 3, len, crashed)
    assert out[:2] == ["A", "B"] and out[3:] == ["C", "D", "E"]
    assert out[2].startswith("crashed poison: the process reading this file died")


def raises_on_b(item: str) -> str:
    if item == "b":
        raise RuntimeError("a bug")
    return item


@pytest.mark.parametrize("jobs", [1, 2])
def test_an_exception_in_a_worker_is_that_file_s_error(jobs):
    out = workers.run_all(raises_on_b, ["a", "b", "c"], jobs, len, crashed)
    assert out == ["a", "crashed b: internal error while reading (RuntimeError: a bug)", "c"]


def unpicklable_on_b(item: str):
    return (lambda: item) if item == "b" else item


def test_a_result_that_cannot_travel_is_that_file_s_error():
    """A worker's result that pickle refuses is reported as such, not as a
    worker that died."""
    out = workers.run_all(unpicklable_on_b, ["a", "b", "c"], 2, len, crashed)
    assert out[0] == "a" and out[2] == "c"
    assert out[1].startswith("crashed b: internal error while reading (") and "pickle" in out[1].lower(), out[1]


def test_without_fork_files_are_read_in_this_process(monkeypatch):
    """Stand-in: a host where no process can be forked (a process limit, a
    sandbox) cannot be made here, so os.fork is made to fail the way it
    fails there (OSError: EAGAIN)."""
    calls = []

    def no_fork():
        calls.append(1)
        raise BlockingIOError(11, "Resource temporarily unavailable")

    monkeypatch.setattr(os, "fork", no_fork)
    assert workers.run_all(str.upper, ["a", "b", "c"], 4, len, crashed) == ["A", "B", "C"]
    assert calls  # it tried
    assert workers.run_alone(str.upper, "d", crashed) == "D"


def poison_all(item: str) -> str:
    if item.startswith("poison"):
        os.kill(os.getpid(), signal.SIGKILL)
    return item.upper()


def recording_forks(monkeypatch) -> list:
    """The pids of the workers forked from here on."""
    real, pids = os.fork, []

    def fork():
        pid = real()
        if pid:
            pids.append(pid)
        return pid

    monkeypatch.setattr(os, "fork", fork)
    return pids


def assert_all_reaped(pids: list) -> None:
    assert pids
    for pid in pids:
        with pytest.raises(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)  # reaped already: no zombie, no orphan still running


def test_workers_that_die_are_replaced(monkeypatch):
    """Every worker dies (two jobs, three poisoned files first): the other
    files are still read by workers forked in their place."""
    pids = recording_forks(monkeypatch)
    items = ["poison-1", "poison-2", "poison-3", "a", "b", "c", "d"]
    out = workers.run_all(poison_all, items, 2, lambda item: 10 if item.startswith("poison") else 1, crashed)
    assert out[3:] == ["A", "B", "C", "D"]
    assert all(o.startswith(f"crashed poison-{n}: the process reading this file died") for n, o in zip((1, 2, 3), out))
    assert len(pids) >= 2 + 3 + 1  # two, a replacement for each death while files remained, each poison read alone
    assert_all_reaped(pids)


def big_result(item: str) -> bytes:
    return item.encode() * (3 << 20)


def test_large_results_arrive_whole():
    """Results far larger than a pipe's buffer (3-6 MB, as --detail on cuFFT)."""
    items = ["a", "bb", "c", "dd", "e"]
    assert workers.run_all(big_result, items, 3, len, crashed) == [big_result(i) for i in items]


def sleepy(item: str) -> str:
    import time

    time.sleep(60)
    return item


def test_an_interrupt_stops_every_worker(monkeypatch):
    """Ctrl-C while the workers read: the busy ones are killed and reaped,
    and the interrupt reaches the caller at once."""
    import time

    def interrupted(fds):
        time.sleep(0.2)  # the workers have their tasks
        raise KeyboardInterrupt

    monkeypatch.setattr(workers, "_readable", interrupted)
    pids = recording_forks(monkeypatch)
    start = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        workers.run_all(sleepy, ["a", "b", "c"], 3, len, crashed)
    assert time.monotonic() - start < 10
    assert len(pids) == 3
    assert_all_reaped(pids)


def test_cli_jobs_option(fx):
    lib = str(fx.lib("plain", "zstd"))
    one = subprocess.run([sys.executable, "-m", "qualify", "inspect", "--json", "--jobs", "1", lib], cwd=REPO,
                         capture_output=True, text=True, timeout=120)
    two = subprocess.run([sys.executable, "-m", "qualify", "inspect", "--json", "--jobs", "2", lib, lib + "-missing"],
                         cwd=REPO, capture_output=True, text=True, timeout=120)
    assert one.returncode == 0 and json.loads(one.stdout)["libraries"][0]["path"] == lib
    assert two.returncode == 2 and "no such file" in two.stderr
    for bad in ("0", "-3", "many", "100000"):
        proc = subprocess.run([sys.executable, "-m", "qualify", "inspect", "--jobs", bad, lib], cwd=REPO,
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 2 and f"--jobs {bad!r}" in proc.stderr and "1 to 256" in proc.stderr, proc.stderr


def test_default_jobs_is_bounded():
    assert 1 <= workers.default_jobs() <= workers.MAX_DEFAULT_JOBS


@pytest.mark.parametrize("load, expected", [(0.0, 4), (0.9, 4), (1.5, 3), (3.99, 1), (7.0, 1)])
def test_default_jobs_leaves_out_the_cpus_other_work_keeps_busy(monkeypatch, load, expected):
    monkeypatch.setattr(workers.os, "sched_getaffinity", lambda _pid: {0, 1, 2, 3})
    monkeypatch.setattr(workers.os, "getloadavg", lambda: (load, 0.0, 0.0))
    assert workers.default_jobs() == expected


def test_default_jobs_without_a_load_average_counts_every_cpu(monkeypatch):
    def unavailable():
        raise OSError("no load average")

    monkeypatch.setattr(workers.os, "sched_getaffinity", lambda _pid: {0, 1, 2, 3, 4, 5, 6, 7, 8, 9})
    monkeypatch.setattr(workers.os, "getloadavg", unavailable)
    assert workers.default_jobs() == workers.MAX_DEFAULT_JOBS


def collector_state(_item: str) -> tuple:
    import gc

    return gc.isenabled(), gc.get_freeze_count() > 0


def test_collector_is_paused_per_file_and_restored(fx, monkeypatch):
    """Reading a file pauses the cyclic collector (census.collector_paused)
    and gives it back as it found it, after a failure too; a pool freezes
    the inherited heap only while it runs."""
    import gc

    assert gc.isenabled()
    seen = []
    real = census.fatbin.read_file

    def spying(*args, **kwargs):
        seen.append(gc.isenabled())
        return real(*args, **kwargs)

    monkeypatch.setattr(census.fatbin, "read_file", spying)
    try:
        census.scan([str(fx.lib("plain", "zstd"))])
        assert seen == [False] and gc.isenabled()
        gc.disable()
        census.scan([str(fx.lib("plain", "zstd"))])
        assert not gc.isenabled()  # a caller's choice is kept
    finally:
        gc.enable()
    with pytest.raises(RuntimeError):
        with census.collector_paused():
            raise RuntimeError("reader bug")
    assert gc.isenabled()
    # In the workers: forked from a frozen heap; here, afterwards: nothing left frozen.
    states = workers.run_all(collector_state, ["a", "b", "c"], 2, len, lambda item, why: why)
    assert states == [(True, True)] * 3
    assert gc.get_freeze_count() == 0
