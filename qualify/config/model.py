"""The targets file's typed values (frozen dataclasses); `config/targets.py` reads the file into them.

Standard library only: noxfile.py imports the targets at start.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Tuple

from qualify.config.imageref import ImageRef
from qualify.core import arch, driver, topology
from qualify.core.enums import CPU_CAPABILITY, Accelerator, Profile
from qualify.core.errors import ConfigError
from qualify.core.ptxjit import PtxJitFloor

REPO_ROOT = Path(__file__).resolve().parents[2]
LOCKS_DIR = REPO_ROOT / "images" / "locks"
PROFILES = Profile.values()


@dataclass(frozen=True)
class BasePin:
    image: ImageRef
    python: str
    source: str
    pinned: str


@dataclass(frozen=True)
class TritonWiring:
    ptxas: str
    ptxas_blackwell: str
    cuobjdump: str
    nvdisasm: str

    def env(self) -> Dict[str, str]:
        """Triton reads TRITON_<TOOL>_PATH, with '-' in the tool name turned into '_'."""
        return {
            "TRITON_PTXAS_PATH": self.ptxas,
            "TRITON_PTXAS_BLACKWELL_PATH": self.ptxas_blackwell,
            "TRITON_CUOBJDUMP_PATH": self.cuobjdump,
            "TRITON_NVDISASM_PATH": self.nvdisasm,
        }


@dataclass(frozen=True)
class Runtime:
    gpu_memory_utilization: float
    unified_memory: bool
    min_gpu_memory_gib: int
    host_reserve_gib: int  # unified memory: what the host keeps for itself, whatever the fraction
    kv_cache_gib: int = 0  # cpu target: host memory vLLM's CPU build reserves for the KV cache (VLLM_CPU_KVCACHE_SPACE)
    server_memory_gib: int = 0  # cpu target: host memory the server needs besides the KV cache and the model


@dataclass(frozen=True)
class RuntimeUser:
    """Who the server runs as. A base that has `uid` already (nvidia/cuda's ubuntu, 1000) keeps its name."""

    name: str
    uid: int


@dataclass(frozen=True)
class Hermetic:
    suite: str
    mirror: str
    python: str
    repository: str


@dataclass(frozen=True)
class PayloadLayer:
    """One layer of an image's payload: the lock's packages whose normalised names match `packages`."""

    name: str
    packages: Tuple[str, ...]  # fnmatch patterns; a package goes into the first layer one of whose patterns matches

    def takes(self, package: str) -> bool:
        return any(fnmatch.fnmatchcase(package, pattern) for pattern in self.packages)


@dataclass(frozen=True)
class BuildSettings:
    """What every image build shares ([build])."""

    cache_budget_bytes: int  # the toolkit's BuildKit cache kept beyond what the newest builds use
    layers: Tuple[PayloadLayer, ...]

    def layer_of(self, package: str) -> str:
        """The layer a package is installed in (the last layer is the catch-all: validated when loaded)."""
        return next(layer.name for layer in self.layers if layer.takes(package))


# Used where a targets file has no [build] table (tests' small files): one layer, 20 GB.
DEFAULT_BUILD = BuildSettings(20 * 10**9, (PayloadLayer("payload", ("*",)),))


@dataclass(frozen=True)
class Target:
    """One target. A cpu target (`accelerator = "cpu"`) has no GPU: no capability (None), CUDA, arch list,
    Triton wiring or driver floor ('' or None); `capability_text` is what its manifests carry instead."""

    name: str
    description: str
    gpus: Tuple[str, ...]
    platform: str
    capability: Optional[arch.Capability]
    cuda: str
    torch_cuda_arch_list: str
    support_level: str
    base: BasePin
    triton: Optional[TritonWiring]
    runtime: Runtime
    user: RuntimeUser
    driver_floor: Optional[driver.DriverVersion]  # the oldest host driver the target's CUDA runs on ([drivers])
    accelerator: Accelerator = Accelerator.CUDA
    # Debian packages the image needs beyond Python (vLLM's CPU build loads libnuma and compiles with g++):
    # in the hermetic base's root filesystem; installed on a pinned base that lacks them.
    system_packages: Tuple[str, ...] = ()

    @property
    def is_cpu(self) -> bool:
        return self.accelerator == Accelerator.CPU

    @property
    def capability_text(self) -> str:
        """The capability as manifests, labels and release records spell it: `12.0`, or `cpu`."""
        return CPU_CAPABILITY if self.capability is None else str(self.capability)

    @property
    def triton_env(self) -> Dict[str, str]:
        return self.triton.env() if self.triton else {}

    @property
    def profiles(self) -> Tuple[str, ...]:
        """The profiles this target builds: smoke is a CUDA extension and Triton, so a cpu target has vllm only."""
        return (Profile.VLLM.value,) if self.is_cpu else PROFILES

    def lock_profile(self, profile: str) -> str:
        """The requirements input and lock name's profile part: a cpu target's vLLM is another build
        (`vllm-cpu`), so it never shares a lock with the GPU targets of its platform."""
        return f"{profile}-{self.accelerator.value}" if self.is_cpu else profile

    @property
    def arch_tag(self) -> str:
        """`amd64` or `arm64`."""
        return self.platform.split("/", 1)[1]

    @property
    def uname_machine(self) -> str:
        return {"amd64": "x86_64", "arm64": "aarch64"}[self.arch_tag]

    def python_for(self, base_kind: str, hermetic: Hermetic) -> str:
        return hermetic.python if base_kind == "hermetic" else self.base.python

    def lock_path(self, profile: str, python: str) -> Path:
        return lock_path(self.lock_profile(profile), self.platform, python)


@dataclass(frozen=True)
class TargetsFile:
    path: Path
    schema: int
    hermetic: Hermetic
    targets: Mapping[str, Target] = field(default_factory=dict)
    # The Blackwell support RFC: passing runs in a row, without a product failure, before a target is baseline.
    promotion_passes: int = 7
    build: BuildSettings = DEFAULT_BUILD
    drivers: Mapping[str, driver.DriverVersion] = field(default_factory=dict)  # [drivers]: CUDA -> driver floor
    # [allreduce] floors: the bus bandwidth a multi-GPU deployment's all-reduce must reach, per topology
    allreduce_floors: Tuple[topology.AllReduceFloor, ...] = ()

    @property
    def pythons(self) -> Tuple[str, ...]:
        """Every interpreter version a target's image has (the hermetic base's, each base pin's), oldest first:
        the one place a Python version comes from (tests/test_house_rules.py)."""
        found = {self.hermetic.python} | {t.base.python for t in self.targets.values()}
        return tuple(sorted(found, key=lambda v: tuple(int(p) for p in v.split("."))))

    @property
    def toolkit_python(self) -> str:
        """The interpreter the toolkit itself runs on where it installs one (a CI runner): the oldest an image
        has, which is the hermetic base's, the toolkit's own floor (pyproject's requires-python)."""
        return self.pythons[0]
    # [promotion] level_checks (issue 39): level -> the serving checks a serving target's runs need for it.
    promotion_level_checks: Mapping[str, Tuple[str, ...]] = field(default_factory=dict)
    # [ptx_jit] floors (issue 51): the first driver that JIT-compiles each PTX ISA; signed into release.json
    ptx_jit: Tuple[PtxJitFloor, ...] = ()

    def get(self, name: str) -> Target:
        if name not in self.targets:
            raise ConfigError(
                f"{self.path}: no target named {name!r}",
                hint=_did_you_mean(name, self.targets) or f"known targets: {', '.join(self.targets)}",
            )
        return self.targets[name]

    def for_capability(self, cap: arch.Capability, machine: Optional[str] = None) -> List[Target]:
        """Targets whose capability is exactly `cap` (and, if given, whose platform fits `machine`)."""
        found = [t for t in self.targets.values() if t.capability == cap]
        if machine is not None:
            found = [t for t in found if t.uname_machine == machine]
        return found

    def cpu_targets(self, machine: Optional[str] = None) -> List[Target]:
        """The cpu targets (for `machine`, when given), in file order."""
        return [t for t in self.targets.values() if t.is_cpu and (machine is None or t.uname_machine == machine)]


def lock_path(profile: str, platform: str, python: str) -> Path:
    return LOCKS_DIR / f"{profile}-{platform.replace('/', '-')}-py{python}.txt"


def _did_you_mean(word: str, options) -> str:
    import difflib

    close = difflib.get_close_matches(word, list(options), n=1)
    return f"did you mean {close[0]!r}?" if close else ""
