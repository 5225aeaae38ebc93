"""Census of compiled GPU architectures: which code each library carries, and
whether that code can run on a target capability.

Public API:

    scan(paths, target: Optional[Capability] = None, detail=False, embedded=True) -> CensusReport
    CensusReport.for_target(target) -> CensusReport   (re-judge, no re-read)
    CensusReport.to_json() -> dict
    iter_files(paths) -> Iterator[Tuple[str, bool]]   ((path, given explicitly))
    judge(file: summary.FileSummary, target: Capability) -> TargetVerdict
    summary.summarize(fatbin.read_file(path, embedded=True)) -> summary.FileSummary   (one file, never raises)

How a library is judged for a target (arch.compatibility and arch.best do
every architecture decision):

- A unit's class is the best class of its SASS and PTX entries (LTO IR and
  unknown kinds are not code the driver loads, so they do not count).
- Each container registered with the CUDA runtime (`.nv_fatbin`, or a
  standalone cubin/fatbin) is one unit: roughly one compiled source file,
  and each must have code for the device or its kernels fail to launch.
- Containers a library embeds elsewhere (cuFFT's `.ldata`, cuBLASLt's
  `.cask_resource`) are kernel databases from which the library picks what
  fits the device, so all containers of one such section form one unit.
- Not judged: nvlink device-link stubs (they hold no kernels), relocatable
  containers in `__nv_relfatbin` (inputs to device linking, never loaded),
  and containers holding no SASS or PTX. A compressed stub cannot be
  recognised without decompressing it, so it is judged like code; its
  architectures are those of the real code next to it.
- The library's class is the WORST class among its units: it is fully
  runnable only if every unit is. With no unit to judge it is null. The
  best class is reported too: NVIDIA's own libraries (cuBLASLt, cuDNN,
  NCCL) register hundreds of single-architecture containers (sm_90a-only,
  sm_100f-only) that they launch only on that architecture, so their worst
  class is `none` on any other device while their best shows they run.
- `cross_generation_jit` is set when a unit can only run by JIT-compiling
  PTX from an older major (e.g. compute_80 on 12.1): a performance defect.
- `ptx_jit` counts the units that run on the target only by JIT, by the PTX
  ISA the driver must compile (`core/ptxisa.py`: the `.version` the PTX
  opens with; `unknown` where it could not be read): a driver older than
  that ISA fails them at the first launch (issue 51).

JSON (`CensusReport.to_json()`; JSON Schema: manifests/inspect.schema.json).
Serialise it with sorted keys (fsutil.canonical_json, or json.dumps with
sort_keys=True as the CLI does); libraries are ordered by path, containers
and no-code units by file offset, architecture lists by capability:

    {
      "schema_version": 1,
      "target": "12.1" | null,
      "paths": ["<path as given>", ...],
      "files_scanned": <int>,             # walked ELF/fatbin files and explicit paths examined
      "embedded_searched": bool,          # false: .nv_fatbin only (scan(..., embedded=False))
      "without_device_code": ["<path>", ...],  # ELF files with no fatbin (walks only)
      "libraries": [
        {
          "path": "<path>", "format": "elf" | "cubin" | "fatbin" | "unknown",
          "size": <bytes>,
          "errors": ["<reason>", ...],    # empty when the file parsed cleanly
          "containers": <int>, "entries": <int>,
          "sass": ["sm_100", "sm_120a", ...], "ptx": ["compute_121", ...],
          "lto_ir": ["lto_75", ...], "other_kinds": ["kind9_100", ...],
          "compression": {"none": n, "lz4": n, "zstd": n, "unknown": n},  # entries
          "link_stubs": {"yes": n, "no": n, "unknown": n},              # containers
          "ptx_isa": {"compute_80": ["9.0"], ...},  # each loadable PTX entry's `.version` ("unknown": unread)
          "sections": {"<section>": {"containers": n, "role": "registered" |
                       "embedded" | "relocatable", "sass": [...], "ptx": [...]}},
          "verdict": null | {
            "target": "12.1",
            "class": "native" | "compatible" | "ptx-jit" | "none" | null,   # worst unit
            "best": <same values>,            # best unit: does anything run at all
            "counts": {"native": n, "compatible": n, "ptx-jit": n, "none": n},
            "cross_generation_jit": bool,
            "units": <int>,               # units judged
            "excluded": {"link_stub": n, "relocatable": n, "no_driver_code": n},
            "no_code": [{"section": s, "offset": <int> | null, "containers": n,
                         "sass": [...], "ptx": [...]}],
            "ptx_jit": {"units": n, "isa": {"9.0": n, "unknown": n}}  # units run only by JIT, by ISA
          },
          "details": [<container>, ...]   # only with detail=True: fatbin_model.Container.to_json()
        }
      ]
    }

Standard library only, Python 3.9 compatible (runs inside images).
"""

from __future__ import annotations

import contextlib
import gc
import os
import stat

from qualify.core import fatbin, fatbin_model, kernels, ptxisa, summary
from qualify.core.arch import (
    Capability,
    CodeKind,
    Compat,
    best,
    compatibility,
    is_cross_generation,
)
from qualify.core.errors import internal_error
from qualify.core.record import field, record

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: typing is not imported at run time (the census's start-up)
    from typing import Dict, Iterator, List, Optional, Sequence, Tuple

SCHEMA_VERSION = 1

# With two or three workers whole files already keep them busy, and cutting
# costs ~5% more CPU (each part maps the file, searches for its first
# container, and keeps its own remembered answers): cut from four on.
CUT_FROM_JOBS = 4

# Re-exported: the JSON's section roles and the units judged live with the summary.
ROLE_REGISTERED = summary.ROLE_REGISTERED
ROLE_EMBEDDED = summary.ROLE_EMBEDDED
ROLE_RELOCATABLE = summary.ROLE_RELOCATABLE
Unit = summary.Unit

_CLASSES = [Compat.NATIVE, Compat.COMPATIBLE, Compat.PTX_JIT, Compat.UNKNOWN, Compat.NONE]


# --- judging ------------------------------------------------------------------


@record
class TargetVerdict:
    target: Capability
    klass: Optional[Compat]  # the worst unit: what the library as a whole can promise
    best: Optional[Compat]  # the best unit: whether anything at all runs
    counts: Dict[Compat, int]
    cross_generation_jit: bool
    units: int
    excluded: Dict[str, int]
    no_code: List[Unit]  # no code for the target, and known to hold kernels: gaps
    no_code_unknown: List[Unit] = field(default_factory=list)  # no code for the target; kernels could not be read
    # Units that run on the target only by PTX JIT, by the PTX ISA the driver must compile (issue 51)
    jit_isa: Dict[str, int] = field(default_factory=dict)

    def to_json(self) -> dict:
        return {
            "target": str(self.target),
            "class": self.klass.value if self.klass else None,
            "best": self.best.value if self.best else None,
            "counts": {c.value: self.counts.get(c, 0) for c in _CLASSES},
            "cross_generation_jit": self.cross_generation_jit,
            "units": self.units,
            "excluded": dict(self.excluded),
            "no_code": [u.to_json() for u in self.no_code],
            "no_code_unknown": [u.to_json() for u in self.no_code_unknown],
            "ptx_jit": {"units": sum(self.jit_isa.values()),
                        "isa": {isa: self.jit_isa[isa] for isa in sorted(self.jit_isa, key=ptxisa.sort_key)}},
        }


def unit_class(unit: Unit, target: Capability) -> Compat:
    """The best class of the unit's code. `none` only when a container is known
    to hold a kernel: a unit whose kernels could not be looked for (compressed,
    no decoder) may be an empty stub, so it is `unknown`, never `none`."""
    klass = best(unit.classes(target))
    if klass is Compat.NONE and not unit.holds_kernels:
        return Compat.UNKNOWN
    return klass


def needs_cross_generation_jit(unit: Unit, target: Capability) -> bool:
    """Runs only through PTX from an older major: the driver JITs the newest
    PTX that fits, so this holds when no runnable PTX is of the target's major."""
    if unit_class(unit, target) is not Compat.PTX_JIT:
        return False
    runnable = [t for t in unit.targets() if compatibility(t, target) is Compat.PTX_JIT]
    return all(is_cross_generation(t, target) for t in runnable)


def jit_isa(unit: Unit, target: Capability) -> str:
    """The PTX ISA a driver must JIT-compile for a unit that runs on `target` only through PTX: the newest
    among the PTX entries it could pick (a unit's PTX comes from one nvcc run, so they agree), UNKNOWN when
    any of them could not be read: an ISA is never assumed."""
    found = set()
    for t in unit.targets():
        if t.kind is CodeKind.PTX and compatibility(t, target) is Compat.PTX_JIT:
            found |= unit.ptx_isas(t)
    if not found or ptxisa.UNKNOWN in found:
        return ptxisa.UNKNOWN
    return max(found, key=ptxisa.key)


def judge(file: summary.FileSummary, target: Capability) -> TargetVerdict:
    """The verdict for `target` (`summary.summarize(fatbin.read_file(path))`).

    Per unit, `unit_class` (a unit with no code for the target whose kernels could not be looked for is
    `unknown`: it may be an empty stub). For the library, `best` is what its code alone allows: when no
    unit has code that can run on the target, nothing in the library runs there, whatever its containers
    hold, so it is `none`, never `unknown` (issue 29: `_flashmla_C`, sm_90a/sm_100f only, on 12.0)."""
    counts: Dict[Compat, int] = {}
    no_code: List[Unit] = []
    no_code_unknown: List[Unit] = []
    raw_classes = set()
    worst: Optional[Compat] = None
    cross = False
    jit: Dict[str, int] = {}
    for unit in file.units:
        raw = best(unit.classes(target))
        raw_classes.add(raw)
        klass = Compat.UNKNOWN if raw is Compat.NONE and not unit.holds_kernels else raw
        counts[klass] = counts.get(klass, 0) + 1
        if klass is Compat.NONE:
            no_code.append(unit)
        elif raw is Compat.NONE:
            no_code_unknown.append(unit)
        if worst is None or klass.rank > worst.rank:
            worst = klass
        if klass is Compat.PTX_JIT:
            isa = jit_isa(unit, target)
            jit[isa] = jit.get(isa, 0) + 1
        cross = cross or needs_cross_generation_jit(unit, target)
    top = best(raw_classes) if raw_classes else None
    return TargetVerdict(target, worst, top, counts, cross, len(file.units), dict(file.excluded), no_code,
                         no_code_unknown, jit)


# --- per library ---------------------------------------------------------------


@record
class LibraryCensus:
    summary: summary.FileSummary
    verdict: Optional[TargetVerdict] = None

    @property
    def path(self) -> str:
        return self.summary.path

    def to_json(self, detail: bool = False) -> dict:
        file = self.summary
        # What the driver can load (registered and embedded containers); code kept only for device
        # linking (`__nv_relfatbin`) is reported apart: it is never loaded, so it is no JIT fallback.
        loaded = frozenset(k for sec in file.sections if sec.role != ROLE_RELOCATABLE for k in sec.keys)
        link_only = frozenset(k for sec in file.sections if sec.role == ROLE_RELOCATABLE for k in sec.keys)
        targets = summary.targets_of(loaded)
        linked = summary.targets_of(link_only)
        others = sorted(
            (number, variant.value, kind, variant)
            for kind, number, variant in file.keys
            if fatbin_model.code_target_of(kind, number, variant) is None
        )
        out = {
            "path": file.path,
            "format": file.format,
            "size": file.size,
            "errors": list(file.errors),
            "containers": file.containers,
            "entries": file.entries,
            "sass": summary.kind_names(targets, CodeKind.SASS),
            "ptx": summary.kind_names(targets, CodeKind.PTX),
            "lto_ir": [fatbin_model.entry_name(k, n, v) for n, _, k, v in others if k == fatbin_model.KIND_LTO_IR],
            "other_kinds": [fatbin_model.entry_name(k, n, v) for n, _, k, v in others if k != fatbin_model.KIND_LTO_IR],
            "compression": dict(file.compression),
            "link_stubs": dict(file.link_stubs),
            "link_only": {"sass": summary.kind_names(linked, CodeKind.SASS),
                          "ptx": summary.kind_names(linked, CodeKind.PTX)},
            "ptx_isa": summary.isa_names(file.isas),
            "sections": {sec.name: sec.to_json() for sec in file.sections},
            "verdict": self.verdict.to_json() if self.verdict else None,
        }
        if file.archive is not None:
            out["archive"] = {"members": file.archive[0], "with_device_code": file.archive[1], "read": False,
                              "note": "a static archive is a link input: its device code is linked into other "
                                      "binaries and never loaded, so its members are counted, not judged"}
        if detail:
            out["details"] = list(file.details or ())
        return out


@record
class CensusReport:
    paths: List[str]
    target: Optional[Capability]
    libraries: List[LibraryCensus]
    files_scanned: int = 0
    without_device_code: List[str] = field(default_factory=list)
    detail: bool = False
    embedded: bool = True  # data sections were searched for kernel databases

    def for_target(self, target: Optional[Capability]) -> CensusReport:
        """The same census judged for another target (files are not read again)."""
        libs = [LibraryCensus(lib.summary, judge(lib.summary, target) if target else None) for lib in self.libraries]
        return CensusReport(
            self.paths, target, libs, self.files_scanned, list(self.without_device_code), self.detail, self.embedded
        )

    @property
    def with_errors(self) -> List[LibraryCensus]:
        return [lib for lib in self.libraries if lib.summary.errors]

    @property
    def unreadable(self) -> List[LibraryCensus]:
        """Paths that could not be opened, listed or examined at all."""
        return [lib for lib in self.libraries if lib.summary.unreadable]

    def to_json(self) -> dict:
        return {
            "schema_version": SCHEMA_VERSION,
            "target": str(self.target) if self.target else None,
            "paths": list(self.paths),
            "files_scanned": self.files_scanned,
            "embedded_searched": self.embedded,
            "without_device_code": list(self.without_device_code),
            "unreadable": [lib.path for lib in self.unreadable],
            "libraries": [lib.to_json(self.detail) for lib in self.libraries],
        }



# --- walking -------------------------------------------------------------------


@record(frozen=True)
class Unreadable:
    """A path the walk could not read: a directory it could not list, or a
    file (or directory entry) it could not open or stat."""

    path: str
    reason: str
    directory: bool

    def scan(self) -> fatbin_model.FileScan:
        """As a census row, so every reader of the libraries sees the error."""
        what = "cannot list directory" if self.directory else "cannot read"
        return fatbin_model.FileScan(path=self.path, format="directory" if self.directory else "unknown", size=0,
                               errors=[f"{what}: {self.reason}"], unreadable=True)


def iter_files(paths: Sequence[str], unreadable: Optional[List[Unreadable]] = None) -> Iterator[Tuple[str, bool]]:
    """(path, explicit) for every regular file to consider, each real file once.

    Directories are walked recursively without following directory symlinks
    (no loops); file symlinks are followed, and a file reached twice (a
    symlinked soname, a path given twice) is read once, under its real path
    when a walk reaches it through both. Explicit paths are yielded even when
    they are not files, so that the caller records why they could not be read.
    Directories that cannot be listed and entries that cannot be examined
    are appended to `unreadable` (never dropped silently).
    """
    sink: List[Unreadable] = unreadable if unreadable is not None else []
    chosen: Dict[object, Tuple[str, bool]] = {}
    for path in paths:
        found = _walk(path, sink) if os.path.isdir(path) else [path]
        for candidate in found:
            key = _identity(candidate)
            explicit = candidate == path
            if key not in chosen or (not explicit and _prefer(candidate, chosen[key])):
                chosen[key] = (candidate, explicit)
    return iter(chosen.values())


def _identity(path: str) -> object:
    try:
        st = os.stat(path)
    except OSError:
        return ("missing", path)
    return (st.st_dev, st.st_ino)


def _prefer(candidate: str, current: Tuple[str, bool]) -> bool:
    """A walked real file replaces a walked symlink to it."""
    path, explicit = current
    return not explicit and os.path.islink(path) and not os.path.islink(candidate)


def _reason(exc: OSError) -> str:
    return exc.strerror or str(exc)


def _walk(root: str, unreadable: List[Unreadable]) -> Iterator[str]:
    def cannot_list(exc: OSError) -> None:
        unreadable.append(Unreadable(exc.filename or root, _reason(exc), True))

    for dirpath, dirnames, filenames in os.walk(root, onerror=cannot_list, followlinks=False):
        dirnames.sort()
        for name in sorted(filenames):
            full = os.path.join(dirpath, name)
            try:
                st = os.stat(full)
            except FileNotFoundError:
                continue  # dangling symlink or vanished file: nothing there to read
            except OSError as exc:  # permission denied on a directory without search permission, ...
                unreadable.append(Unreadable(full, _reason(exc), False))
                continue
            if stat.S_ISREG(st.st_mode):
                yield full


@record(frozen=True)
class ReadTask:
    """One file for a reader (in this process or a worker's)."""

    path: str
    explicit: bool
    embedded: bool
    decompress: bool
    detail: bool

    @property
    def cost(self) -> int:
        """The file's size: work is handed out largest first."""
        try:
            return os.stat(self.path).st_size
        except OSError:
            return 0


def read_one(task: ReadTask) -> Optional[summary.FileSummary]:
    """The summary of one file; None for a walked file that is neither ELF nor fatbin."""
    with collector_paused():
        return _read_one(task)


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """No cyclic garbage collection while one file is read: reading cuFFT
    makes ~100k objects, none of them in a cycle, and the collector's passes
    over them measured 3-5% of the census. What a file leaves behind is
    collected afterwards, and a file's objects are bounded by the reader's
    own limits (MAX_CONTAINERS, MAX_ENTRIES)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _read_one(task: ReadTask) -> Optional[summary.FileSummary]:
    if not task.explicit:
        try:
            kind = fatbin.sniff_strict(task.path)
        except OSError as exc:  # an unreadable file is reported, not skipped
            return summary.summarize(Unreadable(task.path, _reason(exc), False).scan())
        if kind is None:
            return None
    return summary.summarize(fatbin.read_file(task.path, task.embedded, task.decompress), task.detail)


def _read_all(tasks: List[ReadTask], jobs: int) -> List[Optional[summary.FileSummary]]:
    """Every file's summary; with jobs > 1, large files are cut into parts
    (core/parts.py) so that no one file holds up the rest."""
    cut = jobs >= CUT_FROM_JOBS
    if jobs <= 1 or not tasks or (len(tasks) == 1 and not cut):
        # In this process, and the worker and part machinery not even imported: `inspect FILE` is run once per
        # library by scripts, so its start-up counts (nox -s bench-inventory prints it).
        return [_read_guarded(task) for task in tasks]
    from qualify.core import parts, workers

    work: List[object] = []
    spans: List[Tuple[int, int]] = []  # per task: where its items are in `work`
    for task in tasks:
        pieces = parts.plan(task.path, task.embedded, task.decompress, task.detail) if cut else None
        spans.append((len(work), len(pieces) if pieces else 0))
        work.extend(pieces if pieces else [task])
    if tasks[0].decompress and len(work) > 1:
        kernels.load_decoders()  # before the workers fork: each would import them again
    done = workers.run_all(_read_item, work, jobs, _cost, _item_crashed)
    out: List[Optional[summary.FileSummary]] = []
    for task, (at, count) in zip(tasks, spans):
        if not count:
            out.append(done[at])  # type: ignore[arg-type]
            continue
        joined = parts.join(work[at : at + count], done[at : at + count], task.cost)  # type: ignore[arg-type]
        # Parts that do not join up exactly (or a worker that died): read the file whole, in a process of its own.
        out.append(joined if joined is not None else workers.run_alone(read_one, task, _crashed))
    return out


def _read_guarded(task: ReadTask) -> Optional[summary.FileSummary]:
    """read_one in this process, never raising (as workers.run_all's in-process path)."""
    try:
        return read_one(task)
    except Exception as exc:  # a bug must not end the census: the file gets an error row
        return _crashed(task, internal_error(exc))


def _read_item(item: object):
    if isinstance(item, ReadTask):
        return read_one(item)
    from qualify.core import parts

    with collector_paused():
        return parts.read_part(item)  # type: ignore[arg-type]


def _cost(item) -> int:
    return item.cost  # ReadTask or parts.PartTask


def _item_crashed(item: object, reason: str):
    return _crashed(item, reason) if isinstance(item, ReadTask) else None  # a part: its file is read whole


def _crashed(task: ReadTask, reason: str) -> summary.FileSummary:
    return summary.summarize(fatbin_model.FileScan(path=task.path, format="unknown", size=task.cost, errors=[reason]))


def scan(
    paths: Sequence[str],
    target: Optional[Capability] = None,
    detail: bool = False,
    embedded: bool = True,
    decompress: bool = True,
    jobs: int = 1,
) -> CensusReport:
    """Census of every ELF, cubin and fatbin file under `paths`. Never raises on
    bad files: each problem is an error string on that file's record.

    Files given explicitly are always reported; files found by walking a
    directory are reported when they carry device code or could not be read,
    and counted in `without_device_code` when they are ELF files with none
    (a static archive with device code is reported, as a link input).
    embedded=False reads `.nv_fatbin` only (see fatbin.read_file): faster,
    and blind to kernel databases such as cuFFT's. decompress=False looks
    into no compressed container (as in an image without the decoders).
    Paths that cannot be read are rows with an error too, and are listed in
    `unreadable`. jobs > 1 reads files in that many worker processes
    (core/workers.py); the report is the same.
    """
    libraries: List[LibraryCensus] = []
    without: List[str] = []
    walk_errors: List[Unreadable] = []
    tasks = [ReadTask(path, explicit, embedded, decompress, detail) for path, explicit in iter_files(list(paths), walk_errors)]
    results = _read_all(tasks, jobs)
    scanned = 0
    for task, result in zip(tasks, results):
        if result is None:
            continue
        scanned += 1
        if result.containers or result.errors or task.explicit or (result.archive and result.archive[1]):
            libraries.append(LibraryCensus(result))
        else:
            without.append(task.path)
    libraries += [LibraryCensus(summary.summarize(u.scan())) for u in walk_errors]
    libraries.sort(key=lambda lib: lib.path)
    report = CensusReport([str(p) for p in paths], None, libraries, scanned, sorted(without), detail, embedded)
    return report.for_target(target) if target else report
