"""`python -m qualify sums write|check`: SHA256SUMS of the release inputs."""

from __future__ import annotations

import json
from pathlib import Path

from qualify.core.errors import VerificationError
from qualify.release import sums


def configure_parser(parser) -> None:
    sub = parser.add_subparsers(dest="action", required=True)
    write = sub.add_parser("write", help="(re)write SHA256SUMS atomically")
    write.add_argument("--root", type=Path, default=Path("."), help="repository root (default: here)")
    write.add_argument("--output", type=Path, help="where to write (default: ROOT/SHA256SUMS)")
    write.add_argument("--staged", action="store_true",
                       help="sum the inputs as git's index holds them and add SHA256SUMS to the index: what the "
                       "next commit records (scripts/git-hooks/pre-commit runs this)")
    check = sub.add_parser("check", help="report missing, changed and unlisted files")
    check.add_argument("--root", type=Path, default=Path("."), help="repository root (default: here)")
    check.add_argument("--file", type=Path, help="the sums file (default: ROOT/SHA256SUMS)")
    check.add_argument("--json", action="store_true")


def execute(args) -> int:
    if args.action == "write":
        if args.staged and args.output is not None:
            raise VerificationError("--staged writes ROOT/SHA256SUMS and stages it; leave out --output")
        path = sums.write_staged(args.root) if args.staged else sums.write(args.root, args.output)
        count = len(path.read_text(encoding="utf-8").splitlines())
        print(f"{path}: {count} files")
        return 0
    report = sums.check(args.root, args.file)
    if args.json:
        print(json.dumps({"ok": report.ok, "missing": report.missing, "changed": report.changed,
                          "unlisted": report.unlisted}, indent=2))
    else:
        for line in report.lines():
            print(line)
    if not report.ok:
        raise VerificationError(f"SHA256SUMS does not match the release inputs: {len(report.missing)} missing, "
                                f"{len(report.changed)} changed, {len(report.unlisted)} unlisted",
                                hint="regenerate it with `python3 -m qualify sums write` (or `nox -s sums`) once the "
                                "changes are intended; `bash scripts/setup-host.sh` installs a pre-commit hook that "
                                "does it at every commit")
    if not args.json:
        print("SHA256SUMS: OK")
    return 0
