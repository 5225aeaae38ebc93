"""Which serving checks the deployment's release requires, so that a check that did not run is never an exit 0.

The release's signed policy names, per level, the serving checks a run needs (`level_checks`); the checks
of every level from experimental up to the target's intended level are what the deployment must show. A
gate that reads serve-check's or verify.sh's exit status must not see 0 when one of them was not-run (a
server without a tool-call parser, a context too short for the needles): EX_INCOMPLETE says so. Where the
release cannot be read (none recorded, a key that does not verify), nothing proves a check optional, so
every check is required: fail closed.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Optional, Tuple

from qualify.core.enums import SupportLevel
from qualify.core.errors import QualifyError
from qualify.probe.servematrix import CHECK_IDS
from qualify.trust.folder import read_release
from qualify.trust.verify import KeyAnchor


@dataclass(frozen=True)
class Needs:
    checks: Tuple[str, ...]  # the serving checks the deployment must pass
    source: str  # where that comes from, for people

    def missing(self, not_run: Iterable[str]) -> Tuple[str, ...]:
        """Of the checks that did not run, those the deployment needs."""
        return tuple(c for c in not_run if c in self.checks)


def _levels_up_to(intended: str) -> Tuple[str, ...]:
    try:
        top = SupportLevel(intended).rank
    except ValueError:
        top = SupportLevel.OPTIMIZED.rank
    return tuple(lv.value for lv in SupportLevel if SupportLevel.EXPERIMENTAL.rank <= lv.rank <= top)


def needs(release_dir: Optional[Path], key_pin: str, target: str) -> Needs:
    if release_dir is None:
        return Needs(tuple(CHECK_IDS), "no release is recorded for this deployment: every serving check is required")
    try:
        rule = read_release(release_dir, KeyAnchor(pinned=key_pin)).rule(target)
    except (QualifyError, KeyError, StopIteration) as exc:
        return Needs(tuple(CHECK_IDS), f"release {release_dir} cannot be read ({getattr(exc, 'message', exc)}): "
                                       "every serving check is required")
    levels = _levels_up_to(rule.intended_level)
    checks = tuple(dict.fromkeys(c for lv in levels for c in rule.checks_for(lv)))
    return Needs(checks, f"release {release_dir.name}'s signed policy for {target} (intended level "
                         f"{rule.intended_level}): {', '.join(checks) or 'no serving checks'}")
