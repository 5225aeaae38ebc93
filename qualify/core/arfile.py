"""Static archives (`ar`, `.a`): counted, not judged (core/fatbin.py reads the files that are loaded).

Written here rather than with a library: the census runs inside images with the standard library only, and
the format is a 60-byte header per member, every bound of which is checked below."""

from __future__ import annotations

import mmap

from qualify.core.elf import ELF_MAGIC
from qualify.core.fatbin_model import AR_MAGIC, SECTION_RELOCATABLE

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: typing is not imported at run time (the census's start-up)
    from typing import List, Tuple

AR_HEADER = 60
MAX_ARCHIVE_MEMBERS = 100_000
_DEVICE_CODE_SECTIONS = (b".nv_fatbin", SECTION_RELOCATABLE.encode())


def count_members(mm: mmap.mmap) -> Tuple[Tuple[int, int], List[str]]:
    """A static archive (`ar`): its members are objects that are linked into other binaries, never loaded,
    so its device code is not judged. Counted: members, and members that are ELF objects naming a
    device-code section (so a report can say what the archive would bring into a link); and what was
    wrong with the archive, in words."""
    pos, members, with_code, errors = len(AR_MAGIC), 0, 0, []
    while pos + AR_HEADER <= len(mm):
        header = mm[pos:pos + AR_HEADER]
        if header[58:60] != b"`\n":
            errors.append(f"static archive: bad member header at offset {pos}")
            break
        try:
            size = int(header[48:58].decode("ascii").strip() or "0")
        except (UnicodeDecodeError, ValueError):
            errors.append(f"static archive: bad member size at offset {pos}")
            break
        start, end = pos + AR_HEADER, pos + AR_HEADER + size
        if end > len(mm):
            errors.append(f"static archive: member at offset {pos} runs past the end of the file")
            break
        name = header[:16].rstrip()
        if name not in (b"/", b"//", b"/SYM64/"):  # the symbol table and the long-name table are no members
            members += 1
            if mm[start:start + 4] == ELF_MAGIC and any(mm.find(n, start, end) >= 0 for n in _DEVICE_CODE_SECTIONS):
                with_code += 1
        if members > MAX_ARCHIVE_MEMBERS:
            errors.append(f"static archive: more than {MAX_ARCHIVE_MEMBERS} members; not counted further")
            break
        pos = end + (size & 1)  # members are 2-byte aligned
    return (members, with_code), errors
