"""The trust gate's decision: from a verified manifest and its current level, then from the GPU checks run on
this host."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Optional

from qualify.core import manifest as mf
from qualify.core.enums import Profile, SupportLevel
from qualify.trust.verify import CurrentLevel

CPU_NO_GPU_CHECKS = "cpu target: no GPU checks apply"
# Levels whose GPU evidence already comes from enough runs on the target (the Blackwell support RFC's promotion rule).
PROVEN_LEVELS = (SupportLevel.BASELINE.value, SupportLevel.OPTIMIZED.value)


class Action(str, enum.Enum):
    DEPLOY = "deploy"
    PROBE = "probe"
    REFUSE = "refuse"


@dataclass(frozen=True)
class Decision:
    action: str  # an Action value
    reason: str


def gate_decision(m: mf.Manifest, promoted: bool = True, current: Optional[CurrentLevel] = None) -> Decision:
    """What the deploy does with a manifest whose signature, release and digest verified.

    The level is `current`'s, the verified target's (`VerifiedTarget.current`: its signed promotion record's
    where one exists, else release.json's; from release/v3 the manifest keeps the released level). Without it
    (the registry's attestation) the manifest's own level, with `promoted` saying whether a promotion record
    reached it. Only a level promoted by evidence (baseline, optimized, with a signed promotion record)
    deploys without the GPU checks running here first; experimental and unverified probe, and so does a
    baseline that a release signed without the promotion rule (an older toolkit's one-run baseline); a
    manifest that `verify --require-pass` would refuse, or an unsupported level, is refused.
    """
    if current is not None:
        promoted = current.promoted
    level, verdict = current.level if current is not None else m.support_level, m.verdict
    if m.problems:
        return Decision(Action.REFUSE.value, f"the manifest is damaged: {'; '.join(m.problems)}")
    if not m.passes:
        failing = f" (failing checks: {', '.join(m.failing)})" if m.failing else ""
        return Decision(Action.REFUSE.value, f"the manifest's verdict is {verdict or 'missing'}{failing}")
    if level == SupportLevel.UNSUPPORTED or level not in mf.LEVELS:
        return Decision(Action.REFUSE.value, f"the manifest's support level is {level or 'missing'}")
    if m.profile != Profile.VLLM:
        return Decision(Action.REFUSE.value, f"the image is the {m.profile or 'unrecorded'} profile, which holds no vLLM "
                        "server: it qualifies the toolchain, it cannot serve (release a --profile vllm build)")
    if m.is_cpu and verdict == "pass":
        # No GPU evidence can exist for it; its level is raised by the serving correctness matrix, not here.
        return Decision(Action.DEPLOY.value, f"{CPU_NO_GPU_CHECKS} (verdict {verdict}, support level {level})")
    if level == SupportLevel.UNVERIFIED or verdict == "incomplete":
        return Decision(Action.PROBE.value, f"qualified only statically (support level {level}, verdict {verdict}): "
                        "the GPU checks must pass on this host first")
    if level not in PROVEN_LEVELS:
        return Decision(Action.PROBE.value, f"support level {level}, verdict {verdict}: not yet promoted by evidence, "
                        "so the GPU checks run on this host first")
    if not promoted:
        return Decision(Action.PROBE.value, f"support level {level} was signed at release time, not reached by the "
                        "promotion rule (no promotion record): the GPU checks run on this host first")
    return Decision(Action.DEPLOY.value, f"support level {level}, verdict {verdict}")
