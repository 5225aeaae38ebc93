"""release.json's policy `ptx_jit` (issue 51): the signed table of which driver first JIT-compiles each PTX ISA.

`qualify release` writes it from images/targets.toml `[ptx_jit] floors`; the deploy compares a host's driver
with the PTX ISA a verified manifest needs (deploy/ptxgate.py) only by this signed copy. An extension point
of policy version 1 that this toolkit applies (policy.ENFORCED): a release that signs it is never read as if
the rule were not there. Rows: `{isa, cuda, driver}` (core/ptxjit.py: PtxJitFloor), each ISA once, a newer ISA
never with an older driver.
"""

from __future__ import annotations

import re
from typing import Any, Tuple

from qualify.core import ptxjit
from qualify.core.driver import DriverVersion
from qualify.core.ptxjit import PtxJitFloor

ISA = re.compile(r"[0-9]{1,3}\.[0-9]{1,3}")
CUDA = re.compile(r"[0-9]{1,2}\.[0-9]{1,2}")


def parse(f: Any) -> Tuple[PtxJitFloor, ...]:
    """The rows of `f` (records.Fields of the policy), strictly; () where the policy has no `ptx_jit`."""
    if "ptx_jit" not in f.doc:
        return ()
    rows = []
    for row in f.items("ptx_jit"):
        row.only("isa", "cuda", "driver")
        driver = DriverVersion.maybe(row.text("driver"))
        if driver is None:
            raise row.error(f"{row.where}: driver {row.doc.get('driver')!r} is not an NVIDIA driver version")
        rows.append(PtxJitFloor(row.text("isa", ISA), row.text("cuda", CUDA), driver))
    problem = ptxjit.table_problem(rows)
    if problem:
        raise f.error(f"{f.where}: ptx_jit: {problem}")
    return ptxjit.ordered(rows)


def as_json(rows: Tuple[PtxJitFloor, ...]) -> dict:
    """What the policy's JSON gains: nothing for a release without a table (its bytes stay as they were)."""
    return {"ptx_jit": [r.as_json() for r in rows]} if rows else {}
