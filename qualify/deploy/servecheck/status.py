"""The serving matrix's standing for the release a deploy is about to serve (start.sh says it).

What counts is what the release's signed promotion record counted (each run's outcome and reason, recomputed
by promote); a serve-check record saved beside the manifest that no promotion has counted yet is shown apart,
labelled as such: nobody has verified it.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import List, Optional

from qualify.core.errors import QualifyError
from qualify.core.readlimit import read_small
from qualify.release import servecount, serving
from qualify.trust.policy import TargetRule
from qualify.trust.verify import VerifiedTarget

HOW = "scripts/verify.sh --matrix runs it here; `qualify promote TAG --evidence` counts its signed record"


def lines(vt: VerifiedTarget, folder: Path, signed: Optional[TargetRule] = None) -> List[str]:
    """`signed`: the release's rule (VerifiedRelease.rule), whose policy names the serving checks."""
    rule = servecount.rule_for(vt.manifest, signed)
    counted = [e for e in (vt.promotion.evidence if vt.promotion else ()) if e.serving_sha256]
    out = []
    if not rule.counts_serving:
        out.append(f"serving matrix: not in this release's rule ({rule.source})")
    elif counted:
        newest = max(counted, key=lambda e: e.time)
        passes = sum(e.outcome == "pass" for e in counted)
        out.append(f"serving matrix: {len(counted)} run(s) counted by promotion {vt.promotion.sequence} (signed), "
                   f"{passes} passing; newest {newest.time}: {newest.outcome}: {newest.reason}")
    else:
        out.append(f"serving matrix: no run counted for this release yet ({HOW})")
    local = _newest_local(vt.target, folder, {e.serving_sha256 for e in counted})
    if local:
        out.append(local)
    return out


def _newest_local(target: str, folder: Path, counted: set) -> str:
    try:
        names = sorted(n for n in os.listdir(folder) if n.startswith(f"{target}.serve-check.") and n.endswith(".json")
                       and not n.endswith(".sigstore.json"))
    except OSError:
        return ""
    if not names:
        return ""
    path = folder / names[-1]
    try:
        data = read_small(path, serving.MAX_BYTES, "serve-check record", serving.ServeRecordError)
        record = serving.parse(data, str(path))
    except QualifyError as exc:
        return f"serving matrix: newest record here unreadable: {exc.message}"
    if hashlib.sha256(data).hexdigest() in counted:
        return ""
    statuses = ", ".join(f"{str(c.get('id')).removeprefix('serve.')} {c.get('status')}" for c in record.checks)
    return (f"serving matrix: newest record here, not counted by any promotion: {path.name}: {record.outcome.value} "
            f"({statuses})")
