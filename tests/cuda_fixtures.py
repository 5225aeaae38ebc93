"""Real CUDA binaries for the census tests, built once per test session.

nvcc is slow, so every artifact is a one-kernel source and the builds run in
parallel; `built(nvcc, tmp_path_factory)` memoises the result at module level
so that the three test modules share one build (a fixture imported into
several modules would otherwise build once per module).

Compression flags, verified with nvcc 13.0.88: by default PTX is ZSTD and
small cubins are stored uncompressed; `-Xfatbin -compress-all` makes every
entry ZSTD; `--compress-mode=speed` switches to LZ4 (with `-compress-all`,
for every entry).
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import os
import re
import shutil
import signal
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Set, Tuple

from qualify.core.arch import CodeKind, CodeTarget

KERNEL = """\
__global__ void scale(float *x) { x[threadIdx.x] *= 2.0f; }
extern "C" void launch(float *x) { scale<<<1, 32>>>(x); }
"""

# A source with no kernel: nvcc still registers a container for it (cuFFT's
# only registered container is such an sm_75 stub).
EMPTY = """\
extern "C" int host_only(int x) { return x + 1; }
"""


def gencode(arch: str, code: str) -> List[str]:
    return ["-gencode", f"arch={arch},code={code}"]


# Shared-object fixtures: name -> gencode flags (nvcc refuses sm_100 and
# sm_100f in one call, so plain, `a` and `f` builds are separate libraries).
SO_GENCODES: Dict[str, List[str]] = {
    "plain": gencode("compute_100", "sm_100") + gencode("compute_120", "sm_120") + gencode("compute_121", "[sm_121,compute_121]"),
    "arch": gencode("compute_100a", "sm_100a") + gencode("compute_103a", "sm_103a") + gencode("compute_120a", "sm_120a"),
    "family": gencode("compute_100f", "sm_100f") + gencode("compute_120f", "sm_120f"),
}
COMPRESSION_FLAGS: Dict[str, List[str]] = {
    "default": [],
    "zstd": ["-Xfatbin", "-compress-all"],
    "lz4": ["--compress-mode=speed", "-Xfatbin", "-compress-all"],
}
# Standalone artifacts: name -> (nvcc flags, file name).
STANDALONE: Dict[str, Tuple[List[str], str]] = {
    "cubin_100": (["-cubin", "-arch=sm_100"], "sm100.cubin"),
    "cubin_120a": (["-cubin", "-arch=sm_120a"], "sm120a.cubin"),
    "cubin_120f": (["-cubin", "-arch=sm_120f"], "sm120f.cubin"),
    "cubin_100a": (["-cubin", "-arch=sm_100a"], "sm100a.cubin"),
    "fatbin": (["-fatbin"] + gencode("compute_120f", "sm_120f") + gencode("compute_121", "compute_121"), "fam.fatbin"),
    "fatbin_100": (["-fatbin"] + gencode("compute_100", "sm_100"), "sm100.fatbin"),
    "lto": (["-fatbin"] + gencode("compute_100", "lto_100"), "lto100.fatbin"),
}
# More libraries: PTX only (an empty device-link container), and -rdc
# (relocatable code kept in __nv_relfatbin).
EXTRA_SO: Dict[str, List[str]] = {
    "ptx100": gencode("compute_100", "compute_100"),
    "rdc": ["-rdc=true"] + gencode("compute_120", "sm_120"),
}


@dataclass
class Fixtures:
    root: Path
    libs: Dict[str, Path] = field(default_factory=dict)  # "plain-default", "arch-zstd", "ptx100", ...
    files: Dict[str, Path] = field(default_factory=dict)  # standalone cubins and fatbins, "embedded"
    build_seconds: float = 0.0

    def lib(self, name: str, compression: str = "default") -> Path:
        return self.libs[f"{name}-{compression}"] if name in SO_GENCODES else self.libs[name]

    def all_paths(self) -> List[Path]:
        return sorted(list(self.libs.values()) + list(self.files.values()))


def _run(cmd: List[str], cwd: Path) -> None:
    proc = subprocess.run(cmd, cwd=str(cwd), capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout}{proc.stderr}")


# Kernel-less libraries (empty.cu, sm_75, every entry compressed), and one
# library linking a kernel-less sm_75 object with an sm_120 kernel, as vLLM's
# _C links its sources (each object is one registered container).
EMPTY_SO: Dict[str, List[str]] = {
    "empty75-zstd": gencode("compute_75", "sm_75") + COMPRESSION_FLAGS["zstd"],
    "empty75-lz4": gencode("compute_75", "sm_75") + COMPRESSION_FLAGS["lz4"],
}


def _mixed_jobs(nvcc: Path, root: Path) -> List[Tuple[str, str, List[str], Path]]:
    def obj(name: str, arch: str, source: str) -> Tuple[str, str, List[str], Path]:
        codes = gencode(f"compute_{arch}", f"sm_{arch}") + COMPRESSION_FLAGS["zstd"]
        cmd = [str(nvcc), "-Xcompiler", "-fPIC", "-c", *codes, "-o", f"{name}.o", source]
        return ("objs", name, cmd, root / f"{name}.o")

    return [obj("empty75", "75", "empty.cu"), obj("kernel120", "120", "kernel.cu")]


def _jobs(nvcc: Path, root: Path) -> List[Tuple[str, str, List[str], Path]]:
    """(group, name, command, output) for every nvcc build."""
    jobs = []
    for name, codes in EMPTY_SO.items():
        out = root / f"lib{name}.so"
        jobs.append(("libs", name, [str(nvcc), "-shared", "-Xcompiler", "-fPIC", *codes, "-o", str(out), "empty.cu"], out))
    for name, codes in SO_GENCODES.items():
        for comp, flags in COMPRESSION_FLAGS.items():
            out = root / f"lib{name}-{comp}.so"
            cmd = [str(nvcc), "-shared", "-Xcompiler", "-fPIC", *codes, *flags, "-o", str(out), "kernel.cu"]
            jobs.append(("libs", f"{name}-{comp}", cmd, out))
    for name, codes in EXTRA_SO.items():
        out = root / f"lib{name}.so"
        cmd = [str(nvcc), "-shared", "-Xcompiler", "-fPIC", *codes, "-o", str(out), "kernel.cu"]
        jobs.append(("libs", name, cmd, out))
    for name, (flags, filename) in STANDALONE.items():
        out = root / filename
        jobs.append(("files", name, [str(nvcc), *flags, "-o", str(out), "kernel.cu"], out))
    return jobs


def build(nvcc: Path, root: Path) -> Fixtures:
    start = time.monotonic()
    root.mkdir(parents=True, exist_ok=True)
    (root / "kernel.cu").write_text(KERNEL)
    (root / "empty.cu").write_text(EMPTY)
    fx = Fixtures(root)
    jobs = _jobs(nvcc, root)
    objs = _mixed_jobs(nvcc, root)
    with ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 2)) as pool:
        list(pool.map(lambda job: _run(job[2], root), jobs + objs))
    for group, name, _cmd, out in jobs:
        getattr(fx, group)[name] = out
    fx.libs["mixed"] = root / "libmixed.so"
    _run([str(nvcc), "-shared", "-o", str(fx.libs["mixed"]), "empty75.o", "kernel120.o"], root)
    fx.files["embedded"] = build_embedded([fx.files["fatbin"]], root / "libembedded.so")
    # Two containers as a kernel database (judged together) and as registered
    # containers (each judged on its own).
    fx.files["pool"] = build_embedded([fx.files["fatbin"], fx.files["fatbin_100"]], root / "libpool.so")
    fx.files["two"] = root / "two.fatbin"
    fx.files["two"].write_bytes(fx.files["fatbin"].read_bytes() + fx.files["fatbin_100"].read_bytes())
    fx.build_seconds = time.monotonic() - start
    return fx


def build_embedded(fatbins: List[Path], out: Path) -> Path:
    """A host library keeping fatbins in .rodata, as cuFFT keeps its kernel
    database outside .nv_fatbin (cuobjdump does not see it)."""
    arrays = []
    for i, fatbin in enumerate(fatbins):
        body = ",".join(str(b) for b in fatbin.read_bytes())
        arrays.append(
            f"const unsigned char kernel_db{i}[] __attribute__((aligned(16))) = {{{body}}};\n"
            f"const unsigned char *db{i}(void) {{ return kernel_db{i}; }}\n"
        )
    src = out.with_suffix(".c")
    src.write_text("".join(arrays))
    _run([shutil.which("gcc") or "cc", "-shared", "-fPIC", "-O0", "-o", str(out), str(src)], out.parent)
    return out


@contextlib.contextmanager
def deadline(seconds: int):
    """Fail instead of hanging: SIGALRM interrupts the block after `seconds`."""

    def _expired(signum, frame):
        raise TimeoutError(f"still running after {seconds} s (a loop that does not advance?)")

    previous = signal.signal(signal.SIGALRM, _expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


# --- cuobjdump -------------------------------------------------------------------


def find_cuobjdump() -> Optional[Path]:
    """The cuobjdump binary of the installed nvidia-cuda-cuobjdump package."""
    try:
        dist = importlib.metadata.distribution("nvidia-cuda-cuobjdump")
    except importlib.metadata.PackageNotFoundError:
        return None
    for f in dist.files or []:
        if f.name == "cuobjdump":
            path = Path(str(dist.locate_file(f)))
            if path.exists():
                return path
    return None


_LISTING = re.compile(r"^(ELF|PTX) file\s+\d+: .*\.((?:sm|compute)_\d+[af]?)\.(?:cubin|ptx)$")


def cuobjdump_arches(cuobjdump: Path, path: Path) -> Set[str]:
    """What `cuobjdump --list-elf` and `--list-ptx` list, as `sm_XY` / `compute_XY`
    without a/f suffix (cuobjdump drops `f`, and names PTX `sm_XY.ptx`)."""
    found: Set[str] = set()
    for flag in ("--list-elf", "--list-ptx"):
        proc = subprocess.run([str(cuobjdump), flag, str(path)], capture_output=True, text=True, timeout=120)
        if "fatal" in proc.stderr:
            raise RuntimeError(f"cuobjdump {flag} {path}: {proc.stderr}")
        for line in proc.stdout.splitlines():
            m = _LISTING.match(line.strip())
            if m:
                listed = CodeTarget.parse(m.group(2))
                kind = CodeKind.SASS if m.group(1) == "ELF" else CodeKind.PTX
                found.add(CodeTarget(kind, listed.capability, listed.variant).without_variant())
    return found
