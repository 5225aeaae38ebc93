"""nvcc-built binaries whose only code for Blackwell is PTX (issue 51), built once per test session.

FlashAttention-2 as vLLM 0.33 builds it for 12.x: sm_80 SASS and compute_80 PTX only, so on 12.0 it runs by
JIT-compiling PTX. nvcc 13.0 writes `.version 9.0` into every PTX it emits, whatever the compute_XY; a
library built by a newer toolkit carries a newer ISA, which nvcc 13.0 cannot write. So `isa91` is nvcc 13.0's
own PTX text with its `.version` line changed to 9.1 (what CUDA 13.1's nvcc writes), packed into a fatbin by
nvcc 13.0 (`nvcc -fatbin` embeds PTX without assembling it): a stand-in for a wheel built with CUDA 13.1,
labelled as such wherever it is used.
"""

from __future__ import annotations

import subprocess
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List

KERNEL = """\
__global__ void scale(float *x) { x[threadIdx.x] *= 2.0f; }
extern "C" void launch(float *x) { scale<<<1, 32>>>(x); }
"""
PTX80 = ["-gencode", "arch=compute_80,code=compute_80"]
# name -> nvcc flags for a shared library of KERNEL
LIBS: Dict[str, List[str]] = {
    "ptx80-zstd": PTX80,  # nvcc 13.0 compresses PTX with ZSTD by default
    "ptx80-lz4": PTX80 + ["--compress-mode=speed", "-Xfatbin", "-compress-all"],
    "ptx80-none": PTX80 + ["--no-compress"],
    # FA2's own shape: sm_80 SASS beside compute_80 PTX
    "fa2-like": ["-gencode", "arch=compute_80,code=[sm_80,compute_80]"],
    # SASS for the target next to the PTX: nothing runs by JIT on 12.0
    "sass120-ptx80": ["-gencode", "arch=compute_120,code=sm_120"] + PTX80,
}


@dataclass(frozen=True)
class PtxFixtures:
    root: Path
    libs: Dict[str, Path]
    isa91: Path  # the stand-in for a CUDA 13.1 build (see above): a standalone fatbin

    def folder(self, *names: str) -> Path:
        """A folder holding only the named fixtures (a site-packages for the census)."""
        out = self.root / ("site-" + "-".join(names))
        out.mkdir(exist_ok=True)
        for name in names:
            source = self.isa91 if name == "isa91" else self.libs[name]
            link = out / source.name
            if not link.exists():
                link.symlink_to(source)
        return out


_BUILT: Dict[Path, PtxFixtures] = {}


def _run(cmd: List[str], cwd: Path) -> None:
    done = subprocess.run(cmd, cwd=str(cwd), capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stdout}{done.stderr}")


def build(nvcc: Path, root: Path) -> PtxFixtures:
    if nvcc in _BUILT:
        return _BUILT[nvcc]
    (root / "k.cu").write_text(KERNEL)
    libs = {name: root / f"lib{name}.so" for name in LIBS}
    jobs = [[str(nvcc), "-shared", "-Xcompiler", "-fPIC", *flags, "-o", str(libs[name]), "k.cu"]
            for name, flags in LIBS.items()]
    jobs.append([str(nvcc), "-ptx", "-arch=compute_80", "-o", "k.ptx", "k.cu"])
    with ThreadPoolExecutor(max_workers=3) as pool:
        list(pool.map(lambda cmd: _run(cmd, root), jobs))
    text = (root / "k.ptx").read_text()
    assert "\n.version 9.0\n" in text, "nvcc 13.0 writes PTX ISA 9.0"  # the fact the fixtures rest on
    (root / "k91.ptx").write_text(text.replace("\n.version 9.0\n", "\n.version 9.1\n"))
    isa91 = root / "isa91-compute80.fatbin"
    _run([str(nvcc), "-fatbin", *PTX80, "-o", str(isa91), "k91.ptx"], root)
    _BUILT[nvcc] = PtxFixtures(root, libs, isa91)
    return _BUILT[nvcc]
