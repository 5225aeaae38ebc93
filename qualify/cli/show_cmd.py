"""`python -m qualify show MANIFEST [--json]`."""

from __future__ import annotations

import json
from pathlib import Path

from qualify.core import manifest
from qualify.release import report


def configure_parser(parser) -> None:
    parser.add_argument("manifest", type=Path)
    parser.add_argument("--json", action="store_true", help="print the predicate as JSON")


def execute(args) -> int:
    stmt = manifest.load(args.manifest)
    if args.json:
        print(json.dumps(manifest.predicate(stmt), indent=2, sort_keys=True))
    else:
        print(report.show(stmt))
    return 0
