"""The tag message's changelog: targets, digests, levels and verdicts since the previous release,
with `qualify diff` (report.changes) underneath for each changed target."""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Sequence

from qualify.core import manifest as mf
from qualify.core.errors import VerificationError
from qualify.release import report
from qualify.release.history import Released


def _old_manifest(previous: Released, target: str) -> Optional[Dict[str, Any]]:
    """The predecessor's manifest of `target` as its tag holds it, verified with the rest of that release."""
    if not previous.release.has(target):
        return None
    try:
        return mf.parse(previous.release.target(target).manifest_bytes, f"{previous.index.tag}:{target}.json")
    except VerificationError:
        return None


def changelog(opts, entries: Sequence[Any], manifests: Mapping[str, bytes], previous: Optional[Released],
              max_lines: int = 4) -> List[str]:
    """Targets, digests, levels and verdicts since the predecessor in the release order (`qualify diff`
    underneath); `previous` is that release, verified (history.place), or None for a first release."""
    if previous is None:
        return ["Changes: first release"]
    tag = previous.index.tag
    old = {e.target: e for e in previous.index.targets}
    lines = [f"Changes since {tag}:"]
    for e in entries:
        before = old.pop(e.target, None)
        if before is None:
            lines.append(f"  + {e.target}: new ({e.digest}, {e.support_level}, {e.verdict})")
            continue
        was = (before.digest, before.support_level, before.verdict)
        if was == (e.digest, e.support_level, e.verdict) and before.manifest_sha256 == e.manifest_sha256:
            lines.append(f"  = {e.target}: unchanged")
            continue
        parts = [f"{what} {a} -> {b}" for what, a, b in zip(("digest", "level", "verdict"), was,
                                                           (e.digest, e.support_level, e.verdict)) if a != b]
        lines.append(f"  ~ {e.target}: " + ("; ".join(parts) or "manifest changed"))
        old_stmt = _old_manifest(previous, e.target)
        if old_stmt is not None:
            changes = [c for c in report.diff(old_stmt, mf.parse(manifests[e.target], e.target))
                       if not c.startswith(("verdict:", "support_level:", "image:"))]  # in the line above
            lines += [f"      {c}" for c in changes[:max_lines]]
            if len(changes) > max_lines:
                lines.append(f"      ... {len(changes) - max_lines} more (qualify diff)")
    lines += [f"  - {name}: no longer released" for name in old]
    return lines
