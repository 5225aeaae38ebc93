"""Census of compiled GPU architectures: which code each library carries, and
whether that code can run on a target capability.

Public API:

    scan(paths, target: Optional[Capability] = None, detail=False, embedded=True) -> CensusReport
    CensusReport.for_target(target) -> CensusReport   (re-judge, no re-read)
    CensusReport.to_json() -> dict
    iter_files(paths) -> Iterator[Tuple[str, bool]]   ((path, given explicitly))
    judge(scan: fatbin_model.FileScan, target: Capability) -> TargetVerdict
    fatbin.read_file(path, embedded=True) -> fatbin_model.FileScan   (one file, never raises)

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
                         "sass": [...], "ptx": [...]}]
          },
          "details": [<container>, ...]   # only with detail=True: fatbin_model.Container.to_json()
        }
      ]
    }

Standard library only, Python 3.9 compatible (runs inside images).
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field
from typing import Dict, Iterable, Iterator, List, Optional, Sequence, Set, Tuple

from qualify.core import fatbin, fatbin_model, kernels
from qualify.core.arch import (
    Capability,
    CodeKind,
    CodeTarget,
    Compat,
    Variant,
    best,
    compatibility,
    compatibility_variant_unknown,
    is_cross_generation,
)

SCHEMA_VERSION = 1

ROLE_REGISTERED = "registered"
ROLE_EMBEDDED = "embedded"
ROLE_RELOCATABLE = "relocatable"

_CLASSES = [Compat.NATIVE, Compat.COMPATIBLE, Compat.PTX_JIT, Compat.UNKNOWN, Compat.NONE]
_COMPRESSIONS = ("none", "lz4", "zstd", "unknown")
_STUBS = (fatbin_model.STUB_YES, fatbin_model.STUB_NO, fatbin_model.STUB_UNKNOWN)


def role(container: fatbin_model.Container) -> str:
    if container.relocatable:
        return ROLE_RELOCATABLE
    return ROLE_REGISTERED if container.registered else ROLE_EMBEDDED


def _target_key(t: CodeTarget) -> Tuple[int, str]:
    return (t.capability.number, t.variant.value)


def _names(targets: Iterable[CodeTarget]) -> List[str]:
    return [str(t) for t in sorted(set(targets), key=_target_key)]


def _entry_keys(containers: Iterable[fatbin_model.Container]) -> Set[Tuple[int, int, Variant]]:
    """Distinct (kind, arch, variant) of the entries: tens of thousands of
    entries in a library, a dozen distinct keys."""
    return {(e.kind_code, e.arch_number, e.variant) for c in containers for e in c.entries}


def _targets_of(keys: Iterable[Tuple[int, int, Variant]]) -> List[CodeTarget]:
    found = (fatbin_model.code_target_of(*key) for key in keys)
    return [t for t in found if t is not None]


def _kind_names(targets: Iterable[CodeTarget], kind: CodeKind) -> List[str]:
    return _names(t for t in targets if t.kind is kind)


# --- judging ------------------------------------------------------------------


@dataclass
class Unit:
    """What is judged as one: a registered container, or an embedded section."""

    section: str
    offset: Optional[int]  # None for an embedded section judged as a whole
    containers: List[fatbin_model.Container]

    def targets(self) -> List[CodeTarget]:
        """The distinct SASS and PTX targets of the unit."""
        return _targets_of(_entry_keys(self.containers))

    def classes(self, target: Capability) -> List[Compat]:
        """The class of each distinct target, UNKNOWN where the bytes that
        decide could not be read: a cubin whose a/f note is damaged, or a
        container read only in part (its missing entries may be anything)."""
        unsure = {(e.kind_code, e.arch_number) for c in self.containers for e in c.entries if not e.variant_known}
        out = []
        for t in self.targets():
            if (fatbin_model.KIND_CUBIN if t.kind is CodeKind.SASS else fatbin_model.KIND_PTX, t.capability.number) in unsure:
                out.append(compatibility_variant_unknown(t, target))
            else:
                out.append(compatibility(t, target))
        if any(c.damaged for c in self.containers):
            out.append(Compat.UNKNOWN)
        return out

    @property
    def holds_kernels(self) -> bool:
        """Some container is known to hold a kernel (not merely unknown)."""
        return any(c.kernels == kernels.KERNELS_YES for c in self.containers)

    def to_json(self) -> dict:
        targets = self.targets()
        return {
            "section": self.section,
            "offset": self.offset,
            "containers": len(self.containers),
            "sass": _kind_names(targets, CodeKind.SASS),
            "ptx": _kind_names(targets, CodeKind.PTX),
        }


@dataclass
class TargetVerdict:
    target: Capability
    klass: Optional[Compat]  # the worst unit: what the library as a whole can promise
    best: Optional[Compat]  # the best unit: whether anything at all runs
    counts: Dict[Compat, int]
    cross_generation_jit: bool
    units: int
    excluded: Dict[str, int]
    no_code: List[Unit]

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
        }


def units(scan: fatbin_model.FileScan) -> Tuple[List[Unit], Dict[str, int]]:
    """The units to judge, in file order, and how many containers were left out and why."""
    excluded = {"link_stub": 0, "relocatable": 0, "no_driver_code": 0, "no_kernel": 0}
    out: List[Unit] = []
    pools: Dict[str, Unit] = {}
    for c in scan.containers:
        r = role(c)
        if r == ROLE_RELOCATABLE:
            excluded["relocatable"] += 1
        elif c.link_stub == fatbin_model.STUB_YES:
            excluded["link_stub"] += 1
        elif not c.damaged and not any(e.code_target is not None for e in c.entries):
            excluded["no_driver_code"] += 1  # a damaged one is judged: its lost entries may be code
        elif c.kernels == kernels.KERNELS_NO:
            excluded["no_kernel"] += 1  # read whole: nothing to launch, nothing to miss
        elif r == ROLE_REGISTERED:
            out.append(Unit(c.section, c.offset, [c]))
        elif c.section in pools:
            pools[c.section].containers.append(c)
        else:
            pools[c.section] = Unit(c.section, None, [c])
            out.append(pools[c.section])
    return out, excluded


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


def judge(scan: fatbin_model.FileScan, target: Capability) -> TargetVerdict:
    judged, excluded = units(scan)
    counts: Dict[Compat, int] = {}
    no_code: List[Unit] = []
    worst: Optional[Compat] = None
    cross = False
    for unit in judged:
        klass = unit_class(unit, target)
        counts[klass] = counts.get(klass, 0) + 1
        if klass is Compat.NONE:
            no_code.append(unit)
        if worst is None or klass.rank > worst.rank:
            worst = klass
        cross = cross or needs_cross_generation_jit(unit, target)
    top = best(counts) if counts else None
    return TargetVerdict(target, worst, top, counts, cross, len(judged), excluded, no_code)


# --- per library ---------------------------------------------------------------


@dataclass
class LibraryCensus:
    scan: fatbin_model.FileScan
    verdict: Optional[TargetVerdict] = None

    @property
    def path(self) -> str:
        return self.scan.path

    def sections(self) -> Dict[str, dict]:
        grouped: Dict[str, List[fatbin_model.Container]] = {}
        for c in self.scan.containers:
            grouped.setdefault(c.section, []).append(c)
        out = {}
        for name, containers in grouped.items():
            targets = _targets_of(_entry_keys(containers))
            out[name] = {
                "containers": len(containers),
                "role": role(containers[0]),
                "sass": _kind_names(targets, CodeKind.SASS),
                "ptx": _kind_names(targets, CodeKind.PTX),
            }
        return out

    def to_json(self, detail: bool = False) -> dict:
        keys = _entry_keys(self.scan.containers)
        targets = _targets_of(keys)
        others = sorted(
            (number, variant.value, kind, variant)
            for kind, number, variant in keys
            if fatbin_model.code_target_of(kind, number, variant) is None
        )
        compression = dict.fromkeys(_COMPRESSIONS, 0)
        stubs = dict.fromkeys(_STUBS, 0)
        entries = 0
        for c in self.scan.containers:
            entries += len(c.entries)
            stubs[c.link_stub] += 1
            for e in c.entries:
                compression[e.compression] += 1
        out = {
            "path": self.scan.path,
            "format": self.scan.format,
            "size": self.scan.size,
            "errors": list(self.scan.errors),
            "containers": len(self.scan.containers),
            "entries": entries,
            "sass": _kind_names(targets, CodeKind.SASS),
            "ptx": _kind_names(targets, CodeKind.PTX),
            "lto_ir": [fatbin_model.entry_name(k, n, v) for n, _, k, v in others if k == fatbin_model.KIND_LTO_IR],
            "other_kinds": [fatbin_model.entry_name(k, n, v) for n, _, k, v in others if k != fatbin_model.KIND_LTO_IR],
            "compression": compression,
            "link_stubs": stubs,
            "sections": self.sections(),
            "verdict": self.verdict.to_json() if self.verdict else None,
        }
        if detail:
            out["details"] = [c.to_json() for c in self.scan.containers]
        return out


@dataclass
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
        libs = [LibraryCensus(lib.scan, judge(lib.scan, target) if target else None) for lib in self.libraries]
        return CensusReport(
            self.paths, target, libs, self.files_scanned, list(self.without_device_code), self.detail, self.embedded
        )

    @property
    def with_errors(self) -> List[LibraryCensus]:
        return [lib for lib in self.libraries if lib.scan.errors]

    @property
    def unreadable(self) -> List[LibraryCensus]:
        """Paths that could not be opened, listed or examined at all."""
        return [lib for lib in self.libraries if lib.scan.unreadable]

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


@dataclass(frozen=True)
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


def _read_one(path: str, explicit: bool, embedded: bool, decompress: bool) -> Optional[fatbin_model.FileScan]:
    """The scan of one file; None for a walked file that is neither ELF nor fatbin."""
    if not explicit:
        try:
            kind = fatbin.sniff_strict(path)
        except OSError as exc:  # an unreadable file is reported, not skipped
            return Unreadable(path, _reason(exc), False).scan()
        if kind is None:
            return None
    return fatbin.read_file(path, embedded, decompress)


def scan(
    paths: Sequence[str],
    target: Optional[Capability] = None,
    detail: bool = False,
    embedded: bool = True,
    decompress: bool = True,
) -> CensusReport:
    """Census of every ELF, cubin and fatbin file under `paths`. Never raises on
    bad files: each problem is an error string on that file's record.

    Files given explicitly are always reported; files found by walking a
    directory are reported when they carry device code or could not be read,
    and counted in `without_device_code` when they are ELF files with none.
    embedded=False reads `.nv_fatbin` only (see fatbin.read_file): faster,
    and blind to kernel databases such as cuFFT's. decompress=False looks
    into no compressed container (as in an image without the decoders).
    Paths that cannot be read are rows with an error too, and are listed in
    `unreadable`.
    """
    libraries: List[LibraryCensus] = []
    without: List[str] = []
    walk_errors: List[Unreadable] = []
    scanned = 0
    for path, explicit in iter_files(list(paths), walk_errors):
        result = _read_one(path, explicit, embedded, decompress)
        if result is None:
            continue
        scanned += 1
        if result.containers or result.errors or explicit:
            libraries.append(LibraryCensus(result))
        else:
            without.append(path)
    libraries += [LibraryCensus(u.scan()) for u in walk_errors]
    libraries.sort(key=lambda lib: lib.path)
    report = CensusReport([str(p) for p in paths], None, libraries, scanned, sorted(without), detail, embedded)
    return report.for_target(target) if target else report
