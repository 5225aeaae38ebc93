"""What a check returns. Standard library only, Python 3.9+ (runs in images)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Dict

PASS, FAIL, WARN, NOT_RUN = "pass", "fail", "warn", "not-run"


@dataclass
class CheckResult:
    id: str  # stable dotted name, e.g. "triton.cross-compile"
    title: str
    status: str  # pass | fail | warn | not-run
    reason: str
    required: bool = True  # counts towards the verdict
    evidence: Dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0

    def __post_init__(self) -> None:
        if self.status not in (PASS, FAIL, WARN, NOT_RUN):
            raise ValueError(f"check {self.id}: bad status {self.status!r}")

    def to_dict(self) -> Dict[str, Any]:
        return asdict(self)


def not_run(id: str, title: str, reason: str, required: bool = True, **evidence: Any) -> CheckResult:
    return CheckResult(id, title, NOT_RUN, reason, required, dict(evidence))
