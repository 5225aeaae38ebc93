"""A large file read in parts by several processes (qualify/core/parts.py)
gives exactly what one process reading it whole gives: on real nvcc output,
cut every few bytes, damaged, and with a container prefix hidden inside
another container's payload."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
from pathlib import Path
from typing import List

import pytest
from cuda_fixtures import build_embedded

from qualify.core import census, fatbin, parts
from qualify.core.fatbin_model import CONTAINER_PREFIX

JOBS = census.CUT_FROM_JOBS  # parts are cut from this many workers on


@pytest.fixture()
def joins(monkeypatch):
    """Counts of joined files and of files read whole again because their parts did not join."""
    counts = {"joined": 0, "whole": 0, "parts": 0}
    join = parts.join

    def counting(tasks, results, size):
        merged = join(tasks, results, size)
        counts["parts"] += len(tasks)
        counts["joined" if merged is not None else "whole"] += 1
        return merged

    monkeypatch.setattr(parts, "join", counting)
    return counts


def cut_every(monkeypatch, nbytes: int) -> None:
    monkeypatch.setattr(parts, "PART_BYTES", nbytes)
    monkeypatch.setattr(parts, "MIN_FILE_BYTES", 0)


def report(paths: List[str], jobs: int, target=None) -> str:
    return json.dumps(census.scan(paths, target, detail=True, jobs=jobs).to_json(), sort_keys=True)


def elf_fixtures(fx) -> List[str]:
    return [str(p) for p in fx.all_paths() if p.read_bytes()[:4] == b"\x7fELF" and p.suffix == ".so"]


@pytest.mark.parametrize("nbytes", [97, 1000, 4093])
def test_parts_equal_one_process(fx, monkeypatch, joins, nbytes):
    paths = elf_fixtures(fx)
    whole = report(paths, 1)
    cut_every(monkeypatch, nbytes)
    assert report(paths, JOBS) == whole
    assert joins["joined"] >= 5 and joins["whole"] == 0 and joins["parts"] > 2 * joins["joined"]


def test_damaged_files_in_parts(fx, monkeypatch, joins, tmp_path):
    """Seeded random damage (bit flips, zeroed and overwritten runs) of every
    ELF fixture, cut at several sizes: the same report, including every error
    and where it was found, as one process."""
    rng = random.Random(15)
    paths = []
    for i, source in enumerate(elf_fixtures(fx)):
        data = Path(source).read_bytes()
        containers = fatbin.read_file(source).containers
        lo, hi = containers[0].offset, max(c.offset + c.size for c in containers)  # where the damage matters
        for j in range(6):
            mutant = bytearray(data)
            for _ in range(rng.randint(1, 6)):
                at = rng.randrange(lo, hi)
                kind = rng.random()
                if kind < 0.4:
                    mutant[at] ^= 1 << rng.randrange(8)
                elif kind < 0.7:
                    mutant[at : at + 64] = bytes(len(mutant[at : at + 64]))
                else:
                    mutant[at : at + 16] = rng.randbytes(len(mutant[at : at + 16]))
            path = tmp_path / f"m{i}-{j}.so"
            path.write_bytes(bytes(mutant))
            paths.append(str(path))
    whole = report(paths, 1)
    damaged = [lib for lib in json.loads(whole)["libraries"] if lib["errors"]]
    assert len(damaged) >= 5  # damage that the walk reports (compared below, error by error)
    for nbytes in (211, 3000):
        cut_every(monkeypatch, nbytes)
        assert report(paths, JOBS) == whole, nbytes
    assert joins["joined"] > 0


def test_prefix_inside_a_payload_is_read_whole(nvcc, tmp_path, monkeypatch, joins):
    """A `__constant__` array holding the container prefix puts a false prefix
    inside a real container's payload. A part that begins between the two
    finds the false one first; the join sees that the walk was still inside
    the real container, and the file is read whole: two containers, not three."""
    source = tmp_path / "fake.cu"
    prefix = ",".join(str(b) for b in CONTAINER_PREFIX)
    source.write_text(
        f"__constant__ unsigned char fake[64] = {{{prefix}, 0x40}};\n"
        "__global__ void scale(float *x) { x[threadIdx.x] *= 2.0f + fake[threadIdx.x]; }\n"
    )
    fat = tmp_path / "fake.fatbin"
    subprocess.run([str(nvcc), "-fatbin", "-gencode", "arch=compute_120,code=sm_120", "--compress-mode=none", "-o",
                    str(fat), str(source)], check=True, cwd=tmp_path)
    data = fat.read_bytes()
    assert data.count(CONTAINER_PREFIX) == 2  # the header's, and the constant's inside the payload
    lib = build_embedded([fat, fat], tmp_path / "libfake.so")
    whole = report([str(lib)], 1)
    (row,) = json.loads(whole)["libraries"]
    assert row["containers"] == 2 and not row["errors"]
    cut_every(monkeypatch, 1000)
    assert report([str(lib)], JOBS) == whole
    assert joins["whole"] == 1


def die_on_second_part(task):
    """read_part, but the worker dies (SIGKILL) on the part named by the environment."""
    if os.environ.get("QUALIFY_TEST_KILL_PART") == str(task.walks[0].start):
        os.kill(os.getpid(), signal.SIGKILL)
    return REAL_READ_PART(task)


REAL_READ_PART = parts.read_part


def test_a_part_whose_worker_dies_is_read_whole(fx, monkeypatch, joins):
    """A worker killed while reading one part: that file is read again whole,
    in a process of its own, and the report is unchanged."""
    path = str(fx.lib("plain", "zstd"))
    whole = report([path], 1)
    cut_every(monkeypatch, 500)
    (plan, *_) = [parts.plan(path, True, True, True)]
    assert plan is not None and len(plan) > 2
    monkeypatch.setenv("QUALIFY_TEST_KILL_PART", str(plan[1].walks[0].start))
    monkeypatch.setattr(parts, "read_part", die_on_second_part)
    assert report([path], JOBS) == whole
    assert joins["whole"] == 1


def test_small_files_and_few_workers_are_not_cut(fx, monkeypatch, joins):
    paths = elf_fixtures(fx)
    report(paths, JOBS)  # the fixtures are far below MIN_FILE_BYTES
    cut_every(monkeypatch, 97)
    report(paths, JOBS - 1)  # too few workers to gain from parts
    assert joins["parts"] == 0


def test_fuzz_checks_parts_against_the_whole_file(fx, monkeypatch):
    """`nox -s fuzz` reads every mutant in parts too: agreeing parts are ok,
    parts that join into another summary are a `mismatch`."""
    import resource

    from qualify.core import record
    from qualify.devtools import fuzz

    path = str(fx.lib("plain", "zstd"))
    memory = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss + (1 << 20)
    assert fuzz._run_once(lambda: fuzz._one(path), 60, memory) == "ok"
    join = parts.join
    monkeypatch.setattr(parts, "join", lambda *a: record.replace(join(*a), containers=join(*a).containers + 1))
    assert fuzz._run_once(lambda: fuzz._one(path), 60, memory) == "mismatch"
