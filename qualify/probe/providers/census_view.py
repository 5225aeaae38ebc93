"""The census as the provider rules read it: one typed record per library.

Records are made once from what the census produced (the manifest's census
rows, or `qualify.core.census.CensusReport.to_json()`), keyed by path; a key
matches a path relative to site-packages when it ends with it. An empty
index means "not examined": library-backed providers are then reported
available but unverified.

Standard library only, Python 3.9 compatible (runs inside images).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from qualify.core.arch import Compat

# The classes this probe knows how to judge. A census may carry another (a
# newer one marks damaged or undecodable input): such a record is undecided,
# and an undecided record never counts as runnable, nor as proof of nothing.
DECIDED = (Compat.NATIVE, Compat.COMPATIBLE, Compat.PTX_JIT, Compat.NONE)


def read_compat(raw: Any) -> Tuple[Optional[Compat], bool]:
    """(class, decided) from a census value: (None, True) when no unit was judged."""
    if raw is None:
        return None, True
    try:
        klass = Compat(raw)
    except ValueError:
        return None, False
    return (klass, True) if klass in DECIDED else (None, False)


@dataclass(frozen=True)
class CensusRecord:
    """One library: its worst and best unit's class for the target, and its code."""

    worst: Optional[Compat] = None  # None: no unit was judged (or the class is undecided)
    best: Optional[Compat] = None
    sass: Tuple[str, ...] = ()
    ptx: Tuple[str, ...] = ()
    cross_generation_ptx: bool = False  # some unit runs only through older-generation PTX
    decided: bool = True  # False: the census gave a class this probe cannot judge

    @classmethod
    def of(cls, worst: Any, best: Any, sass: Sequence[str], ptx: Sequence[str], cross: Any) -> CensusRecord:
        klass, decided = read_compat(worst)
        return cls(worst=klass, best=read_compat(best)[0], sass=tuple(sass), ptx=tuple(ptx),
                   cross_generation_ptx=bool(cross), decided=decided)

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> CensusRecord:
        """From a census row of the manifest (qualify/probe/census_check.py)."""
        return cls.of(row.get("class"), row.get("best"), row.get("sass", ()), row.get("ptx", ()),
                      row.get("cross_generation_jit"))

    @classmethod
    def from_library(cls, lib: Mapping[str, Any]) -> CensusRecord:
        """From one library of CensusReport.to_json()."""
        verdict = lib.get("verdict") or {}
        return cls.of(verdict.get("class"), verdict.get("best"), lib.get("sass", ()), lib.get("ptx", ()),
                      verdict.get("cross_generation_jit"))


# An ELF file with no device code at all still imports; its kernels run nowhere.
NO_DEVICE_CODE = CensusRecord(worst=Compat.NONE)

CensusIndex = Mapping[str, CensusRecord]


def index_rows(rows: Sequence[Mapping[str, Any]]) -> Dict[str, CensusRecord]:
    """The index of the manifest's census rows."""
    return {str(row["path"]): CensusRecord.from_row(row) for row in rows}


def census_index(report: Mapping[str, Any]) -> Dict[str, CensusRecord]:
    """The index of qualify.core.census.CensusReport.to_json() (for one target)."""
    out = {str(lib["path"]): CensusRecord.from_library(lib) for lib in report.get("libraries", [])}
    for path in report.get("without_device_code", []):
        out.setdefault(str(path), NO_DEVICE_CODE)
    return out


def census_entry(census: CensusIndex, rel: str) -> Optional[CensusRecord]:
    """The record for a library, by relative path or a path ending in it."""
    if rel in census:
        return census[rel]
    tail = "/" + rel.lstrip("/")
    for key, value in census.items():
        if str(key).replace(os.sep, "/").endswith(tail):
            return value
    return None


def census_under(census: CensusIndex, folder: str) -> List[CensusRecord]:
    """Records of every library below a package folder (kernel wheels of many files)."""
    mark = folder.strip("/") + "/"
    return [v for k, v in census.items() if ("/" + str(k).replace(os.sep, "/")).find("/" + mark) >= 0]
