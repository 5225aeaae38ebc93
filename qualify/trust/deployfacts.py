"""release.json's policy `deploy` (issue 52): the target facts the deploy uses, signed with the release.

`qualify release` writes it from the releasing checkout's images/targets.toml: per released target, and every
cpu target (chosen on a host without nvidia-smi), its name, accelerator, platform, capability, CUDA, driver
floor, arch list and Triton wiring (for the probe run on the host), the runtime memory facts (the fraction,
unified memory, the smallest GPU, the host reserve, the cpu target's KV cache and server memory) and the image
user; and the `[drivers]` table (CUDA -> the oldest driver that runs it), which the deploy needs for the CUDA
the verified manifest records. The deploy (deploy/preflight.py, deploy/cpuhost.py) matches a host's GPU to a
target, and checks its driver and memory, by this signed copy only: a deploy host's checkout cannot steer it.
An extension point of policy version 1 this toolkit applies (policy.ENFORCED).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from qualify.config.model import Runtime, RuntimeUser, Target
from qualify.core import arch
from qualify.core.driver import DriverVersion
from qualify.core.enums import CPU_CAPABILITY, Accelerator
from qualify.core.manifest import TARGET_NAME

PLATFORMS = {"linux/amd64": "x86_64", "linux/arm64": "aarch64"}  # the platform -> what uname -m says
CUDA = re.compile(r"[0-9]{1,2}\.[0-9]{1,2}")
CAPABILITY = re.compile(r"[0-9]{1,2}\.[0-9]{1,2}")
USER = re.compile(r"[a-z_][a-z0-9_-]{0,31}")
ARCH_LIST = re.compile(r"[0-9A-Za-z.;+ ]{0,200}")
ENV_NAME = re.compile(r"[A-Z][A-Z0-9_]{0,63}")
ENV_VALUE = re.compile(r"/[A-Za-z0-9._/+-]{0,255}")  # the Triton wiring: tool paths inside the image
RUNTIME_KEYS = ("gpu_memory_utilization", "unified_memory", "min_gpu_memory_gib", "host_reserve_gib",
                "kv_cache_gib", "server_memory_gib")
TARGET_KEYS = ("target", "accelerator", "platform", "capability", "cuda", "driver_floor", "torch_cuda_arch_list",
               "triton_env", "runtime", "user")


@dataclass(frozen=True)
class DeployTarget:
    """One target as the deploy knows it: from the verified release's signed policy, never a targets file."""

    name: str
    accelerator: Accelerator
    platform: str
    capability: Optional[arch.Capability]  # None: a cpu target
    cuda: str  # '' for a cpu target
    driver_floor: Optional[DriverVersion]  # the oldest host driver `cuda` runs on (None: a cpu target)
    torch_cuda_arch_list: str
    triton_env: Tuple[Tuple[str, str], ...]
    runtime: Runtime
    user: RuntimeUser

    @property
    def is_cpu(self) -> bool:
        return self.accelerator == Accelerator.CPU

    @property
    def capability_text(self) -> str:
        """As manifests spell it: `12.0`, or `cpu`."""
        return CPU_CAPABILITY if self.capability is None else str(self.capability)

    @property
    def uname_machine(self) -> str:
        return PLATFORMS[self.platform]

    def as_json(self) -> Dict[str, Any]:
        rt = self.runtime
        return {"target": self.name, "accelerator": self.accelerator.value, "platform": self.platform,
                "capability": self.capability_text, "cuda": self.cuda,
                "driver_floor": str(self.driver_floor) if self.driver_floor else "",
                "torch_cuda_arch_list": self.torch_cuda_arch_list, "triton_env": dict(self.triton_env),
                "runtime": {k: getattr(rt, k) for k in RUNTIME_KEYS},
                "user": {"name": self.user.name, "uid": self.user.uid}}


@dataclass(frozen=True)
class DeployFacts:
    targets: Tuple[DeployTarget, ...]
    drivers: Tuple[Tuple[str, DriverVersion], ...]  # [drivers]: CUDA -> the oldest driver that runs it

    @property
    def driver_table(self) -> Dict[str, DriverVersion]:
        return dict(self.drivers)

    def get(self, name: str) -> Optional[DeployTarget]:
        return next((t for t in self.targets if t.name == name), None)

    def for_capability(self, cap: arch.Capability, machine: Optional[str] = None) -> List[DeployTarget]:
        return [t for t in self.targets if t.capability == cap and (machine is None or t.uname_machine == machine)]

    def cpu_targets(self, machine: Optional[str] = None) -> List[DeployTarget]:
        return [t for t in self.targets if t.is_cpu and (machine is None or t.uname_machine == machine)]

    def as_json(self) -> Dict[str, Any]:
        return {"targets": [t.as_json() for t in self.targets],
                "drivers": [{"cuda": c, "driver": str(d)} for c, d in self.drivers]}


def of_targets(targets: Sequence[Target], drivers: Mapping[str, DriverVersion]) -> DeployFacts:
    """What `qualify release` signs, from the targets file's typed targets, in a fixed order (a re-run signs
    the same bytes)."""
    made = tuple(DeployTarget(t.name, t.accelerator, t.platform, t.capability, t.cuda or "", t.driver_floor,
                              t.torch_cuda_arch_list or "", tuple(sorted(t.triton_env.items())), t.runtime, t.user)
                 for t in sorted(targets, key=lambda t: t.name))
    return DeployFacts(made, tuple(sorted((c, d) for c, d in drivers.items())))


def parse(f: Any, released: Sequence[str]) -> Optional[DeployFacts]:
    """The policy's `deploy` (records.Fields of the policy), strictly; None where it has none (a release
    signed before it: the deploy refuses it, deploy/signed.py). Each released target is there once, and
    every other one is a cpu target."""
    if "deploy" not in f.doc:
        return None
    d = f.obj("deploy").only("targets", "drivers")
    drivers = []
    for row in d.items("drivers"):
        row.only("cuda", "driver")
        drivers.append((row.text("cuda", CUDA), _driver(row, "driver")))
    if len({c for c, _ in drivers}) != len(drivers):
        raise d.error(f"{d.where}: drivers names one CUDA version twice")
    targets = tuple(_target(t) for t in d.items("targets"))
    names = [t.name for t in targets]
    if len(set(names)) != len(names):
        raise d.error(f"{d.where}: targets names one target twice")
    missing = sorted(set(released) - set(names))
    extra = sorted(t.name for t in targets if t.name not in released and not t.is_cpu)
    if missing or extra:
        raise d.error(f"{d.where}: the deploy facts must name each released target ({', '.join(missing)} missing) "
                      f"and, besides them, only cpu targets ({', '.join(extra) or 'none'} is not)")
    return DeployFacts(targets, tuple(sorted(drivers)))


def _driver(f: Any, key: str) -> DriverVersion:
    found = DriverVersion.maybe(f.text(key))
    if found is None:
        raise f.error(f"{f.where}: {key} {f.doc.get(key)!r} is not an NVIDIA driver version")
    return found


def _target(f: Any) -> DeployTarget:
    f.only(*TARGET_KEYS)
    name = f.text("target", TARGET_NAME)
    try:
        accelerator = Accelerator(f.text("accelerator"))
    except ValueError:
        raise f.error(f"{f.where}: accelerator {f.doc.get('accelerator')!r} is not one this toolkit knows "
                      f"({', '.join(a.value for a in Accelerator)})",
                      hint="use the toolkit version that made the release (or a newer one)") from None
    platform = f.text("platform")
    if platform not in PLATFORMS:
        raise f.error(f"{f.where}: platform {platform!r} is not one of {', '.join(PLATFORMS)}")
    cpu = accelerator == Accelerator.CPU
    if cpu:
        if f.text("capability") != CPU_CAPABILITY or f.text("cuda", empty=True) or f.text("driver_floor", empty=True):
            raise f.error(f"{f.where}: a cpu target has capability {CPU_CAPABILITY!r}, and no CUDA or driver floor")
        capability, cuda, floor = None, "", None
    else:
        capability = arch.Capability.parse(f.text("capability", CAPABILITY))
        cuda, floor = f.text("cuda", CUDA), _driver(f, "driver_floor")
    env = f.obj("triton_env")
    triton = tuple(sorted((k, env.text(k, ENV_VALUE)) for k in env.doc))
    if any(not ENV_NAME.fullmatch(k) for k, _ in triton):
        raise f.error(f"{f.where}: triton_env names a variable that is not an environment variable name")
    return DeployTarget(name, accelerator, platform, capability, cuda, floor,
                        f.text("torch_cuda_arch_list", ARCH_LIST, empty=True), triton, _runtime(f.obj("runtime")),
                        _user(f.obj("user")))


def _runtime(f: Any) -> Runtime:
    f.only(*RUNTIME_KEYS)
    fraction = f.doc.get("gpu_memory_utilization")
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not math.isfinite(fraction) \
            or not 0 < fraction < 1:
        raise f.error(f"{f.where}: gpu_memory_utilization must be a number between 0 and 1")
    return Runtime(float(fraction), f.flag("unified_memory"), f.integer("min_gpu_memory_gib"),
                   f.integer("host_reserve_gib"), f.integer("kv_cache_gib"), f.integer("server_memory_gib"))


def _user(f: Any) -> RuntimeUser:
    f.only("name", "uid")
    return RuntimeUser(f.text("name", USER), f.integer("uid"))


def as_json(facts: Optional[DeployFacts]) -> dict:
    """What the policy's JSON gains: nothing without facts (an older release's bytes stay as they were)."""
    return {"deploy": facts.as_json()} if facts else {}
