"""The trust gate's decision: from a verified manifest, then from the GPU checks run on this host."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, List, Mapping, Sequence

from qualify.core import manifest as mf
from qualify.release.evidence import Outcome

# Levels whose GPU evidence already comes from enough runs on the target (seed 000's promotion rule).
PROVEN_LEVELS = ("baseline", "optimized")


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


# --- the GPU checks run here ---------------------------------------------------


@dataclass(frozen=True)
class ProbeOutcome:
    outcome: Outcome
    reason: str
    checks: Sequence[Mapping[str, Any]]


def _gpu_checks(predicate: Mapping[str, Any]) -> List[Mapping[str, Any]]:
    return [c for c in predicate.get("checks") or [] if str(c.get("id", "")).startswith("gpu.")]


def _named(checks: Sequence[Mapping[str, Any]]) -> str:
    return "; ".join(f"{c.get('id')}: {c.get('status')}: {c.get('reason', '')}" for c in checks)


def probe_outcome(predicate: Mapping[str, Any], capability: str) -> ProbeOutcome:
    """Pass only when every required GPU check passed on a GPU of the target's capability.

    A required check that failed is a product failure; one that did not run
    (no GPU visible, a timeout) is infrastructure: it proves nothing either way.
    """
    checks = _gpu_checks(predicate)
    required = [c for c in checks if c.get("required", True)]
    failed = [c for c in required if c.get("status") == "fail"]
    if failed:
        return ProbeOutcome(Outcome.PRODUCT_FAILURE, _named(failed), checks)
    not_run = [c for c in required if c.get("status") == "not-run"]
    if not_run:
        return ProbeOutcome(Outcome.INFRASTRUCTURE, _named(not_run), checks)
    if not required:
        return ProbeOutcome(Outcome.INFRASTRUCTURE, "the probe reported no required GPU check", checks)
    devices = (predicate.get("gpu") or {}).get("devices") or []
    seen = str((devices[0] if devices else {}).get("compute_cap", ""))
    if seen != capability:
        return ProbeOutcome(Outcome.INFRASTRUCTURE, f"the probe saw capability {seen or 'none'}, not {capability}",
                            checks)
    return ProbeOutcome(Outcome.PASS, f"{len(required)} required GPU checks passed", checks)
