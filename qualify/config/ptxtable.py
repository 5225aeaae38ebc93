"""images/targets.toml `[ptx_jit] floors` (issue 51): which driver first JIT-compiles each PTX ISA.

Read by config/targets.py (the targets file's one reader) into core/ptxjit.py's PtxJitFloor rows; `qualify
release` signs them into release.json's policy (`ptx_jit`), and the deploy compares a host's driver only with
the verified release's copy, never with this file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, List, Mapping, Tuple

from qualify.core import driver, ptxisa
from qualify.core.errors import ConfigError
from qualify.core.ptxjit import PtxJitFloor, table_problem

_KEYS = ("floors",)
_ROW_KEYS = ("isa", "cuda", "driver")


def parse(table: Mapping[str, Any], drivers: Mapping[str, driver.DriverVersion], path: Path) -> Tuple[PtxJitFloor, ...]:
    """The rows, checked: each ISA once, a newer ISA never with an older driver, and where [drivers] names the
    same CUDA release, the same driver (one fact, one value)."""
    where = f"{path}: [ptx_jit]"
    extra = sorted(set(table) - set(_KEYS))
    if extra or "floors" not in table or not isinstance(table["floors"], list) or not table["floors"]:
        raise ConfigError(f"{where} must hold `floors` only, a non-empty list of {{ isa, cuda, driver }} tables"
                          + (f" (unknown keys: {', '.join(extra)})" if extra else ""))
    rows: List[PtxJitFloor] = []
    for n, row in enumerate(table["floors"], 1):
        at = f"{where} floors[{n}]"
        if not isinstance(row, dict) or sorted(row) != sorted(_ROW_KEYS) or not all(isinstance(row[k], str) for k in row):
            raise ConfigError(f"{at} must be a table of three strings: isa, cuda, driver",
                              hint='e.g. { isa = "9.0", cuda = "13.0", driver = "580.65.06" }')
        try:
            ptxisa.key(row["isa"])
            found = driver.DriverVersion.parse(row["driver"])
        except ValueError as exc:
            raise ConfigError(f"{at}: {exc}") from None
        if row["cuda"] in drivers and drivers[row["cuda"]].parts != found.parts:
            raise ConfigError(f"{at}: CUDA {row['cuda']}'s driver is {drivers[row['cuda']]} in [drivers] and {found} "
                              "here: the same fact, two values")
        rows.append(PtxJitFloor(row["isa"], row["cuda"], found))
    problem = table_problem(rows)
    if problem:
        raise ConfigError(f"{where} floors: {problem}")
    return tuple(sorted(rows, key=lambda r: ptxisa.key(r.isa)))
