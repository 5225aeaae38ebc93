"""Issue 15, items 1-4, on real nvcc 13.0 output: kernel-less containers,
unreadable paths, section-stripped libraries, damage that must not improve a
verdict. Each test fails on the code before the fix."""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from conftest import REPO, require

from qualify.core import census, elf, fatbin
from qualify.core.arch import Capability, Compat

BLACKWELL = ["10.0", "10.3", "12.0", "12.1"]


def judged(path: Path, target: str, decompress: bool = True) -> census.TargetVerdict:
    (lib,) = census.scan([str(path)], Capability.parse(target), decompress=decompress).libraries
    return lib.verdict


# --- 1. kernel-less containers ------------------------------------------------------


@pytest.mark.parametrize("compression", ["zstd", "lz4"])
def test_kernel_less_compressed_library_is_not_none(fx, compression):
    """cuFFT's case: the only registered container is an empty sm_75 one."""
    path = fx.libs[f"empty75-{compression}"]
    scan = fatbin.read_file(str(path))
    assert scan.ok, scan.errors
    assert {e.compression for e in scan.entries} == {compression}
    assert [c.kernels for c in scan.containers] == ["no", "no"]
    for target in BLACKWELL:
        v = judged(path, target)
        assert v.klass is None and v.units == 0 and v.excluded["no_kernel"] == 2, target


@pytest.mark.parametrize("compression", ["zstd", "lz4"])
def test_without_decoder_kernels_are_unknown_never_none(fx, compression):
    """Inside an image with no decoder, whether the sm_75 units hold kernels is unknown: the units are
    `unknown`, never `none` gaps. The library as a whole has no code that can run on a Blackwell device
    whatever its containers hold, so its best is `none` (issue 29: a library of other architectures' code
    only is `none` for the target, decodable or not)."""
    path = fx.libs[f"empty75-{compression}"]
    assert {c.kernels for c in fatbin.read_file(str(path), decompress=False).containers} == {"unknown"}
    for target in BLACKWELL:
        v = judged(path, target, decompress=False)
        assert v.klass is Compat.UNKNOWN and not v.no_code and v.no_code_unknown, target
        assert v.best is Compat.NONE, target


def test_image_interpreter_without_decoders(fx):
    """The same through an interpreter where importing zstandard and lz4 fails."""
    code = (
        "import sys, json\n"
        "sys.modules['zstandard'] = None; sys.modules['lz4'] = None; sys.modules['lz4.block'] = None\n"
        "from qualify.core import census; from qualify.core.arch import Capability\n"
        "print(json.dumps(census.scan(sys.argv[1:], Capability.parse('12.0')).to_json()))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code, str(fx.libs["empty75-zstd"])], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    (lib,) = json.loads(proc.stdout)["libraries"]
    assert lib["verdict"]["class"] == "unknown"


def test_kernel_less_unit_next_to_code(fx):
    """vLLM _C's case: a kernel-less sm_75 object linked with an sm_120 kernel."""
    path = fx.libs["mixed"]
    scan = fatbin.read_file(str(path))
    assert scan.ok, scan.errors
    kernels = {(c.entries[0].name, c.kernels) for c in scan.containers if c.entries}
    assert kernels == {("sm_120", "yes"), ("sm_75", "no")}  # and the device-link stub
    v = judged(path, "12.0")
    assert v.klass is Compat.NATIVE and v.units == 1 and not v.no_code
    assert judged(path, "10.0").klass is Compat.NONE  # the kernel really is missing there
    # Without decoding: the sm_75 unit is unknown, never none.
    assert judged(path, "12.0", decompress=False).klass is Compat.UNKNOWN


def test_every_decoded_entry_agrees_with_pyelftools(fx):
    """The kernel answer, from a 4 KB prefix or a whole decode, against the
    `.text.` sections pyelftools finds in the cubin nvcc wrote."""
    from elftools.elf.elffile import ELFFile

    for key in ("cubin_100", "cubin_120a", "cubin_100a"):
        with open(fx.files[key], "rb") as fh:
            names = [s.name for s in ELFFile(fh).iter_sections()]
        expected = "yes" if any(n.startswith(".text.") for n in names) else "no"
        (container,) = fatbin.read_file(str(fx.files[key])).containers
        assert container.kernels == expected == "yes"


# --- 2. unreadable paths --------------------------------------------------------------

NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]


def as_nobody(*args: str) -> subprocess.CompletedProcess:
    """Root ignores mode bits: unreadability is real only for another user."""
    require(shutil.which("setpriv") is not None, "setpriv (util-linux) is not installed")
    return subprocess.run([*NOBODY, sys.executable, *args], cwd=REPO, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(REPO)})


@pytest.fixture()
def public_tmp():
    """A directory nobody can reach (pytest's tmp_path is under a 0700 folder)."""
    path = Path(tempfile.mkdtemp(prefix="census-unreadable-", dir="/tmp"))
    path.chmod(0o755)
    yield path
    for p in [path, *path.rglob("*")]:
        if p.is_dir() and not p.is_symlink():
            p.chmod(0o755)
    shutil.rmtree(path)


def inspect_json(*paths: Path) -> tuple:
    proc = as_nobody("-m", "qualify", "inspect", "--json", "--target", "12.1", *map(str, paths))
    return proc, (json.loads(proc.stdout) if proc.stdout else None)


def test_mode_000_directory(fx, public_tmp):
    locked = public_tmp / "locked"
    locked.mkdir()
    shutil.copy(fx.lib("plain"), locked / "libplain.so")
    locked.chmod(0)
    proc, report = inspect_json(locked)
    assert proc.returncode == 11, proc.stderr
    assert report["unreadable"] == [str(locked)]
    (row,) = report["libraries"]
    assert row["format"] == "directory" and "Permission denied" in row["errors"][0]
    table = as_nobody("-m", "qualify", "inspect", str(locked))
    assert table.returncode == 11 and "1 unreadable" in table.stdout and "could not be read" in table.stderr


def test_unreadable_entries_inside_a_walk(fx, public_tmp):
    shutil.copy(fx.lib("plain"), public_tmp / "libplain.so")
    (public_tmp / "sub").mkdir()
    shutil.copy(fx.lib("arch"), public_tmp / "sub" / "libarch.so")
    (public_tmp / "sub").chmod(0)
    shutil.copy(fx.lib("family"), public_tmp / "libsecret.so")
    (public_tmp / "libsecret.so").chmod(0)
    (public_tmp / "noexec").mkdir()  # listable, not searchable: its entries cannot be examined
    shutil.copy(fx.lib("plain"), public_tmp / "noexec" / "libhidden.so")
    (public_tmp / "noexec").chmod(0o744)
    proc, report = inspect_json(public_tmp)
    assert proc.returncode == 11, proc.stderr
    assert sorted(report["unreadable"]) == sorted(
        str(public_tmp / p) for p in ("sub", "libsecret.so", "noexec/libhidden.so")
    )
    rows = {r["path"]: r for r in report["libraries"]}
    assert rows[str(public_tmp / "libplain.so")]["verdict"]["class"] == "native"
    assert all(rows[p]["errors"] for p in report["unreadable"])


def test_library_named_inside_a_non_searchable_directory(fx, public_tmp):
    (public_tmp / "d").mkdir()
    shutil.copy(fx.lib("plain"), public_tmp / "d" / "libplain.so")
    (public_tmp / "d").chmod(0o700)
    proc, report = inspect_json(public_tmp / "d" / "libplain.so")
    assert proc.returncode == 11, proc.stderr
    assert "no such file" not in proc.stderr
    (row,) = report["libraries"]
    assert "Permission denied" in row["errors"][0]


def test_probe_census_check_reports_unreadable(fx, public_tmp):
    locked = public_tmp / "locked"
    locked.mkdir()
    shutil.copy(fx.lib("plain"), locked / "libplain.so")
    locked.chmod(0)
    code = (
        "import sys, json\n"
        "from qualify.core.arch import Capability\n"
        "from qualify.probe import census_check\n"
        "out = census_check.run(Capability.parse('12.1'), '12.1', sys.argv[1:], None, None)\n"
        "check = [c for c in out['checks'] if c.id == 'census.unreadable'][0]\n"
        "print(json.dumps({'status': check.status, 'detail': check.reason}))\n"
    )
    proc = as_nobody("-c", code, str(public_tmp))
    assert proc.returncode == 0, proc.stderr
    check = json.loads(proc.stdout)
    assert check["status"] == "warn" and "locked" in check["detail"], check


# --- 3. section headers stripped --------------------------------------------------------


def test_stripped_section_headers_fall_back_to_segments(fx, tmp_path):
    objcopy = shutil.which("llvm-objcopy")
    require(objcopy is not None, "llvm-objcopy is not installed (scripts/setup-host.sh installs llvm)")
    stripped = tmp_path / "libstripped.so"
    subprocess.run([objcopy, "--strip-sections", str(fx.lib("plain")), str(stripped)], check=True)
    # Still a library the loader takes.
    load = subprocess.run([sys.executable, "-c", f"import ctypes; ctypes.CDLL({str(stripped)!r}).launch"],
                          capture_output=True, text=True, timeout=60)
    assert load.returncode == 0, load.stderr
    scan = fatbin.read_file(str(stripped))
    assert scan.ok, scan.errors
    original = fatbin.read_file(str(fx.lib("plain")))
    assert [[e.name for e in c.entries] for c in scan.containers] == [[e.name for e in c.entries] for c in original.containers]
    assert all(c.section.startswith(elf.SEGMENT_PREFIX) and c.registered for c in scan.containers)
    for target in BLACKWELL:
        assert judged(stripped, target).klass == judged(fx.lib("plain"), target).klass


# --- 4. damage never improves a verdict ----------------------------------------------------


def test_bit_flips_in_e_shoff_never_make_sm100a_run_on_10_3(fx, tmp_path):
    data = fx.files["cubin_100a"].read_bytes()
    assert judged(fx.files["cubin_100a"], "10.3").klass is Compat.NONE
    damaged = tmp_path / "damaged.cubin"
    for bit in range(64):
        flipped = bytearray(data)
        shoff = struct.unpack_from("<Q", flipped, 40)[0] ^ (1 << bit)
        struct.pack_into("<Q", flipped, 40, shoff)
        damaged.write_bytes(bytes(flipped))
        v = judged(damaged, "10.3")
        assert v.klass in (Compat.NONE, Compat.UNKNOWN), f"bit {bit}: {v.klass}"
        assert judged(damaged, "10.0").klass in (Compat.NATIVE, Compat.UNKNOWN), f"bit {bit}"


def test_unknown_container_version_is_not_dropped(fx, tmp_path):
    """two.fatbin: sm_120f+compute_121, then sm_100 (none on 12.0)."""
    data = bytearray(fx.files["two"].read_bytes())
    first, second = fatbin.read_file(str(fx.files["two"])).containers
    assert judged(fx.files["two"], "12.0").klass is Compat.NONE
    struct.pack_into("<H", data, second.offset + 4, 2)  # container version 2
    damaged = tmp_path / "v2.fatbin"
    damaged.write_bytes(bytes(data))
    scan = fatbin.read_file(str(damaged))
    assert "unsupported version 2" in " ".join(scan.errors)
    v = judged(damaged, "12.0")
    assert v.klass is Compat.UNKNOWN and v.best is Compat.NATIVE
