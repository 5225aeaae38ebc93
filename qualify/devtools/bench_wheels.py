"""A corpus of real kernel libraries for `nox -s bench-inventory`: five packages' wheels from PyPI, pinned
by hash, their shared objects unpacked once into `.cache/bench-wheels/<key>/libs/<package>/`.

The packages are what users of a vLLM image inspect besides torch: vLLM's own kernels (its `_C`,
`_moe_C`, FlashMLA and FlashAttention 2/3 extensions), NVIDIA's NPP (eleven CUDA 13 libraries),
bitsandbytes (one library per CUDA release from 11.8 to 13.2; cuobjdump 13.2 aborts on the CUDA 12.1
build), CuPy's CUDA 13 build (CUB, Thrust, cuRAND kernels) and CTranslate2 (LZ4-compressed fatbins).
Together 31 libraries with a `.nv_fatbin`, 1.36 GB, about 4k entries: most of them compressed, as nvcc
12.8 and later write them by default, which is what cuobjdump spends its time decompressing.

Downloaded with pip (`--require-hashes`, no dependencies, the wheel's own platform), each file's SHA-256
checked again here before it is opened; members are unpacked only under their package's folder (names
with `..`, absolute names and links are refused), each bounded in size. A killed run leaves nothing that
looks complete: the libraries are unpacked into a scratch folder renamed into place, and the wheels
(0.75 GB) are removed once unpacked.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import List

from qualify.core.errors import ExternalCommandError, QualifyError
from qualify.devtools import bench_inventory as inv

CACHE = inv.REPO / ".cache" / "bench-wheels"
MAX_MEMBER = 2 << 30  # one unpacked library
MAX_UNPACKED = 4 << 30  # all of them
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_24_x86_64", "manylinux2014_x86_64")
PYTHON = "3.11"  # the tag of the two wheels built per interpreter; the libraries are read, never loaded


@dataclass(frozen=True)
class Wheel:
    name: str
    version: str
    filename: str
    sha256: str
    size: int  # bytes, as the index states it (for the disk check and the progress line)

    @property
    def requirement(self) -> str:
        return f"{self.name}=={self.version} --hash=sha256:{self.sha256}"


WHEELS = (
    Wheel("vllm", "0.33.0", "vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl",
          "4b6bdec4ab269990bf70d45a3c1e94c3760a27064513760193b26d6f0da883aa", 336_361_138),
    Wheel("nvidia-npp", "13.2.0.58", "nvidia_npp-13.2.0.58-py3-none-manylinux_2_27_x86_64.whl",
          "cf59284ad215a49e270a3763dbde3a060aabdd8f31b787b9f1192209ec6ae9e8", 261_290_267),
    Wheel("bitsandbytes", "0.50.2", "bitsandbytes-0.50.2-py3-none-manylinux_2_24_x86_64.whl",
          "55348a9a4a21bfd99cf8c7b32fe67b4030ae5c2a05738e03c1747f65fa6ec283", 43_139_553),
    Wheel("cupy-cuda13x", "14.2.0", "cupy_cuda13x-14.2.0-cp311-cp311-manylinux2014_x86_64.whl",
          "f94843e54500a9c8c169135f79572bfaba946efe4f7178e834c227280c1b0c12", 69_969_199),
    Wheel("ctranslate2", "4.8.5", "ctranslate2-4.8.5-cp311-cp311-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl",
          "79a30a2c974530dbb5083f4922d28ffad87e08542f423aa91c53fbf4543cc35f", 42_565_499),
)


def corpus_key() -> str:
    recipe = repr((WHEELS, MAX_MEMBER))
    return hashlib.sha256(recipe.encode()).hexdigest()[:16]


def libs_root(root: Path = CACHE) -> Path:
    return root / corpus_key() / "libs"


def ensure_libraries(root: Path = CACHE) -> List[Path]:
    """The corpus's libraries (every unpacked shared object with a `.nv_fatbin` section), made once."""
    done = root / corpus_key()
    if not (done / "libs").is_dir():
        need = sum(w.size for w in WHEELS) * 3  # the wheels, then about twice their size unpacked
        free = shutil.disk_usage(root.parent if root.parent.exists() else inv.REPO).free
        if free < need:
            raise QualifyError(f"the wheel corpus needs about {need / 1e9:.1f} GB free under {root}, "
                               f"{free / 1e9:.1f} GB are", hint="free disk space, or run with --no-corpus")
        root.mkdir(parents=True, exist_ok=True)
        scratch = done.with_name(done.name + f".partial-{os.getpid()}")
        shutil.rmtree(scratch, ignore_errors=True)
        try:
            start = time.monotonic()
            wheels = download(WHEELS, scratch / "wheels")
            for wheel, path in zip(WHEELS, wheels):
                unpack(path, scratch / "libs" / wheel.name)
                path.unlink()  # unpacked: the wheel itself is not needed again
            os.replace(scratch, done)
            inv.REPORT.say(f"wheel corpus ready in {time.monotonic() - start:.0f} s: {done}")
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    return libraries(done / "libs")


def download(wheels: tuple, into: Path) -> List[Path]:
    """Each wheel by pip, hash-checked by pip and again here."""
    into.mkdir(parents=True, exist_ok=True)
    total = sum(w.size for w in wheels)
    inv.REPORT.say(f"downloading {len(wheels)} wheels ({total / 1e9:.2f} GB) into {into}")
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as fh:
        fh.write("".join(w.requirement + "\n" for w in wheels))
        requirements = fh.name
    try:
        argv = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:", "--require-hashes",
                "--python-version", PYTHON, "--implementation", "cp", "-d", str(into), "-r", requirements]
        for platform in PLATFORMS:
            argv += ["--platform", platform]
        proc = subprocess.run(argv)
    finally:
        os.unlink(requirements)
    if proc.returncode != 0:
        raise ExternalCommandError(f"pip download of the wheel corpus failed ({proc.returncode})",
                                   hint="see pip's output above")
    paths = []
    for wheel in wheels:
        path = into / wheel.filename
        if not path.is_file():
            raise QualifyError(f"pip did not download {wheel.filename}", hint=f"look in {into}")
        got = sha256_of(path)
        if got != wheel.sha256:
            raise QualifyError(f"{path}: SHA-256 {got}, pinned {wheel.sha256}", hint="delete it and run again")
        paths.append(path)
    return paths


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def unpack(wheel: Path, into: Path) -> List[Path]:
    """The wheel's shared objects (`*.so`, `*.so.N`) under `into`, by their names in the wheel."""
    out, total = [], 0
    with zipfile.ZipFile(wheel) as zf:
        for info in zf.infolist():
            name = PurePosixPath(info.filename)
            if info.is_dir() or not (name.suffix == ".so" or ".so." in name.name):
                continue
            if name.is_absolute() or ".." in name.parts or "\\" in info.filename or not name.parts:
                raise QualifyError(f"{wheel.name}: member {info.filename!r} would be written outside {into}")
            if (info.external_attr >> 16) & 0o170000 == 0o120000:
                raise QualifyError(f"{wheel.name}: member {info.filename!r} is a symbolic link")
            if info.file_size > MAX_MEMBER or total + info.file_size > MAX_UNPACKED:
                raise QualifyError(f"{wheel.name}: member {info.filename!r} ({info.file_size} bytes) is over the "
                                   f"bench's bounds ({MAX_MEMBER} a file, {MAX_UNPACKED} in all)")
            target = into.joinpath(*name.parts)
            target.parent.mkdir(parents=True, exist_ok=True)
            with zf.open(info) as src, open(target, "wb") as dst:
                copied = 0
                for block in iter(lambda: src.read(1 << 20), b""):
                    copied += len(block)
                    if copied > info.file_size:  # more than the directory says: refuse rather than fill the disk
                        raise QualifyError(f"{wheel.name}: member {info.filename!r} is larger than it declares")
                    dst.write(block)
            total += info.file_size
            out.append(target)
    return out


def libraries(root: Path) -> List[Path]:
    """Every library under `root` whose `.nv_fatbin` holds a container: what cuobjdump can list."""
    return sorted(inv.find_libraries(root))


def label(path: Path, root: Path) -> str:
    """`<package>/<name>`: the package folder and the library's own name."""
    rel = path.relative_to(root)
    return f"{rel.parts[0]}/{rel.name}"


if __name__ == "__main__":
    print("\n".join(map(str, ensure_libraries())))
