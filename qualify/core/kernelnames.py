"""The kernel names a library's fatbins carry, per entry: what a kernel-family census reads (issue 50).

`kernels.py` decides only whether a container holds *any* kernel, from a few KB of each entry. Whether a
provider's kernel family (vLLM's SM120 CUTLASS NVFP4 grouped GEMM, say) has code for a GPU needs the names
themselves: a cubin's kernels are its `.text.<mangled name>` sections, a PTX entry's are its `.entry <name>`
lines. Compressed entries are decoded whole, with the decoders the image side stages (probe/staged.py);
without them, or over the per-file budget, the entry's names are unknown, never "none".

The names say what was compiled for an architecture, not that it does anything there: a kernel guarded for
another architecture compiles to an empty body in other cubins (vLLM 0.33's SM120 NVFP4 grouped GEMM is
62 KB of code in its sm_120f cubin and 384 bytes, an immediate exit, in the sm_100f cubin of the same
unit). So each cubin kernel comes with the size of its code (its `.text.<name>` section), and a family
counts only kernels with real code (probe/providers/families.py); PTX kernels have no size (-1).

Standard library only (decoders optional), Python 3.9 compatible (runs inside images).
"""

from __future__ import annotations

import mmap
import re
import struct

from qualify.core import fatbin
from qualify.core.arch import CodeTarget
from qualify.core.elf import ElfHeader, FormatError
from qualify.core.kernels import Decoders
from qualify.core.record import record

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: typing is not imported at run time
    from typing import Dict, List, Optional, Tuple

MAX_NAMES_PER_ENTRY = 200_000  # the largest real cubins hold a few thousand kernels
MAX_NAME_BYTES = 64 << 10  # a mangled CUTLASS kernel name is a few KB
_SECTION = struct.Struct("<IIQQQQ")  # name, type, flags, address, offset, size of an ELF64 section header
_PTX_ENTRY = re.compile(rb"\.entry\s+([A-Za-z_$][A-Za-z0-9_$]*)")


@record(frozen=True)
class EntryNames:
    """One code object of a fatbin: its code target and the kernels it defines (None: unknown)."""

    code: Optional[CodeTarget]  # None: a kind that is neither SASS nor PTX (LTO IR)
    arch: str  # the entry's name as the census prints it (sm_120f, compute_90)
    kernels: Optional[Tuple[Tuple[str, int], ...]]  # (mangled name, bytes of code; -1 for PTX); None: unknown
    why_unknown: str = ""

    @property
    def names(self) -> Optional[Tuple[str, ...]]:
        return None if self.kernels is None else tuple(name for name, _ in self.kernels)


@record(frozen=True)
class NamesScan:
    path: str
    entries: Tuple[EntryNames, ...]
    errors: Tuple[str, ...]  # the file's own problems (unreadable, damaged containers)


def cubin_kernels(data: bytes) -> Optional[List[Tuple[str, int]]]:
    """(name, code bytes) of each kernel of a whole cubin (its `.text.<name>` sections); None when its tables
    cannot be read."""
    try:
        elf = ElfHeader.parse(data)
        count, stride = elf.shnum, elf.shentsize
        if not elf.is64 or elf.shoff == 0 or count == 0 or stride < 64 or elf.shstrndx >= count:
            return None
        if elf.shoff + count * stride > len(data):
            return None
        _n, _t, _f, _a, table, length = _SECTION.unpack_from(data, elf.shoff + elf.shstrndx * stride)
        if table + length > len(data):
            return None
        names = []
        for i in range(count):
            name, _type, _flags, _addr, _offset, size = _SECTION.unpack_from(data, elf.shoff + i * stride)
            start = table + name
            if start + 6 > table + length or data[start:start + 6] != b".text.":
                continue
            end = data.find(b"\0", start, min(table + length, start + MAX_NAME_BYTES))
            if end < 0:
                return None
            names.append((data[start + 6:end].decode("utf-8", "replace"), size))
            if len(names) > MAX_NAMES_PER_ENTRY:
                return None
        return names
    except (FormatError, struct.error):
        return None


def ptx_kernels(data: bytes) -> List[Tuple[str, int]]:
    return [(m.decode("ascii"), -1) for m in _PTX_ENTRY.findall(data)][:MAX_NAMES_PER_ENTRY]


def _payload(mm: mmap.mmap, entry, decoders: Decoders) -> Tuple[Optional[bytes], str]:
    start = entry.offset + entry.header_size
    if entry.compression == "none":
        end = start + entry.payload_size
        if end > len(mm):
            return None, "the entry runs past the end of the file"
        return mm[start:end], ""
    if not decoders.can(entry.compression):
        return None, f"{entry.compression} compressed, and no decoder for it in this interpreter"
    data = decoders.decode(mm, entry, entry.uncompressed_size)
    if data is None or len(data) != entry.uncompressed_size:
        return None, f"{entry.compression} entry could not be decoded whole (damaged, or over the decode budget)"
    return data, ""


def entry_names(mm: mmap.mmap, entry, decoders: Decoders) -> EntryNames:
    code = entry.code_target
    if not (entry.is_cubin or entry.is_ptx):
        return EntryNames(code, entry.name, None, f"a {entry.kind} entry: not code the driver loads")
    data, why = _payload(mm, entry, decoders)
    if data is None:
        return EntryNames(code, entry.name, None, why)
    if entry.is_ptx:
        return EntryNames(code, entry.name, tuple(ptx_kernels(data)))
    kernels = cubin_kernels(data)
    if kernels is None:
        return EntryNames(code, entry.name, None, "the cubin's section tables cannot be read")
    return EntryNames(code, entry.name, tuple(kernels))


def scan(path: str, decompress: bool = True) -> NamesScan:
    """Every entry of every container in `path` (registered `.nv_fatbin` containers and embedded ones), with
    its kernel names. Never raises on bad input: problems are recorded."""
    found = fatbin.read_file(path, embedded=True, decompress=False)  # the kernels question is ours to answer
    errors = list(found.errors)
    if found.unreadable or not found.containers:
        return NamesScan(str(path), (), tuple(errors))
    decoders = Decoders(decompress)
    out: List[EntryNames] = []
    try:
        with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            for container in found.containers:
                if container.damaged:
                    errors.append(f"container at {container.offset:#x}: {container.error}")
                for entry in container.entries:
                    out.append(entry_names(mm, entry, decoders))
    except (OSError, ValueError) as exc:
        errors.append(f"cannot read: {exc}")
    return NamesScan(str(path), tuple(out), tuple(errors))


def by_arch(found: NamesScan) -> Dict[str, int]:
    """For people: kernels per entry name (unknown entries count as -1)."""
    counts: Dict[str, int] = {}
    for e in found.entries:
        counts[e.arch] = -1 if e.kernels is None else counts.get(e.arch, 0) + len(e.kernels)
    return counts
