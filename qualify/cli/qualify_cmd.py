"""`python -m qualify qualify TARGET [--base ...] [--profile ...] [--engine ...] [--force]`.

Composes two stages: build (only when no built image exists) and qualify.
"""

from __future__ import annotations

import sys

from qualify.cli.build_cmd import add_image_options
from qualify.config import targets
from qualify.core.errors import ConfigError
from qualify.host.engine import Engine
from qualify.imagebuild import image
from qualify.qualification import stage as qualification


def configure_parser(parser) -> None:
    add_image_options(parser)
    parser.add_argument("--force", action="store_true", help="qualify again even if this image was qualified by this probe")


def execute(args) -> int:
    tf = targets.load(args.file)
    opts = image.BuildOptions(target=args.target, base=args.base, profile=args.profile, engine=args.engine)
    record = image.load_record(opts.target, opts.profile, opts.base)
    engine = Engine(opts.engine).check()
    if record is None or not engine.exists(record.image_reference):
        print(f"[qualify] no built {opts.profile} image of {opts.target} on the {opts.base} base: building it first",
              file=sys.stderr, flush=True)
        built = image.build(tf, opts, engine)
        if not isinstance(built, image.BuildRecord):
            raise ConfigError("nothing was built (dry run?)")
        record = built
    return qualification.report(qualification.qualify(tf, record, engine, force=args.force), sys.stdout)
