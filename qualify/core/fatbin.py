"""Which GPU code a binary carries, read from headers only.

Reads ELF shared objects (any ELF file), standalone cubins and standalone
fatbins. Nothing large is copied: the file is mmapped and container headers,
entry headers and (for uncompressed cubins) the ELF header of the payload
are read. Whether a container holds a kernel is decided in kernels.py (just
enough decompression; `unknown` without a decoder), the ELF structure is read
in elf.py, static archives are counted in arfile.py, and the types given back
are in fatbin_model.py. Every size taken from the file is checked against the
bytes really there before it is used,
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
takes ~33 ms. Measured with `nox -s bench-inventory` (2026-11-30, same JSON
output either way): on the 16-core GPU host's 31 CUDA libraries the full
census takes 0.354 s with this reader and 0.555 s with pyelftools
(QUALIFY_ELF_READER=pyelftools; 0.404 s and 0.617 s in a second run), which
would miss the >= 100x-over-cuobjdump target (70-80x); on the 2-core build
host 0.432 s against 0.478 s. So this
reader stays the default (ARCHITECTURE.md, "Where we wrote our own code").

A file's reading is an ordered list of walks (`elf_walks`): each walks one
section's containers, and a walk can be bounded to the containers that start
in a byte range, so that core/parts.py can read one large file in several
processes and join the parts into exactly this reader's result.

Pages of the mapping count in the resident set once touched, so they are
given back (MADV_DONTNEED) as the walk moves on: peak memory stays near
60 MB on 500 MB libraries instead of growing with the sections searched.

Standard library only and Python 3.9 compatible: this module runs inside
images with their own python3.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import stat
import struct

from qualify.core import arfile, cubin, ptxisa
from qualify.core.arch import Variant
from qualify.core.elf import (
    ELF_MAGIC,
    EM_CUDA,
    SHF_ALLOC,
    SHF_EXECINSTR,
    SHT_NOBITS,
    SHT_PROGBITS,
    ElfHeader,
    FormatError,
    Section,
    section_reader,
    segments,
)
from qualify.core.errors import internal_error
from qualify.core.fatbin_model import (
    AR_MAGIC,
    ARCH_NUMBER_RANGE,
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
    SECTION_RELOCATABLE,
    STUB_NO,
    STUB_UNKNOWN,
    WALK_EMBEDDED,
    WALK_ERROR,
    WALK_REGISTERED,
    Container,
    Entry,
    FileScan,
    Walk,
    WalkEdge,
)
from qualify.core.kernels import KERNELS_UNKNOWN, Decoders, container_kernels
from qualify.core.search import Finder

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: typing is not imported at run time (the census's start-up)
    from typing import Iterator, List, Optional, Tuple

# Allocated data sections whose format is fixed by the toolchain (unwind
# tables, GOT, TLS images): never a fatbin, and .eh_frame alone is MBs.
_STRUCTURED_SECTIONS = frozenset({".eh_frame", ".eh_frame_hdr", ".gcc_except_table", ".got", ".got.plt", ".tdata", ".interp"})
_ZERO_CHUNK = 1 << 20


class LimitReached(Exception):
    """Internal: a file holds more than any real library does; stop reading it."""


# --- public entry points -----------------------------------------------------


def open_regular(path: str) -> int:
    """A read-only descriptor, refusing anything but a regular file. O_NONBLOCK:
    opening a FIFO for reading would otherwise wait for a writer forever."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(f"{path}: not a regular file")
    return fd


@contextlib.contextmanager
def mapped(path: str) -> Iterator[mmap.mmap]:
    """The regular file at `path`, mapped read-only. OSError when it cannot
    be opened, ValueError when it is empty."""
    fd = open_regular(path)
    try:
        with mmap.mmap(fd, 0, access=mmap.ACCESS_READ) as mm:
            yield mm
    finally:
        os.close(fd)


def sniff(path: str) -> Optional[str]:
    """'elf', 'fatbin' or 'archive' from the first bytes; None for anything else."""
    try:
        return sniff_strict(path)
    except OSError:
        return None


def sniff_strict(path: str) -> Optional[str]:
    """As sniff, but a file that cannot be opened or read raises OSError."""
    fd = open_regular(path)
    try:
        head = os.read(fd, len(AR_MAGIC))
    finally:
        os.close(fd)
    if head[:4] == ELF_MAGIC:
        return "elf"
    if head[:4] == MAGIC_BYTES:
        return "fatbin"
    if head == AR_MAGIC:
        return "archive"
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
        fd = open_regular(path)
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
                except LimitReached as exc:
                    scan.errors.append(str(exc))
        finally:
            os.close(fd)
    except (OSError, ValueError) as exc:
        scan.errors.append(f"cannot read: {exc}")
    except Exception as exc:  # a bug here must not kill the census: record it
        scan.errors.append(internal_error(exc))
    return scan


def _read_mapped(mm: mmap.mmap, scan: FileScan, embedded: bool, decoders: Decoders) -> None:
    head = mm[:4]
    if head == MAGIC_BYTES:
        scan.format = "fatbin"
        ContainerReader(mm, scan, decoders).run(Walk(WALK_REGISTERED, "", 0, len(mm)))
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
    elif mm[:len(AR_MAGIC)] == AR_MAGIC:
        scan.format = "archive"
        scan.archive, errors = arfile.count_members(mm)
        scan.errors.extend(errors)
    else:
        scan.errors.append("neither an ELF file, a fatbin nor a static archive (unknown magic)")


def _read_elf(mm: mmap.mmap, elf: ElfHeader, scan: FileScan, embedded: bool, decoders: Decoders) -> None:
    reader = ContainerReader(mm, scan, decoders)
    for walk in elf_walks(mm, elf, embedded):
        reader.run(walk)


def elf_walks(mm: mmap.mmap, elf: ElfHeader, embedded: bool) -> List[Walk]:
    """The steps that read an ELF file's containers, in file order."""
    try:
        sections = section_reader()(mm, elf)
    except (FormatError, struct.error, IndexError) as exc:
        return [_error(f"bad ELF section table: {exc}")]
    if not sections:
        # `llvm-objcopy --strip-sections` leaves a library that still loads:
        # the loader needs only the program headers, so search those.
        return _segment_walks(mm, elf)
    walks = []
    covered = 0  # sections must not overlap: bounds the total work by the file size
    for sec in sorted(sections, key=lambda s: (s.offset, s.size)):
        if not _may_hold_fatbins(sec) or (not embedded and sec.name != SECTION_REGISTERED):
            continue
        if sec.end > len(mm):
            where = f"section {sec.name} ({sec.offset:#x}+{sec.size:#x})"
            walks.append(_error(f"{where} extends past the end of the file ({len(mm):#x})"))
            continue
        start = max(sec.offset, covered)
        if start >= sec.end:
            walks.append(_error(f"section {sec.name} at {sec.offset:#x} lies inside another section"))
            continue
        covered = sec.end
        kind = WALK_REGISTERED if sec.name == SECTION_REGISTERED else WALK_EMBEDDED
        walks.append(Walk(kind, sec.name, start, sec.end))
    return walks


def _error(message: str) -> Walk:
    return Walk(WALK_ERROR, "", 0, 0, message=message)


def _segment_walks(mm: mmap.mmap, elf: ElfHeader) -> List[Walk]:
    """Containers in the loadable data segments. Which of them are registered
    (`.nv_fatbin`) cannot be told without section names, so each is judged on
    its own, as registered containers are: the stricter of the two rules."""
    try:
        found = segments(mm, elf)
    except (FormatError, struct.error) as exc:
        return [_error(f"bad ELF program headers: {exc}")]
    walks = []
    covered = 0
    for seg in sorted(found, key=lambda s: (s.offset, s.size)):
        if seg.end > len(mm):
            walks.append(_error(f"segment at {seg.offset:#x}+{seg.size:#x} extends past the end of the file ({len(mm):#x})"))
            continue
        start = max(seg.offset, covered)
        if start < seg.end:
            covered = seg.end
            walks.append(Walk(WALK_EMBEDDED, seg.name, start, seg.end))
    return walks


def _may_hold_fatbins(sec: Section) -> bool:
    if sec.size == 0 or sec.type == SHT_NOBITS:
        return False
    if sec.name == SECTION_REGISTERED:
        return True
    if sec.name in _STRUCTURED_SECTIONS:
        return False
    return sec.type == SHT_PROGBITS and bool(sec.flags & SHF_ALLOC) and not sec.flags & SHF_EXECINSTR


def _read_cubin(mm: mmap.mmap, elf: ElfHeader, scan: FileScan, decoders: Decoders) -> None:
    number = cubin.sm_of(elf)
    if not ARCH_NUMBER_RANGE[0] <= number <= ARCH_NUMBER_RANGE[1]:
        scan.errors.append(f"cubin e_flags {elf.flags:#x} name no plausible SM ({number})")
        return
    errors_before = len(scan.errors)
    variant, known = cubin.variant_of(mm, elf, scan)
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
        link_stub=cubin.stub_status(elf.abi_version, elf.flags),
        variant_known=known,
        ptx_isa=None,
    )
    # A damaged section table hides the a/f note: the container says so, and
    # the census then judges the variant as unknown rather than plain.
    error = scan.errors[-1] if len(scan.errors) > errors_before else None
    container = Container(offset=0, size=len(mm), section="", entries=[entry], error=error, kernels=KERNELS_UNKNOWN)
    container.kernels = container_kernels(mm, container, decoders)
    scan.containers.append(container)


_NEAR = 64  # containers in a database are back to back or a little padding apart

_ENTRY_HEADER = struct.Struct("<HxxIQI8xI8xQ8xQ")  # the 0x40 bytes every entry header has

_RELEASE_EVERY = 16 << 20

_FIRST_WINDOW = 64 << 10

_SCAN_WINDOW = 16 << 20  # one search touches at most this much before pages are given back


class ContainerReader:
    """Walks containers in one mapped file, giving back mapped pages as it goes:
    pages of a file mapping count in the resident set, and a census touches
    hundreds of MB of them in one library (cuBLASLt, cuFFT)."""

    def __init__(self, mm: mmap.mmap, scan: FileScan, decoders: Optional[Decoders] = None) -> None:
        self.mm = mm
        self.finder = Finder(mm)
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
        then window by window (core/search.py), growing windows up to
        _SCAN_WINDOW and giving pages back in between (one search over a
        100 MB section would map all of it at once).
        """
        near = self.mm[pos : min(end, pos + _NEAR)].find(needle)
        if near >= 0:
            return pos + near
        size = min(_FIRST_WINDOW, _SCAN_WINDOW)
        while pos < end:
            window_end = min(end, pos + size)
            # A match may start anywhere before window_end, so search a needle further.
            found = self.finder.first(needle, pos, min(end, window_end + len(needle) - 1))
            if found >= 0:
                return found
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
            raise LimitReached(f"stopped after {MAX_CONTAINERS} containers: more than any real library holds")

    def error(self, message: str) -> None:
        if len(self.scan.errors) >= MAX_ERRORS:
            raise LimitReached(f"stopped after {MAX_ERRORS} errors: the file is badly damaged")
        self.scan.errors.append(message)

    def run(self, walk: Walk) -> WalkEdge:
        if walk.kind == WALK_ERROR:
            self.error(walk.message)
            return WalkEdge(None, 0, False)
        if walk.kind == WALK_REGISTERED:
            return self.walk_registered(walk.start, walk.end, walk.section, walk.stop, walk.resync)
        return self.scan_embedded(walk.start, walk.end, walk.section, walk.stop)

    def walk_registered(
        self, start: int, end: int, section: str, stop: Optional[int] = None, resync: bool = False
    ) -> WalkEdge:
        """Containers back to back (zero padding allowed between them). Anything
        else in between is reported, then the walk resynchronises on the next
        container magic. With `stop`, only containers starting before it
        (searching at most a needle past it); with `resync`, the bytes before
        the first container are not this walk's to report."""
        mm, pos, first = self.mm, start, None
        bound = end if stop is None else min(end, stop)
        limit = end if stop is None else min(end, bound + len(MAGIC_BYTES) - 1)
        gap_check = not resync
        while pos < bound:
            self.release_below(pos)
            if gap_check and mm[pos : pos + 4] == MAGIC_BYTES:
                first = pos if first is None else first
                container, next_pos = _parse_container(mm, pos, end, section, self.entries_left, self.decoders)
                self.add(container)
                # A damaged header: its bytes are skipped, not reported as a gap.
                pos, gap_check = (next_pos, True) if next_pos is not None else (pos + 4, False)
                continue
            found = self.next_match(MAGIC_BYTES, pos, limit)
            if found >= bound:
                if stop is not None:
                    return WalkEdge(first, pos, gap_check)
                found = end  # as without a bound: the rest of the section is the gap
            if gap_check:
                message = gap_error(mm, section, pos, found)
                if message:
                    self.error(message)
            pos, gap_check = found, True
        return WalkEdge(first, pos, gap_check)

    def scan_embedded(self, start: int, end: int, section: str, stop: Optional[int] = None) -> WalkEdge:
        """Containers found by their 8-byte prefix in a data section. A prefix
        whose container does not hold up is reported: the prefix is too
        specific to occur by chance, so it is a damaged container. With
        `stop`, only containers starting before it."""
        mm, pos, decoders, first = self.mm, start, self.decoders, None
        bound = end if stop is None else min(end, stop)
        limit = end if stop is None else min(end, bound + len(CONTAINER_PREFIX) - 1)
        while pos < bound:
            if pos - self.released >= _RELEASE_EVERY:
                self.release_below(pos)
            # Databases hold containers back to back: look at `pos` before searching.
            if pos + 8 > end or mm[pos : pos + 8] != CONTAINER_PREFIX:
                found = self.next_match(CONTAINER_PREFIX, pos, limit)
                if found >= bound:
                    return WalkEdge(first, pos, False)
                pos = found
            first = pos if first is None else first
            container, next_pos = _parse_container(mm, pos, end, section, self.entries_left, decoders)
            self.add(container)
            pos = next_pos if next_pos is not None else pos + len(CONTAINER_PREFIX)
        return WalkEdge(first, pos, False)


def gap_error(mm: mmap.mmap, section: str, pos: int, found: int) -> Optional[str]:
    """The report for bytes between registered containers, unless they are zero padding."""
    if _all_zero(mm, pos, found):
        return None
    where = f"section {section} " if section else ""
    return f"{where}offset {pos:#x}: {found - pos} bytes that are not a fatbin container"


def _parse_container(
    mm: mmap.mmap, pos: int, limit: int, section: str, max_entries: int = MAX_ENTRIES, decoders: Optional[Decoders] = None
) -> Tuple[Container, Optional[int]]:
    """The container at `pos`, and where the next one may start (None when the
    header itself cannot be trusted)."""
    entries: List[Entry] = []
    container = Container(pos, 0, section, entries, None, KERNELS_UNKNOWN)
    if limit - pos < _HEADER_SIZE:
        container.error = f"{_where(section, pos)}: header truncated ({limit - pos} bytes left)"
        return container, None
    _magic, version, header_size, body = _CONTAINER_UNPACK(mm, pos)
    container.size = header_size + body
    problem = None
    if version != 1:
        problem = f"unsupported version {version}"
    elif header_size != _HEADER_SIZE:
        problem = f"header size {header_size:#x} (expected 0x10)"
    elif body > limit - pos - header_size:
        problem = f"declares {body:#x} bytes but only {limit - pos - header_size:#x} remain"
    if problem:
        container.error = f"{_where(section, pos)}: {problem}"
        return container, None
    body_end = pos + header_size + body
    ptx = False
    try:
        # The entries, parsed inline: this loop runs for every entry of every container (cuFFT: 24k), so
        # it makes one struct read per header (two for an uncompressed cubin, whose ELF header says
        # whether it is a device-link stub), one table look-up for variant and compression, one object.
        unpack, cubin_head, flag_info, stubs = _ENTRY_UNPACK, _CUBIN_UNPACK, _FLAG_INFO, _STUB_BY_TOP_BYTE
        at = pos + header_size
        while at < body_end:
            if len(entries) >= max_entries:
                raise LimitReached(f"stopped after {MAX_ENTRIES} entries: more than any real library holds")
            left = body_end - at
            if left < ENTRY_MIN_HEADER:
                if not _all_zero(mm, at, body_end):
                    raise FormatError(f"{left} trailing bytes at {at:#x} are not an entry")
                break
            kind, hsize, psize, csize, arch, flags, usize = unpack(mm, at)
            if hsize < ENTRY_MIN_HEADER or hsize > ENTRY_MAX_HEADER or hsize > left:
                raise FormatError(f"entry at {at:#x}: header size {hsize:#x} is invalid")
            if psize > left - hsize:
                raise FormatError(
                    f"entry at {at:#x}: payload size {psize:#x} runs past the container ({left - hsize:#x} bytes left)"
                )
            if arch < _ARCH_LOW or arch > _ARCH_HIGH:
                raise FormatError(f"entry at {at:#x}: arch number {arch} is implausible")
            info = flag_info.get(flags & _FLAG_MASK)
            if info is None:
                raise FormatError(f"entry at {at:#x}: flags {flags:#x} mark it both `a` and `f`")
            variant, compression = info[1] if csize else info[0]
            if kind == KIND_PTX:
                stub = STUB_NO
                ptx = True
            elif kind == KIND_CUBIN and compression == "none" and psize >= 64:
                # what cubin.stub_status reads, from the payload's ELF64 header
                ident, abi, machine, e_flags = cubin_head(mm, at + hsize)
                if ident == _CUBIN_IDENT and machine == EM_CUDA and abi >= 8:
                    stub = stubs.get(e_flags >> 24, STUB_UNKNOWN)
                else:
                    stub = STUB_UNKNOWN
            else:
                stub = STUB_UNKNOWN
            entries.append(Entry(at, kind, arch, variant, flags, compression, hsize, psize, csize, usize, stub, True, None))
            at += hsize + psize
    except FormatError as exc:
        container.error = f"{_where(section, pos)}: {exc}"
    if section != SECTION_RELOCATABLE:  # never loaded, never judged: not worth decompressing
        decoders = decoders or Decoders(False)
        if ptx:  # what a driver must JIT: its ISA against the driver's (issue 51)
            ptxisa.fill(mm, entries, decoders)
        container.kernels = container_kernels(mm, container, decoders)
    return container, body_end


_HEADER_SIZE = CONTAINER_HEADER.size
_CONTAINER_UNPACK = CONTAINER_HEADER.unpack_from
_ENTRY_UNPACK = _ENTRY_HEADER.unpack_from
_ARCH_LOW, _ARCH_HIGH = ARCH_NUMBER_RANGE
_CUBIN_UNPACK = cubin.CUBIN_HEAD.unpack_from
_CUBIN_IDENT = cubin.CUBIN_IDENT
_STUB_BY_TOP_BYTE = cubin.STUB_BY_TOP_BYTE


def _where(section: str, pos: int) -> str:
    return f"{section} container at {pos:#x}" if section else f"container at {pos:#x}"


def _flag_info() -> dict:
    """(variant, compression) by the flag bits that decide them, for an entry without and with a compressed
    size: an entry flagged neither ZSTD nor LZ4 that states a compressed size is compressed in a way not
    known here. Flags marking an entry both `a` and `f` are left out: that header is damaged."""
    table = {}
    for bits in range(16):
        flags = (FLAG_ARCH if bits & 1 else 0) | (FLAG_FAMILY if bits & 2 else 0)
        flags |= (FLAG_ZSTD if bits & 4 else 0) | (FLAG_LZ4 if bits & 8 else 0)
        if flags & FLAG_ARCH and flags & FLAG_FAMILY:
            continue
        variant = Variant.ARCH if flags & FLAG_ARCH else Variant.FAMILY if flags & FLAG_FAMILY else Variant.PLAIN
        if flags & FLAG_ZSTD:
            plain = packed = "zstd"
        elif flags & FLAG_LZ4:
            plain = packed = "lz4"
        else:
            plain, packed = "none", "unknown"
        table[flags] = ((variant, plain), (variant, packed))
    return table


_FLAG_MASK = FLAG_ARCH | FLAG_FAMILY | FLAG_ZSTD | FLAG_LZ4
_FLAG_INFO = _flag_info()


def _all_zero(mm: mmap.mmap, start: int, end: int) -> bool:
    """True when mm[start:end] is all zero bytes, read in bounded chunks."""
    pos = start
    while pos < end:
        chunk = mm[pos : min(end, pos + _ZERO_CHUNK)]
        if chunk.count(0) != len(chunk):
            return False
        pos += len(chunk)
    return True
