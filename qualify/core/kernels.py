"""Whether a fatbin container holds a kernel: nvcc emits kernel-less containers
(device-link stubs, empty translation units), and they must not count as code.

Entries are decompressed just enough (ZSTD with `zstandard`, LZ4 with `lz4`,
both optional: absent, as in an image, the answer is `unknown`): a 4 KB
prefix shows a kernel's `.text.<name>` in nvcc's section-name table; only
when it does not is the entry decoded whole (bounded by its declared size,
MAX_DECOMPRESSED_ENTRY and a per-file budget) and its section table read.
Standard library only (decoders optional), Python 3.9 compatible.
"""

from __future__ import annotations

import functools
import importlib
import mmap
import struct
from typing import Optional, Tuple

from qualify.core.elf import EM_CUDA, ElfHeader, FormatError, section_table
from qualify.core.fatbin_model import Container, Entry

# Whether a container holds a kernel (a `.text.<name>` section in a cubin, an
# `.entry` in PTX). Decided by decompressing just enough of its entries.
KERNELS_YES = "yes"



KERNELS_NO = "no"



KERNELS_UNKNOWN = "unknown"  # compressed with no decoder at hand, over budget, or damaged



# Bounds on decompression: one entry, and all entries of one file together
# (the largest real cubins are tens of MB; a hostile header may claim more).
MAX_DECOMPRESSED_ENTRY = 256 << 20



MAX_DECOMPRESSED_FILE = 1 << 30



# nvcc writes a cubin's section-name table right after the 64-byte ELF
# header, so a kernel's `.text.<name>` shows within the first few KB; only
# when it does not is the whole cubin decompressed and its section table read.
_KERNEL_PREFIX = 4096



_TEXT_NAME = b"\0.text."



_PTX_ENTRY = b".entry"



def _optional(module: str):
    """An optional decoder module, or None. Imported by name: the image side
    runs with the standard library and pyelftools only, where these are
    absent and compressed containers' kernels are `unknown`."""
    try:
        return importlib.import_module(module)
    except ImportError:
        return None



@functools.cache
def _decoder_modules() -> Tuple[object, object]:
    return _optional("zstandard"), _optional("lz4.block")



class _MappedSource:
    """A file-like view of mm[start:end] for zstandard's stream reader, so a
    prefix is decompressed without copying the whole compressed payload."""

    def __init__(self, mm: mmap.mmap, start: int, end: int) -> None:
        self.mm, self.pos, self.end = mm, start, end

    def read(self, size: int = -1) -> bytes:
        stop = self.end if size < 0 else min(self.end, self.pos + size)
        data = self.mm[self.pos : stop]
        self.pos = stop
        return data



class Decoders:
    """ZSTD and LZ4 decoders when present, and a per-file budget of
    decompressed bytes: every decompression is bounded by its entry's declared
    uncompressed size, and all of a file's together by MAX_DECOMPRESSED_FILE."""

    def __init__(self, enabled: bool) -> None:
        zstd, lz4 = _decoder_modules() if enabled else (None, None)
        self._zstd = zstd.ZstdDecompressor() if zstd is not None else None
        self._zstd_size = getattr(zstd, "frame_content_size", None)
        self._lz4 = lz4
        self.budget = MAX_DECOMPRESSED_FILE

    def can(self, compression: str) -> bool:
        return (compression == "zstd" and self._zstd is not None) or (compression == "lz4" and self._lz4 is not None)

    def decode(self, mm: mmap.mmap, entry: Entry, limit: int) -> Optional[bytes]:
        """Up to `limit` bytes of the entry's decompressed payload; None when
        it cannot be had (no decoder, over budget, or damaged data)."""
        size = entry.uncompressed_size
        if not self.can(entry.compression) or size > MAX_DECOMPRESSED_ENTRY or min(limit, size) > self.budget:
            return None
        start = entry.offset + entry.header_size
        packed = entry.compressed_size if 0 < entry.compressed_size <= entry.payload_size else entry.payload_size
        want = min(limit, size)
        try:
            if entry.compression == "zstd" and size <= _ZSTD_WHOLE:
                out = self._zstd_whole(mm[start : start + packed], size)  # one call: cheaper than a stream
            elif entry.compression == "zstd":
                out = self._zstd_read(mm, start, start + packed, want)
            else:
                # lz4.block decodes whole blocks only (bounded by the declared
                # size); LZ4 runs at GB/s, and a pure-Python prefix decoder
                # measured 30x slower than decoding whole cubins in C.
                out = self._lz4.decompress(mm[start : start + packed], uncompressed_size=size)[:want]
        except Exception:  # zstd.ZstdError, lz4's LZ4BlockError, ...: the data is damaged
            return None
        self.budget -= len(out)
        if len(out) == size:
            return out  # decoded whole anyway: the caller needs no second pass
        return out if len(out) == want else None

    def _zstd_whole(self, packed: bytes, size: int) -> bytes:
        """A small frame at once. The frame's own content size, when it states
        one, must be the entry's: it is what the decoder would allocate."""
        declared = self._zstd_size(packed)
        if declared not in (-1, size):
            raise ValueError(f"ZSTD frame declares {declared} bytes, the entry {size}")
        return self._zstd.decompress(packed, max_output_size=size)

    def _zstd_read(self, mm: mmap.mmap, start: int, end: int, want: int) -> bytes:
        chunks, got = [], 0
        # A small read size: a 4 KB prefix needs a few KB of input, not 64 KB copied out of the mapping.
        with self._zstd.stream_reader(_MappedSource(mm, start, end), read_size=_ZSTD_READ, closefd=False) as reader:
            while got < want:
                chunk = reader.read(want - got)
                if not chunk:
                    break
                chunks.append(chunk)
                got += len(chunk)
        return b"".join(chunks)



_ZSTD_READ = 8192



_ZSTD_WHOLE = 64 << 10  # entries up to this size are decoded whole (kernel-less ones are small)



def container_kernels(mm: mmap.mmap, container: Container, decoders: Decoders) -> str:
    """yes when any entry holds a kernel; no when every driver-loadable entry
    was read whole and none does; unknown otherwise. Stops at the first yes."""
    if container.is_link_stub:
        return KERNELS_NO  # nvlink device-link stubs, read from the cubin header
    answers = set()
    # Cubins first: their section names sit at the start, while PTX may hold
    # MBs of constant tables before its first `.entry`. LTO IR and unknown
    # kinds are not loaded by the driver, so they do not decide.
    loadable = [e for e in container.entries if e.is_cubin] + [
        e for e in container.entries if e.is_ptx
    ]
    for entry in loadable:
        answer = _entry_kernels(mm, entry, decoders)
        if answer == KERNELS_YES:
            return KERNELS_YES
        answers.add(answer)
    if container.damaged or answers != {KERNELS_NO}:
        return KERNELS_UNKNOWN
    return KERNELS_NO



def _entry_kernels(mm: mmap.mmap, entry: Entry, decoders: Decoders) -> str:
    start = entry.offset + entry.header_size
    if entry.compression == "none":
        end = start + entry.payload_size
        if entry.is_ptx:
            return KERNELS_YES if mm.find(_PTX_ENTRY, start, end) >= 0 else KERNELS_NO
        if mm.find(_TEXT_NAME, start, min(end, start + _KERNEL_PREFIX)) >= 0:
            return KERNELS_YES
        return _cubin_kernels(mm[start:end])
    head = decoders.decode(mm, entry, _KERNEL_PREFIX)
    if head is None:
        return KERNELS_UNKNOWN
    needle = _PTX_ENTRY if entry.is_ptx else _TEXT_NAME
    if needle in head[:_KERNEL_PREFIX] if entry.is_cubin else needle in head:
        return KERNELS_YES
    whole = head if len(head) == entry.uncompressed_size else decoders.decode(mm, entry, entry.uncompressed_size)
    if whole is None:
        return KERNELS_UNKNOWN
    if entry.is_ptx:
        return KERNELS_YES if _PTX_ENTRY in whole else KERNELS_NO
    return _cubin_kernels(whole)



def _cubin_kernels(data: bytes) -> str:
    """From a whole cubin's section table: a kernel is a `.text.<name>` section.
    A cubin whose table cannot be read, or that has none, is unknown.
    Without `.text.` anywhere in it no section can bear such a name, so the
    names need not be decoded: checking that the table is sound is enough."""
    try:
        elf = ElfHeader.parse(data)
        if elf.machine != EM_CUDA or elf.shoff == 0 or elf.shnum == 0:
            return KERNELS_UNKNOWN
        if b".text." not in data:
            if elf.shentsize < 64 or elf.shoff + elf.shnum * elf.shentsize > len(data):
                return KERNELS_UNKNOWN
            return KERNELS_NO
        sections = section_table(data, elf)
    except (FormatError, struct.error, IndexError):
        return KERNELS_UNKNOWN
    return KERNELS_YES if any(sec.name.startswith(".text.") for sec in sections) else KERNELS_NO
