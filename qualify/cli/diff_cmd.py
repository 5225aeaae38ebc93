"""`python -m qualify diff OLD NEW [--json]`: what changed between two manifests.

Exit status as diff(1): 0 when they are the same, 1 when they differ, 2 or more on errors.
"""

from __future__ import annotations

import json
from pathlib import Path

from qualify.core import manifest
from qualify.release import report
from qualify.release.standing import standing_of


def configure_parser(parser) -> None:
    parser.add_argument("old", type=Path)
    parser.add_argument("new", type=Path)
    parser.add_argument("--json", action="store_true",
                        help="structured changes: kind (target, platform, capability, verdict, support_level, image, "
                        "package, library, check), name, before, after")


def _current(path: Path):
    """The manifest at `path` as it stands now: in a release folder, with its verified current level and
    promotion record (release/v3 manifests keep the released level)."""
    stmt = manifest.load(path)
    return report.as_current(stmt, standing_of(path, manifest.Manifest.from_statement(stmt, str(path))))


def execute(args) -> int:
    found = report.changes(_current(args.old), _current(args.new))
    if args.json:
        print(json.dumps({"old": str(args.old), "new": str(args.new), "differ": bool(found),
                          "changes": [c.as_dict() for c in found]}, indent=2, sort_keys=True))
    else:
        print("\n".join(c.line() for c in found) if found else "no differences")
    return 1 if found else 0
