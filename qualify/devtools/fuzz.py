"""A bounded mutation campaign over the census reader (`nox -s fuzz -- [--seconds N]`).

    python -m qualify.devtools.fuzz [--seconds N] [--seed S] [--fixtures DIR]

Builds the nvcc fixtures of tests/cuda_fixtures.py once (or reads them from
--fixtures), then for N seconds mutates one at random (bit flips, bytes and
header fields set to boundary values, truncation, a duplicated or deleted
chunk), writes it to a scratch file and runs fatbin.read_file and
census.judge for a Blackwell target on it, with and without decompression,
and reads it again in parts cut every 997 bytes (core/parts.py), which must
join into exactly the same summary or refuse to join.

Outcomes per run: `ok` (read, maybe with errors recorded), `crash` (an
exception escaped: read_file must never raise), `hang` (a run over
--run-limit seconds, stopped by SIGALRM), `memory` (MemoryError, or the
process's peak resident set growing past --memory-mb), `mismatch` (parts
that joined into another summary). It prints runs,
runs/s and the outcome counts, and the first reproducer of each bad outcome
is kept under --keep. Exit status 1 when any run was bad.
"""

from __future__ import annotations

import argparse
import collections
import os
import random
import resource
import signal
import struct
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional

from qualify.core import census, fatbin, fatbin_model, parts, summary
from qualify.core.arch import Capability

REPO = Path(__file__).resolve().parents[2]
TARGETS = [Capability(10, 0), Capability(12, 1)]
INTERESTING = [0, 1, 0x7F, 0x80, 0xFF, 0xFFFF, 0xFFFFFFFF, 0x7FFFFFFF, 0xFFFFFFFFFFFFFFFF, 0x40, 0x10]


class _Hang(Exception):
    pass


def _fixtures(given: Optional[str]) -> List[bytes]:
    if given:
        paths = sorted(p for p in Path(given).rglob("*") if p.is_file() and p.suffix in (".so", ".cubin", ".fatbin"))
    else:
        sys.path.insert(0, str(REPO / "tests"))
        import cuda_fixtures  # the same builds the tests use

        root = Path(tempfile.mkdtemp(prefix="fuzz-fixtures-"))
        paths = cuda_fixtures.build(Path("/usr/local/cuda/bin/nvcc"), root).all_paths()
    return [p.read_bytes() for p in paths if p.stat().st_size]


def _anchors(data: bytes) -> List[int]:
    """Offsets worth hitting: ELF header fields, container and entry headers."""
    out = [18, 24, 32, 40, 48, 58, 60, 62]
    pos = data.find(fatbin_model.MAGIC_BYTES)
    while pos >= 0 and len(out) < 400:
        out += [pos + 4, pos + 6, pos + 8, pos + 16, pos + 20, pos + 24, pos + 32, pos + 44, pos + 56, pos + 72]
        pos = data.find(fatbin_model.MAGIC_BYTES, pos + 4)
    return [o for o in out if o < len(data)]


def _mutate(data: bytes, rng: random.Random) -> bytes:
    buf = bytearray(data)
    for _ in range(rng.choice((1, 1, 2, 4))):
        kind = rng.randrange(5)
        anchors = [a for a in _anchors(data) if a < len(buf)]  # an earlier step may have cut the file
        at = rng.choice(anchors) if anchors and rng.random() < 0.6 else rng.randrange(len(buf))
        if kind == 0:
            buf[at] ^= 1 << rng.randrange(8)
        elif kind == 1:
            width = rng.choice((1, 2, 4, 8))
            value = rng.choice(INTERESTING) & ((1 << (8 * width)) - 1)
            if at + width <= len(buf):
                struct.pack_into({1: "<B", 2: "<H", 4: "<I", 8: "<Q"}[width], buf, at, value)
        elif kind == 2 and len(buf) > 1:
            del buf[rng.randrange(1, len(buf)) :]
        elif kind == 3:
            size = rng.randrange(1, 4096)
            buf[at:at] = buf[at : at + size]
        elif kind == 4:
            del buf[at : at + rng.randrange(1, 4096)]
        if not buf:
            buf = bytearray(b"\0")
    return bytes(buf)


def _one(path: str) -> None:
    for decompress in (True, False):
        file = summary.summarize(fatbin.read_file(path, decompress=decompress), detail=True)
        for target in TARGETS:
            census.judge(file, target)
        if decompress:
            _parts_agree(path, file)


_PART_BYTES = 997  # cut every 997 bytes: inside headers, entries and padding


def _parts_agree(path: str, whole: summary.FileSummary) -> None:
    """Read in parts (core/parts.py, in this process): joined, the parts must
    give exactly the whole file's summary, or refuse to join."""
    tasks = parts.plan(path, True, True, True, part_bytes=_PART_BYTES, min_file_bytes=0)
    if not tasks:
        return
    joined = parts.join(tasks, [parts.read_part(t) for t in tasks], os.path.getsize(path))
    if joined is not None and joined != whole:
        raise _Mismatch()


class _Mismatch(Exception):
    """The parts joined into something other than the whole file's summary."""


def _run_once(check: Callable[[], None], limit: float, memory_kb: int) -> str:
    signal.setitimer(signal.ITIMER_REAL, limit)
    try:
        check()
    except _Hang:
        return "hang"
    except _Mismatch:
        return "mismatch"
    except MemoryError:
        return "memory"
    except Exception:
        return "crash"
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    if resource.getrusage(resource.RUSAGE_SELF).ru_maxrss > memory_kb:
        return "memory"
    return "ok"


def campaign(seeds: List[bytes], seconds: float, seed: int, run_limit: float, memory_mb: int, keep: Path) -> Dict[str, int]:
    rng = random.Random(seed)
    outcomes: Dict[str, int] = collections.Counter()

    def alarm(signum, frame):
        raise _Hang()

    signal.signal(signal.SIGALRM, alarm)
    memory_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss + memory_mb * 1024
    keep.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="fuzz-") as tmp:
        path = Path(tmp) / "input"
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            data = _mutate(rng.choice(seeds), rng)
            path.write_bytes(data)
            outcome = _run_once(lambda: _one(str(path)), run_limit, memory_kb)
            outcomes[outcome] += 1
            if outcome != "ok" and outcomes[outcome] == 1:
                (keep / f"{outcome}.bin").write_bytes(data)
    return dict(outcomes)


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m qualify.devtools.fuzz", description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="length of the campaign (default 60)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--fixtures", help="a folder of .so/.cubin/.fatbin to mutate instead of building the nvcc fixtures")
    parser.add_argument("--run-limit", type=float, default=5.0, help="seconds one run may take before it is a hang")
    parser.add_argument("--memory-mb", type=int, default=512, help="peak RSS growth that counts as a memory blow-up")
    parser.add_argument("--keep", default=str(REPO / ".cache" / "fuzz"), help="first reproducer of each bad outcome")
    args = parser.parse_args(argv)
    seeds = _fixtures(args.fixtures)
    print(f"{len(seeds)} seed files; fuzzing for {args.seconds:.0f} s (seed {args.seed})", flush=True)
    start = time.monotonic()
    outcomes = campaign(seeds, args.seconds, args.seed, args.run_limit, args.memory_mb, Path(args.keep))
    elapsed = time.monotonic() - start
    runs = sum(outcomes.values())
    counts = "  ".join(f"{k} {outcomes.get(k, 0)}" for k in ("ok", "crash", "hang", "memory", "mismatch"))
    print(f"runs {runs}  runs/s {runs / elapsed:.1f}  {counts}")
    return 0 if runs and outcomes.get("ok", 0) == runs else 1


if __name__ == "__main__":
    sys.exit(main())
