"""What a check returns. Standard library only, Python 3.9+ (runs in images)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Dict

from qualify.core.enums import CheckStatus

# Short names for the check modules; the enum is the one spelling.
PASS, FAIL, WARN, NOT_RUN = CheckStatus.PASS, CheckStatus.FAIL, CheckStatus.WARN, CheckStatus.NOT_RUN


@dataclass
class CheckResult:
    id: str  # stable dotted name, e.g. "triton.cross-compile"
    title: str
    status: CheckStatus
    reason: str
    required: bool = True  # counts towards the verdict
    evidence: Dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0

    def __post_init__(self) -> None:
        try:
            self.status = CheckStatus(self.status)
        except ValueError:
            raise ValueError(f"check {self.id}: bad status {self.status!r}") from None

    def to_dict(self) -> Dict[str, Any]:
        out = asdict(self)
        out["status"] = self.status.value  # the manifest holds plain JSON values
        return out


def not_run(id: str, title: str, reason: str, required: bool = True, **evidence: Any) -> CheckResult:
    return CheckResult(id, title, NOT_RUN, reason, required, dict(evidence))
