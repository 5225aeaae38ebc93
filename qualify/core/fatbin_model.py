"""The fatbin format's constants and what the reader gives back (Entry, Container, FileScan).

Apart from the reader (fatbin.py) so that kernel detection (kernels.py) can use
the same types without an import cycle. Standard library only, Python 3.9.
"""

from __future__ import annotations

import functools
import struct

from qualify.core.arch import ArchError, Capability, CodeKind, CodeTarget, Variant
from qualify.core.elf import SEGMENT_PREFIX
from qualify.core.record import field, record

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: typing is not imported at run time (the census's start-up)
    from typing import List, Optional, Tuple

FATBIN_MAGIC = 0xBA55ED50
MAGIC_BYTES = struct.pack("<I", FATBIN_MAGIC)
AR_MAGIC = b"!<arch>\n"  # a static archive (`.a`): link inputs, never loaded
# magic + version 1 + header size 16: what a real container starts with.
CONTAINER_PREFIX = MAGIC_BYTES + struct.pack("<HH", 1, 16)
CONTAINER_HEADER = struct.Struct("<IHHQ")

ENTRY_MIN_HEADER = 0x40  # must reach the uncompressed size at 0x38
ENTRY_MAX_HEADER = 0x1000  # 0x40..0x80 seen; anything this large is corrupt
ARCH_NUMBER_RANGE = (10, 999)  # sm_10 .. sm_999: anything else is a damaged header
# Per file. cuFFT, the largest seen, has 24k containers and 24k entries: a
# file with far more is hostile, and every record costs memory.
MAX_CONTAINERS = 250_000
MAX_ENTRIES = 500_000
MAX_ERRORS = 100

KIND_PTX = 1
KIND_CUBIN = 2
KIND_LTO_IR = 8  # seen in cuFFT's callback kernels (nvcc `code=lto_XY`)

FLAG_LZ4 = 0x2000
FLAG_ZSTD = 0x8000
FLAG_ARCH = 0x100000  # `a` variant
FLAG_FAMILY = 0x200000  # `f` variant

# Top byte of a cubin's e_flags (ELF ABI version >= 8): nvlink's device-link
# stubs, which hold no kernels, carry 0x05; cubins with code carry 0x06.
STUB_TOP_BYTE = 0x05
CODE_TOP_BYTE = 0x06

SECTION_REGISTERED = ".nv_fatbin"
SECTION_RELOCATABLE = "__nv_relfatbin"


# Link-stub status of an entry or container.
STUB_YES = "yes"
STUB_NO = "no"
STUB_UNKNOWN = "unknown"  # compressed, or not a cubin whose header we understand


@functools.cache
def code_target_of(kind_code: int, arch_number: int, variant: Variant) -> Optional[CodeTarget]:
    """SASS or PTX target the driver can load; None for LTO IR and unknown kinds.
    Cached: a library has tens of thousands of entries but a dozen distinct targets."""
    kind = {KIND_CUBIN: CodeKind.SASS, KIND_PTX: CodeKind.PTX}.get(kind_code)
    if kind is None:
        return None
    try:
        return CodeTarget(kind, Capability.from_number(arch_number), variant)
    except ArchError:
        return None


def entry_name(kind_code: int, arch_number: int, variant: Variant) -> str:
    """`sm_120a`, `compute_121`, `lto_75` (nvcc's `code=lto_75`), or `kind<N>_<arch>`."""
    target = code_target_of(kind_code, arch_number, variant)
    if target is not None:
        return str(target)
    prefix = "lto" if kind_code == KIND_LTO_IR else f"kind{kind_code}"
    return f"{prefix}_{arch_number}{variant.value}"


@record
class Entry:
    """One code object inside a fatbin container (or a standalone cubin)."""

    # __slots__ (written out: records take them as declared): a
    # library holds up to tens of thousands of entries, and a __dict__ each
    # would triple their memory and the page faults that come with it.
    __slots__ = (
        "offset",
        "kind_code",
        "arch_number",
        "variant",
        "flags",
        "compression",
        "header_size",
        "payload_size",
        "compressed_size",
        "uncompressed_size",
        "link_stub",
        "variant_known",
        "ptx_isa",
    )

    offset: int  # file offset of the entry header (0 for a standalone cubin)
    kind_code: int  # 1 PTX, 2 ELF cubin, 8 LTO IR
    arch_number: int  # 121 for 12.1
    variant: Variant
    flags: int
    compression: str  # none | lz4 | zstd | unknown
    header_size: int
    payload_size: int
    compressed_size: int
    uncompressed_size: int
    link_stub: str  # yes | no | unknown
    variant_known: bool  # False for a standalone cubin without a tool note
    ptx_isa: Optional[str]  # a PTX entry's `.version` ("9.0", or ptxisa.UNKNOWN); None for any other kind

    @property
    def kind(self) -> str:
        return {KIND_PTX: "ptx", KIND_CUBIN: "cubin", KIND_LTO_IR: "lto-ir"}.get(self.kind_code, "unknown")

    @property
    def code_target(self) -> Optional[CodeTarget]:
        return code_target_of(self.kind_code, self.arch_number, self.variant)

    @property
    def name(self) -> str:
        return entry_name(self.kind_code, self.arch_number, self.variant)

    @property
    def is_cubin(self) -> bool:
        return self.kind_code == KIND_CUBIN

    @property
    def is_ptx(self) -> bool:
        return self.kind_code == KIND_PTX

    @property
    def packed_size(self) -> int:
        """The payload bytes a decoder reads: the compressed size where the
        header states one that fits the payload, else the whole payload."""
        return self.compressed_size if 0 < self.compressed_size <= self.payload_size else self.payload_size

    @property
    def compressed(self) -> bool:
        return self.compression != "none"

    def to_json(self) -> dict:
        return {
            "offset": self.offset,
            "kind": self.kind,
            "kind_code": self.kind_code,
            "arch": self.name,
            "arch_number": self.arch_number,
            "variant": self.variant.value,
            "variant_known": self.variant_known,
            "flags": self.flags,
            "compression": self.compression,
            "header_size": self.header_size,
            "payload_size": self.payload_size,
            "compressed_size": self.compressed_size,
            "uncompressed_size": self.uncompressed_size,
            "link_stub": self.link_stub,
            "ptx_isa": self.ptx_isa,
        }


@record
class Container:
    """One fatbin container: roughly one compiled source file."""

    __slots__ = ("offset", "size", "section", "entries", "error", "kernels")  # see Entry

    offset: int  # file offset of the container header
    size: int  # header + entries, as declared
    section: str  # ELF section name; "" for a standalone fatbin or cubin
    entries: List[Entry]
    error: Optional[str]  # set when the container could not be read to its end
    kernels: str  # yes | no | unknown: whether any entry holds a kernel

    @property
    def relocatable(self) -> bool:
        """Relocatable device code for later linking: never loaded at run time."""
        return self.section == SECTION_RELOCATABLE

    @property
    def registered(self) -> bool:
        """Registered with the CUDA runtime (what cuobjdump lists). Containers
        found through program headers count as registered: without section
        names they cannot be told apart, and judging each on its own is the
        stricter rule."""
        return self.section in (SECTION_REGISTERED, "") or self.section.startswith(SEGMENT_PREFIX)

    @property
    def damaged(self) -> bool:
        """Could not be read to its end: entries may be missing."""
        return self.error is not None

    @property
    def is_link_stub(self) -> bool:
        return self.link_stub == STUB_YES

    @property
    def link_stub(self) -> str:
        """yes: nvlink device-link stub only; no: holds code; unknown: cannot tell."""
        if not self.entries:
            return STUB_UNKNOWN
        if len(self.entries) == 1:  # most containers; the rule below gives the same
            return self.entries[0].link_stub
        statuses = {e.link_stub for e in self.entries}
        if statuses == {STUB_YES}:
            return STUB_YES
        if STUB_NO in statuses:
            return STUB_NO
        return STUB_UNKNOWN

    def to_json(self) -> dict:
        return {
            "offset": self.offset,
            "size": self.size,
            "section": self.section,
            "relocatable": self.relocatable,
            "link_stub": self.link_stub,
            "kernels": self.kernels,
            "error": self.error,
            "entries": [e.to_json() for e in self.entries],
        }


@record
class FileScan:
    """Everything read from one file."""

    path: str
    format: str  # elf | cubin | fatbin | archive | unknown
    size: int
    containers: List[Container] = field(default_factory=list)
    errors: List[str] = field(default_factory=list)
    unreadable: bool = False  # could not be opened or listed at all (permission denied, ...)
    archive: Optional[Tuple[int, int]] = None  # a static archive: (members, members that carry device code)

    @property
    def ok(self) -> bool:
        return not self.errors

    @property
    def entries(self) -> List[Entry]:
        return [e for c in self.containers for e in c.entries]


# How a file is read: an ordered list of steps (fatbin.elf_walks), so that a
# large file can be read in parts by several processes (core/parts.py).
WALK_REGISTERED = "registered"  # containers back to back (`.nv_fatbin`, a standalone fatbin)
WALK_EMBEDDED = "embedded"  # containers found by their prefix in a data section or segment
WALK_ERROR = "error"  # a problem found while planning, reported in its place


@record(frozen=True)
class Walk:
    kind: str
    section: str
    start: int
    end: int  # the section's end: a container is parsed up to it, whichever part found it
    stop: Optional[int] = None  # a part of a section: only containers that start before `stop`
    resync: bool = False  # a part that starts inside the section: what precedes its first container is the previous part's
    message: str = ""  # WALK_ERROR


@record(frozen=True)
class WalkEdge:
    """Where a part's walk began and ended, for joining it to its neighbours."""

    first: Optional[int]  # the first container it parsed (None: none starts in the part)
    cont: int  # where the walk would go on
    gap_check: bool  # registered walks: the bytes from `cont` to the next container must be zero

