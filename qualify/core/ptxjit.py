"""Which PTX ISA a host driver JIT-compiles, and whether that covers what an image needs (issue 51).

A driver's JIT compiler is the ptxas of its own CUDA release: it compiles PTX up to that release's ISA, and
newer PTX fails at the first launch with CUDA_ERROR_UNSUPPORTED_PTX_VERSION (222, "the provided PTX was
compiled with an unsupported toolchain"). Minor-version compatibility does not help: a CUDA 13.1 image runs on
an R580 driver, but PTX ISA 9.1 does not JIT there. The census records the ISA of each PTX entry
(core/ptxisa.py) and the manifest the newest one that code run here only by JIT needs
(`predicate.census.ptx_jit`, probe/census_check.py).

The table is data: images/targets.toml `[ptx_jit] floors` (ISA, the CUDA release that introduced it, that
release's oldest Linux driver), signed into each release's policy (`ptx_jit`, trust/policy.py); the deploy
compares only against the verified release's copy (deploy/ptxgate.py). This module holds the types and compares.

Standard library only, Python 3.9 compatible (core/: the image side may import it; nothing on the census path does).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence, Tuple

from qualify.core import ptxisa
from qualify.core.driver import DriverVersion


@dataclass(frozen=True)
class PtxJitFloor:
    """PTX ISA `isa` came with CUDA `cuda`, whose oldest Linux driver `driver` is the first to JIT it."""

    isa: str  # "9.0"
    cuda: str  # "13.0"
    driver: DriverVersion  # 580.65.06

    def as_json(self) -> dict:
        return {"isa": self.isa, "cuda": self.cuda, "driver": str(self.driver)}


def table_problem(floors: Sequence[PtxJitFloor]) -> Optional[str]:
    """Why a table cannot be used (an ISA twice, or a newer ISA with an older driver), or None."""
    ordered = sorted(floors, key=lambda f: ptxisa.key(f.isa))
    for before, after in zip(ordered, ordered[1:]):
        if before.isa == after.isa:
            return f"PTX ISA {after.isa} is named twice"
        if after.driver.parts < before.driver.parts:
            return (f"PTX ISA {after.isa} names driver {after.driver}, older than ISA {before.isa}'s {before.driver}: "
                    "a newer ISA needs a newer driver")
    return None


def ordered(floors: Sequence[PtxJitFloor]) -> Tuple[PtxJitFloor, ...]:
    return tuple(sorted(floors, key=lambda f: ptxisa.key(f.isa)))


def highest_for(floors: Sequence[PtxJitFloor], found: DriverVersion) -> Optional[PtxJitFloor]:
    """The row of the newest ISA that driver `found` JIT-compiles (None: older than every row's driver)."""
    best = None
    for row in ordered(floors):
        if row.driver.parts <= found.parts:
            best = row
    return best


def floor_for(floors: Sequence[PtxJitFloor], isa: str) -> Optional[PtxJitFloor]:
    """The oldest row that JIT-compiles ISA `isa` (its own, or the first newer one the table has); None when
    the ISA is newer than every row: the table cannot say which driver JITs it."""
    want = ptxisa.key(isa)
    return next((row for row in ordered(floors) if ptxisa.key(row.isa) >= want), None)


@dataclass(frozen=True)
class JitLibrary:
    library: str  # its path below the site-packages
    units: int  # units that run on the target only by PTX JIT
    isa: Tuple[Tuple[str, int], ...]  # (ISA or ptxisa.UNKNOWN, units)
    ptx: Tuple[str, ...]  # its PTX targets (compute_80)

    def describe(self) -> str:
        isas = "/".join(isa for isa, _ in self.isa)
        return f"{self.library} ({self.units} unit(s) of PTX {', '.join(self.ptx) or '?'}, ISA {isas})"


@dataclass(frozen=True)
class PtxNeeds:
    """A verified manifest's `predicate.census.ptx_jit`: the newest PTX ISA that code run on the target only by
    JIT needs, the units whose ISA could not be read, and the libraries. `recorded` is False for a manifest
    from before issue 51 (an older toolkit): nothing is known, which is said, never passed."""

    recorded: bool
    highest_isa: Optional[str] = None
    unknown_units: int = 0
    libraries: Tuple[JitLibrary, ...] = ()

    @property
    def needed(self) -> bool:
        return bool(self.libraries)

    def naming(self, isa: Optional[str] = None, limit: int = 4) -> str:
        """The libraries that need `isa` (all of them when None), for a message."""
        chosen = [x for x in self.libraries if isa is None or any(i == isa for i, _ in x.isa)]
        text = ", ".join(x.describe() for x in chosen[:limit])
        return text + (f" and {len(chosen) - limit} more" if len(chosen) > limit else "")

    @classmethod
    def of(cls, predicate: Mapping[str, Any], where: str = "predicate") -> PtxNeeds:
        """Read strictly: a section that is there but malformed raises ValueError naming the key."""
        census = predicate.get("census")
        section = census.get("ptx_jit") if isinstance(census, Mapping) else None
        if section is None:
            return cls(False)
        where = f"{where}.census.ptx_jit"
        if not isinstance(section, Mapping):
            raise ValueError(f"{where} is not an object")
        highest = section.get("highest_isa")
        unknown = section.get("unknown_units")
        libs = section.get("libraries")
        if highest is not None and not _is_isa(highest):
            raise ValueError(f"{where}.highest_isa {highest!r} is not a PTX ISA version")
        if not _count(unknown) or not isinstance(libs, list):
            raise ValueError(f"{where}: unknown_units must be a count and libraries a list")
        out = []
        for n, lib in enumerate(libs):
            at = f"{where}.libraries[{n}]"
            if not isinstance(lib, Mapping) or not isinstance(lib.get("library"), str) or not _count(lib.get("units")):
                raise ValueError(f"{at}: a library name and a unit count expected")
            isa = lib.get("isa")
            ptx = lib.get("ptx", [])
            if not isinstance(isa, Mapping) or not all(_is_isa(k) or k == ptxisa.UNKNOWN for k in isa) \
                    or not all(_count(v) for v in isa.values()):
                raise ValueError(f"{at}.isa: PTX ISA versions and unit counts expected")
            if not isinstance(ptx, list) or not all(isinstance(p, str) for p in ptx):
                raise ValueError(f"{at}.ptx: a list of PTX targets expected")
            out.append(JitLibrary(lib["library"], lib["units"], tuple((k, v) for k, v in isa.items()), tuple(ptx)))
        known = [isa for lib in out for isa, _ in lib.isa if isa != ptxisa.UNKNOWN]
        if known and (highest is None or ptxisa.key(highest) != max(ptxisa.key(i) for i in known)):
            raise ValueError(f"{where}.highest_isa {highest!r} is not the newest of its libraries' ISA versions")
        return cls(True, highest, unknown, tuple(out))


def _is_isa(value: Any) -> bool:
    if not isinstance(value, str):
        return False
    try:
        ptxisa.key(value)
    except ValueError:
        return False
    return True


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


@dataclass(frozen=True)
class Shortfall:
    """The host driver cannot JIT what the image needs: both numbers and the driver that would."""

    needed: str  # the ISA the image needs
    driver: DriverVersion  # this host's
    reaches: Optional[PtxJitFloor]  # the newest row this driver JITs (None: older than every row)
    floor: PtxJitFloor  # the oldest row that JITs the needed ISA

    def describe(self) -> str:
        reach = (f"JIT-compiles PTX up to ISA {self.reaches.isa} (CUDA {self.reaches.cuda}'s driver branch)"
                 if self.reaches else f"is older than every driver the table names: it JIT-compiles PTX older than "
                 f"ISA {self.floor.isa}, at best")
        return (f"this host's driver {self.driver} {reach}, and the image needs PTX ISA {self.needed} "
                f"(drivers from {self.floor.driver}, CUDA {self.floor.cuda}'s, JIT-compile it)")

    def fix(self) -> str:
        return (f"install a newer driver branch: R{self.floor.driver.branch} ({self.floor.driver} or newer, the "
                f"driver of CUDA {self.floor.cuda}) or any later branch; reboot, then check with nvidia-smi")


def shortfall(needs: PtxNeeds, floors: Sequence[PtxJitFloor], found: DriverVersion) -> Optional[Shortfall]:
    """Why driver `found` cannot JIT the image's newest needed ISA, or None when it can. The caller has made
    sure the ISA is known and the table reaches it (floor_for is not None)."""
    isa = needs.highest_isa
    if isa is None:
        return None
    floor = floor_for(floors, isa)
    if floor is None:
        raise ValueError(f"PTX ISA {isa} is newer than the table")
    if found.parts >= floor.driver.parts:
        return None
    return Shortfall(isa, found, highest_for(floors, found), floor)
