"""`python -m qualify compare M1.json M2.json ... [--target T] [--json | --markdown] [--width N]`.

Images side by side (release/compare.py). Exit status: 0 when the verdicts agree, 1 when they differ
(the question was which image to deploy), 2 or more on errors.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from qualify.core.report import emit
from qualify.release import compare
from qualify.signing import formats


def configure_parser(parser) -> None:
    parser.add_argument("manifests", type=Path, nargs="+", metavar="MANIFEST",
                        help="qualification manifests (ours or of images built elsewhere: qualify --image)")
    parser.add_argument("--target", default=None,
                        help="compare only the manifests for this target (without it they must all be for one)")
    form = parser.add_mutually_exclusive_group()
    form.add_argument("--json", action="store_true",
                      help="stable JSON: images, and rows of section, name, values (one per image), differs")
    form.add_argument("--markdown", action="store_true", help="a GitHub table for release notes, differing rows in bold")
    parser.add_argument("--width", type=int, default=None,
                        help="line width of the table (default: the terminal's); cut text ends in an ellipsis")


def execute(args) -> int:
    manifests, skipped = formats.beside_their_files(args.manifests)
    if skipped:  # docs/qualify.md's `build/external/sm120-*.json` matches the bundles beside the manifests too
        emit(f"compare: skipped {len(skipped)} signature or bundle file(s) given beside their manifests: "
             + ", ".join(str(p) for p in skipped))
    result = compare.compare(manifests, args.target)
    if args.json:
        print(json.dumps(result.to_json(), indent=2, sort_keys=True))
    elif args.markdown:
        print(result.markdown())
    else:
        print(result.text(args.width or shutil.get_terminal_size((160, 24)).columns))
    return 1 if result.verdicts_differ else 0
