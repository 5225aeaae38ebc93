"""`python -m qualify show MANIFEST [--json] [--width N]`."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from qualify.core import manifest
from qualify.release import report
from qualify.release.standing import standing_of


def configure_parser(parser) -> None:
    parser.add_argument("manifest", type=Path)
    parser.add_argument("--json", action="store_true", help="print the predicate as JSON")
    parser.add_argument("--width", type=int, default=None,
                        help="line width; cut text ends in an ellipsis (default: the terminal's width, "
                        f"else {report.DEFAULT_WIDTH})")


def execute(args) -> int:
    stmt = manifest.load(args.manifest)
    if args.json:  # the manifest as it is: its own support_level (a promotion's is in the promotion record)
        print(json.dumps(manifest.predicate(stmt), indent=2, sort_keys=True))
    else:
        width = args.width or shutil.get_terminal_size((report.DEFAULT_WIDTH, 24)).columns
        print(report.show(stmt, width, standing_of(args.manifest, manifest.Manifest.from_statement(
            stmt, str(args.manifest)))))
    return 0
