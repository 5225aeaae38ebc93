"""qualify.core.fatbin on real nvcc 13.0 output, against cuobjdump, and on damaged copies."""

from __future__ import annotations

import os
import random
import shutil
import struct
import subprocess
import sys
from pathlib import Path
from typing import List

import pytest
from conftest import REPO, require
from cuda_fixtures import COMPRESSION_FLAGS, SO_GENCODES, cuobjdump_arches, deadline, find_cuobjdump
from elftools.elf.elffile import ELFFile

from qualify.core import fatbin, fatbin_model
from qualify.core.arch import Variant

EXPECTED_CODE = {
    "plain": ["sm_100", "sm_120", "sm_121", "compute_121"],
    "arch": ["sm_100a", "sm_103a", "sm_120a"],
    "family": ["sm_100f", "sm_120f"],
}


def names(container: fatbin_model.Container) -> List[str]:
    return [e.name for e in container.entries]


def section_range(path: Path, name: str):
    """(offset, size) of a section, read with pyelftools (an independent reader)."""
    with open(path, "rb") as fh:
        sec = ELFFile(fh).get_section_by_name(name)
        return sec["sh_offset"], sec["sh_size"]


# --- what nvcc builds ---------------------------------------------------------------


def test_fixtures_build_quickly(fx):
    assert fx.build_seconds < 180, f"fixture build took {fx.build_seconds:.0f} s"


@pytest.mark.parametrize("compression", sorted(COMPRESSION_FLAGS))
@pytest.mark.parametrize("name", sorted(SO_GENCODES))
def test_shared_object(fx, name, compression):
    scan = fatbin.read_file(str(fx.lib(name, compression)))
    assert scan.ok, scan.errors
    assert scan.format == "elf"
    # nvcc -shared: the device-link stub container, then the code container.
    stub, code = scan.containers
    assert {c.section for c in scan.containers} == {".nv_fatbin"}
    assert names(code) == EXPECTED_CODE[name]
    assert names(stub) == [n for n in EXPECTED_CODE[name] if n.startswith("sm_")]
    offset, size = section_range(fx.lib(name, compression), ".nv_fatbin")
    assert stub.offset == offset and stub.offset + stub.size == code.offset
    assert code.offset + code.size == offset + size
    for c in scan.containers:
        assert c.size == 16 + sum(e.header_size + e.payload_size for e in c.entries)
        assert c.error is None


@pytest.mark.parametrize("name", sorted(SO_GENCODES))
def test_compression_flags(fx, name):
    default = fatbin.read_file(str(fx.lib(name, "default"))).entries
    # Default: small cubins stored as they are, PTX ZSTD.
    assert {e.compression for e in default if e.kind == "cubin"} == {"none"}
    assert {e.compression for e in default if e.kind == "ptx"} <= {"zstd"}
    for compression in ("zstd", "lz4"):
        entries = fatbin.read_file(str(fx.lib(name, compression))).entries
        assert {e.compression for e in entries} == {compression}
        for e in entries:
            assert 0 < e.compressed_size <= e.payload_size < e.uncompressed_size


@pytest.mark.parametrize("name", sorted(SO_GENCODES))
def test_link_stubs(fx, name):
    stub, code = fatbin.read_file(str(fx.lib(name, "default"))).containers
    assert stub.link_stub == "yes" and code.link_stub == "no"
    # Compressed cubins cannot be looked into without decompressing them.
    stub, code = fatbin.read_file(str(fx.lib(name, "zstd"))).containers
    assert stub.link_stub == "unknown"
    assert {e.link_stub for e in code.entries if e.kind == "cubin"} == {"unknown"}


def test_variants_come_from_entry_flags(fx):
    entries = fatbin.read_file(str(fx.lib("arch"))).entries + fatbin.read_file(str(fx.lib("family"))).entries
    for e in entries:
        expected = Variant.ARCH if e.flags & 0x100000 else Variant.FAMILY if e.flags & 0x200000 else None
        assert e.variant is expected
    assert [e.arch_number for e in fatbin.read_file(str(fx.lib("arch"))).containers[1].entries] == [100, 103, 120]


@pytest.mark.parametrize(
    "key, arch",
    [("cubin_100", "sm_100"), ("cubin_120a", "sm_120a"), ("cubin_120f", "sm_120f")],
)
def test_standalone_cubin(fx, key, arch):
    scan = fatbin.read_file(str(fx.files[key]))
    assert scan.ok, scan.errors
    assert scan.format == "cubin"
    (container,) = scan.containers
    (entry,) = container.entries
    assert entry.name == arch and entry.variant_known
    assert entry.link_stub == "no" and entry.compression == "none"
    assert entry.payload_size == fx.files[key].stat().st_size


def test_standalone_fatbin(fx):
    scan = fatbin.read_file(str(fx.files["fatbin"]))
    assert scan.ok and scan.format == "fatbin"
    (container,) = scan.containers
    assert names(container) == ["sm_120f", "compute_121"]
    assert container.offset == 0 and container.size == fx.files["fatbin"].stat().st_size


def test_lto_ir_entry(fx):
    (entry,) = fatbin.read_file(str(fx.files["lto"])).entries
    assert entry.kind == "lto-ir" and entry.kind_code == 8
    assert entry.name == "lto_100" and entry.code_target is None


def test_ptx_only_library_has_an_empty_link_container(fx):
    scan = fatbin.read_file(str(fx.lib("ptx100")))
    assert scan.ok, scan.errors
    empty, code = scan.containers
    assert empty.entries == [] and empty.size == 16
    assert names(code) == ["compute_100"]


def test_relocatable_device_code(fx):
    scan = fatbin.read_file(str(fx.lib("rdc")))
    assert scan.ok, scan.errors
    by_section = {c.section: c for c in scan.containers}
    assert set(by_section) == {".nv_fatbin", "__nv_relfatbin"}
    assert by_section["__nv_relfatbin"].relocatable and not by_section[".nv_fatbin"].relocatable
    assert names(by_section["__nv_relfatbin"]) == ["sm_120"]


def test_fatbin_embedded_in_rodata(fx):
    scan = fatbin.read_file(str(fx.files["embedded"]))
    assert scan.ok, scan.errors
    (container,) = scan.containers
    assert container.section == ".rodata" and not container.registered
    assert names(container) == ["sm_120f", "compute_121"]


def test_non_elf_and_empty_files(tmp_path):
    text = tmp_path / "notes.txt"
    text.write_text("hello")
    empty = tmp_path / "empty.so"
    empty.write_bytes(b"")
    assert fatbin.sniff(str(text)) is None
    assert "unknown magic" in fatbin.read_file(str(text)).errors[0]
    assert fatbin.read_file(str(empty)).errors == ["empty file"]
    assert "cannot read" in fatbin.read_file(str(tmp_path / "missing.so")).errors[0]


def test_fifo_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "pipe.so"
    import os

    os.mkfifo(fifo)
    with deadline(5):
        assert fatbin.sniff(str(fifo)) is None
        assert "not a regular file" in fatbin.read_file(str(fifo)).errors[0]


# --- agreement with NVIDIA cuobjdump ---------------------------------------------------


@pytest.fixture(scope="session")
def cuobjdump():
    path = find_cuobjdump()
    require(path is not None, "nvidia-cuda-cuobjdump (the test extra) is not installed")
    return path


def test_agrees_with_cuobjdump(fx, cuobjdump):
    for path in fx.all_paths():
        scan = fatbin.read_file(str(path))
        ours = {
            e.code_target.without_variant()
            for c in scan.containers
            if c.registered
            for e in c.entries
            if e.code_target is not None
        }
        assert ours == cuobjdump_arches(cuobjdump, path), path.name


def test_benchmark_comparison(fx, cuobjdump):
    """The benchmark's reading of cuobjdump's listing (qualify.devtools.bench_inventory)."""
    from qualify.core import census
    from qualify.devtools import bench_inventory

    for path in (fx.lib("family"), fx.lib("plain", "lz4"), fx.files["cubin_120a"], fx.lib("rdc")):
        listings = [
            subprocess.run([str(cuobjdump), flag, str(path)], capture_output=True, text=True, timeout=60).stdout
            for flag in ("--list-elf", "--list-ptx")
        ]
        lib = census.scan([str(path)]).to_json()["libraries"][0]
        result = bench_inventory.compare(lib, *listings)
        assert result.agree, (path.name, result.only_ours, result.only_theirs)
    missed = bench_inventory.compare(lib, "", "")
    assert not missed.agree and missed.only_ours == {"sm_120"}


# --- damaged files: error records, never exceptions or hangs ------------------------------


def read_damaged(path: Path) -> fatbin_model.FileScan:
    with deadline(10):
        scan = fatbin.read_file(str(path))
    assert all(isinstance(e, str) and e for e in scan.errors)
    return scan


def patched(src: Path, dst: Path, offset: int, fmt: str, value: int) -> Path:
    data = bytearray(src.read_bytes())
    struct.pack_into(fmt, data, offset, value)
    dst.write_bytes(bytes(data))
    return dst


def test_truncated_fatbin_at_every_point(fx, tmp_path):
    data = fx.files["fatbin"].read_bytes()
    out = tmp_path / "cut.fatbin"
    for cut in range(1, len(data), 7):
        out.write_bytes(data[:cut])
        scan = read_damaged(out)
        assert scan.errors, f"no error when cut at {cut}"


@pytest.mark.parametrize("where", ["ident", "elf_header", "nv_fatbin_header", "nv_fatbin_entry", "payload", "end"])
def test_truncated_shared_object(fx, tmp_path, where):
    src = fx.lib("plain")
    data = src.read_bytes()
    offset, size = section_range(src, ".nv_fatbin")
    cut = {
        "ident": 3,
        "elf_header": 40,
        "nv_fatbin_header": offset + 8,
        "nv_fatbin_entry": offset + 16 + 0x20,
        "payload": offset + size // 2,
        "end": len(data) - 1,
    }[where]
    out = tmp_path / "cut.so"
    out.write_bytes(data[:cut])
    assert read_damaged(out).errors


def _entry_offset(fx) -> int:
    """File offset of the first entry of the code container in libplain-default.so."""
    return fatbin.read_file(str(fx.lib("plain"))).containers[1].entries[0].offset


HEADER_DAMAGE = {
    # name: (where, struct format, value, expected words in the error)
    "magic": ("container", "<I", 0xBA55ED51, "not a fatbin container"),
    "version": ("container+4", "<H", 7, "unsupported version"),
    "huge container header size": ("container+6", "<H", 0xFFFF, "header size"),
    "size past the end": ("container+8", "<Q", 1 << 62, "remain"),
    "entry header size zero": ("entry+4", "<I", 0, "header size"),
    "huge entry header size": ("entry+4", "<I", 0xFFFFFFF0, "header size"),
    "payload past the end": ("entry+8", "<Q", 1 << 40, "runs past"),
    "arch number": ("entry+0x1c", "<I", 7, "implausible"),
    "both a and f": ("entry+0x28", "<Q", 0x300011, "both"),
}


@pytest.mark.parametrize("damage", sorted(HEADER_DAMAGE))
def test_damaged_container_headers(fx, tmp_path, damage):
    where, fmt, value, words = HEADER_DAMAGE[damage]
    base_name, _, plus = where.partition("+")
    lib = fatbin.read_file(str(fx.lib("plain")))
    base = lib.containers[1].offset if base_name == "container" else _entry_offset(fx)
    out = patched(fx.lib("plain"), tmp_path / "bad.so", base + int(plus or "0", 0), fmt, value)
    scan = read_damaged(out)
    assert any(words in e for e in scan.errors), scan.errors
    # The intact stub container before the damage is still reported.
    assert scan.containers[0].entries and scan.containers[0].error is None


def test_zero_sizes_are_not_loops(fx, tmp_path):
    # A zero-size container is legal (nvcc emits one for a PTX-only library):
    # the bytes after it are then reported, and the walk goes on.
    lib = fatbin.read_file(str(fx.lib("plain")))
    out = patched(fx.lib("plain"), tmp_path / "zero.so", lib.containers[1].offset + 8, "<Q", 0)
    scan = read_damaged(out)
    assert scan.containers[1].entries == [] and scan.errors
    # Entries with an empty payload advance by their header.
    data = struct.pack("<IHHQ", fatbin_model.FATBIN_MAGIC, 1, 16, 0x40 * 20000)
    entry = bytearray(0x40)
    struct.pack_into("<HxxIQ", entry, 0, 2, 0x40, 0)
    struct.pack_into("<I", entry, 0x1C, 120)
    many = tmp_path / "many.fatbin"
    many.write_bytes(data + bytes(entry) * 20000)
    scan = read_damaged(many)
    assert scan.ok and len(scan.entries) == 20000


ELF_DAMAGE = {
    # name: (offset in the ELF64 header, format, value)
    "section table past the end": (0x28, "<Q", 1 << 40),
    "section header size zero": (0x3A, "<H", 0),
    "string table index out of range": (0x3E, "<H", 0x7FFF),
    "class": (0x04, "<B", 9),
    "big endian": (0x05, "<B", 2),
}


@pytest.mark.parametrize("damage", sorted(ELF_DAMAGE))
def test_damaged_elf_headers(fx, tmp_path, damage):
    offset, fmt, value = ELF_DAMAGE[damage]
    out = patched(fx.lib("plain"), tmp_path / "bad.so", offset, fmt, value)
    read_damaged(out)  # any outcome but an exception or a hang


def test_extended_section_count_that_does_not_fit(fx, tmp_path):
    src = fx.lib("plain")
    with open(src, "rb") as fh:
        shoff = ELFFile(fh).header["e_shoff"]
    out = patched(src, tmp_path / "ext.so", 0x3C, "<H", 0)  # e_shnum = 0: count is in section 0
    out = patched(out, out, shoff + 0x20, "<Q", 1 << 60)  # section 0's sh_size
    scan = read_damaged(out)
    assert any("do not fit" in e for e in scan.errors), scan.errors


def test_section_size_past_the_end(fx, tmp_path):
    src = fx.lib("plain")
    with open(src, "rb") as fh:
        elf = ELFFile(fh)
        index = [s.name for s in elf.iter_sections()].index(".nv_fatbin")
        entry = elf.header["e_shoff"] + index * elf.header["e_shentsize"]
    out = patched(src, tmp_path / "big.so", entry + 0x20, "<Q", 1 << 50)
    scan = read_damaged(out)
    assert any("extends past the end" in e for e in scan.errors), scan.errors


def test_damaged_embedded_container(fx, tmp_path):
    src = fx.files["embedded"]
    container = fatbin.read_file(str(src)).containers[0]
    out = patched(src, tmp_path / "bad.so", container.offset + 8, "<Q", 1 << 40)
    scan = read_damaged(out)
    assert scan.errors and ".rodata container" in scan.errors[0]


def test_damaged_cubin(fx, tmp_path):
    src = fx.files["cubin_120a"]
    out = patched(src, tmp_path / "bad.cubin", 0x30, "<I", 0x06000002)  # e_flags with SM 0
    assert "plausible SM" in read_damaged(out).errors[0]
    out.write_bytes(src.read_bytes()[:0x30])
    assert read_damaged(out).errors


@pytest.mark.parametrize("key", ["plain", "fatbin", "cubin_120f"])
def test_random_bit_flips(fx, tmp_path, key):
    src = fx.lib(key) if key in SO_GENCODES else fx.files[key]
    data = src.read_bytes()
    if key in SO_GENCODES:
        offset, size = section_range(src, ".nv_fatbin")
        with open(src, "rb") as fh:
            shoff = ELFFile(fh).header["e_shoff"]
        regions = [(0, 64), (offset, 0x200), (offset + size - 0x100, 0x100), (shoff, len(data) - shoff)]
    else:
        regions = [(0, min(len(data), 0x400))]
    rng = random.Random(1234)
    out = tmp_path / f"flip-{src.name}"
    for _ in range(150):
        damaged = bytearray(data)
        for _ in range(rng.randint(1, 4)):
            start, length = rng.choice(regions)
            pos = start + rng.randrange(length)
            damaged[pos] ^= 1 << rng.randrange(8)
        out.write_bytes(bytes(damaged))
        read_damaged(out)


# --- bounded work and memory ---------------------------------------------------------------


@pytest.mark.parametrize("first, window", [(1, 1), (3, 3), (7, 7), (8, 8), (9, 9), (61, 61), (3, 4096), (1, 1 << 20)])
def test_scan_windows_do_not_miss_containers(fx, monkeypatch, first, window):
    # The prefix straddles a window border for some of these sizes.
    monkeypatch.setattr(fatbin, "_NEAR", 0)  # no shortcut: search window by window
    monkeypatch.setattr(fatbin, "_FIRST_WINDOW", first)
    monkeypatch.setattr(fatbin, "_SCAN_WINDOW", window)
    monkeypatch.setattr(fatbin, "_RELEASE_EVERY", 4096)
    scan = fatbin.read_file(str(fx.files["pool"]))
    assert scan.ok and [names(c) for c in scan.containers] == [["sm_120f", "compute_121"], ["sm_100"]]


def test_memory_stays_bounded(tmp_path):
    """A 256 MB data section is searched without mapping all of it at once."""
    gcc = shutil.which("gcc")
    require(gcc is not None, "gcc is needed to build a large ELF")
    src = tmp_path / "big.c"
    src.write_text("const unsigned char big[256 << 20] = {1};\nconst unsigned char *get(void) { return big; }\n")
    lib = tmp_path / "libbig.so"
    subprocess.run([gcc, "-shared", "-fPIC", "-o", str(lib), str(src)], check=True, timeout=120)
    code = (
        "import resource, sys; from qualify.core import fatbin; "
        "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss; "
        "scan = fatbin.read_file(sys.argv[1]); assert scan.ok and not scan.containers, scan.errors; "
        "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before)"
    )
    proc = subprocess.run([sys.executable, "-c", code, str(lib)], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert int(proc.stdout) < 64 * 1024, f"peak RSS grew by {int(proc.stdout) // 1024} MB"


def test_record_counts_are_bounded(tmp_path, monkeypatch):
    """A file of millions of tiny valid records must not exhaust memory."""
    empty = struct.pack("<IHHQ", fatbin_model.FATBIN_MAGIC, 1, 16, 0)
    many = tmp_path / "empties.fatbin"
    many.write_bytes(empty * 50)
    monkeypatch.setattr(fatbin, "MAX_CONTAINERS", 10)
    scan = read_damaged(many)
    assert len(scan.containers) == 10 and "stopped after 10 containers" in scan.errors[-1]

    entry = bytearray(0x40)
    struct.pack_into("<HxxIQ", entry, 0, 2, 0x40, 0)
    struct.pack_into("<I", entry, 0x1C, 120)
    big = tmp_path / "entries.fatbin"
    big.write_bytes(struct.pack("<IHHQ", fatbin_model.FATBIN_MAGIC, 1, 16, 0x40 * 1000) + bytes(entry) * 1000)
    monkeypatch.setattr(fatbin, "MAX_ENTRIES", 100)
    assert "stopped after 100 entries" in read_damaged(big).errors[-1]


def test_error_count_is_bounded(tmp_path):
    bad = struct.pack("<IHHQ", fatbin_model.FATBIN_MAGIC, 9, 16, 0)  # version 9, over and over
    path = tmp_path / "bad.fatbin"
    path.write_bytes(bad * 1000)
    scan = read_damaged(path)
    assert len(scan.errors) == fatbin_model.MAX_ERRORS + 1 and "stopped after" in scan.errors[-1]


@pytest.mark.parametrize("near, first, window", [(0, 1, 5), (0, 4, 4), (64, 16, 1 << 16), (0, 7, 9)])
def test_next_match_finds_every_needle_in_order(tmp_path, monkeypatch, near, first, window):
    import mmap

    monkeypatch.setattr(fatbin, "_NEAR", near)
    monkeypatch.setattr(fatbin, "_FIRST_WINDOW", first)
    monkeypatch.setattr(fatbin, "_SCAN_WINDOW", window)
    rng = random.Random(7)
    data = bytearray(rng.getrandbits(8) for _ in range(200_000))
    for _ in range(60):  # planted needles, some overlapping or adjacent
        pos = rng.randrange(len(data) - 8)
        data[pos : pos + 8] = fatbin_model.CONTAINER_PREFIX
    path = tmp_path / "blob"
    path.write_bytes(bytes(data))
    expected, i = [], data.find(fatbin_model.CONTAINER_PREFIX)
    while i >= 0:
        expected.append(i)
        i = data.find(fatbin_model.CONTAINER_PREFIX, i + 1)
    with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        reader = fatbin.ContainerReader(mm, fatbin_model.FileScan(str(path), "unknown", len(data)))
        found, pos = [], 0
        while True:
            pos = reader.next_match(fatbin_model.CONTAINER_PREFIX, pos, len(data))
            if pos >= len(data):
                break
            found.append(pos)
            pos += 1
    assert found == expected


def test_bench_spreads_cuobjdump_rounds_among_the_censuses():
    """cuobjdump runs before, between and after the censuses, so that the
    ratio compares runs made under the same load (qualify.devtools.bench_inventory)."""
    from qualify.devtools import bench_inventory

    assert bench_inventory.cuobjdump_rounds(5, 3) == [0, 2, 5]
    assert bench_inventory.cuobjdump_rounds(5, 1) == [5]
    assert bench_inventory.cuobjdump_rounds(5, 2) == [0, 5]
    m = bench_inventory.Measurement
    runs = [m(40.0, 10, [0], 39.0), m(50.0, 12, [0], 49.0), m(35.0, 11, [0], 34.0)]
    middle = bench_inventory.median_measurement(runs)
    assert (middle.wall_s, middle.cpu_s, middle.peak_mb) == (40.0, 39.0, 12)


def _resident_fraction(path) -> float:
    """The share of the file's pages in the page cache (mincore(2) on a mapping of it)."""
    import ctypes
    import mmap as mmap_module

    from qualify.core import search

    with open(path, "rb") as fh, mmap_module.mmap(fh.fileno(), 0, access=mmap_module.ACCESS_READ) as mm:
        pages = (len(mm) + mmap_module.PAGESIZE - 1) // mmap_module.PAGESIZE
        vec = (ctypes.c_ubyte * pages)()
        mincore = ctypes.CDLL(None, use_errno=True).mincore
        mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
        assert mincore(search._address(mm), len(mm), vec) == 0, ctypes.get_errno()
        return sum(v & 1 for v in vec) / pages


def test_bench_page_cache_fresh_drops_the_cached_pages_then_reads_them_back(tmp_path):
    """--page-cache fresh (the default): each library is dropped from the page
    cache and read back before anything is timed, so both tools find it cached
    as a file read from disk is, whatever its history (measured on a real
    ext4 file through mincore(2), not a stand-in)."""
    from qualify.devtools import bench_inventory

    path = tmp_path / "lib.so"
    with open(path, "wb") as fh:
        fh.write(os.urandom(4 << 20))
        fh.flush()
        os.fsync(fh.fileno())  # dirty pages cannot be dropped
    path.read_bytes()
    assert _resident_fraction(path) == 1.0
    with open(path, "rb") as fh:
        bench_inventory.drop_cached(fh.fileno())
    assert _resident_fraction(path) < 0.1
    bench_inventory.warm_page_cache([path], bench_inventory.PageCache.AS_FOUND)
    assert _resident_fraction(path) == 1.0
    bench_inventory.warm_page_cache([path], bench_inventory.PageCache.FRESH)
    assert _resident_fraction(path) == 1.0
