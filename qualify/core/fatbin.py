"""Which GPU code a binary carries, read from headers only.

Reads ELF shared objects (any ELF file), standalone cubins and standalone
fatbins. Nothing large is copied: the file is mmapped and container headers,
entry headers and (for uncompressed cubins) the ELF header of the payload
are read. Whether a container holds a kernel is decided in kernels.py (just
enough decompression; `unknown` without a decoder), the ELF structure is read
in elf.py, and the types given back are in fatbin_model.py. Every size taken
from the file is checked against the bytes really there before it is used,
and every loop advances by at least one header, so a truncated, bit-flipped
or hostile file gives error strings in `FileScan.errors`, never an exception
and never a hang.

Fatbin layout (ARCHITECTURE.md, "The fatbinary format"; verified with nvcc 13.0):
container header (16 bytes): u32 magic 0xBA55ED50, u16 version 1, u16 header
size 0x10, u64 size of the entries that follow. Entry header: u16 kind at
0x00, u32 header size at 0x04, u64 payload size at 0x08, u32 compressed size
at 0x10, u32 arch number at 0x1C, u64 flags at 0x28, u64 uncompressed size at
0x38. The next entry starts at entry start + header size + payload size.

Where containers live in an ELF file:
- `.nv_fatbin`: the containers registered with the CUDA runtime, back to
  back. This is all that `cuobjdump` lists.
- `__nv_relfatbin`: relocatable device code kept for later device linking;
  not loaded at run time.
- anywhere else (cuFFT's `.ldata`, cuBLASLt's `.cask_resource`, CUPTI's
  `.rodata`): databases the library loads itself; found by scanning
  allocated, non-executable data sections for the 8-byte container prefix.

The ELF section table is read with `struct` rather than pyelftools: it is
thirty lines, every bound is checked here, and importing pyelftools alone
takes ~33 ms. Measured with `nox -s bench-inventory` (2026-11-30, 2-core
build host under load 5, torch 2.14.1's 22 CUDA libraries, median of 3):
own reader 1.50 s wall / 0.89 s CPU, pyelftools (QUALIFY_ELF_READER=
pyelftools, same JSON output) 1.40 s wall / 0.93 s CPU: within the noise
on wall time, ~5% on CPU time, so the difference is not large. The switch to
pyelftools as the default is held back only because neither reaches the
>= 100x-over-cuobjdump condition for the full census yet (89x and 96x wall;
see issue 15); once the census does, pyelftools should become the default.

Pages of the mapping count in the resident set once touched, so they are
given back (MADV_DONTNEED) as the walk moves on: peak memory stays near
60 MB on 500 MB libraries instead of growing with the sections searched.

Standard library only and Python 3.9 compatible: this module runs inside
images with their own python3.
"""

from __future__ import annotations

import mmap
import os
import re
import stat
import struct
from typing import Optional, Tuple

from qualify.core.arch import ArchError, CodeTarget, Variant
from qualify.core.elf import (
    ELF_MAGIC,
    ELF_READER,  # noqa: F401  (QUALIFY_ELF_READER, read where the census runs)
    EM_CUDA,
    SECTION_READERS,
    SHF_ALLOC,
    SHF_EXECINSTR,
    SHT_NOBITS,
    SHT_PROGBITS,
    ElfHeader,
    FormatError,
    Section,
    section_table,
    segments,
)
from qualify.core.fatbin_model import (
    ARCH_NUMBER_RANGE,
    CODE_TOP_BYTE,
    CONTAINER_HEADER,
    CONTAINER_PREFIX,
    ENTRY_MAX_HEADER,
    ENTRY_MIN_HEADER,
    FLAG_ARCH,
    FLAG_FAMILY,
    FLAG_LZ4,
    FLAG_ZSTD,
    KIND_CUBIN,
    KIND_PTX,
    MAGIC_BYTES,
    MAX_CONTAINERS,
    MAX_ENTRIES,
    MAX_ERRORS,
    SECTION_REGISTERED,
    STUB_NO,
    STUB_TOP_BYTE,
    STUB_UNKNOWN,
    STUB_YES,
    Container,
    Entry,
    FileScan,
)
from qualify.core.kernels import KERNELS_UNKNOWN, Decoders, container_kernels

# Allocated data sections whose format is fixed by the toolchain (unwind
# tables, GOT, TLS images): never a fatbin, and .eh_frame alone is MBs.
_STRUCTURED_SECTIONS = frozenset({".eh_frame", ".eh_frame_hdr", ".gcc_except_table", ".got", ".got.plt", ".tdata", ".interp"})
_ZERO_CHUNK = 1 << 20
_NOTE_LIMIT = 1 << 16
_STUB_BY_TOP_BYTE = {STUB_TOP_BYTE: STUB_YES, CODE_TOP_BYTE: STUB_NO}


class _LimitReached(Exception):
    """Internal: a file holds more than any real library does; stop reading it."""



# --- public entry points -----------------------------------------------------


def _open_regular(path: str) -> int:
    """A read-only descriptor, refusing anything but a regular file. O_NONBLOCK:
    opening a FIFO for reading would otherwise wait for a writer forever."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(f"{path}: not a regular file")
    return fd



def sniff(path: str) -> Optional[str]:
    """'elf' or 'fatbin' from the first four bytes; None for anything else."""
    try:
        return sniff_strict(path)
    except OSError:
        return None



def sniff_strict(path: str) -> Optional[str]:
    """As sniff, but a file that cannot be opened or read raises OSError."""
    fd = _open_regular(path)
    try:
        head = os.read(fd, 4)
    finally:
        os.close(fd)
    if head == ELF_MAGIC:
        return "elf"
    if head == MAGIC_BYTES:
        return "fatbin"
    return None



def read_file(path: str, embedded: bool = True, decompress: bool = True) -> FileScan:
    """Read every fatbin container (or the cubin) in `path`. Never raises on bad
    input: problems are recorded in the result's `errors`.

    embedded=False reads `.nv_fatbin` only (what the CUDA runtime registers and
    cuobjdump lists), skipping the search of data sections that takes most of
    the time on large libraries. decompress=False never decompresses (as in an
    image without zstandard and lz4): compressed containers' kernels are
    then `unknown`."""
    scan = FileScan(path=str(path), format="unknown", size=0)
    try:
        fd = _open_regular(path)
    except OSError as exc:
        scan.unreadable = exc.errno is not None  # not merely "not a regular file"
        scan.errors.append(f"cannot read: {exc}")
        return scan
    try:
        try:
            scan.size = os.fstat(fd).st_size
            if scan.size == 0:
                scan.errors.append("empty file")
                return scan
            with mmap.mmap(fd, 0, access=mmap.ACCESS_READ) as mm:
                try:
                    _read_mapped(mm, scan, embedded, Decoders(decompress))
                except _LimitReached as exc:
                    scan.errors.append(str(exc))
        finally:
            os.close(fd)
    except (OSError, ValueError) as exc:
        scan.errors.append(f"cannot read: {exc}")
    except Exception as exc:  # a bug here must not kill the census: record it
        scan.errors.append(f"internal error while reading ({type(exc).__name__}: {exc})")
    return scan



def _read_mapped(mm: mmap.mmap, scan: FileScan, embedded: bool, decoders: Decoders) -> None:
    head = mm[:4]
    if head == MAGIC_BYTES:
        scan.format = "fatbin"
        _ContainerReader(mm, scan, decoders).walk_registered(0, len(mm), "")
    elif head == ELF_MAGIC:
        try:
            elf = ElfHeader.parse(mm)
        except FormatError as exc:
            scan.format = "elf"
            scan.errors.append(f"bad ELF header: {exc}")
            return
        if elf.machine == EM_CUDA:
            scan.format = "cubin"
            _read_cubin(mm, elf, scan, decoders)
        else:
            scan.format = "elf"
            _read_elf(mm, elf, scan, embedded, decoders)
    else:
        scan.errors.append("neither an ELF file nor a fatbin (unknown magic)")



def _read_elf(mm: mmap.mmap, elf: ElfHeader, scan: FileScan, embedded: bool, decoders: Decoders) -> None:
    reader = _ContainerReader(mm, scan, decoders)
    try:
        sections = SECTION_READERS.get(ELF_READER, section_table)(mm, elf)
    except (FormatError, struct.error, IndexError) as exc:
        scan.errors.append(f"bad ELF section table: {exc}")
        return
    if not sections:
        # `llvm-objcopy --strip-sections` leaves a library that still loads:
        # the loader needs only the program headers, so search those.
        _read_segments(mm, elf, reader)
        return
    covered = 0  # sections must not overlap: bounds the total work by the file size
    for sec in sorted(sections, key=lambda s: (s.offset, s.size)):
        if not _may_hold_fatbins(sec) or (not embedded and sec.name != SECTION_REGISTERED):
            continue
        if sec.end > len(mm):
            reader.error(f"section {sec.name} ({sec.offset:#x}+{sec.size:#x}) extends past the end of the file ({len(mm):#x})")
            continue
        start = max(sec.offset, covered)
        if start >= sec.end:
            reader.error(f"section {sec.name} at {sec.offset:#x} lies inside another section")
            continue
        covered = sec.end
        if sec.name == SECTION_REGISTERED:
            reader.walk_registered(start, sec.end, sec.name)
        else:
            reader.scan_embedded(start, sec.end, sec.name)



def _read_segments(mm: mmap.mmap, elf: ElfHeader, reader: _ContainerReader) -> None:
    """Containers in the loadable data segments. Which of them are registered
    (`.nv_fatbin`) cannot be told without section names, so each is judged on
    its own, as registered containers are: the stricter of the two rules."""
    try:
        found = segments(mm, elf)
    except (FormatError, struct.error) as exc:
        reader.error(f"bad ELF program headers: {exc}")
        return
    covered = 0
    for seg in sorted(found, key=lambda s: (s.offset, s.size)):
        if seg.end > len(mm):
            reader.error(f"segment at {seg.offset:#x}+{seg.size:#x} extends past the end of the file ({len(mm):#x})")
            continue
        start = max(seg.offset, covered)
        if start < seg.end:
            covered = seg.end
            reader.scan_embedded(start, seg.end, seg.name)



def _may_hold_fatbins(sec: Section) -> bool:
    if sec.size == 0 or sec.type == SHT_NOBITS:
        return False
    if sec.name == SECTION_REGISTERED:
        return True
    if sec.name in _STRUCTURED_SECTIONS:
        return False
    return sec.type == SHT_PROGBITS and bool(sec.flags & SHF_ALLOC) and not sec.flags & SHF_EXECINSTR



def _read_cubin(mm: mmap.mmap, elf: ElfHeader, scan: FileScan, decoders: Decoders) -> None:
    number = _cubin_sm(elf)
    if not ARCH_NUMBER_RANGE[0] <= number <= ARCH_NUMBER_RANGE[1]:
        scan.errors.append(f"cubin e_flags {elf.flags:#x} name no plausible SM ({number})")
        return
    errors_before = len(scan.errors)
    variant, known = _cubin_variant(mm, elf, scan)
    entry = Entry(
        offset=0,
        kind_code=KIND_CUBIN,
        arch_number=number,
        variant=variant,
        flags=0,
        compression="none",
        header_size=0,
        payload_size=len(mm),
        compressed_size=0,
        uncompressed_size=len(mm),
        link_stub=_stub_status(elf),
        variant_known=known,
    )
    # A damaged section table hides the a/f note: the container says so, and
    # the census then judges the variant as unknown rather than plain.
    error = scan.errors[-1] if len(scan.errors) > errors_before else None
    container = Container(offset=0, size=len(mm), section="", entries=[entry], error=error, kernels=KERNELS_UNKNOWN)
    container.kernels = container_kernels(mm, container, decoders)
    scan.containers.append(container)



def _cubin_sm(elf: ElfHeader) -> int:
    # ABI version 8 (CUDA 12.8+) keeps the SM in bits 8-15; older cubins in bits 0-7.
    return (elf.flags >> 8) & 0xFF if elf.abi_version >= 8 else elf.flags & 0xFF



def _stub_status(elf: ElfHeader) -> str:
    return _stub_from_flags(elf.abi_version, elf.flags)



def _stub_from_flags(abi_version: int, e_flags: int) -> str:
    if abi_version < 8:  # older cubins keep other bits there
        return STUB_UNKNOWN
    return _STUB_BY_TOP_BYTE.get(e_flags >> 24, STUB_UNKNOWN)



def _cubin_variant(mm: mmap.mmap, elf: ElfHeader, scan: FileScan) -> Tuple[Variant, bool]:
    """The a/f suffix is not in e_flags; ptxas records `-arch sm_XYa` in the
    `.note.nv.tkinfo` note, which is what cuobjdump reads too."""
    try:
        sections = section_table(mm, elf)
    except (FormatError, struct.error, IndexError) as exc:
        scan.errors.append(f"bad ELF section table: {exc}")
        return Variant.PLAIN, False
    for sec in sections:
        if sec.name != ".note.nv.tkinfo" or sec.end > len(mm):
            continue
        note = mm[sec.offset : sec.offset + min(sec.size, _NOTE_LIMIT)]
        match = re.search(rb"-arch\s+([A-Za-z0-9_]+)", note)
        if match:
            try:
                return CodeTarget.parse(match.group(1).decode("ascii")).variant, True
            except ArchError:
                pass
    return Variant.PLAIN, False

_NEAR = 64  # containers in a database are back to back or a little padding apart

_ENTRY_HEADER = struct.Struct("<HxxIQI8xI8xQ8xQ")  # the 0x40 bytes every entry header has

_RELEASE_EVERY = 16 << 20

_CUBIN_IDENT = ELF_MAGIC + bytes([2, 1])  # ELF64, little-endian

_CUBIN_FIELDS = struct.Struct("<18xH28xI")  # e_machine at 18, e_flags at 48

_FIRST_WINDOW = 64 << 10

_SCAN_WINDOW = 16 << 20  # one search touches at most this much before pages are given back



class _ContainerReader:
    """Walks containers in one mapped file, giving back mapped pages as it goes:
    pages of a file mapping count in the resident set, and a census touches
    hundreds of MB of them in one library (cuBLASLt, cuFFT)."""

    def __init__(self, mm: mmap.mmap, scan: FileScan, decoders: Optional[Decoders] = None) -> None:
        self.mm = mm
        self.scan = scan
        self.decoders = decoders if decoders is not None else Decoders(False)
        self.released = 0
        self.entries_left = MAX_ENTRIES

    def release_below(self, pos: int) -> None:
        if pos - self.released < _RELEASE_EVERY or not hasattr(self.mm, "madvise"):
            return
        start = self.released - self.released % mmap.PAGESIZE
        end = pos - pos % mmap.PAGESIZE
        if end > start:
            self.mm.madvise(mmap.MADV_DONTNEED, start, end - start)
        self.released = pos

    def next_match(self, needle: bytes, pos: int, end: int) -> int:
        """Where `needle` next starts in [pos, end), or `end`.

        Looked for just ahead first (containers in a database sit back to back),
        then window by window, growing windows up to _SCAN_WINDOW and giving
        pages back in between (one search over a 100 MB section would map all
        of it at once). Each window is searched backwards: CPython's reverse
        search anchors on the needle's first byte (0x50) rather than its last
        (0x00, everywhere in binaries) and runs ~1.5x faster than `re` and ~2x
        faster than a forward find here.
        """
        mm = self.mm
        near = mm[pos : min(end, pos + _NEAR)].find(needle)
        if near >= 0:
            return pos + near
        size = min(_FIRST_WINDOW, _SCAN_WINDOW)
        while pos < end:
            window_end = min(end, pos + size)
            # A match may start anywhere before window_end, so search a needle further.
            hi = min(end, window_end + len(needle) - 1)
            first = -1
            while True:
                found = mm.rfind(needle, pos, hi)
                if found < 0:
                    break
                first, hi = found, found + len(needle) - 1
            if first >= 0:
                return first
            pos = window_end
            self.release_below(pos)
            size = min(size * 2, _SCAN_WINDOW)
        return end

    def add(self, container: Container) -> None:
        self.scan.containers.append(container)
        self.entries_left -= len(container.entries)
        if container.error:
            self.error(container.error)
        if len(self.scan.containers) >= MAX_CONTAINERS:
            raise _LimitReached(f"stopped after {MAX_CONTAINERS} containers: more than any real library holds")

    def error(self, message: str) -> None:
        if len(self.scan.errors) >= MAX_ERRORS:
            raise _LimitReached(f"stopped after {MAX_ERRORS} errors: the file is badly damaged")
        self.scan.errors.append(message)

    def walk_registered(self, start: int, end: int, section: str) -> None:
        """Containers back to back (zero padding allowed between them). Anything
        else in between is reported, then the walk resynchronises on the next
        container magic."""
        mm, pos = self.mm, start
        while pos < end:
            self.release_below(pos)
            if mm[pos : pos + 4] == MAGIC_BYTES:
                container, next_pos = _parse_container(mm, pos, end, section, self.entries_left, self.decoders)
                self.add(container)
                pos = next_pos if next_pos is not None else self.next_match(MAGIC_BYTES, pos + 4, end)
                continue
            found = self.next_match(MAGIC_BYTES, pos, end)
            if not _all_zero(mm, pos, found):
                where = f"section {section} " if section else ""
                self.error(f"{where}offset {pos:#x}: {found - pos} bytes that are not a fatbin container")
            pos = found

    def scan_embedded(self, start: int, end: int, section: str) -> None:
        """Containers found by their 8-byte prefix in a data section. A prefix
        whose container does not hold up is reported: the prefix is too
        specific to occur by chance, so it is a damaged container."""
        mm, pos = self.mm, start
        while pos < end:
            self.release_below(pos)
            pos = self.next_match(CONTAINER_PREFIX, pos, end)
            if pos >= end:
                return
            container, next_pos = _parse_container(mm, pos, end, section, self.entries_left, self.decoders)
            self.add(container)
            pos = next_pos if next_pos is not None else pos + len(CONTAINER_PREFIX)



def _parse_container(
    mm: mmap.mmap, pos: int, limit: int, section: str, max_entries: int = MAX_ENTRIES, decoders: Optional[Decoders] = None
) -> Tuple[Container, Optional[int]]:
    """The container at `pos`, and where the next one may start (None when the
    header itself cannot be trusted)."""
    container = Container(offset=pos, size=0, section=section, entries=[], error=None, kernels=KERNELS_UNKNOWN)
    if limit - pos < CONTAINER_HEADER.size:
        container.error = f"{_where(section, pos)}: header truncated ({limit - pos} bytes left)"
        return container, None
    _magic, version, header_size, body = CONTAINER_HEADER.unpack_from(mm, pos)
    container.size = header_size + body
    problem = None
    if version != 1:
        problem = f"unsupported version {version}"
    elif header_size != CONTAINER_HEADER.size:
        problem = f"header size {header_size:#x} (expected 0x10)"
    elif body > limit - pos - header_size:
        problem = f"declares {body:#x} bytes but only {limit - pos - header_size:#x} remain"
    if problem:
        container.error = f"{_where(section, pos)}: {problem}"
        return container, None
    body_end = pos + header_size + body
    try:
        _parse_entries(mm, pos + header_size, body_end, container, max_entries)
    except FormatError as exc:
        container.error = f"{_where(section, pos)}: {exc}"
    if not container.relocatable:  # never loaded, never judged: not worth decompressing
        container.kernels = container_kernels(mm, container, decoders or Decoders(False))
    return container, body_end



def _where(section: str, pos: int) -> str:
    return f"{section} container at {pos:#x}" if section else f"container at {pos:#x}"



def _parse_entries(mm: mmap.mmap, pos: int, end: int, container: Container, max_entries: int) -> None:
    while pos < end:
        if len(container.entries) >= max_entries:
            raise _LimitReached(f"stopped after {MAX_ENTRIES} entries: more than any real library holds")
        left = end - pos
        if left < ENTRY_MIN_HEADER:
            if not _all_zero(mm, pos, end):
                raise FormatError(f"{left} trailing bytes at {pos:#x} are not an entry")
            return
        entry = _parse_entry(mm, pos, left)
        container.entries.append(entry)
        pos += entry.header_size + entry.payload_size



def _parse_entry(mm: mmap.mmap, pos: int, left: int) -> Entry:
    kind, header_size, payload_size, compressed_size, arch_number, flags, uncompressed_size = _ENTRY_HEADER.unpack_from(mm, pos)
    if header_size < ENTRY_MIN_HEADER or header_size > ENTRY_MAX_HEADER or header_size > left:
        raise FormatError(f"entry at {pos:#x}: header size {header_size:#x} is invalid")
    if payload_size > left - header_size:
        raise FormatError(
            f"entry at {pos:#x}: payload size {payload_size:#x} runs past the container ({left - header_size:#x} bytes left)"
        )
    if not ARCH_NUMBER_RANGE[0] <= arch_number <= ARCH_NUMBER_RANGE[1]:
        raise FormatError(f"entry at {pos:#x}: arch number {arch_number} is implausible")
    if flags & FLAG_ARCH and flags & FLAG_FAMILY:
        raise FormatError(f"entry at {pos:#x}: flags {flags:#x} mark it both `a` and `f`")
    compression = _compression(flags, compressed_size)
    link_stub = STUB_NO if kind == KIND_PTX else STUB_UNKNOWN
    if kind == KIND_CUBIN and compression == "none":
        link_stub = _payload_stub_status(mm, pos + header_size, payload_size)
    variant = Variant.ARCH if flags & FLAG_ARCH else Variant.FAMILY if flags & FLAG_FAMILY else Variant.PLAIN
    return Entry(
        pos,
        kind,
        arch_number,
        variant,
        flags,
        compression,
        header_size,
        payload_size,
        compressed_size,
        uncompressed_size,
        link_stub,
        True,
    )



def _compression(flags: int, compressed_size: int) -> str:
    if flags & FLAG_ZSTD:
        return "zstd"
    if flags & FLAG_LZ4:
        return "lz4"
    return "unknown" if compressed_size else "none"



def _payload_stub_status(mm: mmap.mmap, start: int, size: int) -> str:
    """From the ELF64 header of an uncompressed cubin payload (read directly:
    this runs for tens of thousands of entries)."""
    if size < 64 or mm[start : start + 6] != _CUBIN_IDENT:
        return STUB_UNKNOWN
    machine, e_flags = _CUBIN_FIELDS.unpack_from(mm, start)
    if machine != EM_CUDA:
        return STUB_UNKNOWN
    return _stub_from_flags(mm[start + 8], e_flags)



def _all_zero(mm: mmap.mmap, start: int, end: int) -> bool:
    """True when mm[start:end] is all zero bytes, read in bounded chunks."""
    pos = start
    while pos < end:
        chunk = mm[pos : min(end, pos + _ZERO_CHUNK)]
        if chunk.count(0) != len(chunk):
            return False
        pos += len(chunk)
    return True
