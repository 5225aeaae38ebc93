"""`python -m qualify merge PATH... --out DIR`: evidence from many hosts into `qualify promote`'s input.

PATH: probe manifests (*.json), directories of them, or Job pod logs (*.log).
The same evidence counts once; two image digests for one target are refused.
Prints the files written, one a line: `qualify promote TAG --evidence $(cat list)`.
"""

from __future__ import annotations

from pathlib import Path

from qualify.core.report import Reporter
from qualify.scaleout import merge

REPORT = Reporter("merge")


def configure_parser(parser) -> None:
    parser.add_argument("paths", nargs="+", type=Path, help="evidence files, directories or pod logs")
    parser.add_argument("--out", type=Path, required=True, help="directory for the merged evidence (new or empty)")


def execute(args) -> int:
    merged = merge.merge(args.paths)
    for dropped, kept in merged.duplicates:
        REPORT.say(f"{dropped}: the same evidence as {kept}; counted once")
    for path in merge.write(merged, args.out):
        print(path)
    by_target = {}
    for e in merged.evidence:
        by_target.setdefault(e.target, []).append(e)
    for target, evs in sorted(by_target.items()):
        images = sorted({e.digest for e in evs if not e.is_host})
        REPORT.say(f"{target}: {len(evs)} evidence file(s); image {images[0] if images else '(host evidence only)'}")
    return 0
