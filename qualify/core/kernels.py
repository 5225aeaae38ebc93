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

from qualify.core.elf import EM_CUDA, ElfHeader, FormatError
from qualify.core.fatbin_model import KIND_CUBIN, KIND_PTX, STUB_YES, Container, Entry

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: typing is not imported at run time (the census's start-up)
    from typing import Callable, Dict, List, Optional, Tuple

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


_EARLY_PREFIX = 1024  # LZ4 entries are asked for this much first (see _compressed_kernels)


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
def _zstd_module():
    return _optional("zstandard")


@functools.cache
def _lz4_module():
    return _optional("lz4.block")


def _decoder_modules() -> Tuple[object, object]:
    return _zstd_module(), _lz4_module()


@functools.cache
def _lz4_partial() -> Optional[Callable[..., int]]:
    """liblz4's LZ4_decompress_safe_partial, or None.

    python-lz4 decodes whole blocks only, and a kernel shows in a cubin's
    first 4 KB: decoding just those costs a third of decoding cuFFT's typical
    17 KB cubin (3.0 vs 9.4 us, over its 10k LZ4 cubins). The function is
    part of liblz4's stable API (bounds-checked, for untrusted input); it is
    taken from the extension python-lz4 already loaded (which exports it),
    else from the system's liblz4, else whole blocks are decoded."""
    import ctypes

    def system_liblz4() -> Optional[str]:
        import ctypes.util  # runs ldconfig: only when the extension lacks the function

        return ctypes.util.find_library("lz4")

    block = _lz4_module()
    for where in (lambda: getattr(getattr(block, "_block", None), "__file__", None), system_liblz4):
        name = where()
        if not name:
            continue
        try:
            fn = ctypes.CDLL(name).LZ4_decompress_safe_partial
        except (OSError, AttributeError):
            continue
        fn.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_int, ctypes.c_int, ctypes.c_int]
        fn.restype = ctypes.c_int
        return fn
    return None


def decoder_status() -> Dict[str, bool]:
    """Which decoders this interpreter has: a census without one reads the kernels of those containers as
    `unknown`, and says so."""
    zstd, lz4 = _decoder_modules()
    return {"zstd": zstd is not None, "lz4": lz4 is not None}


def load_decoders() -> None:
    """Import the decoders now (before worker processes fork, so that each
    does not import them again)."""
    if _lz4_module() is not None:
        _lz4_partial()
    _zstd_module()


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
        # Each decoder is imported at the first entry that needs it: most small libraries hold no compressed
        # entry, and zstandard (with `platform`), lz4 and ctypes cost ~4 ms of a census's start-up.
        self._want_zstd = self._want_lz4 = enabled
        self._zstd = self._zstd_size = self._lz4 = self._lz4_partial = None
        self._buffer: Optional[object] = None  # the partial decoder's output, reused
        self.budget = MAX_DECOMPRESSED_FILE
        self.answers: Dict[Tuple[int, int, bytes], str] = {}  # see _entry_kernels
        self.remembered = 0  # bytes of payload held as keys of `answers`
        # The last entry decoded and what came out: a PTX entry's ISA (ptxisa.py) and its kernels are read from
        # the same prefix, so the second question decodes nothing (issue 51; measured on the sm120 vLLM image).
        self._last_at, self._last = -1, b""

    def can(self, compression: str) -> bool:
        if compression == "lz4":
            if self._want_lz4:
                self._load_lz4()
            return self._lz4 is not None
        if compression == "zstd":
            if self._want_zstd:
                self._load_zstd()
            return self._zstd is not None
        return False

    def _load_zstd(self) -> None:
        self._want_zstd = False
        zstd = _zstd_module()
        if zstd is not None:
            self._zstd = zstd.ZstdDecompressor()
            self._zstd_size = getattr(zstd, "frame_content_size", None)

    def _load_lz4(self) -> None:
        self._want_lz4 = False
        self._lz4 = _lz4_module()
        self._lz4_partial = _lz4_partial() if self._lz4 is not None else None

    def decode(self, mm: mmap.mmap, entry: Entry, limit: int) -> Optional[bytes]:
        """Up to `limit` bytes of the entry's decompressed payload; None when
        it cannot be had (no decoder, over budget, or damaged data)."""
        size = entry.uncompressed_size
        compression = entry.compression
        want = min(limit, size)
        if entry.offset == self._last_at and (len(self._last) == size or len(self._last) >= want):
            return self._last if len(self._last) == size else self._last[:want]
        if not self.can(compression) or size > MAX_DECOMPRESSED_ENTRY or want > self.budget:
            return None
        start = entry.offset + entry.header_size
        packed = entry.packed_size
        try:
            if compression == "zstd" and (size <= _ZSTD_WHOLE or want == size):
                # One call, bounded by the declared size: cheaper than a stream when all of it is wanted
                # (kernelnames.py reads whole entries: _C's 399 ZSTD cubins, 2.7 s streamed).
                out = self._zstd_whole(mm[start : start + packed], size)
            elif compression == "zstd":
                out = self._zstd_read(mm, start, start + packed, want)
            elif want < size and self._lz4_partial is not None:
                out = self._lz4_prefix(mm, start, packed, want, size)
            else:
                # Whole blocks, bounded by the declared size (a pure-Python
                # prefix decoder measured 30x slower than this in C).
                out = self._lz4.decompress(mm[start : start + packed], uncompressed_size=size)[:want]
        except Exception:  # zstd.ZstdError, lz4's LZ4BlockError, ...: the data is damaged
            return None
        self.budget -= len(out)
        if len(out) == size:
            self._last_at, self._last = entry.offset, out
            return out  # decoded whole anyway: the caller needs no second pass
        if len(out) != want:
            return None
        self._last_at, self._last = entry.offset, out
        return out

    def _lz4_prefix(self, mm: mmap.mmap, start: int, packed: int, want: int, size: int) -> bytes:
        """The first `want` bytes of an LZ4 block, from as little of its input
        as can hold them (see _lz4_input), else from all of it."""
        if self._buffer is None or len(self._buffer) < want:
            import ctypes

            self._buffer = ctypes.create_string_buffer(max(want, _KERNEL_PREFIX))
        short = _lz4_input(want, size)
        if short < packed:
            # A cut input ends the decoding early, never wrongly: fewer bytes
            # than `want` mean the cut was too short, and the whole input decides.
            got = self._lz4_partial(mm[start : start + short], self._buffer, short, want, want)
            if got == want:
                return self._buffer[:want]
        got = self._lz4_partial(mm[start : start + packed], self._buffer, packed, want, want)
        if got != want:  # negative: malformed; fewer: the block is shorter than its entry declares
            raise ValueError(f"LZ4 prefix: {got} bytes of {want}")
        return self._buffer[:want]

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


def _lz4_input(want: int, size: int) -> int:
    """LZ4 input that always holds `want` bytes of output of a valid block of `size`.

    An LZ4 sequence is a token, literals, a 2-byte offset and a match of at
    least 4 bytes, each length extended a byte per 255. Complete sequences
    take at most 1.034 input bytes per output byte (a 3-byte token and offset
    buy at least a 4-byte match; extensions cost 1/255); the last one, cut
    short, may still carry a literal and a match length reaching to the
    block's `size`. So cuFFT's PTX (11 KB packed at the median, for a 4 KB
    question) is copied out of the mapping in part, not whole."""
    return 2 * want + 2 * size // 255 + 64


_ZSTD_WHOLE = 64 << 10  # entries up to this size are decoded whole (kernel-less ones are small)


def container_kernels(mm: mmap.mmap, container: Container, decoders: Decoders) -> str:
    """yes when any entry holds a kernel; no when every driver-loadable entry
    was read whole and none does; unknown otherwise. Stops at the first yes."""
    entries = container.entries
    if len(entries) == 1:  # most containers (cuFFT: 24k of 24k): the same rules, fewer steps
        entry = entries[0]
        if entry.link_stub == STUB_YES:
            return KERNELS_NO
        if entry.kind_code != KIND_CUBIN and entry.kind_code != KIND_PTX:
            return KERNELS_UNKNOWN
        answer = _entry_kernels(mm, entry, decoders)
        if answer == KERNELS_YES or (answer == KERNELS_NO and container.error is None):
            return answer
        return KERNELS_UNKNOWN
    # One pass: whether every entry is an nvlink device-link stub (container.is_link_stub, read from the
    # cubin headers), and the entries the driver loads. Cubins first: their section names sit at the
    # start, while PTX may hold MBs of constant tables before its first `.entry`. LTO IR and unknown
    # kinds are not loaded by the driver, so they do not decide. The smallest cubin first: any one with a
    # kernel decides, and a small one is decoded whole in one call where a large one costs a 128 KB ZSTD block.
    cubins: List[Entry] = []
    ptx: List[Entry] = []
    stubs_only = bool(entries)
    for entry in entries:
        if entry.link_stub != STUB_YES:
            stubs_only = False
        if entry.kind_code == KIND_CUBIN:
            cubins.append(entry)
        elif entry.kind_code == KIND_PTX:
            ptx.append(entry)
    if stubs_only:
        return KERNELS_NO
    if len(cubins) > 1:
        cubins.sort(key=_size)
    answers = set()
    loadable = cubins + ptx
    for entry in loadable:
        answer = _entry_kernels(mm, entry, decoders)
        if answer == KERNELS_YES:
            return KERNELS_YES
        answers.add(answer)
    if container.damaged or answers != {KERNELS_NO}:
        return KERNELS_UNKNOWN
    return KERNELS_NO


def _size(entry: Entry) -> int:
    return entry.uncompressed_size


def _entry_kernels(mm: mmap.mmap, entry: Entry, decoders: Decoders) -> str:
    start = entry.offset + entry.header_size
    if entry.compression == "none":
        end = start + entry.payload_size
        if entry.is_ptx:
            return KERNELS_YES if mm.find(_PTX_ENTRY, start, end) >= 0 else KERNELS_NO
        if mm.find(_TEXT_NAME, start, min(end, start + _KERNEL_PREFIX)) >= 0:
            return KERNELS_YES
        return _cubin_kernels(mm[start:end], whole=True)
    if not decoders.can(entry.compression):
        return KERNELS_UNKNOWN  # no decoder (inside an image): nothing to decode, nothing to remember
    packed = entry.packed_size
    if packed > _REMEMBER_PACKED:
        return _compressed_kernels(mm, entry, decoders)
    # Small payloads repeat (cuBLASLt and cuDNN: ~7k identical kernel-less
    # cubins): the same bytes of the same kind and size give the same answer.
    key = (entry.kind_code, entry.uncompressed_size, mm[start : start + packed])
    answer = decoders.answers.get(key)
    if answer is None:
        answer = _compressed_kernels(mm, entry, decoders)
        if decoders.remembered + packed <= _REMEMBER_BYTES:
            decoders.answers[key] = answer
            decoders.remembered += packed
    return answer


# Remembered answers: payloads up to this size, up to this many bytes a file.
_REMEMBER_PACKED = 4096
_REMEMBER_BYTES = 8 << 20


def _compressed_kernels(mm: mmap.mmap, entry: Entry, decoders: Decoders) -> str:
    if entry.compression == "lz4" and entry.uncompressed_size > _EARLY_PREFIX:
        # LZ4 costs what it outputs, and a kernel's name comes early: in all
        # 11k of cuFFT's PTX and cubins within 938 bytes (99% within 306).
        early = decoders.decode(mm, entry, _EARLY_PREFIX)
        if early is not None and (early.find(_PTX_ENTRY if entry.is_ptx else _TEXT_NAME) >= 0):
            return KERNELS_YES
    head = decoders.decode(mm, entry, _KERNEL_PREFIX)
    if head is None:
        return KERNELS_UNKNOWN
    if entry.is_ptx:
        if _PTX_ENTRY in head:
            return KERNELS_YES
        whole = head if len(head) == entry.uncompressed_size else decoders.decode(mm, entry, entry.uncompressed_size)
        if whole is None:
            return KERNELS_UNKNOWN
        return KERNELS_YES if _PTX_ENTRY in whole else KERNELS_NO
    if head.find(_TEXT_NAME, 0, _KERNEL_PREFIX) >= 0:
        return KERNELS_YES
    return _cubin_by_names(mm, entry, decoders, head)


def _cubin_by_names(mm: mmap.mmap, entry: Entry, decoders: Decoders, data: bytes) -> str:
    """Decode as far as the section headers and the section-name table reach
    (read from the ELF header, then from the name table's own header), not the
    whole cubin: cuBLASLt's 3.4 MB cubins keep both in their first 100 KB."""
    size = entry.uncompressed_size
    for _ in range(3):  # the header table's extent, then the name table's
        if len(data) >= size:
            return _cubin_kernels(data, whole=True)
        need = _names_extent(data)
        if need is None or need > size:
            need = size
        if need <= len(data):
            return _cubin_kernels(data, whole=False)
        data = decoders.decode(mm, entry, need)
        if data is None:
            return KERNELS_UNKNOWN
    return KERNELS_UNKNOWN


def _names_extent(data: bytes) -> Optional[int]:
    """How many bytes hold the section header table and, once its header is
    in `data`, the section-name table; None when the ELF header cannot tell."""
    try:
        elf = ElfHeader.parse(data)
    except (FormatError, struct.error):
        return None
    if not elf.is64 or elf.shoff == 0 or elf.shnum == 0 or elf.shentsize < 64:
        return None
    need = elf.shoff + elf.shnum * elf.shentsize
    names_header = elf.shoff + elf.shstrndx * elf.shentsize
    if elf.shstrndx < elf.shnum and names_header + 64 <= len(data):
        _name, _type, _flags, _addr, offset, length = _SECTION_HEADER.unpack_from(data, names_header)
        need = max(need, offset + length)
    return need


_SECTION_HEADER = struct.Struct("<IIQQQQ")  # name, type, flags, address, offset, size of an ELF64 section


def _cubin_kernels(data: bytes, whole: bool) -> str:
    """From a cubin's section names: a kernel is a `.text.<name>` section.
    `data` is the whole cubin, or a prefix holding its section headers and
    name table. A cubin whose table or names cannot be read is unknown."""
    try:
        elf = ElfHeader.parse(data)
        if elf.machine != EM_CUDA or not elf.is64 or elf.shoff == 0 or elf.shnum == 0 or elf.shentsize < 64:
            return KERNELS_UNKNOWN
        count, stride = elf.shnum, elf.shentsize
        if elf.shoff + count * stride > len(data) or elf.shstrndx >= count:
            return KERNELS_UNKNOWN
        if whole and b".text." not in data:
            return KERNELS_NO  # no section can bear such a name: the table is sound, that is enough
        _name, _type, _flags, _addr, names, length = _SECTION_HEADER.unpack_from(data, elf.shoff + elf.shstrndx * stride)
        if names + length > len(data):
            return KERNELS_UNKNOWN
        for i in range(count):
            name = _NAME_OFFSET.unpack_from(data, elf.shoff + i * stride)[0]
            if name + len(_TEXT) <= length and data.startswith(_TEXT, names + name):
                return KERNELS_YES
    except (FormatError, struct.error):
        return KERNELS_UNKNOWN
    return KERNELS_NO


_NAME_OFFSET = struct.Struct("<I")


_TEXT = b".text."
