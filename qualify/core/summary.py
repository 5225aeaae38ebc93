"""What the census keeps of a file once it has been read.

A FileScan holds every container and entry (cuFFT: 24k of each); judging a
target and writing the JSON need far less: the units to judge, the distinct
(kind, arch, variant) keys, and counts. `summarize` computes that where the
file was read, so a worker process hands back a few hundred small records
instead of tens of thousands of objects (pickling cuFFT's FileScan costs
more than reading the file). Everything here is independent of the target:
one summary is judged for any number of targets.

Standard library only, Python 3.9 compatible (runs inside images).
"""

from __future__ import annotations

import functools

from qualify.core import fatbin_model, kernels, ptxisa
from qualify.core.arch import CodeKind, CodeTarget, Compat, Variant, compatibility, compatibility_variant_unknown
from qualify.core.record import record

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: typing is not imported at run time (the census's start-up)
    from typing import Dict, FrozenSet, List, Optional, Tuple
    EntryKey = Tuple[int, int, Variant]  # (kind code, arch number, variant): a dozen distinct per library
    IsaKey = Tuple[int, Variant, str]  # a PTX entry's (arch number, variant, ISA or ptxisa.UNKNOWN)

ROLE_REGISTERED = "registered"
ROLE_EMBEDDED = "embedded"
ROLE_RELOCATABLE = "relocatable"

COMPRESSIONS = ("none", "lz4", "zstd", "unknown")
STUBS = (fatbin_model.STUB_YES, fatbin_model.STUB_NO, fatbin_model.STUB_UNKNOWN)
EXCLUSIONS = ("link_stub", "relocatable", "no_driver_code", "no_kernel")
_ONLY_STUBS = {fatbin_model.STUB_YES}
_EMPTY = frozenset()
_PTX = fatbin_model.KIND_PTX



def role(container: fatbin_model.Container) -> str:
    if container.relocatable:
        return ROLE_RELOCATABLE
    return ROLE_REGISTERED if container.registered else ROLE_EMBEDDED


def targets_of(keys: FrozenSet[EntryKey]) -> List[CodeTarget]:
    found = (fatbin_model.code_target_of(*key) for key in keys)
    return [t for t in found if t is not None]


def _target_key(t: CodeTarget) -> Tuple[int, str]:
    return (t.capability.number, t.variant.value)


def kind_names(targets: List[CodeTarget], kind: CodeKind) -> List[str]:
    return [str(t) for t in sorted({t for t in targets if t.kind is kind}, key=_target_key)]


def isa_names(isas: FrozenSet[IsaKey]) -> Dict[str, List[str]]:
    """{"compute_80": ["9.0"], ...}: each PTX target's ISA versions (ptxisa.UNKNOWN last), by capability."""
    out: Dict[Tuple[int, str], Tuple[str, set]] = {}
    for number, variant, isa in isas:
        target = fatbin_model.code_target_of(_PTX, number, variant)
        if target is not None:
            out.setdefault(_target_key(target), (str(target), set()))[1].add(isa)
    return {name: sorted(found, key=ptxisa.sort_key) for _, (name, found) in sorted(out.items())}


@record(frozen=True)
class Unit:
    """What is judged as one: a registered container, or an embedded section."""

    section: str
    offset: Optional[int]  # None for an embedded section judged as a whole
    containers: int
    keys: FrozenSet[EntryKey]
    unsure: FrozenSet[Tuple[int, int]]  # (kind, arch) whose a/f variant could not be read
    damaged: bool  # a container read only in part: its missing entries may be anything
    holds_kernels: bool  # some container is known to hold a kernel (not merely unknown)
    isas: FrozenSet[IsaKey] = _EMPTY  # its PTX entries' ISA versions (issue 51)

    def ptx_isas(self, code: CodeTarget) -> FrozenSet[str]:
        """The ISA versions of the unit's PTX entries for `code` (a compute_XY of the unit)."""
        number, variant = code.capability.number, code.variant
        return frozenset(isa for n, v, isa in self.isas if n == number and v is variant)

    def targets(self) -> List[CodeTarget]:
        """The distinct SASS and PTX targets of the unit."""
        return targets_of(self.keys)

    def classes(self, target) -> List[Compat]:
        """The class of each distinct target, UNKNOWN where the bytes that
        decide could not be read."""
        out = []
        for t in self.targets():
            kind = fatbin_model.KIND_CUBIN if t.kind is CodeKind.SASS else fatbin_model.KIND_PTX
            if (kind, t.capability.number) in self.unsure:
                out.append(compatibility_variant_unknown(t, target))
            else:
                out.append(compatibility(t, target))
        if self.damaged:
            out.append(Compat.UNKNOWN)
        return out

    def to_json(self) -> dict:
        targets = self.targets()
        return {
            "section": self.section,
            "offset": self.offset,
            "containers": self.containers,
            "sass": kind_names(targets, CodeKind.SASS),
            "ptx": kind_names(targets, CodeKind.PTX),
        }


@record(frozen=True)
class SectionSummary:
    name: str
    containers: int
    role: str
    keys: FrozenSet[EntryKey]

    def to_json(self) -> dict:
        targets = targets_of(self.keys)
        return {
            "containers": self.containers,
            "role": self.role,
            "sass": kind_names(targets, CodeKind.SASS),
            "ptx": kind_names(targets, CodeKind.PTX),
        }


@record(frozen=True)
class FileSummary:
    """One file as the census sees it."""

    path: str
    format: str
    size: int
    errors: Tuple[str, ...]
    unreadable: bool
    containers: int
    entries: int
    keys: FrozenSet[EntryKey]
    compression: Tuple[Tuple[str, int], ...]  # entries, in COMPRESSIONS order
    link_stubs: Tuple[Tuple[str, int], ...]  # containers, in STUBS order
    sections: Tuple[SectionSummary, ...]  # in file order
    units: Tuple[Unit, ...]  # in file order
    excluded: Tuple[Tuple[str, int], ...]  # containers left out of judging, in EXCLUSIONS order
    details: Optional[Tuple[dict, ...]] = None  # every container's JSON (summarize(detail=True))
    archive: Optional[Tuple[int, int]] = None  # a static archive: (members, members with device code)
    isas: FrozenSet[IsaKey] = _EMPTY  # the ISA of each loadable PTX entry (relocatable ones are never loaded)

    @property
    def ok(self) -> bool:
        return not self.errors


def summarize(scan: fatbin_model.FileScan, detail: bool = False) -> FileSummary:
    """One pass over the containers (cuFFT has 24k): counts, keys per
    section, and the units to judge."""
    compression = dict.fromkeys(COMPRESSIONS, 0)
    stubs = dict.fromkeys(STUBS, 0)
    acc = _Units()
    entries = 0
    sections: Dict[str, _Section] = {}
    all_isas: set = set()
    for c in scan.containers:
        ents = c.entries
        entries += len(ents)
        unsure = None  # (kind, arch) whose a/f variant could not be read: standalone cubins only
        isas = None  # its PTX entries' (arch, variant, ISA)
        if len(ents) == 1:  # most containers (cuFFT: 24k of 24k): the same as below, fewer steps
            e = ents[0]
            stub = e.link_stub
            compression[e.compression] += 1
            keys = {(e.kind_code, e.arch_number, e.variant)}
            if not e.variant_known:
                unsure = {(e.kind_code, e.arch_number)}
            if e.kind_code == _PTX:
                isas = {(e.arch_number, e.variant, e.ptx_isa or ptxisa.UNKNOWN)}
        else:
            keys = set()
            statuses = set()
            for e in ents:
                compression[e.compression] += 1
                keys.add((e.kind_code, e.arch_number, e.variant))
                statuses.add(e.link_stub)
                if not e.variant_known:
                    unsure = unsure or set()
                    unsure.add((e.kind_code, e.arch_number))
                if e.kind_code == _PTX:
                    isas = isas or set()
                    isas.add((e.arch_number, e.variant, e.ptx_isa or ptxisa.UNKNOWN))
            # as Container.link_stub: a stub only if all entries are, code if any is
            if statuses == _ONLY_STUBS:
                stub = fatbin_model.STUB_YES
            else:
                stub = fatbin_model.STUB_NO if fatbin_model.STUB_NO in statuses else fatbin_model.STUB_UNKNOWN
        stubs[stub] += 1
        sec = sections.get(c.section)
        if sec is None:
            sec = sections[c.section] = _Section(c.section, role(c))
        sec.count += 1
        sec.keys |= keys
        if isas and sec.role != ROLE_RELOCATABLE:
            all_isas |= isas
        acc.add(c, sec.role, stub, keys, unsure, isas)
    units, excluded = acc.result()
    return FileSummary(
        path=scan.path,
        format=scan.format,
        size=scan.size,
        errors=tuple(scan.errors),
        unreadable=scan.unreadable,
        containers=len(scan.containers),
        entries=entries,
        keys=frozenset(k for sec in sections.values() for k in sec.keys),
        compression=tuple(compression.items()),
        link_stubs=tuple(stubs.items()),
        sections=tuple(SectionSummary(sec.name, sec.count, sec.role, frozenset(sec.keys)) for sec in sections.values()),
        units=tuple(units),
        excluded=tuple((k, excluded[k]) for k in EXCLUSIONS),
        details=tuple(c.to_json() for c in scan.containers) if detail else None,
        archive=scan.archive,
        isas=frozenset(all_isas),
    )


def merge(parts: List[FileSummary], errors: List[str], size: int) -> FileSummary:
    """One file's summary from the summaries of its parts, in file order
    (core/parts.py). An embedded section cut into parts is still one unit,
    placed where its first container is; `errors` are the parts' errors with
    those found while joining them."""
    first = parts[0]
    sections: Dict[str, _Section] = {}
    order: List[object] = []
    pools: Dict[str, _Pool] = {}
    for part in parts:
        for sec in part.sections:
            acc = sections.get(sec.name)
            if acc is None:
                acc = sections[sec.name] = _Section(sec.name, sec.role)
            acc.count += sec.containers
            acc.keys |= sec.keys
        for unit in part.units:
            if unit.offset is not None:
                order.append(unit)
                continue
            pool = pools.get(unit.section)
            if pool is None:
                pool = pools[unit.section] = _Pool(unit.section)
                order.append(pool)
            pool.add(unit.containers, unit.keys, unit.unsure, unit.damaged, unit.holds_kernels, unit.isas)
    return FileSummary(
        path=first.path,
        format=first.format,
        size=size,
        errors=tuple(errors),
        unreadable=False,
        containers=sum(p.containers for p in parts),
        entries=sum(p.entries for p in parts),
        keys=frozenset(k for p in parts for k in p.keys),
        compression=_sum_counts([p.compression for p in parts]),
        link_stubs=_sum_counts([p.link_stubs for p in parts]),
        sections=tuple(SectionSummary(sec.name, sec.count, sec.role, frozenset(sec.keys)) for sec in sections.values()),
        units=tuple(u.unit() if isinstance(u, _Pool) else u for u in order),
        excluded=_sum_counts([p.excluded for p in parts]),
        details=tuple(d for p in parts for d in (p.details or ())) if first.details is not None else None,
        isas=frozenset(k for p in parts for k in p.isas),
    )


def _sum_counts(counts: List[Tuple[Tuple[str, int], ...]]) -> Tuple[Tuple[str, int], ...]:
    total: Dict[str, int] = {}
    for pairs in counts:
        for key, n in pairs:
            total[key] = total.get(key, 0) + n
    return tuple(total.items())


class _Section:
    def __init__(self, name: str, role: str) -> None:
        self.name, self.role, self.count, self.keys = name, role, 0, set()


class _Pool:
    """An embedded section's containers, gathered into one unit."""

    def __init__(self, section: str) -> None:
        self.section, self.count, self.keys, self.unsure, self.isas = section, 0, set(), set(), set()
        self.damaged = self.holds_kernels = False

    def add(self, count: int, keys: set, unsure: set, damaged: bool, holds_kernels: bool, isas=None) -> None:
        """Containers of the section: one as read, or a part's whole unit (merge)."""
        self.count += count
        self.keys |= keys
        self.unsure |= unsure
        if isas:
            self.isas |= isas
        self.damaged = self.damaged or damaged
        self.holds_kernels = self.holds_kernels or holds_kernels

    def unit(self) -> Unit:
        keys, unsure = frozenset(self.keys), frozenset(self.unsure)
        return Unit(self.section, None, self.count, keys, unsure, self.damaged, self.holds_kernels,
                    frozenset(self.isas) if self.isas else _EMPTY)


@functools.cache
def _loadable(key: EntryKey) -> bool:
    return fatbin_model.code_target_of(*key) is not None


class _Units:
    """The units to judge, in file order, and how many containers were left out and why."""

    def __init__(self) -> None:
        self.excluded = dict.fromkeys(EXCLUSIONS, 0)
        self.order: List[object] = []  # Unit or _Pool, in file order
        self.pools: Dict[str, _Pool] = {}
        self.interned: Dict[FrozenSet[EntryKey], FrozenSet[EntryKey]] = {}  # thousands of units, a dozen key sets
        self.interned_isas: Dict[FrozenSet[IsaKey], FrozenSet[IsaKey]] = {}

    def add(self, c: fatbin_model.Container, r: str, stub: str, keys: set, unsure: Optional[set],
            isas: Optional[set] = None) -> None:
        excluded = self.excluded
        if r == ROLE_RELOCATABLE:
            excluded["relocatable"] += 1
        elif stub == fatbin_model.STUB_YES:
            excluded["link_stub"] += 1
        elif c.error is None and not any(map(_loadable, keys)):
            excluded["no_driver_code"] += 1  # a damaged one is judged: its lost entries may be code
        elif c.kernels == kernels.KERNELS_NO:
            excluded["no_kernel"] += 1  # read whole: nothing to launch, nothing to miss
        elif r == ROLE_REGISTERED:
            frozen = frozenset(keys)
            frozen = self.interned.setdefault(frozen, frozen)
            holds = c.kernels == kernels.KERNELS_YES
            found = _EMPTY
            if isas:
                found = frozenset(isas)
                found = self.interned_isas.setdefault(found, found)
            self.order.append(Unit(c.section, c.offset, 1, frozen, frozenset(unsure) if unsure else _EMPTY,
                                   c.error is not None, holds, found))
        else:
            pool = self.pools.get(c.section)
            if pool is None:
                pool = self.pools[c.section] = _Pool(c.section)
                self.order.append(pool)
            pool.add(1, keys, unsure or _EMPTY, c.error is not None, c.kernels == kernels.KERNELS_YES, isas)

    def result(self) -> Tuple[List[Unit], Dict[str, int]]:
        return [u.unit() if isinstance(u, _Pool) else u for u in self.order], self.excluded
