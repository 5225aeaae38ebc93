"""`python -m qualify pin [TARGET...] [--file F] [--json]`."""

from __future__ import annotations

import json
from pathlib import Path

from qualify.config import targets
from qualify.imagebuild import pin


def configure_parser(parser) -> None:
    parser.add_argument("targets", nargs="*", help="targets to re-pin (default: all)")
    parser.add_argument("--file", type=Path, default=targets.DEFAULT_TARGETS_FILE)
    parser.add_argument("--json", action="store_true")


def execute(args) -> int:
    changes = pin.pin(args.file, args.targets)
    if args.json:
        print(json.dumps(pin.as_json(changes), indent=2, sort_keys=True))
    else:
        print(pin.table(changes))
        n = sum(c.changed for c in changes)
        print(f"{args.file}: {n} digest(s) changed" if n else f"{args.file}: unchanged")
    return 0
