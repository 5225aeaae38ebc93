"""Benchmark the fatbin census against NVIDIA cuobjdump (`nox -s bench-inventory`).

    python -m qualify.devtools.bench_inventory [--venv DIR] [--cuobjdump PATH] [--runs N] [--cuobjdump-runs N]
                                               [--page-cache fresh|as-found]

`nox -s bench-inventory` runs bench_corpus.py: this, then the kernel-package corpus and the census's
start-up (`--corpus-only`: just that, without the 5 GB torch venv; `--no-corpus`: just this).

1. Makes (or reuses) a scratch venv, `.cache/bench-venv`, holding
   torch==2.14.1 (a CUDA 13 build: ~5 GB of nvidia-* wheels) and the
   cuobjdump of nvidia-cuda-cuobjdump==13.2.51.
2. Finds every library in it with a `.nv_fatbin` section, and reads each file
   once, untimed, so that both tools run with a warm page cache. By default
   (--page-cache fresh) each file's cached pages are dropped first
   (POSIX_FADV_DONTNEED: clean pages only, no root needed) and read back,
   so both tools find the files cached as a file read from disk is, not in
   whatever state its history left: on kernels that cache files read from
   disk in multi-page folios (ext4 and XFS on recent 6.x kernels), a file
   written by pip (or unpacked from an image) sits in the cache as single
   4 KB pages until it is evicted, and every page a tool maps then costs
   more CPU (on the 2-core build host, the bench venv as found: 0.56 s of
   census CPU and 31-35 s of cuobjdump; fresh: 0.41 s and 27-28 s; same
   output). --page-cache as-found keeps the cache as it is. Compiles
   the toolkit's bytecode first, as `pip install` does: where
   PYTHONDONTWRITEBYTECODE is set (this build host sets it), every timed run
   would otherwise compile the package from source, ~15 ms that no
   installed copy pays.
3. Times `python -m qualify inspect --json` over all of them in one fresh
   subprocess (five times; the median is reported): as users run it (worker
   processes, one per CPU up to core/workers.MAX_DEFAULT_JOBS), in one
   process (`--jobs 1`; the two outputs must be byte-identical), with
   `--registered-only` (`.nv_fatbin` only: cuobjdump's coverage, without the
   search of data sections for kernel databases), with `--no-decompress`
   (what the probe does inside an image, where zstandard and lz4 are absent)
   and with pyelftools reading the ELF section table
   (QUALIFY_ELF_READER=pyelftools; see fatbin's docstring), then cuobjdump
   `--list-elf` and `--list-ptx`, one call per file and listing, as
   cuobjdump takes one file per call. Each tool runs under a fresh helper
   process that reports its wall time, the CPU time of all its descendants
   (workers included) and `getrusage(RUSAGE_CHILDREN).ru_maxrss` (the
   largest single process), so neither tool's figures are mixed with the
   other's (or with pip's). One more, untimed run of each census samples the
   summed PSS of its whole process tree: the memory of all workers together.
   cuobjdump runs several times (--cuobjdump-runs, 3 by default: before, in
   the middle of and after the censuses), and the median is compared: on a
   shared machine a single run, minutes away from the censuses, carries the
   machine's drift into the ratio (35-50 s within one hour here).
4. Checks per library that the architecture sets agree. cuobjdump lists only
   `.nv_fatbin` and prints `f` cubins without their suffix (and PTX as
   `sm_XY.ptx`), so the comparison is of the `.nv_fatbin` entries, by
   `CodeTarget.without_variant()`. Containers the census finds elsewhere
   (cuFFT's `.ldata`, cuBLASLt's `.cask_resource`) are counted in a column of
   their own.

Wall and CPU time are both reported: on a shared machine the wall time
depends on the other jobs, the CPU time much less; and with worker processes
the wall time is what a user waits while the CPU time is the work done.

Exit status: 0 when every library agrees, 1 when one does not. The speed and
memory targets (>= 100x faster than cuobjdump, < 200 MB peak) are reported,
not enforced: they depend on the machine.
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import venv
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Dict, List, Optional, Set, Tuple

from qualify.core import census, fatbin_model, workers
from qualify.core.arch import ArchError, CodeKind, CodeTarget
from qualify.core.errors import ExternalCommandError, QualifyError
from qualify.core.report import Reporter, emit
from qualify.host.tables import table

REPORT = Reporter("bench")

REPO = Path(__file__).resolve().parents[2]
DEFAULT_VENV = REPO / ".cache" / "bench-venv"
REQUIREMENTS = ["torch==2.14.1", "nvidia-cuda-cuobjdump==13.2.51"]
TARGET_SPEEDUP = 100.0
TARGET_PEAK_MB = 200.0
_LISTING = re.compile(r"^(ELF|PTX) file\s+\d+: .*\.((?:sm|compute)_\d+[af]?)\.(?:cubin|ptx)$")
_CHUNK = 16 << 20


@dataclass
class Measurement:
    wall_s: float
    peak_mb: float
    returncodes: List[int]
    cpu_s: float = 0.0  # user + system time of the measured processes (workers included)
    tree_mb: Optional[float] = None  # peak summed PSS of the process tree (measure(..., tree=True); None: not measurable)


@dataclass
class Comparison:
    path: Path
    size: int
    containers: int
    outside: int  # containers outside .nv_fatbin (cuobjdump does not list them)
    ours: Set[str]  # .nv_fatbin arches with a/f
    agree: bool
    only_ours: Set[str]
    only_theirs: Set[str]


# --- the venv -----------------------------------------------------------------------


def ensure_venv(path: Path) -> Path:
    """Site-packages of the scratch venv, installing the requirements once."""
    python = path / "bin" / "python"
    stamp = path / ".bench-requirements"
    wanted = "\n".join(REQUIREMENTS)
    if not python.exists():
        REPORT.say(f"creating {path}")
        venv.EnvBuilder(with_pip=True, clear=True).create(str(path))
    if not stamp.exists() or stamp.read_text() != wanted:
        REPORT.say(f"pip install {' '.join(REQUIREMENTS)} (about 5 GB, once)")
        proc = subprocess.run([str(python), "-m", "pip", "install", "-q", *REQUIREMENTS])
        if proc.returncode != 0:
            raise ExternalCommandError(
                f"pip install into {path} failed ({proc.returncode})",
                hint="see pip's output above; delete the venv to start again",
            )
        stamp.write_text(wanted)
    found = sorted((path / "lib").glob("python*/site-packages"))
    if not found:
        raise QualifyError(f"no site-packages under {path}", hint=f"delete {path} and run again")
    return found[0]


def find_cuobjdump(site: Path, given: Optional[str]) -> Path:
    candidate = Path(given) if given else site / "nvidia" / "cu13" / "bin" / "cuobjdump"
    if not os.access(candidate, os.X_OK):
        raise QualifyError(f"cuobjdump not found at {candidate}", hint="pass --cuobjdump PATH")
    return candidate


def find_libraries(site: Path) -> List[Path]:
    """Every file whose `.nv_fatbin` holds a container (what cuobjdump can list)."""
    report = census.scan([str(site)])
    return [
        Path(lib.path) for lib in report.libraries
        if any(sec.name == fatbin_model.SECTION_REGISTERED for sec in lib.summary.sections)
    ]


def compile_bytecode() -> None:
    """The toolkit's .pyc files, as an installed copy has them."""
    if not compileall.compile_dir(str(REPO / "qualify"), quiet=1):
        raise QualifyError(f"could not compile {REPO / 'qualify'} to bytecode", hint="see the errors above")


class PageCache(Enum):
    """How the libraries are cached before anything is timed (--page-cache;
    step 2 of the module docstring); the value is the option's word."""

    FRESH = "fresh"
    AS_FOUND = "as-found"

    @property
    def meaning(self) -> str:
        if self is PageCache.FRESH:
            return "each library's cached pages dropped and read back"
        return "left as it was, each library read once"


def warm_page_cache(paths: List[Path], mode: PageCache = PageCache.FRESH) -> None:
    """Every file read once, untimed; with PageCache.FRESH its cached pages are dropped first."""
    for path in paths:
        with open(path, "rb") as fh:
            if mode is PageCache.FRESH:
                drop_cached(fh.fileno())
            while fh.read(_CHUNK):
                pass


def drop_cached(fd: int) -> None:
    """Ask the kernel to drop the file's clean cached pages (pages another
    process has mapped, or not yet written back, stay)."""
    if hasattr(os, "posix_fadvise"):
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)


# --- measuring -------------------------------------------------------------------------


def measure(
    commands: List[List[str]], outputs: List[Path], extra_env: Optional[Dict[str, str]] = None, tree: bool = False
) -> Measurement:
    """Run `commands` one after another in a fresh helper process."""
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as fh:
        json.dump({"commands": commands, "outputs": [str(p) for p in outputs], "tree": tree}, fh)
        plan = fh.name
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "qualify.devtools.bench_inventory", "--measure", plan],
            capture_output=True, text=True, env={**_env(), **(extra_env or {})},
        )
    finally:
        os.unlink(plan)
    if proc.returncode != 0:
        raise ExternalCommandError(f"measuring helper failed: {proc.stderr.strip()}")
    data = json.loads(proc.stdout)
    peak = data["peak_kb"] / 1024.0
    tree = data["tree_peak_kb"] / 1024.0 if data["tree_peak_kb"] is not None else None
    return Measurement(data["wall_s"], peak, data["returncodes"], data["cpu_s"], tree)


def measure_census(
    libraries: List[Path], output: Path, runs: int, options: List[str], extra_env: Optional[Dict[str, str]] = None
) -> Measurement:
    """The census, `runs` times, each in a fresh process: the median wall and
    CPU times (a shared machine is noisy) and the highest peak."""
    argv = [sys.executable, "-m", "qualify", "inspect", "--json", *options, *map(str, libraries)]
    results = [measure([argv], [output], extra_env) for _ in range(runs)]
    for r in results:
        if r.returncodes != [0]:
            raise ExternalCommandError(f"python -m qualify inspect {' '.join(options)} failed ({r.returncodes[0]})")
    walls = [r.wall_s for r in results]
    label = " ".join([*(f"{k}={v}" for k, v in (extra_env or {}).items()), "inspect", *options])
    print(f"{label} wall times (s): " + " ".join(f"{w:.3f}" for w in walls), flush=True)
    middle = median_measurement(results)
    middle.tree_mb = measure([argv], [output], extra_env, tree=True).tree_mb  # one more run, untimed
    return middle


def cuobjdump_rounds(steps: int, rounds: int) -> List[int]:
    """Before which census step each cuobjdump round runs (`steps`: after the
    last), spread evenly from the first to the last: 5 steps, 3 rounds ->
    [0, 2, 5] (one round: at the end, after the censuses)."""
    if rounds <= 1:
        return [steps]
    return [round(k * steps / (rounds - 1)) for k in range(rounds)]


def median_measurement(results: List[Measurement]) -> Measurement:
    """Median wall and CPU times of several runs of one tool, its highest peak."""
    return Measurement(
        statistics.median(r.wall_s for r in results), max(r.peak_mb for r in results), [0],
        statistics.median(r.cpu_s for r in results),
    )


def _env() -> Dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return env


def _measure_helper(plan_path: str) -> int:
    """Inside the helper: run the plan, print wall time and the children's peak
    RSS (the largest single process: ru_maxrss); with "tree", also the peak of
    the summed PSS of each command's whole process tree (its workers too),
    sampled every 10 ms (an untimed run: the sampling costs CPU)."""
    plan = json.loads(Path(plan_path).read_text())
    codes = []
    tree_peak_kb: Optional[int] = None  # stays None where /proc has no smaps_rollup (gVisor, say)
    start = time.perf_counter()
    for argv, output in zip(plan["commands"], plan["outputs"]):
        with open(output, "wb") as out:
            proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.DEVNULL)
            while plan.get("tree") and proc.poll() is None:
                sample = _tree_pss_kb(proc.pid)
                if sample is not None:
                    tree_peak_kb = max(tree_peak_kb or 0, sample)
                time.sleep(0.01)
            codes.append(proc.wait())
    wall = time.perf_counter() - start
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    peak_kb = usage.ru_maxrss  # KiB on Linux
    print(json.dumps({"wall_s": wall, "peak_kb": peak_kb, "returncodes": codes,
                      "cpu_s": usage.ru_utime + usage.ru_stime, "tree_peak_kb": tree_peak_kb}))
    return 0


def _tree_pss_kb(root: int) -> Optional[int]:
    """Summed PSS (shared pages divided among their sharers, so forked workers
    are not counted twice) of `root` and its descendants."""
    parents: Dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
                parents[int(entry)] = int(stat.rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
    tree, grew = {root}, True
    while grew:
        found = {pid for pid, ppid in parents.items() if ppid in tree} - tree
        grew = bool(found)
        tree |= found
    total, read = 0, False
    for pid in tree:
        try:
            text = Path(f"/proc/{pid}/smaps_rollup").read_text()
        except OSError:
            continue
        read = True
        total += sum(int(line.split()[1]) for line in text.splitlines() if line.startswith("Pss:"))
    return total if read else None


# --- comparing ----------------------------------------------------------------------------


def cuobjdump_arches(listing: str, kind: CodeKind) -> Set[str]:
    """`ELF file    1: libfoo.1.sm_90.cubin` / `PTX file    1: libfoo.1.sm_90.ptx`."""
    found = set()
    for line in listing.splitlines():
        m = _LISTING.match(line.strip())
        if not m:
            continue
        try:
            listed = CodeTarget.parse(m.group(2))
        except ArchError:
            continue
        found.add(CodeTarget(kind, listed.capability, listed.variant).without_variant())
    return found


def compare(lib: dict, elf_listing: str, ptx_listing: str) -> Comparison:
    """What cuobjdump lists: the registered containers (`.nv_fatbin`, or a
    standalone cubin or fatbin)."""
    registered = [sec for sec in lib["sections"].values() if sec["role"] == census.ROLE_REGISTERED]
    ours = {name for sec in registered for name in sec["sass"] + sec["ptx"]}
    ours_plain = {CodeTarget.parse(name).without_variant() for name in ours}
    theirs = cuobjdump_arches(elf_listing, CodeKind.SASS) | cuobjdump_arches(ptx_listing, CodeKind.PTX)
    return Comparison(
        path=Path(lib["path"]),
        size=lib["size"],
        containers=lib["containers"],
        outside=lib["containers"] - sum(sec["containers"] for sec in registered),
        ours=ours,
        agree=ours_plain == theirs,
        only_ours=ours_plain - theirs,
        only_theirs=theirs - ours_plain,
    )


# --- output ----------------------------------------------------------------------------------


def _arch_key(name: str):
    target = CodeTarget.parse(name)
    return (target.kind is CodeKind.PTX, target.capability.number, target.variant.value)


def library_table(rows: List[Comparison], site: Path) -> str:
    body = [
        [
            str(c.path.relative_to(site)) if c.path.is_relative_to(site) else str(c.path),
            f"{c.size / 1e6:.1f}",
            str(c.containers),
            str(c.outside),
            " ".join(sorted(c.ours, key=_arch_key)),
            "yes" if c.agree else "NO",
        ]
        for c in rows
    ]
    header = ["LIBRARY", "SIZE MB", "CONTAINERS", "NOT IN .nv_fatbin", "ARCHES IN .nv_fatbin (ours)", "AGREE"]
    return table(body, header, rule=False)


def summary_table(tools: List[Tuple[str, Measurement]], theirs: Measurement) -> str:
    rows = [
        [
            name,
            f"{m.wall_s:.3f}",
            f"{m.cpu_s:.3f}",
            f"{m.peak_mb:.0f}",
            f"{m.tree_mb:.0f}" if m.tree_mb is not None else "-",
            f"{theirs.wall_s / m.wall_s:.0f}x" if m.wall_s else "-",
            f"{theirs.cpu_s / m.cpu_s:.0f}x" if m.cpu_s else "-",
        ]
        for name, m in tools
    ]
    header = ["TOOL", "WALL S", "CPU S", "PEAK MB (ONE PROCESS)", "PEAK MB (ALL)", "SPEED-UP (WALL)", "SPEED-UP (CPU)"]
    return table(rows, header, rule=False)


def target_lines(full: Measurement, registered: Measurement, theirs: Measurement, single: Measurement, jobs: int) -> List[str]:
    """The targets are on wall time (what a user waits), as the default runs
    them; the one-process figures are printed beside them, not hidden."""

    def verdict(ok: bool) -> str:
        return "met" if ok else "MISSED"

    lines = []
    rows = (
        (f"same coverage as cuobjdump (--registered-only, {jobs} processes)", registered),
        (f"full census ({jobs} processes)", full),
    )
    for name, m in rows:
        speedup = theirs.wall_s / m.wall_s if m.wall_s else float("inf")
        lines.append(
            f"target >= {TARGET_SPEEDUP:.0f}x faster than cuobjdump, {name}: "
            f"{verdict(speedup >= TARGET_SPEEDUP)} ({speedup:.0f}x)"
        )
    lines.append(
        f"for reference, full census in one process (--jobs 1): {theirs.wall_s / single.wall_s:.0f}x on wall time, "
        f"{theirs.cpu_s / single.cpu_s:.0f}x on CPU time; full census with {jobs} processes: "
        f"{theirs.cpu_s / full.cpu_s:.0f}x on CPU time"
    )
    trees = [m.tree_mb for m in (full, registered, single)]
    if any(t is None for t in trees):
        largest = max(full.peak_mb, registered.peak_mb, single.peak_mb)
        lines.append(
            f"target peak memory < {TARGET_PEAK_MB:.0f} MB (all processes together): NOT MEASURED (no "
            f"/proc/PID/smaps_rollup here); the largest single process peaked at {largest:.0f} MB"
        )
    else:
        peak = max(trees)
        lines.append(
            f"target peak memory < {TARGET_PEAK_MB:.0f} MB (all processes together): "
            f"{verdict(peak < TARGET_PEAK_MB)} ({peak:.0f} MB)"
        )
    return lines


# --- main ---------------------------------------------------------------------------------------


def run(
    venv_dir: Path,
    cuobjdump_arg: Optional[str],
    runs: int,
    site_arg: Optional[str] = None,
    cuobjdump_runs: int = 3,
    page_cache: PageCache = PageCache.FRESH,
) -> int:
    # --site compares against an existing install (a GPU host's torch) instead of the scratch venv
    site = Path(site_arg) if site_arg else ensure_venv(venv_dir)
    cuobjdump = find_cuobjdump(site, cuobjdump_arg)
    libraries = find_libraries(site)
    if not libraries:
        raise QualifyError(f"no library with a .nv_fatbin section under {site}")
    total = sum(p.stat().st_size for p in libraries)
    print(f"{len(libraries)} libraries with a .nv_fatbin section under {site} ({total / 1e9:.2f} GB)", flush=True)
    print(f"load average at start: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs", flush=True)
    compile_bytecode()
    warm_page_cache(libraries, page_cache)
    print(f"page cache: {page_cache.meaning} (--page-cache {page_cache.value})", flush=True)
    with tempfile.TemporaryDirectory(prefix="bench-inventory-") as tmp:
        out = Path(tmp)
        commands, outputs = [], []
        for i, path in enumerate(libraries):
            for flag in ("--list-elf", "--list-ptx"):
                commands.append([str(cuobjdump), flag, str(path)])
                outputs.append(out / f"{i}{flag}.txt")
        dumps: List[Measurement] = []

        def run_cuobjdump() -> None:
            print(f"running cuobjdump {len(commands)} times (slow: it decompresses everything), "
                  f"round {len(dumps) + 1} of {cuobjdump_runs}", flush=True)
            dumps.append(measure(commands, outputs))
            print(f"cuobjdump wall time: {dumps[-1].wall_s:.1f} s", flush=True)

        censuses = [
            ("census.json", [], None),
            ("single.json", ["--jobs", "1"], None),
            ("registered.json", ["--registered-only"], None),
            ("plain.json", ["--no-decompress"], None),
            ("elftools.json", [], {"QUALIFY_ELF_READER": "pyelftools"}),
        ]
        measured: Dict[str, Measurement] = {}
        rounds = cuobjdump_rounds(len(censuses), cuobjdump_runs)
        for step in range(len(censuses) + 1):
            for _ in range(rounds.count(step)):
                run_cuobjdump()
            if step < len(censuses):
                name, options, extra_env = censuses[step]
                measured[name] = measure_census(libraries, out / name, runs, options, extra_env)
        full, single, registered, plain, elftools = (
            measured[k] for k in ("census.json", "single.json", "registered.json", "plain.json", "elftools.json")
        )
        if (out / "census.json").read_bytes() != (out / "single.json").read_bytes():
            raise QualifyError("the census with one process and with several differ", hint=f"compare them in {out}")
        theirs = median_measurement(dumps)
        print("cuobjdump wall times (s): " + " ".join(f"{m.wall_s:.1f}" for m in dumps), flush=True)
        report = json.loads((out / "census.json").read_text())
        by_path = {lib["path"]: lib for lib in report["libraries"]}
        rows = [
            compare(by_path[str(p)], outputs[2 * i].read_text(errors="replace"), outputs[2 * i + 1].read_text(errors="replace"))
            for i, p in enumerate(libraries)
        ]
    print()
    print(library_table(rows, site))
    print()
    jobs = workers.default_jobs()
    tools = [
        (f"qualify inspect, {jobs} processes (median of {runs})", full),
        (f"qualify inspect --jobs 1 (median of {runs})", single),
        (f"qualify inspect --registered-only (median of {runs})", registered),
        (f"qualify inspect --no-decompress (median of {runs})", plain),
        (f"qualify inspect, pyelftools ELF reader (median of {runs})", elftools),
        (f"cuobjdump --list-elf/--list-ptx ({len(commands)} calls, median of {len(dumps)})", theirs),
    ]
    print(summary_table(tools, theirs))
    print()
    for line in target_lines(full, registered, theirs, single, jobs):
        print(line)
    for c in rows:
        if not c.agree:
            print(f"DISAGREE {c.path}: only ours {sorted(c.only_ours)}, only cuobjdump {sorted(c.only_theirs)}")
    return 0 if all(c.agree for c in rows) else 1


def make_parser(prog: str = "python -m qualify.devtools.bench_inventory") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    parser.add_argument("--venv", default=str(DEFAULT_VENV), help=f"scratch venv (default {DEFAULT_VENV})")
    parser.add_argument("--cuobjdump", help="cuobjdump binary (default: the one pip put in the venv)")
    parser.add_argument("--site", help="an existing site-packages to census instead of the scratch venv")
    parser.add_argument("--runs", type=int, default=5, help="census runs; the median wall time is reported")
    parser.add_argument(
        "--cuobjdump-runs", type=int, default=3, help="cuobjdump runs, spread among the censuses; the median is compared"
    )
    parser.add_argument(
        "--page-cache",
        choices=[m.value for m in PageCache],
        default=PageCache.FRESH.value,
        help="; ".join(f"{m.value}: {m.meaning}" for m in PageCache) + " (default: fresh)",
    )
    parser.add_argument("--measure", help=argparse.SUPPRESS)  # internal: the measuring helper
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    """The large libraries only (`nox -s bench-inventory` runs bench_corpus.main: these, then the corpus)."""
    args = make_parser().parse_args(argv)
    if args.measure:
        return _measure_helper(args.measure)
    try:
        return run(Path(args.venv), args.cuobjdump, max(1, args.runs), args.site, max(1, args.cuobjdump_runs),
                   PageCache(args.page_cache))
    except QualifyError as exc:
        emit(f"error: {exc}")
        return exc.exit_code


if __name__ == "__main__":
    sys.exit(main())
