"""Deciding whether a compressed cubin holds a kernel with as little decoding
as the answer needs (qualify/core/kernels.py), on real nvcc 13.0 cubins
packed by NVIDIA's fatbinary: ZSTD and LZ4 prefixes, decoding only as far
as the section headers and name table reach, the LZ4 partial decoder, and
remembered answers for repeated payloads. Every answer is checked against
a decoder that reads the whole payload."""

from __future__ import annotations

import json
import mmap
import os
import shutil
import struct
import subprocess
from pathlib import Path

import pytest
from conftest import require

from qualify.core import census, elf, fatbin, kernels

PAD = 300_000  # random bytes after a cubin's section table: what a prefix decode must not read


@pytest.fixture(scope="session")
def packed(nvcc, tmp_path_factory):
    """name -> fatbin (zstd and lz4) of: a kernel cubin whose first 4 KB hold
    no `.text.` name (llvm-objcopy adds 60 long section names ahead of it), a
    kernel-less cubin, and a cubin whose name table claims more bytes than the
    cubin has; each followed by PAD random bytes, as a large cubin's code
    follows its tables."""
    objcopy = shutil.which("llvm-objcopy")
    require(objcopy is not None, "llvm-objcopy is not installed (scripts/setup-host.sh installs llvm)")
    fatbinary = nvcc.parent / "fatbinary"
    root = tmp_path_factory.mktemp("kernel-detection")
    (root / "k.cu").write_text("__global__ void scale(float *x) { x[threadIdx.x] *= 2.0f; }\n")
    (root / "nok.cu").write_text('__device__ float table[64] = {1.0f};\nextern "C" int host_only(int x) { return x + 1; }\n')
    for name in ("k", "nok"):
        subprocess.run([str(nvcc), "-cubin", "-arch=sm_120", "-o", f"{name}.cubin", f"{name}.cu"], cwd=root, check=True)
    (root / "pad.bin").write_bytes(os.urandom(256))
    names = [f"--add-section=.nv.pad{i:03d}{'x' * 100}=pad.bin" for i in range(60)]
    subprocess.run([objcopy, *names, "k.cubin", "long-names.cubin"], cwd=root, check=True)
    cubins = {
        "kernel": (root / "long-names.cubin").read_bytes(),
        "no-kernel": (root / "nok.cubin").read_bytes(),
    }
    cubins["bad-names"] = _claim_longer_name_table(cubins["kernel"])
    out = {}
    for name, data in cubins.items():
        padded = root / f"{name}.cubin"
        padded.write_bytes(data + os.urandom(PAD))
        if name == "no-kernel":
            target = root / "small-no-kernel-zstd.fatbin"
            subprocess.run([str(fatbinary), f"--create={target}", f"--image3=kind=elf,sm=120,file={root / 'nok.cubin'}",
                            "--compress-all"], check=True, capture_output=True)
            out["small-no-kernel-zstd"] = target
        for mode, flags in (("zstd", ["--compress-all"]), ("lz4", ["--compress-all", "--compress-mode=speed"])):
            target = root / f"{name}-{mode}.fatbin"
            subprocess.run([str(fatbinary), f"--create={target}", f"--image3=kind=elf,sm=120,file={padded}", *flags],
                           check=True, capture_output=True)
            out[f"{name}-{mode}"] = target
    return out


def _claim_longer_name_table(cubin: bytes) -> bytes:
    """The name table's header says it runs PAD * 4 bytes past the cubin's end."""
    header = elf.ElfHeader.parse(cubin)
    at = header.shoff + header.shstrndx * header.shentsize + 32  # sh_size of the name table's header
    data = bytearray(cubin)
    struct.pack_into("<Q", data, at, len(cubin) + PAD * 4)
    return bytes(data)


def decode_answer(path: Path) -> tuple:
    """(kernels answer, bytes decompressed, uncompressed size) of the one container."""
    scan = fatbin.read_file(str(path), decompress=False)
    assert scan.ok, scan.errors
    (container,) = scan.containers
    with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        decoders = kernels.Decoders(True)
        answer = kernels.container_kernels(mm, container, decoders)
    return answer, kernels.MAX_DECOMPRESSED_FILE - decoders.budget, container.entries[0].uncompressed_size


@pytest.mark.parametrize("mode", ["zstd", "lz4"])
def test_kernel_found_by_reading_only_the_tables(packed, mode):
    answer, decoded, size = decode_answer(packed[f"kernel-{mode}"])
    assert answer == "yes"
    # A 4 KB prefix, then as far as the section headers reach (the cubin's end,
    # for this layout): never the padding after them.
    assert decoded <= kernels._EARLY_PREFIX * (mode == "lz4") + 4096 + (size - PAD) < size // 5


@pytest.mark.parametrize("mode", ["zstd", "lz4"])
def test_kernel_less_cubin_from_its_first_kilobytes(packed, mode):
    answer, decoded, size = decode_answer(packed[f"no-kernel-{mode}"])
    assert answer == "no"
    assert size > PAD and decoded <= 2 * 4096  # the old code decoded all of it


@pytest.mark.parametrize("mode", ["zstd", "lz4"])
def test_a_name_table_past_the_end_is_unknown(packed, mode):
    answer, _decoded, _size = decode_answer(packed[f"bad-names-{mode}"])
    assert answer == "unknown"


@pytest.mark.parametrize("mode", ["zstd", "lz4"])
def test_answers_agree_with_whole_payload_decoding(packed, mode):
    """The same containers decoded whole, their section names read by pyelftools."""
    import io

    import lz4.block
    import zstandard
    from elftools.elf.elffile import ELFFile

    for name in ("kernel", "no-kernel"):
        path = packed[f"{name}-{mode}"]
        (container,) = fatbin.read_file(str(path), decompress=False).containers
        (entry,) = container.entries
        raw = path.read_bytes()[entry.offset + entry.header_size:][: entry.compressed_size or entry.payload_size]
        if mode == "zstd":
            whole = zstandard.ZstdDecompressor().decompress(raw, max_output_size=entry.uncompressed_size)
        else:
            whole = lz4.block.decompress(raw, uncompressed_size=entry.uncompressed_size)
        names = [s.name for s in ELFFile(io.BytesIO(whole)).iter_sections()]
        expected = "yes" if any(n.startswith(".text.") for n in names) else "no"
        assert decode_answer(path)[0] == expected == ("yes" if name == "kernel" else "no")


def test_lz4_partial_decoder_is_the_liblz4_one():
    assert kernels._lz4_partial() is not None, "python-lz4's extension no longer exports LZ4_decompress_safe_partial"


def test_without_the_partial_decoder_the_census_is_the_same(fx, packed, monkeypatch):
    paths = [str(p) for p in fx.all_paths()] + [str(p) for p in packed.values()]
    with_partial = json.dumps(census.scan(paths, detail=True).to_json(), sort_keys=True)
    monkeypatch.setattr(kernels, "_lz4_partial", lambda: None)  # whole LZ4 blocks, as on a host without it
    assert json.dumps(census.scan(paths, detail=True).to_json(), sort_keys=True) == with_partial


def test_damaged_lz4_start_is_unknown(packed, tmp_path):
    """The first token of the LZ4 block claims more literals than the block holds."""
    path = packed["kernel-lz4"]
    (container,) = fatbin.read_file(str(path), decompress=False).containers
    (entry,) = container.entries
    data = bytearray(path.read_bytes())
    start = entry.offset + entry.header_size
    data[start] = 0xF0  # literal length 15 + the bytes that follow
    data[start + 1 : start + 64] = b"\xff" * 63  # ... adding up to far more than the block
    damaged = tmp_path / "damaged.fatbin"
    damaged.write_bytes(bytes(data))
    assert decode_answer(damaged)[0] == "unknown"


def test_remembered_answers_change_nothing(fx, packed, monkeypatch):
    """Repeated small payloads are answered once; without that, the same census."""
    paths = [str(p) for p in fx.all_paths()] + [str(p) for p in packed.values()]
    remembered = json.dumps(census.scan(paths, detail=True).to_json(), sort_keys=True)
    monkeypatch.setattr(kernels, "_REMEMBER_PACKED", -1)
    assert json.dumps(census.scan(paths, detail=True).to_json(), sort_keys=True) == remembered


def test_a_repeated_payload_is_decoded_once(packed, tmp_path, monkeypatch):
    """Two identical kernel-less containers (as cuBLASLt and cuDNN repeat
    thousands): one decode, two answers."""
    twice = tmp_path / "twice.fatbin"
    twice.write_bytes(packed["small-no-kernel-zstd"].read_bytes() * 2)
    calls = []
    decode = kernels.Decoders.decode

    def counting(self, mm, entry, limit):
        calls.append(entry.offset)
        return decode(self, mm, entry, limit)

    monkeypatch.setattr(kernels.Decoders, "decode", counting)
    scan = fatbin.read_file(str(twice))
    assert scan.ok, scan.errors
    assert [c.kernels for c in scan.containers] == ["no", "no"]
    assert len(set(calls)) == 1


def _spy_lz4_inputs(monkeypatch) -> list:
    """The input size of every call to liblz4's partial decoder."""
    real = kernels._lz4_partial()
    sizes = []

    def spy(src, dst, src_size, target, capacity):
        sizes.append(src_size)
        return real(src, dst, src_size, target, capacity)

    monkeypatch.setattr(kernels, "_lz4_partial", lambda: spy)
    return sizes


def test_lz4_prefix_is_decoded_from_part_of_the_input(packed, monkeypatch):
    """The kernel cubin is followed by 300 KB of random bytes, which LZ4
    cannot shrink: the 4 KB question copies ~8 KB of input, not ~300 KB."""
    import lz4.block

    sizes = _spy_lz4_inputs(monkeypatch)
    path = packed["kernel-lz4"]
    (container,) = fatbin.read_file(str(path), decompress=False).containers
    (entry,) = container.entries
    raw = path.read_bytes()[entry.offset + entry.header_size :][: entry.compressed_size]
    with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        head = kernels.Decoders(True).decode(mm, entry, 4096)
    assert head == lz4.block.decompress(raw, uncompressed_size=entry.uncompressed_size)[:4096]
    assert sizes == [kernels._lz4_input(4096, entry.uncompressed_size)]
    assert sizes[0] < len(raw) // 20


def test_lz4_prefix_past_the_cut_reads_the_whole_input(tmp_path, monkeypatch):
    """A hand-made LZ4 block (real format, decoded by liblz4) whose first
    match length runs over 9,000 extension bytes while its entry declares
    5,000 bytes: the cut input cannot hold the 4 KB prefix, so the whole
    input decides, and the answer is python-lz4's own."""
    import lz4.block

    from qualify.core.arch import Variant
    from qualify.core.fatbin_model import FLAG_LZ4, KIND_CUBIN, STUB_UNKNOWN, Entry

    extension = 9000
    block = bytes([0x1F]) + b"A" + b"\x01\x00" + b"\xff" * extension + b"\x00" + bytes([0x50]) + b"BBBBB"
    real_size = 1 + (15 + 4 + 255 * extension) + 5
    path = tmp_path / "long-match.lz4"
    path.write_bytes(block)
    entry = Entry(0, KIND_CUBIN, 120, Variant.PLAIN, FLAG_LZ4, "lz4", 0, len(block), len(block), 5000, STUB_UNKNOWN, True, None)
    assert kernels._lz4_input(4096, entry.uncompressed_size) < len(block)
    sizes = _spy_lz4_inputs(monkeypatch)
    with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        head = kernels.Decoders(True).decode(mm, entry, 4096)
    assert head == lz4.block.decompress(block, uncompressed_size=real_size)[:4096] == b"A" * 4096
    assert sizes == [kernels._lz4_input(4096, 5000), len(block)]
