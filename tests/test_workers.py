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
from cuda_fixtures import built

from qualify.core import census, workers
from qualify.core.arch import Capability


@pytest.fixture(scope="session")
def fx(nvcc, tmp_path_factory):
    return built(nvcc, tmp_path_factory)


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


def test_without_a_working_pool_files_are_read_in_this_process(monkeypatch):
    """Stand-in: a sandbox without sem_open cannot be made here, so the pool's
    construction is made to fail the way it fails there (OSError/NotImplementedError)."""
    import concurrent.futures

    def no_pool(*args, **kwargs):
        raise NotImplementedError("This platform lacks a functioning sem_open implementation")

    monkeypatch.setattr(concurrent.futures, "ProcessPoolExecutor", no_pool)
    assert workers.run_all(str.upper, ["a", "b"], 4, len, crashed) == ["A", "B"]


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
