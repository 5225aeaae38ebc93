"""The census on a corpus like the kernel packages users inspect, and its start-up (`nox -s bench-inventory`).

    python -m qualify.devtools.bench_corpus [bench_inventory's options] [--corpus-only | --no-corpus]

runs bench_inventory's large libraries first (unless --corpus-only), then this (unless --no-corpus).

A review measured the census on an unseen corpus of five kernel packages (34 libraries, 1.98 GB, mostly
uncompressed cubins) at 23-28x cuobjdump, start-up being most of it. Two corpora stand in for it:

1. Real (bench_wheels.py): the shared objects of five PyPI packages' wheels, pinned by hash (vLLM,
   NVIDIA NPP, bitsandbytes, CuPy, CTranslate2): 31 libraries, 1.36 GB, ~3k entries per GB, most of
   them compressed, as current nvcc writes them.
2. Synthetic (`.cache/bench-corpus/<key>`, built once, ~2 min; the key is this recipe and nvcc's version):
   real fatbins from /usr/local/cuda/bin/nvcc (templated kernels, 10-200 per source; SASS for sm_75 to
   sm_121 with `a` and `f` variants, a little PTX; most `--no-compress`, two with nvcc's default
   compression: ZSTD PTX, large cubins compressed). SHARED libraries are linked by `nvcc -shared` end to
   end (host registration and all); the rest are gcc-built host libraries whose `.nv_fatbin` section holds
   those nvcc fatbins back to back, repeated to a kernel package's size (objcopy: nvcc alone would take
   hours to emit 1.9 GB), with a `.rodata` of their own for the census to search (random bytes: the
   slowest kind to search). Sizes from 0.1 MB to 500 MB, most of them small: 34 libraries, 1.87 GB, 13k
   entries, 7k per GB, nearly all uncompressed: more entries, and more of them uncompressed, than real
   kernel packages carry per GB, so the census's share of work (per entry) is the largest and
   cuobjdump's (per byte, most of all per compressed byte) the smallest.

Then:
1. Start-up, on the smallest synthetic library: `python -c pass`, `python -m qualify inspect FILE --json`
   and cuobjdump `--list-elf` + `--list-ptx`, taken in turn RUNS times (a shared host drifts: each round
   has all three), wall times, min and median; the census's start-up is its time over the bare
   interpreter's (the median of the rounds' differences). Target: within 35 ms.
2. Each corpus: one census of all of it (`inspect --json FILE...`, as users run it, and with `--jobs 1`;
   the two outputs must be byte-identical), one census per file (a script calling it per library), and
   cuobjdump two calls per file (three rounds: before, between and after), with the architecture sets
   compared per library (where cuobjdump fails on a library, what it listed before failing is compared).
   Target: >= 50x cuobjdump for the one census of the corpus. A last table puts the corpora side by side
   (min and median of the rounds).

Wall times are medians on a noisy machine; the tables are what counts, nothing here is asserted.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import venv
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from qualify.core import workers
from qualify.core.errors import ExternalCommandError, QualifyError
from qualify.core.report import emit
from qualify.devtools import bench_inventory as inv
from qualify.devtools import bench_wheels
from qualify.host.tables import table

NVCC = Path("/usr/local/cuda/bin/nvcc")
CORPUS_DIR = inv.REPO / ".cache" / "bench-corpus"
CUOBJDUMP_VENV = inv.REPO / ".cache" / "bench-cuobjdump"
TARGET_STARTUP_MS = 35.0
TARGET_SPEEDUP = 50.0
RECIPE = 1  # bump when what is built changes


def _gencode(*targets: str) -> List[str]:
    """`"90a"`: SASS sm_90a from compute_90a; anything with a comma is nvcc's own `arch=...,code=...`."""
    flags: List[str] = []
    for t in targets:
        flags += ["-gencode", f"arch={t}" if "," in t else f"arch=compute_{t},code=sm_{t}"]
    return flags


NO_COMPRESS = ["--no-compress"]
# name -> (kernels in the source, nvcc flags)
FATBINS: Dict[str, Tuple[int, List[str]]] = {
    "small4": (10, NO_COMPRESS + _gencode("80", "90", "100", "120")),
    "big4": (200, NO_COMPRESS + _gencode("80", "90", "100", "120")),
    "hopper_bw_a": (100, NO_COMPRESS + _gencode("90a", "100a")),
    "family_ptx": (100, _gencode("100f", "120f", "compute_120f,code=compute_120f")),
    "rtx": (200, NO_COMPRESS + _gencode("120", "121")),
    "older": (50, _gencode("75", "86", "89")),
}
# nvcc -shared libraries: name -> (kernels, nvcc flags)
SHARED: Dict[str, Tuple[int, List[str]]] = {
    "libtiny_sm120.so": (1, NO_COMPRESS + _gencode("120")),
    "libops_sm90_sm100.so": (20, NO_COMPRESS + _gencode("90", "100")),
    "libops_bw.so": (40, NO_COMPRESS + _gencode("100", "103", "120")),
    "libops_ptx.so": (10, _gencode("120", "compute_120,code=compute_120")),
    "libops_a.so": (20, NO_COMPRESS + _gencode("100a", "120a")),
    "libops_legacy.so": (10, _gencode("75", "80")),
}
PACKED = 28  # further libraries: .nv_fatbin made of the fatbins above
SMALLEST_MB, LARGEST_MB = 0.1, 500.0


def _source(kernels: int, tag: str) -> str:
    body = "  float v = x[threadIdx.x];\n#pragma unroll\n  for (int i = 0; i < 32; ++i) v = v * N + i * 0.5f;\n"
    lines = [f"template <int N> __global__ void k_{tag}(float *x) {{\n{body}  x[threadIdx.x] = v;\n}}\n"]
    lines += [f"template __global__ void k_{tag}<{i}>(float *);\n" for i in range(1, kernels + 1)]
    lines.append(f'extern "C" int host_{tag}(void) {{ return {kernels}; }}\n')
    return "".join(lines)


def _sizes() -> List[float]:
    """PACKED sizes in MB, geometric from SMALLEST_MB to LARGEST_MB: most libraries small."""
    step = (LARGEST_MB / SMALLEST_MB) ** (1 / (PACKED - 1))
    return [SMALLEST_MB * step**k for k in range(PACKED)]


def _run(cmd: List[str], cwd: Path) -> None:
    proc = subprocess.run(cmd, cwd=str(cwd), capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        raise ExternalCommandError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout}{proc.stderr}")


def corpus_key(nvcc: Path) -> str:
    version = subprocess.run([str(nvcc), "--version"], capture_output=True, text=True, timeout=60).stdout
    recipe = repr((RECIPE, FATBINS, SHARED, PACKED, SMALLEST_MB, LARGEST_MB, _source(2, "x"), version))
    return hashlib.sha256(recipe.encode()).hexdigest()[:16]


def ensure_corpus(nvcc: Path = NVCC, root: Path = CORPUS_DIR) -> List[Path]:
    """The corpus's libraries, built once (into a scratch folder renamed into place: a killed build leaves
    nothing that looks complete)."""
    if not os.access(nvcc, os.X_OK):
        raise QualifyError(f"nvcc not found at {nvcc}", hint="the corpus is built with CUDA 13's nvcc")
    done = root / corpus_key(nvcc)
    if not (done / "libs").is_dir():
        inv.REPORT.say(f"building the corpus into {done} with {nvcc} (once, ~2 min)")
        start = time.monotonic()
        scratch = done.with_name(done.name + f".partial-{os.getpid()}")
        shutil.rmtree(scratch, ignore_errors=True)
        try:
            _build(nvcc, scratch)
            os.replace(scratch, done)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        inv.REPORT.say(f"corpus built in {time.monotonic() - start:.0f} s")
    return sorted((done / "libs").iterdir())


def _build(nvcc: Path, root: Path) -> None:
    work, libs = root / "work", root / "libs"
    work.mkdir(parents=True)
    libs.mkdir()
    jobs: List[List[str]] = []
    for name, (kernels, flags) in FATBINS.items():
        (work / f"{name}.cu").write_text(_source(kernels, name))
        jobs.append([str(nvcc), "-fatbin", *flags, "-o", f"{name}.fatbin", f"{name}.cu"])
    for name, (kernels, flags) in SHARED.items():
        tag = name.split(".")[0]
        (work / f"{tag}.cu").write_text(_source(kernels, tag))
        jobs.append([str(nvcc), "-shared", "-Xcompiler", "-fPIC", *flags, "-o", str(libs / name), f"{tag}.cu"])
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        list(pool.map(lambda cmd: _run(cmd, work), jobs))
    fatbins = [(work / f"{name}.fatbin").read_bytes() for name in FATBINS]
    fatbins = [data + bytes(-len(data) % 16) for data in fatbins]  # each container 16-aligned, as ld places them
    (work / "host.c").write_text('int host_symbol(int x) { return x + 1; }\n')
    _run([shutil.which("gcc") or "cc", "-shared", "-fPIC", "-O1", "-o", "host.so", "host.c"], work)
    for k, size_mb in enumerate(_sizes()):
        chosen = [fatbins[(k + j) % len(fatbins)] for j in range(1 + k % 3)]  # one to three kinds of fatbin
        section, want, at = bytearray(), int(size_mb * 0.97e6), 0
        while len(section) < want or not section:
            section += chosen[at % len(chosen)]
            at += 1
        (work / "fatbin.bin").write_bytes(section)
        # host data the census searches for kernel databases (none there): deterministic bytes, 3% of the size
        (work / "rodata.bin").write_bytes(hashlib.shake_256(str(k).encode()).digest(max(4096, int(size_mb * 0.03e6))))
        out = libs / f"libpacked{k:02d}_{size_mb:.1f}MB.so"
        _run(["objcopy", "--add-section", ".nv_fatbin=fatbin.bin", "--set-section-flags", ".nv_fatbin=readonly,data",
              "--add-section", ".rodata.tables=rodata.bin", "--set-section-flags",
              ".rodata.tables=alloc,load,readonly,data,contents", "host.so", str(out)], work)
    shutil.rmtree(work)


def ensure_cuobjdump(given: Optional[str], site: Optional[Path]) -> Path:
    """--cuobjdump, the bench venv's, or a small venv of the same pinned nvidia-cuda-cuobjdump."""
    if given or (site is not None and (site / "nvidia" / "cu13" / "bin" / "cuobjdump").exists()):
        return inv.find_cuobjdump(site or Path("/"), given)
    python = CUOBJDUMP_VENV / "bin" / "python"
    pinned = next(r for r in inv.REQUIREMENTS if r.startswith("nvidia-cuda-cuobjdump"))
    found = sorted(CUOBJDUMP_VENV.glob("lib/python*/site-packages/nvidia/cu13/bin/cuobjdump"))
    if not found:
        inv.REPORT.say(f"pip install {pinned} into {CUOBJDUMP_VENV}")
        venv.EnvBuilder(with_pip=True, clear=True).create(str(CUOBJDUMP_VENV))
        if subprocess.run([str(python), "-m", "pip", "install", "-q", pinned]).returncode != 0:
            raise ExternalCommandError(f"pip install {pinned} failed", hint="see pip's output above")
        found = sorted(CUOBJDUMP_VENV.glob("lib/python*/site-packages/nvidia/cu13/bin/cuobjdump"))
    if not found:
        raise QualifyError(f"no cuobjdump in {CUOBJDUMP_VENV}", hint="pass --cuobjdump PATH")
    return found[0]


# --- measuring --------------------------------------------------------------------------------------------


def _wall_ms(argv: List[str], env: Dict[str, str]) -> float:
    start = time.perf_counter()
    proc = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    elapsed = (time.perf_counter() - start) * 1e3
    if proc.returncode != 0:
        raise ExternalCommandError(f"{' '.join(argv)} failed ({proc.returncode})")
    return elapsed


def startup(library: Path, cuobjdump: Optional[Path], runs: int) -> Dict[str, List[float]]:
    """Wall times (ms) of the bare interpreter, the census of `library` and cuobjdump on it (where given),
    in turn: interleaved, so a change of load hits both sides of a pair."""
    env = inv._env()
    python = [sys.executable]
    commands = {
        "python -c pass": [[*python, "-c", "pass"]],
        "python -m qualify inspect FILE --json": [[*python, "-m", "qualify", "inspect", str(library), "--json"]],
    }
    if cuobjdump is not None:
        commands["cuobjdump --list-elf FILE, --list-ptx FILE"] = [
            [str(cuobjdump), f, str(library)] for f in ("--list-elf", "--list-ptx")]
    times: Dict[str, List[float]] = {name: [] for name in commands}
    for _ in range(runs):
        for name, argvs in commands.items():
            times[name].append(sum(_wall_ms(argv, env) for argv in argvs))
    return times


def startup_over(times: Dict[str, List[float]]) -> float:
    """The census's start-up over the bare interpreter: the median of the interleaved rounds' differences."""
    return statistics.median(c - b for c, b in zip(times["python -m qualify inspect FILE --json"],
                                                   times["python -c pass"]))


def startup_lines(library: Path, times: Dict[str, List[float]]) -> List[str]:
    rows = [[name, f"{min(ms):.1f}", f"{statistics.median(ms):.1f}"] for name, ms in times.items()]
    bare, census = times["python -c pass"], times["python -m qualify inspect FILE --json"]
    over = startup_over(times)
    verdict = "met" if over <= TARGET_STARTUP_MS else "MISSED"
    return [f"start-up, on the smallest library ({library.name}, {library.stat().st_size / 1e6:.2f} MB), "
            f"{len(bare)} rounds, wall ms:", table(rows, ["COMMAND", "MIN MS", "MEDIAN MS"], rule=False),
            f"target census within {TARGET_STARTUP_MS:.0f} ms of python -c pass: {verdict} "
            f"({over:.1f} ms: the median of the rounds' differences; {min(census) - min(bare):.1f} ms between the minima)"]


@dataclass
class CorpusResult:
    name: str
    libraries: int
    size: int
    entries: int
    uncompressed: int
    census: List[inv.Measurement]  # one census of the corpus, each round (default processes)
    single: List[inv.Measurement]  # the same with --jobs 1
    cuobjdump: List[inv.Measurement]
    agree: bool


def run(cuobjdump_arg: Optional[str], site: Optional[Path], runs: int, cuobjdump_runs: int,
        page_cache: inv.PageCache, startup_runs: int = 21, wheels: bool = True) -> int:
    """The start-up, then each corpus (the real wheels' libraries first, the synthetic one second), then
    the two side by side."""
    synthetic = ensure_corpus()
    real = bench_wheels.ensure_libraries() if wheels else []
    cuobjdump = ensure_cuobjdump(cuobjdump_arg, site)
    print(f"load average at start: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs", flush=True)
    inv.compile_bytecode()
    inv.warm_page_cache(real + synthetic, page_cache)
    smallest = min(synthetic, key=lambda p: p.stat().st_size)
    lines = startup_lines(smallest, startup(smallest, cuobjdump, startup_runs))
    results = []
    if real:
        root = bench_wheels.libs_root()
        print(f"\nreal corpus: {len(real)} libraries of {len(bench_wheels.WHEELS)} PyPI packages "
              f"({', '.join(f'{w.name} {w.version}' for w in bench_wheels.WHEELS)}), under {root}", flush=True)
        results.append(_measure("real: 5 PyPI kernel packages", real, root, cuobjdump, runs, cuobjdump_runs,
                                lambda p: bench_wheels.label(p, root)))
    print(f"\nsynthetic corpus: {len(synthetic)} libraries ({len(SHARED)} linked by nvcc -shared, {PACKED} with nvcc "
          f"fatbins in .nv_fatbin), under {synthetic[0].parent}", flush=True)
    results.append(_measure("synthetic: nvcc-built, entry-heavy", synthetic, synthetic[0].parent, cuobjdump, runs,
                            cuobjdump_runs, lambda p: p.name))
    print()
    for line in lines:
        print(line)
    print()
    print(corpus_table(results))
    for r in results:
        ratio = statistics.median(m.wall_s for m in r.cuobjdump) / statistics.median(m.wall_s for m in r.census)
        print(f"target >= {TARGET_SPEEDUP:.0f}x cuobjdump, one census of the {r.name} corpus: "
              f"{'met' if ratio >= TARGET_SPEEDUP else 'MISSED'} ({ratio:.0f}x, median over median)")
    return 0 if all(r.agree for r in results) else 1


def _measure(name: str, libraries: List[Path], root: Path, cuobjdump: Path, runs: int, cuobjdump_runs: int,
             label) -> CorpusResult:
    """cuobjdump, the census (as users run it, then in one process), once per file, cuobjdump again, ...:
    cuobjdump's rounds spread among the censuses, as for the large libraries."""
    with tempfile.TemporaryDirectory(prefix="bench-corpus-") as tmp:
        out = Path(tmp)
        dumps, outputs, commands = [], [], []
        for i, path in enumerate(libraries):
            for flag in ("--list-elf", "--list-ptx"):
                commands.append([str(cuobjdump), flag, str(path)])
                outputs.append(out / f"{i}{flag}.txt")
        argv = [sys.executable, "-m", "qualify", "inspect", "--json", *map(str, libraries)]
        dumps.append(inv.measure(commands, outputs))
        census = _rounds(argv, out / "census.json", runs)
        dumps.append(inv.measure(commands, outputs))
        single = _rounds([*argv[:5], "--jobs", "1", *argv[5:]], out / "single.json", runs)
        dumps.append(inv.measure(commands, outputs))
        per_file = _per_file(libraries, out, max(1, runs // 2))
        for _ in range(max(0, cuobjdump_runs - 3)):
            dumps.append(inv.measure(commands, outputs))
        if (out / "census.json").read_bytes() != (out / "single.json").read_bytes():
            raise QualifyError("the census with one process and with several differ", hint=f"compare them in {out}")
        theirs = inv.median_measurement(dumps)
        by_path = {lib["path"]: lib for lib in json.loads((out / "census.json").read_text())["libraries"]}
        rows = []
        for i, p in enumerate(libraries):
            codes = dumps[0].returncodes[2 * i : 2 * i + 2]
            rows.append((inv.compare(by_path[str(p)], outputs[2 * i].read_text(errors="replace"),
                                     outputs[2 * i + 1].read_text(errors="replace")), max(codes)))
    print(library_table(rows, label))
    entries = sum(lib["entries"] for lib in by_path.values())
    packed = {k: sum(lib["compression"][k] for lib in by_path.values()) for k in ("none", "lz4", "zstd")}
    total = sum(p.stat().st_size for p in libraries)
    print(f"{sum(lib['containers'] for lib in by_path.values())} containers, {entries} entries, "
          f"{entries / (total / 1e9):.0f} entries per GB (uncompressed {packed['none']}, ZSTD {packed['zstd']}, "
          f"LZ4 {packed['lz4']}): the census's work grows with entries, cuobjdump's with bytes, most of all "
          "compressed ones (it decompresses every entry)")
    tools = [(f"qualify inspect --json, the whole corpus ({workers.default_jobs()} process(es) at the start, "
              f"median of {runs})", inv.median_measurement(census)),
             (f"qualify inspect --jobs 1 --json, the whole corpus (median of {runs})", inv.median_measurement(single)),
             (f"qualify inspect FILE --json once per file ({len(libraries)} runs, median of {max(1, runs // 2)})",
              per_file),
             (f"cuobjdump --list-elf/--list-ptx ({len(commands)} calls, median of {len(dumps)})", theirs)]
    print(inv.summary_table(tools, theirs))
    print("census wall times (s): " + " ".join(f"{m.wall_s:.3f}" for m in census)
          + "; --jobs 1: " + " ".join(f"{m.wall_s:.3f}" for m in single))
    print("cuobjdump wall times (s): " + " ".join(f"{m.wall_s:.2f}" for m in dumps))
    agree = True
    for c, code in rows:
        if code == 0 and not c.agree:
            agree = False
            print(f"DISAGREE {c.path}: only ours {sorted(c.only_ours)}, only cuobjdump {sorted(c.only_theirs)}")
        elif code != 0 and c.only_theirs:
            agree = False
            print(f"DISAGREE {c.path}: cuobjdump failed ({code}) after listing {sorted(c.only_theirs)}, not ours")
    return CorpusResult(name, len(libraries), total, entries, packed["none"], census, single, dumps, agree)


def _rounds(argv: List[str], output: Path, runs: int) -> List[inv.Measurement]:
    results = [inv.measure([argv], [output]) for _ in range(runs)]
    if any(r.returncodes != [0] for r in results):
        raise ExternalCommandError(f"{' '.join(argv[:5])} ... failed")
    return results


def library_table(rows: List[Tuple[inv.Comparison, int]], label) -> str:
    """Per library: what the census finds in `.nv_fatbin`, and whether cuobjdump lists the same; where
    cuobjdump fails, whether what it listed before failing is the census's too."""
    body = []
    for c, code in rows:
        if code != 0:
            verdict = f"cuobjdump failed ({code}); its {len(c.ours) - len(c.only_ours)} listed agree" \
                if not c.only_theirs else f"NO (cuobjdump failed, {code})"
        else:
            verdict = "yes" if c.agree else "NO"
        body.append([label(c.path), f"{c.size / 1e6:.1f}", str(c.containers), str(c.outside),
                     " ".join(sorted(c.ours, key=inv._arch_key)), verdict])
    header = ["LIBRARY", "SIZE MB", "CONTAINERS", "NOT IN .nv_fatbin", "ARCHES IN .nv_fatbin (ours)", "AGREE"]
    return table(body, header, rule=False)


def corpus_table(results: List[CorpusResult]) -> str:
    """The corpora side by side: min and median of the rounds, and the ratio of the medians."""

    def span(ms: List[inv.Measurement]) -> str:
        walls = [m.wall_s for m in ms]
        return f"{min(walls):.3f} / {statistics.median(walls):.3f}"

    rows = []
    for r in results:
        theirs = statistics.median(m.wall_s for m in r.cuobjdump)
        rows.append([r.name, str(r.libraries), f"{r.size / 1e9:.2f}", str(r.entries),
                     f"{r.entries / (r.size / 1e9):.0f}", f"{r.uncompressed / (r.size / 1e9):.0f}",
                     span(r.census), span(r.single), span(r.cuobjdump),
                     f"{theirs / statistics.median(m.wall_s for m in r.census):.0f}x",
                     f"{theirs / statistics.median(m.wall_s for m in r.single):.0f}x"])
    header = ["CORPUS", "LIBRARIES", "GB", "ENTRIES", "ENTRIES/GB", "UNCOMPRESSED/GB", "CENSUS S (MIN / MEDIAN)",
              "--jobs 1 S", "CUOBJDUMP S", "RATIO", "RATIO --jobs 1"]
    return table(rows, header, rule=False)


def _per_file(libraries: List[Path], out: Path, runs: int) -> inv.Measurement:
    """One `inspect FILE --json` per library, as a script calling it per library: the median of `runs`."""
    argvs = [[sys.executable, "-m", "qualify", "inspect", str(p), "--json"] for p in libraries]
    outputs = [out / f"one-{i}.json" for i in range(len(libraries))]
    results = [inv.measure(argvs, outputs) for _ in range(runs)]
    if any(code != 0 for r in results for code in r.returncodes):
        raise ExternalCommandError("python -m qualify inspect FILE --json failed on a corpus library")
    return inv.median_measurement(results)


def _startup_only(library: Path, runs: int) -> int:
    if not library.is_file():
        emit(f"error: {library}: no such file (give a library with a .nv_fatbin, e.g. one of the synthetic corpus)")
        return 2
    print(f"{sys.executable} (Python {sys.version.split()[0]}), load average at start: {os.getloadavg()[0]:.1f} on "
          f"{os.cpu_count()} CPUs", flush=True)
    inv.compile_bytecode()
    for _ in range(2):  # the page cache and bytecode warm, untimed
        _wall_ms([sys.executable, "-m", "qualify", "inspect", str(library), "--json"], inv._env())
    times = startup(library, None, runs)
    for line in startup_lines(library, times):
        print(line)
    print(f"load average at end: {os.getloadavg()[0]:.1f}")
    return 0 if startup_over(times) <= TARGET_STARTUP_MS else 1


def main(argv: Optional[List[str]] = None) -> int:
    parser = inv.make_parser("nox -s bench-inventory --")
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--corpus-only", action="store_true", help="only the kernel-package corpus and the start-up")
    which.add_argument("--no-corpus", action="store_true", help="only the large libraries")
    parser.add_argument("--no-wheels", action="store_true",
                        help="leave out the corpus of real PyPI kernel packages (no download): the synthetic one only")
    which.add_argument("--startup-only", metavar="FILE", type=Path,
                       help="only the census's start-up on FILE, against `python -c pass` (no cuobjdump: runs on a "
                            "host without CUDA, such as a quiet GPU host's bare Python)")
    parser.add_argument("--startup-runs", type=int, default=21, help="interleaved pairs for the start-up (default 21)")
    args = parser.parse_args(argv)
    if args.measure:
        return inv._measure_helper(args.measure)
    if args.startup_only:
        return _startup_only(args.startup_only, max(1, args.startup_runs))
    runs, cuobjdump_runs, page_cache = max(1, args.runs), max(1, args.cuobjdump_runs), inv.PageCache(args.page_cache)
    try:
        code = 0
        if not args.corpus_only:
            code = inv.run(Path(args.venv), args.cuobjdump, runs, args.site, cuobjdump_runs, page_cache)
        if not args.no_corpus:
            site = None if args.corpus_only or args.site else inv.ensure_venv(Path(args.venv))
            code = max(code, run(args.cuobjdump, site, runs, cuobjdump_runs, page_cache, wheels=not args.no_wheels))
        return code
    except QualifyError as exc:
        emit(f"error: {exc}")
        return exc.exit_code


if __name__ == "__main__":
    sys.exit(main())
