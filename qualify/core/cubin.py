"""A cubin's own facts, read from its ELF header and notes: its SM, its a/f
variant, and whether it is an nvlink device-link stub. Used for standalone
cubins and for the uncompressed cubins inside fatbin entries (fatbin.py).
Standard library only, Python 3.9 compatible.
"""

from __future__ import annotations

import mmap
import re
import struct

from qualify.core.arch import ArchError, CodeTarget, Variant
from qualify.core.elf import ELF_MAGIC, EM_CUDA, ElfHeader, FormatError, section_table
from qualify.core.fatbin_model import CODE_TOP_BYTE, STUB_NO, STUB_TOP_BYTE, STUB_UNKNOWN, STUB_YES, FileScan

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: typing is not imported at run time (the census's start-up)
    from typing import Tuple

_NOTE_LIMIT = 1 << 16
STUB_BY_TOP_BYTE = {STUB_TOP_BYTE: STUB_YES, CODE_TOP_BYTE: STUB_NO}


def sm_of(elf: ElfHeader) -> int:
    """The SM number (120 for sm_120). ABI version 8 (CUDA 12.8+) keeps the SM in bits 8-15; older cubins in bits 0-7."""
    return (elf.flags >> 8) & 0xFF if elf.abi_version >= 8 else elf.flags & 0xFF


def stub_status(abi_version: int, e_flags: int) -> str:
    """yes for an nvlink device-link stub, no for a cubin with code, from e_flags' top byte."""
    if abi_version < 8:  # older cubins keep other bits there
        return STUB_UNKNOWN
    return STUB_BY_TOP_BYTE.get(e_flags >> 24, STUB_UNKNOWN)


def variant_of(mm: mmap.mmap, elf: ElfHeader, scan: FileScan) -> Tuple[Variant, bool]:
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


CUBIN_IDENT = ELF_MAGIC + bytes([2, 1])  # ELF64, little-endian
# What says whether an uncompressed cubin payload is a device-link stub, in one read of its ELF64 header:
# the identity's first 6 bytes, the ABI version at 8, e_machine at 18, e_flags at 48 (fatbin.py reads it
# this way inline, for tens of thousands of entries; payload_stub_status is the same rule as a function).
CUBIN_HEAD = struct.Struct("<6s2xB9xH28xI")


def payload_stub_status(mm: mmap.mmap, start: int, size: int) -> str:
    """From the ELF64 header of an uncompressed cubin payload of `size` bytes at `start`."""
    if size < 64:
        return STUB_UNKNOWN
    ident, abi_version, machine, e_flags = CUBIN_HEAD.unpack_from(mm, start)
    if ident != CUBIN_IDENT or machine != EM_CUDA:
        return STUB_UNKNOWN
    return stub_status(abi_version, e_flags)
