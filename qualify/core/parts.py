"""Reading one large file in parts, in several processes.

With many cores the census waits for its largest file: cuFFT's kernel
database (24k containers in one section) alone takes a quarter of a second.
So a large file's walks (fatbin.elf_walks) are cut at byte offsets into
parts. A part reads the containers that *start* inside it, parsing each to
its end wherever that is, and says where its walk stopped
(fatbin_model.WalkEdge). Joining the parts checks that each one begins
exactly where the one-process walk would have gone on, and checks the bytes
between registered containers that straddle a cut as that walk would have.
A join that does not hold, or a file over a per-file limit, gives None: the
caller then reads the file whole. The result is always what one process
reading the file gives (tests/test_parts.py compares them, cut every few KB).

Standard library only, Python 3.9 compatible.
"""

from __future__ import annotations

from qualify.core import fatbin, summary
from qualify.core.elf import ELF_MAGIC, EM_CUDA, ElfHeader, FormatError
from qualify.core.fatbin_model import (
    MAX_CONTAINERS,
    MAX_ENTRIES,
    MAX_ERRORS,
    WALK_ERROR,
    WALK_REGISTERED,
    FileScan,
    Walk,
    WalkEdge,
)
from qualify.core.kernels import MAX_DECOMPRESSED_FILE, Decoders
from qualify.core.record import record

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: typing is not imported at run time (the census's start-up)
    from typing import List, Optional, Tuple

# Parts of about this size: measured on a 16-core host (torch 2.11's 31 CUDA
# libraries, 8 workers), 32 MB parts left one dense 32 MB piece of cuFFT's
# database (0.108 s) as the critical path; with 8 MB the largest part took
# 0.040 s and the workers finished within 1 ms of each other.
PART_BYTES = 8 << 20
MIN_FILE_BYTES = 64 << 20  # smaller files are read whole (and from how many workers on: census.CUT_FROM_JOBS)


@record(frozen=True)
class PartTask:
    """Some consecutive walks of one file. Only the first may start inside a
    section (resync) and only the last may stop inside one (stop)."""

    path: str
    walks: Tuple[Walk, ...]
    decompress: bool
    detail: bool

    @property
    def cost(self) -> int:
        return sum((w.stop if w.stop is not None else w.end) - w.start for w in self.walks if w.kind != WALK_ERROR)


@record(frozen=True)
class PartResult:
    summary: summary.FileSummary  # the containers and errors of this part
    first: WalkEdge  # of its first walk
    last: WalkEdge  # of its last walk
    decompressed: int  # bytes decompressed
    stopped: bool  # a per-file limit was reached: the part is incomplete


def plan(
    path: str,
    embedded: bool,
    decompress: bool,
    detail: bool,
    part_bytes: Optional[int] = None,
    min_file_bytes: Optional[int] = None,
) -> Optional[List[PartTask]]:
    """The parts of a large ELF library, or None to read it whole (small, not
    a sectioned ELF file, unreadable, or nothing worth cutting). The sizes
    default to PART_BYTES and MIN_FILE_BYTES (the fuzz cuts every few bytes)."""
    part_bytes = part_bytes or PART_BYTES
    min_file_bytes = MIN_FILE_BYTES if min_file_bytes is None else min_file_bytes
    try:
        with fatbin.mapped(path) as mm:
            if len(mm) < max(min_file_bytes, part_bytes) or mm[:4] != ELF_MAGIC:
                return None
            elf = ElfHeader.parse(mm)
            if elf.machine == EM_CUDA:
                return None
            walks = fatbin.elf_walks(mm, elf, embedded)
    except (OSError, ValueError, FormatError):
        return None
    parts = _cut(walks, part_bytes)
    if len(parts) < 2:
        return None
    return [PartTask(path, tuple(p), decompress, detail) for p in parts]


def _cut(walks: List[Walk], part_bytes: int) -> List[List[Walk]]:
    """Consecutive walks, in parts of about `part_bytes`: a part is closed once
    full, and a walk longer than the room left is cut (a sliver is not: the
    part is closed first). Only a part's first walk can start inside a
    section and only its last can stop inside one."""
    parts: List[List[Walk]] = [[]]
    room = part_bytes
    for walk in walks:
        if walk.kind == WALK_ERROR:
            parts[-1].append(walk)
            continue
        lo = walk.start
        if walk.end - lo > room and room < part_bytes // 4 and parts[-1]:
            parts.append([])
            room = part_bytes
        while walk.end - lo > room + part_bytes // 2:  # the last piece is at least half a part
            parts[-1].append(Walk(walk.kind, walk.section, lo, walk.end, lo + room, lo != walk.start))
            parts.append([])
            lo, room = lo + room, part_bytes
        parts[-1].append(Walk(walk.kind, walk.section, lo, walk.end, None, lo != walk.start))
        room -= walk.end - lo
        if room <= 0:
            parts.append([])
            room = part_bytes
    return [p for p in parts if p]


def read_part(task: PartTask) -> PartResult:
    """Run the part's walks (in a worker). Never raises on bad input."""
    scan = FileScan(path=task.path, format="elf", size=0)
    decoders = Decoders(task.decompress)
    edges: List[WalkEdge] = []
    stopped = False
    try:
        with fatbin.mapped(task.path) as mm:
            reader = fatbin.ContainerReader(mm, scan, decoders)
            for walk in task.walks:
                edges.append(reader.run(walk))
    except fatbin.LimitReached:
        stopped = True
    except (OSError, ValueError):
        stopped = True  # the file changed or vanished since it was planned: read it whole
    none = WalkEdge(None, 0, False)
    first = edges[0] if edges else none
    last = edges[-1] if len(edges) == len(task.walks) else none
    return PartResult(summary.summarize(scan, task.detail), first, last, MAX_DECOMPRESSED_FILE - decoders.budget, stopped)


def join(tasks: List[PartTask], results: List[Optional[PartResult]], size: int) -> Optional[summary.FileSummary]:
    """The file's summary from its parts, or None when they do not join up
    exactly as one walk (then read the file whole)."""
    if any(r is None or r.stopped for r in results):
        return None
    errors: List[List[str]] = []
    carried: Optional[WalkEdge] = None  # where the cut section's walk would go on
    try:
        with fatbin.mapped(tasks[0].path) as mm:
            for task, result in zip(tasks, results):
                assert result is not None
                head = task.walks[0]
                before: List[str] = []
                if head.resync:
                    if carried is None:
                        return None
                    start = result.first.first
                    if start is None and head.stop is None:
                        start = head.end  # the walk ran to the section's end: the rest is one gap
                    if start is not None:
                        if start < carried.cont:
                            return None  # this part began inside a container the walk had not left
                        if head.kind == WALK_REGISTERED and carried.gap_check and carried.cont < start:
                            message = fatbin.gap_error(mm, head.section, carried.cont, start)
                            if message:
                                before.append(message)
                errors.append(before + list(result.summary.errors))
                tail = task.walks[-1]
                if tail.stop is None:
                    carried = None
                elif not (len(task.walks) == 1 and head.resync and result.first.first is None):
                    carried = result.last  # a part with no container leaves the walk where it was
    except (OSError, ValueError):
        return None
    merged = summary.merge([r.summary for r in results if r is not None], [e for part in errors for e in part], size)
    over = (
        merged.containers >= MAX_CONTAINERS
        or merged.entries >= MAX_ENTRIES
        or len(merged.errors) >= MAX_ERRORS
        or sum(r.decompressed for r in results if r is not None) > MAX_DECOMPRESSED_FILE
    )
    return None if over else merged
