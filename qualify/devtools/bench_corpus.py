"""The census on a corpus like the kernel packages users inspect, and its start-up (`nox -s bench-inventory`).

    python -m qualify.devtools.bench_corpus [bench_inventory's options] [--corpus-only | --no-corpus]

runs bench_inventory's large libraries first (unless --corpus-only), then this (unless --no-corpus).

A review measured the census on an unseen corpus of five kernel packages (34 libraries, 1.98 GB, mostly
uncompressed cubins) at 23-28x cuobjdump, start-up being most of it. This is that case, built here:

1. The corpus (`.cache/bench-corpus/<key>`, built once, ~2 min; the key is this recipe and nvcc's version):
   real fatbins from /usr/local/cuda/bin/nvcc (templated kernels, 10-200 per source; SASS for sm_75 to
   sm_121 with `a` and `f` variants, a little PTX; most `--no-compress`, two with nvcc's default
   compression: ZSTD PTX, large cubins compressed). SHARED libraries are linked by `nvcc -shared` end to
   end (host registration and all); the rest are gcc-built host libraries whose `.nv_fatbin` section holds
   those nvcc fatbins back to back, repeated to a kernel package's size (objcopy: nvcc alone would take
   hours to emit 1.9 GB), with a `.rodata` of their own for the census to search. Sizes from 0.1 MB to
   500 MB, most of them small: 34 libraries, 1.87 GB, 13k entries.
2. Start-up, on the smallest library: `python -c pass`, `python -m qualify inspect FILE --json` and
   cuobjdump `--list-elf` + `--list-ptx`, taken in turn RUNS times (a shared host drifts: each round has
   all three), wall times, min and median; the census's start-up is its time over the bare interpreter's
   (the median of the rounds' differences). Target: within 35 ms.
3. The corpus: one census of all of it (`inspect --json FILE...`, as for the large libraries), one census
   per file (a script calling it per library), and cuobjdump two calls per file (three rounds: before,
   between and after), with the architecture sets compared per library. Target: >= 50x cuobjdump for
   the one census of the corpus.

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
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from qualify.core import workers
from qualify.core.errors import ExternalCommandError, QualifyError
from qualify.devtools import bench_inventory as inv
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


def startup(library: Path, cuobjdump: Path, runs: int) -> Dict[str, List[float]]:
    """Wall times (ms) of the bare interpreter, the census of `library` and cuobjdump on it, in turn."""
    env = inv._env()
    python = [sys.executable]
    commands = {
        "python -c pass": [[*python, "-c", "pass"]],
        "python -m qualify inspect FILE --json": [[*python, "-m", "qualify", "inspect", str(library), "--json"]],
        "cuobjdump --list-elf FILE, --list-ptx FILE": [[str(cuobjdump), f, str(library)] for f in ("--list-elf", "--list-ptx")],
    }
    times: Dict[str, List[float]] = {name: [] for name in commands}
    for _ in range(runs):
        for name, argvs in commands.items():
            times[name].append(sum(_wall_ms(argv, env) for argv in argvs))
    return times


def startup_lines(library: Path, times: Dict[str, List[float]]) -> List[str]:
    rows = [[name, f"{min(ms):.1f}", f"{statistics.median(ms):.1f}"] for name, ms in times.items()]
    bare, census = times["python -c pass"], times["python -m qualify inspect FILE --json"]
    over = statistics.median(c - b for c, b in zip(census, bare))
    verdict = "met" if over <= TARGET_STARTUP_MS else "MISSED"
    return [f"start-up, on the smallest library ({library.name}, {library.stat().st_size / 1e6:.2f} MB), "
            f"{len(bare)} rounds, wall ms:", table(rows, ["COMMAND", "MIN MS", "MEDIAN MS"], rule=False),
            f"target census within {TARGET_STARTUP_MS:.0f} ms of python -c pass: {verdict} "
            f"({over:.1f} ms: the median of the rounds' differences; {min(census) - min(bare):.1f} ms between the minima)"]


def run(cuobjdump_arg: Optional[str], site: Optional[Path], runs: int, cuobjdump_runs: int,
        page_cache: inv.PageCache, startup_runs: int = 21) -> int:
    libraries = ensure_corpus()
    cuobjdump = ensure_cuobjdump(cuobjdump_arg, site)
    total = sum(p.stat().st_size for p in libraries)
    print(f"\ncorpus: {len(libraries)} libraries ({len(SHARED)} linked by nvcc -shared, {PACKED} with nvcc fatbins in "
          f".nv_fatbin), {total / 1e9:.2f} GB, under {libraries[0].parent}", flush=True)
    print(f"load average at start: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs", flush=True)
    inv.compile_bytecode()
    inv.warm_page_cache(libraries, page_cache)
    smallest = min(libraries, key=lambda p: p.stat().st_size)
    lines = startup_lines(smallest, startup(smallest, cuobjdump, startup_runs))
    with tempfile.TemporaryDirectory(prefix="bench-corpus-") as tmp:
        out = Path(tmp)
        dumps, outputs, commands = [], [], []
        for i, path in enumerate(libraries):
            for flag in ("--list-elf", "--list-ptx"):
                commands.append([str(cuobjdump), flag, str(path)])
                outputs.append(out / f"{i}{flag}.txt")
        dumps.append(inv.measure(commands, outputs))
        whole = inv.measure_census(libraries, out / "census.json", runs, [])
        dumps.append(inv.measure(commands, outputs))
        per_file = _per_file(libraries, out, max(1, runs // 2))
        dumps.append(inv.measure(commands, outputs))
        for _ in range(max(0, cuobjdump_runs - 3)):
            dumps.append(inv.measure(commands, outputs))
        theirs = inv.median_measurement(dumps)
        by_path = {lib["path"]: lib for lib in json.loads((out / "census.json").read_text())["libraries"]}
        rows = [inv.compare(by_path[str(p)], outputs[2 * i].read_text(errors="replace"),
                            outputs[2 * i + 1].read_text(errors="replace")) for i, p in enumerate(libraries)]
    entries = sum(lib["entries"] for lib in by_path.values())
    packed = {k: sum(lib["compression"][k] for lib in by_path.values()) for k in ("none", "lz4", "zstd")}
    print()
    print(inv.library_table(rows, libraries[0].parent))
    print(f"{sum(lib['containers'] for lib in by_path.values())} containers, {entries} entries "
          f"({total / max(1, entries) / 1e3:.0f} KB per entry; uncompressed {packed['none']}, ZSTD {packed['zstd']}, "
          f"LZ4 {packed['lz4']}): the census's work grows with entries, cuobjdump's with bytes")
    print()
    for line in lines:
        print(line)
    print()
    tools = [(f"qualify inspect --json, the whole corpus ({workers.default_jobs()} processes, median of {runs})", whole),
             (f"qualify inspect FILE --json once per file ({len(libraries)} runs, median of {max(1, runs // 2)})", per_file),
             (f"cuobjdump --list-elf/--list-ptx ({len(commands)} calls, median of {len(dumps)})", theirs)]
    print(inv.summary_table(tools, theirs))
    speedup = theirs.wall_s / whole.wall_s if whole.wall_s else float("inf")
    print(f"target >= {TARGET_SPEEDUP:.0f}x cuobjdump, one census of the corpus: "
          f"{'met' if speedup >= TARGET_SPEEDUP else 'MISSED'} ({speedup:.0f}x); once per file: "
          f"{theirs.wall_s / per_file.wall_s:.1f}x (no target: each run pays the interpreter's start)")
    print("cuobjdump wall times (s): " + " ".join(f"{m.wall_s:.2f}" for m in dumps))
    for c in rows:
        if not c.agree:
            print(f"DISAGREE {c.path}: only ours {sorted(c.only_ours)}, only cuobjdump {sorted(c.only_theirs)}")
    return 0 if all(c.agree for c in rows) else 1


def _per_file(libraries: List[Path], out: Path, runs: int) -> inv.Measurement:
    """One `inspect FILE --json` per library, as a script calling it per library: the median of `runs`."""
    argvs = [[sys.executable, "-m", "qualify", "inspect", str(p), "--json"] for p in libraries]
    outputs = [out / f"one-{i}.json" for i in range(len(libraries))]
    results = [inv.measure(argvs, outputs) for _ in range(runs)]
    if any(code != 0 for r in results for code in r.returncodes):
        raise ExternalCommandError("python -m qualify inspect FILE --json failed on a corpus library")
    return inv.median_measurement(results)


def main(argv: Optional[List[str]] = None) -> int:
    parser = inv.make_parser("nox -s bench-inventory --")
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--corpus-only", action="store_true", help="only the kernel-package corpus and the start-up")
    which.add_argument("--no-corpus", action="store_true", help="only the large libraries")
    args = parser.parse_args(argv)
    if args.measure:
        return inv._measure_helper(args.measure)
    runs, cuobjdump_runs, page_cache = max(1, args.runs), max(1, args.cuobjdump_runs), inv.PageCache(args.page_cache)
    try:
        code = 0
        if not args.corpus_only:
            code = inv.run(Path(args.venv), args.cuobjdump, runs, args.site, cuobjdump_runs, page_cache)
        if not args.no_corpus:
            site = None if args.corpus_only or args.site else inv.ensure_venv(Path(args.venv))
            code = max(code, run(args.cuobjdump, site, runs, cuobjdump_runs, page_cache))
        return code
    except QualifyError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code


if __name__ == "__main__":
    sys.exit(main())
