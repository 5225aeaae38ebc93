"""The promotion policy a release signs: release.json's `policy` section (version 1), as typed values.

`qualify promote` applies only what this section says (and the release's own entries: capability and
platform), never a targets file handed to it: a copy of images/targets.toml that says "one pass suffices"
or "sm120 is capability 9.0" changes nothing. The section is written by `qualify release` from the
releasing checkout's targets file (`[promotion] consecutive_passes`, `[allreduce] floors`) and the qualified
manifests (`predicate.target.intended_support_level`). Promote judges a multi-GPU run's bus bandwidth, and the
deploy's all-reduce gate the GPUs it is about to serve on, only by the signed `allreduce_floors`. The deploy's
target facts (which target a GPU is, its driver floor, memory and user: `deploy`, trust/deployfacts.py) are
signed here too, so that a deploy host's targets file steers nothing (issue 52).

    "policy": {
      "version": 1,
      "promotion": {"consecutive_passes": 7, "required_gpu_checks": ["gpu.memory", ...]},
      "targets": [{"target": "sm120", "intended_level": "baseline"}],
      "level_checks": [{"level": "baseline", "checks": ["serve.determinism", ...]}],   # issue 39
      "allreduce_floors": [{"topology": "nvlink", "gpus": 2, "min_bus_gbps": 150.0}, ...],  # issue 44
      "ptx_jit": [{"isa": "9.0", "cuda": "13.0", "driver": "580.65.06"}, ...],  # issue 51 (trust/ptxfloors.py)
      "deploy": {"targets": [{"target": "sm120", "capability": "12.0", ...}], "drivers": [...]}  # issue 52
    }

Extension points are typed and parsed strictly now, so a later issue only has to apply them: a release
whose policy fills one that this toolkit does not apply (`ENFORCED`) is refused, never read as if the
rule were not there. A new meaning for an existing field needs a new `version`; a reader refuses a version
it does not know.

A release signed before this section existed keeps the rule it was made under (`implied`): seven
consecutive passes (the Blackwell support RFC; every earlier targets file said 7), the four required GPU checks, and the
intended level its signed manifest recorded (else experimental: never baseline on a guess).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple

from qualify.core import ptxjit, topology
from qualify.core.enums import SupportLevel
from qualify.probe.gpu import REQUIRED_GPU_CHECKS
from qualify.probe.servematrix import CHECK_IDS as SERVE_CHECKS
from qualify.trust import deployfacts, ptxfloors
from qualify.trust.deployfacts import DeployFacts

Fields = Any  # records.Fields, passed in by records.py (which imports this module: no import back)
VERSION = 1
KNOWN_VERSIONS = (1,)
IMPLIED_PASSES = 7  # the Blackwell support RFC: what every release before the signed policy was promoted under
INTENDED = (SupportLevel.BASELINE.value, SupportLevel.OPTIMIZED.value, SupportLevel.EXPERIMENTAL.value)
CHECK_ID = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")
TOPOLOGY = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")
# The extension points this toolkit applies: issue 39's "level_checks" (servecount.rule_for), issue 44's
# "allreduce_floors" (promote's rows.by_floor and the deploy's all-reduce gate, deploy/run.py) and issue 51's
# "ptx_jit" (the deploy's PTX JIT gate, deploy/ptxgate.py) and issue 52's "deploy" (the target facts the deploy
# uses: trust/deployfacts.py, deploy/signed.py).
ENFORCED: frozenset = frozenset({"level_checks", "allreduce_floors", "ptx_jit", "deploy"})


@dataclass(frozen=True)
class LevelChecks:
    """Issue 39: the serving checks (`qualify serve-check`, servematrix.CHECK_IDS) that a run of a serving
    target (the cpu target, a vllm profile: servecount.serves) must pass, in a verified serve-check record of
    its deployment, for it to count toward `level`. Only `serve.*` ids this toolkit judges are accepted: a
    check it could not apply is refused, never skipped."""

    level: str
    checks: Tuple[str, ...]

    def as_json(self) -> Dict[str, Any]:
        return {"level": self.level, "checks": list(self.checks)}


# Issue 44: the lowest all-reduce bus bandwidth (gpu.nccl-allreduce, GB/s) a run on `gpus` or more GPUs joined by
# `topology` may measure and still count as a pass. One type with the probe's and preflight's (core/topology.py),
# so the floor the deploy takes from the verified release is what the probe in the image judges by.
AllReduceFloor = topology.AllReduceFloor
# Issue 51: which driver first JIT-compiles each PTX ISA (core/ptxjit.py); the deploy's PTX gate reads only this.
PtxJitFloor = ptxjit.PtxJitFloor


@dataclass(frozen=True)
class TargetPolicy:
    target: str
    intended_level: str


@dataclass(frozen=True)
class ReleasePolicy:
    version: int
    consecutive_passes: int
    required_gpu_checks: Tuple[str, ...]
    targets: Tuple[TargetPolicy, ...]
    level_checks: Tuple[LevelChecks, ...] = ()
    allreduce_floors: Tuple[AllReduceFloor, ...] = ()
    ptx_jit: Tuple[PtxJitFloor, ...] = ()  # issue 51: the first driver that JITs each PTX ISA
    deploy: Optional[DeployFacts] = None  # issue 52: the target facts the deploy uses (None: signed before them)

    def intended(self, target: str) -> Optional[str]:
        return next((t.intended_level for t in self.targets if t.target == target), None)

    def as_json(self) -> Dict[str, Any]:
        return {"version": self.version,
                "promotion": {"consecutive_passes": self.consecutive_passes,
                              "required_gpu_checks": list(self.required_gpu_checks)},
                "targets": [{"target": t.target, "intended_level": t.intended_level} for t in self.targets],
                "level_checks": [x.as_json() for x in self.level_checks],
                "allreduce_floors": [x.as_json() for x in self.allreduce_floors], **ptxfloors.as_json(self.ptx_jit),
                **deployfacts.as_json(self.deploy)}

    @classmethod
    def parse(cls, f: Fields, released: Sequence[str]) -> ReleasePolicy:
        """Strictly, with `released` the targets release.json lists: the policy names each exactly once."""
        f.only("version", "promotion", "targets", "level_checks", "allreduce_floors", "ptx_jit", "deploy")
        version = f.integer("version", 1)
        if version not in KNOWN_VERSIONS:
            raise f.error(f"{f.where}: policy version {version} is newer than this toolkit knows "
                          f"({', '.join(map(str, KNOWN_VERSIONS))}); its rule cannot be applied",
                          hint="use the toolkit version that made the release (or a newer one)")
        promotion = f.obj("promotion").only("consecutive_passes", "required_gpu_checks")
        checks = promotion.texts("required_gpu_checks")
        if not checks or any(not CHECK_ID.fullmatch(c) for c in checks) or len(set(checks)) != len(checks):
            raise f.error(f"{f.where}: promotion.required_gpu_checks must list distinct check ids")
        targets = []
        for t in f.items("targets"):
            t.only("target", "intended_level")
            level = t.text("intended_level")
            if level not in INTENDED:
                raise t.error(f"{t.where}: intended_level {level!r} is not one of {', '.join(INTENDED)}")
            targets.append(TargetPolicy(t.text("target"), level))
        named = [t.target for t in targets]
        if sorted(named) != sorted(released):
            raise f.error(f"{f.where}: targets {', '.join(sorted(named)) or 'none'} are not the released targets "
                          f"{', '.join(sorted(released)) or 'none'}")
        level_checks = tuple(_level_checks(x) for x in f.items("level_checks"))
        floors = tuple(_floor(x) for x in f.items("allreduce_floors"))
        if len({(x.topology, x.gpus) for x in floors}) != len(floors):
            raise f.error(f"{f.where}: allreduce_floors names one topology and GPU count twice")
        ptx_jit = ptxfloors.parse(f)
        deploy = deployfacts.parse(f, released)
        for name, values in (("level_checks", level_checks), ("allreduce_floors", floors), ("ptx_jit", ptx_jit),
                             ("deploy", deploy)):
            if values and name not in ENFORCED:
                raise f.error(f"{f.where}: the release's policy sets {name}, which this toolkit does not apply; "
                              "refused rather than promoted or deployed without that rule",
                              hint="use the toolkit version that made the release (or a newer one)")
        return cls(version, promotion.integer("consecutive_passes", 1), tuple(checks), tuple(targets),
                   level_checks, floors, ptx_jit, deploy)


def _level_checks(f: Fields) -> LevelChecks:
    f.only("level", "checks")
    level, checks = f.text("level"), f.texts("checks")
    if level not in INTENDED or any(not CHECK_ID.fullmatch(c) for c in checks) or len(set(checks)) != len(checks):
        raise f.error(f"{f.where}: a level of {', '.join(INTENDED)} and distinct check ids expected")
    unknown = [c for c in checks if c not in SERVE_CHECKS]
    if unknown:
        raise f.error(f"{f.where}: level {level} names check(s) {', '.join(unknown)}, which this toolkit does not "
                      f"judge (it judges {', '.join(SERVE_CHECKS)}); refused rather than promoted without them",
                      hint="use the toolkit version that made the release (or a newer one)")
    return LevelChecks(level, tuple(checks))


def _floor(f: Fields) -> AllReduceFloor:
    f.only("topology", "gpus", "min_bus_gbps")
    value = f.doc.get("min_bus_gbps")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise f.error(f"{f.where}: min_bus_gbps must be a positive number")
    joined = f.text("topology", TOPOLOGY)
    if joined not in topology.TOPOLOGIES:  # a floor this toolkit cannot match to GPUs: refused, never ignored
        raise f.error(f"{f.where}: topology {joined!r} is not one this toolkit knows ({', '.join(topology.TOPOLOGIES)})",
                      hint="use the toolkit version that made the release (or a newer one)")
    return AllReduceFloor(joined, f.integer("gpus", 2), float(value))


def for_release(intended: Mapping[str, str], consecutive_passes: int,
                allreduce_floors: Sequence[AllReduceFloor] = (),
                level_checks: Optional[Mapping[str, Sequence[str]]] = None,
                ptx_jit: Sequence[PtxJitFloor] = (), deploy: Optional[DeployFacts] = None) -> ReleasePolicy:
    """The policy `qualify release` signs: the targets' intended levels, the targets file's pass count, its
    all-reduce floors ([allreduce]) and its `[promotion] level_checks` (levels in INTENDED's order), in a fixed
    order so a re-run signs the same bytes; and the target facts the deploy uses (`deploy`, issue 52)."""
    if consecutive_passes < 1:
        raise ValueError("consecutive_passes must be at least 1")
    floors = tuple(AllReduceFloor(f.topology, f.gpus, float(f.min_bus_gbps))
                   for f in sorted(allreduce_floors, key=lambda f: (f.topology, f.gpus)))
    given = level_checks or {}
    checks = tuple(LevelChecks(level, tuple(given[level])) for level in INTENDED if given.get(level))
    return ReleasePolicy(VERSION, consecutive_passes, tuple(REQUIRED_GPU_CHECKS),
                         tuple(TargetPolicy(t, intended[t]) for t in sorted(intended)), checks, floors,
                         ptxjit.ordered(ptx_jit), deploy)


def recorded_intended(predicate: Mapping[str, Any]) -> Optional[str]:
    """The intended level a qualified manifest recorded (predicate.target.intended_support_level), if known."""
    target = predicate.get("target") if isinstance(predicate, Mapping) else None
    level = target.get("intended_support_level") if isinstance(target, Mapping) else None
    return level if level in INTENDED else None


@dataclass(frozen=True)
class TargetRule:
    """Everything `promote` applies to one target, from the verified release alone."""

    target: str
    capability: str
    platform: str
    intended_level: str
    consecutive_passes: int
    required_gpu_checks: Tuple[str, ...]
    signed: bool  # False: a release from before the signed policy, under the implied rule
    version: int = 0  # the policy version (0: implied)
    # The signed all-reduce floors (none: no multi-GPU run can pass, rows.by_floor; the implied rule has none).
    allreduce_floors: Tuple[AllReduceFloor, ...] = ()
    level_checks: Tuple[LevelChecks, ...] = ()  # the signed serving checks per level (servecount.rule_for)

    def checks_for(self, level: str) -> Tuple[str, ...]:
        return tuple(c for x in self.level_checks if x.level == level for c in x.checks)

    def describe(self) -> str:
        how = f"release.json policy v{self.version}" if self.signed else "the implied rule of a release signed " \
            "before release.json held a policy"
        floors = ", ".join(f"{f.topology} from {f.gpus} GPUs {f.min_bus_gbps:g} GB/s" for f in self.allreduce_floors)
        return (f"{self.consecutive_passes} consecutive passes on capability {self.capability} ({self.platform}), "
                f"intended level {self.intended_level}; all-reduce floors: {floors or 'none signed'} ({how})")


def rule(policy: Optional[ReleasePolicy], target: str, capability: str, platform: str,
         predicate: Mapping[str, Any]) -> TargetRule:
    """The rule for `target` of a verified release: its signed policy, else the implied one."""
    if policy is not None:
        return TargetRule(target, capability, platform, policy.intended(target) or SupportLevel.EXPERIMENTAL.value,
                          policy.consecutive_passes, policy.required_gpu_checks, True, policy.version,
                          policy.allreduce_floors, policy.level_checks)
    return TargetRule(target, capability, platform, recorded_intended(predicate) or SupportLevel.EXPERIMENTAL.value,
                      IMPLIED_PASSES, tuple(REQUIRED_GPU_CHECKS), False)
