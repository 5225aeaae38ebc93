"""One check's outcome, as the record's checks list holds it (the manifest schema's check shape)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Mapping, Optional

from qualify.core.enums import CheckStatus


@dataclass(frozen=True)
class CheckResult:
    id: str
    status: CheckStatus
    reason: str
    evidence: Mapping[str, Any] = field(default_factory=dict)
    figures: Mapping[str, float] = field(default_factory=dict)  # the record's figures: numbers worth a column
    seconds: float = 0.0

    def as_check(self, title: str, required: bool) -> Dict[str, Any]:
        return {"id": self.id, "title": title, "status": self.status.value, "required": required,
                "reason": self.reason, "evidence": dict(self.evidence), "seconds": round(self.seconds, 3)}


def passed(check_id: str, reason: str, evidence: Mapping[str, Any], **figures: float) -> CheckResult:
    return CheckResult(check_id, CheckStatus.PASS, reason, evidence, figures)


def failed(check_id: str, reason: str, evidence: Optional[Mapping[str, Any]] = None, **figures: float) -> CheckResult:
    return CheckResult(check_id, CheckStatus.FAIL, reason, evidence or {}, figures)


def not_run(check_id: str, reason: str, evidence: Optional[Mapping[str, Any]] = None, **figures: float) -> CheckResult:
    return CheckResult(check_id, CheckStatus.NOT_RUN, reason, evidence or {}, figures)


def significant(x: float, digits: int = 4) -> float:
    """`x` to `digits` significant digits (a KL of 3e-7 stays 3e-7, never 0.0)."""
    return float(f"{x:.{digits}g}")


def timed(run: Callable[[], CheckResult]) -> CheckResult:
    began = time.monotonic()
    result = run()
    return CheckResult(result.id, result.status, result.reason, result.evidence, result.figures,
                       time.monotonic() - began)
