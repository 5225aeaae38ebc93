"""`python -m qualify diff OLD NEW [--json]`: what changed between two releases. Exit 1 when anything did."""

from __future__ import annotations

import json
from pathlib import Path

from qualify.core import manifest
from qualify.release import report


def configure_parser(parser) -> None:
    parser.add_argument("old", type=Path)
    parser.add_argument("new", type=Path)
    parser.add_argument("--json", action="store_true")


def execute(args) -> int:
    lines = report.diff(manifest.load(args.old), manifest.load(args.new))
    if args.json:
        print(json.dumps({"changes": lines}, indent=2))
    else:
        print("\n".join(lines) if lines else "no differences")
    return 0
