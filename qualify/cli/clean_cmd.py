"""`python -m qualify clean [--all] [--dry-run] [--json]`: remove what the toolkit made, say what it freed."""

from __future__ import annotations

from pathlib import Path

from qualify.host import clean
from qualify.host.engine import Engine
from qualify.host.registry import Registry


def configure_parser(parser) -> None:
    parser.add_argument("--all", action="store_true",
                        help="also released images, the hermetic base and the debootstrap cache (default: keep them)")
    parser.add_argument("--dry-run", action="store_true", help="list what would be removed, remove nothing")
    parser.add_argument("--json", action="store_true", help="the report as JSON")
    parser.add_argument("--engine", choices=("docker", "podman"), default="docker", help="(default: docker)")
    parser.add_argument("--releases", type=Path, default=None,
                        help="where release folders live (default: manifests/ of this checkout)")


def execute(args) -> int:
    engine = Engine(args.engine).check()
    report = clean.clean(engine, Registry.from_env(), args.releases or clean.default_releases_dir(),
                         everything=args.all, dry_run=args.dry_run)
    clean.print_report(report, args.json)
    return 0
