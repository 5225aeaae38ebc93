"""What `python -m qualify inspect FILE --json` imports (its start-up is most of its time on a small library;
`nox -s bench-inventory` prints the times): on a real nvcc-built library without compressed entries, neither
argparse, typing nor dataclasses, no decoder, no ctypes, no worker or part machinery and nothing of the host
side; a library whose kernels are in ZSTD entries brings zstandard, and only that decoder (a cubin read
uncompressed answers before any PTX is decoded)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
KERNEL = "__global__ void scale(float *x) { x[threadIdx.x] *= 2.0f; }\n" \
         "extern \"C\" void launch(float *x) { scale<<<1, 32>>>(x); }\n"
NEVER = {"argparse", "typing", "dataclasses", "inspect", "shutil", "locale", "pickle", "select",
         "qualify.core.parts", "qualify.host", "qualify.host.tables", "elftools"}
DECODERS = {"zstandard", "lz4", "lz4.block", "ctypes"}


@pytest.fixture(scope="module")
def libraries(nvcc, tmp_path_factory):
    root = tmp_path_factory.mktemp("startup")
    (root / "k.cu").write_text(KERNEL)
    built = {}
    for name, flags in (("plain", ["--no-compress", "-gencode", "arch=compute_120,code=sm_120"]),
                        ("zstd", ["-gencode", "arch=compute_120,code=compute_120"])):
        out = root / f"lib{name}.so"
        subprocess.run([str(nvcc), "-shared", "-Xcompiler", "-fPIC", *flags, "-o", str(out), "k.cu"], cwd=root,
                       check=True, capture_output=True, timeout=300)
        built[name] = out
    return built


def _imported(path: Path):
    """The modules loaded when `python -m qualify inspect PATH --json` exits (run as -m runs it: runpy)."""
    code = ("import atexit, json, runpy, sys\n"
            "atexit.register(lambda: sys.stderr.write('MODULES ' + json.dumps(sorted(sys.modules)) + '\\n'))\n"
            f"sys.argv = ['qualify', 'inspect', {str(path)!r}, '--json']\n"
            "runpy.run_module('qualify', run_name='__main__', alter_sys=True)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert proc.returncode == 0, proc.stderr
    line = next(x for x in proc.stderr.splitlines() if x.startswith("MODULES "))
    return set(json.loads(line[len("MODULES "):])), json.loads(proc.stdout)


def test_a_small_uncompressed_library_imports_only_what_its_census_needs(libraries):
    names, report = _imported(libraries["plain"])
    (lib,) = report["libraries"]
    assert lib["sass"] == ["sm_120"] and lib["compression"]["none"] == lib["entries"] > 0  # really read
    assert not names & (NEVER | DECODERS), sorted(names & (NEVER | DECODERS))
    assert "qualify.core.census" in names  # the census itself was imported


def test_a_compressed_entry_brings_its_decoder_only(libraries):
    names, report = _imported(libraries["zstd"])
    (lib,) = report["libraries"]
    assert lib["compression"]["zstd"] > 0 and lib["ptx"] == ["compute_120"]
    assert "zstandard" in names
    others = (NEVER - {"typing"}) | {"lz4", "lz4.block", "ctypes"}  # zstandard itself imports typing
    assert not names & others, sorted(names & others)
