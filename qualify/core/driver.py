"""NVIDIA driver versions, and whether a host driver can run an image's CUDA.

Two failures users hit before any kernel runs: a host driver older than the
image's CUDA needs ("unsatisfied condition: cuda>=13.0", vllm#18813), and an
image whose loader finds CUDA's forward-compatibility libcuda (`compat/`)
instead of the host driver's, which fails with error 803 on a driver newer
than the compat library and with 804 on GPUs that do not support forward
compatibility (GeForce, RTX workstation, GB10). The floors live in
images/targets.toml ([drivers]); this module only compares.

Standard library only, Python 3.9 compatible (the probe imports it inside images).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional, Tuple

_VERSION = re.compile(r"([0-9]{3,4})(?:\.([0-9]{1,3}))?(?:\.([0-9]{1,3}))?")
# Forward compatibility (compat/ libraries on an older driver) is supported only on data-center GPUs.
FORWARD_COMPAT_CAPABILITIES = ("10.0", "10.3")

DROP_COMPAT_FIX = ("remove CUDA's compat/ directory from the image's loader path (LD_LIBRARY_PATH, /etc/ld.so.conf.d): "
                   "the NVIDIA container toolkit mounts the host driver's libcuda, which is the one to use")


@dataclass(frozen=True, order=True)
class DriverVersion:
    """`580.65.06` as (580, 65, 6): compared as numbers, printed as given."""

    parts: Tuple[int, ...]
    text: str = ""

    @classmethod
    def parse(cls, text: str) -> DriverVersion:
        m = _VERSION.fullmatch((text or "").strip())
        if not m:
            raise ValueError(f"{text!r} is not an NVIDIA driver version such as 580.65.06")
        return cls(tuple(int(p) for p in m.groups() if p is not None), text.strip())

    @classmethod
    def maybe(cls, text: Optional[str]) -> Optional[DriverVersion]:
        try:
            return cls.parse(text or "")
        except ValueError:
            return None

    @property
    def branch(self) -> int:
        """R580, R590: the first number."""
        return self.parts[0]

    def __str__(self) -> str:
        return self.text or ".".join(map(str, self.parts))


def too_old(found: DriverVersion, floor: DriverVersion) -> bool:
    return found.parts < floor.parts


def driver_problem(found: Optional[DriverVersion], floor: DriverVersion, cuda: str) -> Optional[str]:
    """Why a host driver cannot run CUDA `cuda` (whose floor is `floor`), or None when it can."""
    if found is None:
        return f"the host's driver version cannot be read; CUDA {cuda} needs {floor} or newer"
    if too_old(found, floor):
        return (f"the host's NVIDIA driver is {found}; the image's CUDA {cuda} needs {floor} or newer "
                f"(R{floor.branch} branch)")
    return None


def compat_problem(compat: DriverVersion, host: DriverVersion, capability: str) -> Optional[str]:
    """Why a forward-compatibility libcuda `compat` on the image's loader path fails on this host, or None."""
    if host.parts == compat.parts:
        return None
    if host.parts > compat.parts:
        return (f"the image's loader finds CUDA's forward-compatibility libcuda {compat}, older than this host's "
                f"driver {host}: CUDA fails with error 803 (system has unsupported display driver / cuda driver "
                "combination)")
    if capability not in FORWARD_COMPAT_CAPABILITIES:
        return (f"the image's loader finds CUDA's forward-compatibility libcuda {compat} for this host's older driver "
                f"{host}, and capability {capability} GPUs do not support forward compatibility: CUDA fails with "
                "error 804 (forward compatibility was attempted on non supported HW)")
    return None
