"""ELF structure for the fatbin reader: the header, the section table, the loadable segments.

Read with `struct` over a mapped file rather than pyelftools by default: it is
a few dozen lines, every bound is checked here, and importing pyelftools alone
takes ~33 ms (QUALIFY_ELF_READER=pyelftools selects pyelftools; fatbin.py says
what the benchmark measured). Standard library only, Python 3.9 compatible.
"""

from __future__ import annotations

import mmap
import os
import struct

from qualify.core.record import record

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: typing is not imported at run time (the census's start-up)
    from typing import List, Optional, Tuple

ELF_MAGIC = b"\x7fELF"


MAX_SECTIONS = 200_000  # relocatable objects built with -ffunction-sections have many


EM_CUDA = 190


SHT_PROGBITS = 1


SHT_NOBITS = 8


SHF_ALLOC = 0x2


SHF_EXECINSTR = 0x4


_NAME_LIMIT = 256


class FormatError(Exception):
    """Internal: the bytes do not follow the format (becomes an error string)."""


@record(frozen=True)
class Section:
    name: str
    type: int
    flags: int
    offset: int
    size: int

    @property
    def end(self) -> int:
        return self.offset + self.size


@record(frozen=True)
class ElfHeader:
    is64: bool
    abi_version: int
    machine: int
    flags: int
    shoff: int
    shentsize: int
    shnum: int
    shstrndx: int
    phoff: int = 0
    phentsize: int = 0
    phnum: int = 0

    @classmethod
    def parse(cls, buf, base: int = 0, limit: Optional[int] = None) -> ElfHeader:
        """Parse the ELF header at buf[base:limit] (little-endian only)."""
        limit = len(buf) if limit is None else limit
        if limit - base < 52 or buf[base : base + 4] != ELF_MAGIC:
            raise FormatError("not an ELF header")
        ei_class, ei_data, abi_version = buf[base + 4], buf[base + 5], buf[base + 8]
        if ei_data != 1:
            raise FormatError(f"unsupported byte order (EI_DATA={ei_data})")
        if ei_class == 2:
            if limit - base < 64:
                raise FormatError("ELF64 header truncated")
            machine = struct.unpack_from("<H", buf, base + 18)[0]
            phoff, shoff, flags = struct.unpack_from("<QQI", buf, base + 32)
            phentsize, phnum, shentsize, shnum, shstrndx = struct.unpack_from("<HHHHH", buf, base + 54)
            return cls(True, abi_version, machine, flags, shoff, shentsize, shnum, shstrndx, phoff, phentsize, phnum)
        if ei_class == 1:
            machine = struct.unpack_from("<H", buf, base + 18)[0]
            phoff, shoff, flags = struct.unpack_from("<III", buf, base + 28)
            phentsize, phnum, shentsize, shnum, shstrndx = struct.unpack_from("<HHHHH", buf, base + 42)
            return cls(False, abi_version, machine, flags, shoff, shentsize, shnum, shstrndx, phoff, phentsize, phnum)
        raise FormatError(f"unknown ELF class {ei_class}")


def section_table(mm: mmap.mmap, elf: ElfHeader) -> List[Section]:
    """All section headers, bounds-checked against the file."""
    if elf.shoff == 0:
        return []
    entsize = 64 if elf.is64 else 40
    if elf.shentsize < entsize:
        raise FormatError(f"section header size {elf.shentsize} is smaller than {entsize}")
    if elf.shoff + elf.shentsize > len(mm):
        raise FormatError(f"section table offset {elf.shoff:#x} is past the end of the file")
    raw = [_raw_section(mm, elf, 0)]
    count, strndx = elf.shnum, elf.shstrndx
    if count == 0:  # extended numbering: the real count is in section 0
        count = raw[0][4]
    if strndx == 0xFFFF:
        strndx = raw[0][5]
    if count * elf.shentsize > len(mm) - elf.shoff:
        raise FormatError(f"{count} section headers at {elf.shoff:#x} do not fit in the file")
    if count > MAX_SECTIONS:
        raise FormatError(f"{count} section headers: more than any real library has")
    raw.extend(_raw_section(mm, elf, i) for i in range(1, count))
    strtab = raw[strndx] if 0 < strndx < count else None
    sections = []
    for name_off, sh_type, sh_flags, sh_offset, sh_size, _link in raw:
        name = _section_name(mm, strtab, name_off)
        sections.append(Section(name, sh_type, sh_flags, sh_offset, sh_size))
    return sections


def _raw_section(mm: mmap.mmap, elf: ElfHeader, index: int) -> Tuple[int, int, int, int, int, int]:
    """(name, type, flags, offset, size, link) of one section header."""
    pos = elf.shoff + index * elf.shentsize
    if elf.is64:
        name, sh_type, flags, _addr, offset, size, link = struct.unpack_from("<IIQQQQI", mm, pos)
    else:
        name, sh_type, flags, _addr, offset, size, link = struct.unpack_from("<IIIIIII", mm, pos)
    return name, sh_type, flags, offset, size, link


def _section_name(mm: mmap.mmap, strtab, name_off: int) -> str:
    if strtab is None:
        return ""
    start, size = strtab[3], strtab[4]
    if name_off >= size or start + size > len(mm):
        return ""
    end = min(start + size, start + name_off + _NAME_LIMIT)
    raw = mm[start + name_off : end]
    return raw.split(b"\0", 1)[0].decode("ascii", "replace")


def _section_table_pyelftools(mm: mmap.mmap, elf: ElfHeader) -> List[Section]:
    """The same table read by pyelftools (for the measurement in the module
    docstring; QUALIFY_ELF_READER=pyelftools selects it)."""
    from elftools.common.exceptions import ELFError, ELFParseError
    from elftools.elf.elffile import ELFFile

    try:
        elffile = ELFFile(mm)
        if elffile.num_sections() > MAX_SECTIONS:
            raise FormatError(f"{elffile.num_sections()} section headers: more than any real library has")
        return [
            Section(sec.name, _SHT_CODES.get(sec["sh_type"], -1), sec["sh_flags"], sec["sh_offset"], sec["sh_size"])
            for sec in elffile.iter_sections()
        ]
    except (ELFError, ELFParseError, ValueError, OSError) as exc:
        raise FormatError(str(exc)) from None


# pyelftools names section types; the census needs only these two.
_SHT_CODES = {"SHT_PROGBITS": SHT_PROGBITS, "SHT_NOBITS": SHT_NOBITS}


SECTION_READERS = {"own": section_table, "pyelftools": _section_table_pyelftools}


def section_reader():
    """The section-table reader QUALIFY_ELF_READER chooses (`own`, the default, or `pyelftools`), read where
    the census runs, not at import."""
    return SECTION_READERS.get(os.environ.get("QUALIFY_ELF_READER", "own"), section_table)


# Program headers: what the loader maps. Without a section table the
# containers are found in the loadable, non-executable segments.
_PT_LOAD = 1


_PF_X = 0x1


MAX_SEGMENTS = 4096


SEGMENT_PREFIX = "PT_LOAD@"  # section label of containers found through a segment


def segments(mm: mmap.mmap, elf: ElfHeader) -> List[Section]:
    """Loadable non-executable segments, bounds-checked, as Sections named by file offset."""
    entsize = 56 if elf.is64 else 32
    if elf.phoff == 0 or elf.phnum == 0:
        return []
    if elf.phentsize < entsize or elf.phnum > MAX_SEGMENTS:
        raise FormatError(f"program header size {elf.phentsize} or count {elf.phnum} is invalid")
    if elf.phoff + elf.phnum * elf.phentsize > len(mm):
        raise FormatError(f"{elf.phnum} program headers at {elf.phoff:#x} do not fit in the file")
    out = []
    for i in range(elf.phnum):
        pos = elf.phoff + i * elf.phentsize
        if elf.is64:
            p_type, p_flags, offset, _vaddr, _paddr, filesz = struct.unpack_from("<IIQQQQ", mm, pos)
        else:
            p_type, offset, _vaddr, _paddr, filesz, _memsz, p_flags = struct.unpack_from("<IIIIIII", mm, pos)
        if p_type == _PT_LOAD and not p_flags & _PF_X and filesz:
            out.append(Section(f"{SEGMENT_PREFIX}{offset:#x}", SHT_PROGBITS, SHF_ALLOC, offset, filesz))
    return out
