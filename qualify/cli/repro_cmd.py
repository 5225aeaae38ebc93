"""`python -m qualify repro TARGET [image options] [--builder B] [--keep] [--json] [--check-base]`.

Builds the image twice from clean state (no cache, one SOURCE_DATE_EPOCH,
under a scratch tag: the build record and the real tag are left alone),
compares the digests, and prints `reproducible` or what differs and why.
Exit 0 only when every image checked is reproducible.
"""

from __future__ import annotations

import json
import shutil
import sys

from qualify.cli.build_cmd import add_image_options
from qualify.config import targets
from qualify.core.errors import ConfigError
from qualify.host.engine import Engine
from qualify.host.registry import Registry
from qualify.imagebuild import image
from qualify.repro import double as repro


def configure_parser(parser) -> None:
    add_image_options(parser)
    parser.add_argument("--builder", choices=("auto", "buildx", "buildkit"), default="auto",
                        help="docker only: use this builder instead of the detected one (the classic builder, which "
                             "DOCKER_BUILDKIT=0 selects, cannot build the images and is refused)")
    parser.add_argument("--keep", action="store_true", help="keep the image tarballs (their paths are printed)")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument("--check-base", action="store_true",
                        help="with --base hermetic: also debootstrap the rootfs again and build the hermetic base "
                             "twice (scratch repository), and compare")
    parser.add_argument("--max-files", type=int, default=12, help="differing files listed per layer (default 12)")


def execute(args) -> int:
    tf = targets.load(args.file)
    if args.check_base and args.base != "hermetic":
        raise ConfigError("--check-base checks the hermetic base", hint="add --base hermetic")
    engine = Engine(args.engine, builder=None if args.builder == "auto" else args.builder).check()
    image.check_builder(engine)  # before any build: the second one would fail the same way
    registry = Registry.from_env().ensure()
    repro.say(engine.describe())
    note = repro.cannot_reproduce_note(engine)
    if note:
        repro.say(note)
    opts = image.BuildOptions(target=args.target, base=args.base, profile=args.profile, engine=args.engine)
    workdir = repro.scratch_dir()
    outcomes = []
    try:
        if args.check_base:
            outcomes.append(repro.check_rootfs(tf, args.target, workdir))
            outcomes.append(repro.double_build_base(tf, args.target, engine, registry, workdir, keep=args.keep))
        outcomes.append(repro.double_build(tf, opts, engine, registry, workdir, keep=args.keep))
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    if args.json:
        print(json.dumps([repro.outcome_json(o) for o in outcomes], indent=2, sort_keys=True))
    else:
        for outcome in outcomes:
            print("\n".join(repro.outcome_lines(outcome, args.max_files)))
        if args.keep:
            print(f"tarballs kept in {workdir}")
    sys.stdout.flush()
    return repro.exit_status(outcomes)
