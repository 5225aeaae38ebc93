"""`python -m qualify qualify TARGET [--base ...] [--profile ...] [--engine ...] [--force]`."""

from __future__ import annotations

import sys

from .. import build, qualification, targets
from .build_cmd import add_image_options


def configure_parser(parser) -> None:
    add_image_options(parser)
    parser.add_argument("--force", action="store_true", help="qualify again even if this image was qualified by this probe")


def execute(args) -> int:
    tf = targets.load(args.file)
    opts = build.BuildOptions(target=args.target, base=args.base, profile=args.profile, engine=args.engine)
    return qualification.qualify_target(tf, opts, args.force, sys.stdout)
