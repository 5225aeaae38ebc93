"""The trust gate's decision: from a verified manifest, then from the GPU checks run on this host."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Mapping

from qualify.core import manifest as mf
from qualify.core.enums import SupportLevel

# Levels whose GPU evidence already comes from enough runs on the target (seed 000's promotion rule).
PROVEN_LEVELS = (SupportLevel.BASELINE.value, SupportLevel.OPTIMIZED.value)


class Action(str, enum.Enum):
    DEPLOY = "deploy"
    PROBE = "probe"
    REFUSE = "refuse"


@dataclass(frozen=True)
class Decision:
    action: str  # an Action value
    reason: str


def gate_decision(result: Mapping[str, Any], require_pass_ok: bool) -> Decision:
    """What the deploy does with a manifest whose signature and digest verified.

    `result` is what `qualify verify` reports (without --require-pass);
    `require_pass_ok` whether the same verification passed with it. Only a
    level promoted by evidence (baseline, optimized) deploys without the GPU
    checks running here first; experimental and unverified probe.
    """
    level, verdict = result.get("support_level"), result.get("verdict")
    failing = ", ".join(result.get("failing_checks") or [])
    if not require_pass_ok or verdict == "fail":
        detail = f" (failing checks: {failing})" if failing else ""
        return Decision(Action.REFUSE.value, f"the manifest's verdict is {verdict}{detail}")
    if level == "unsupported" or level not in mf.LEVELS:
        return Decision(Action.REFUSE.value, f"the manifest's support level is {level or 'missing'}")
    if level == "unverified" or verdict == "incomplete":
        return Decision(Action.PROBE.value, f"qualified only statically (support level {level}, verdict {verdict}): "
                        "the GPU checks must pass on this host first")
    if level not in PROVEN_LEVELS:
        return Decision(Action.PROBE.value, f"support level {level}, verdict {verdict}: not yet promoted by evidence, "
                        "so the GPU checks run on this host first")
    return Decision(Action.DEPLOY.value, f"support level {level}, verdict {verdict}")
