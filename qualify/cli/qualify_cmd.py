"""`python -m qualify qualify TARGET [--base ...] [--profile ...] [--engine ...] [--force]`,
or `python -m qualify qualify --image REF --target TARGET [--profile ...] [--gpus ...] [--out FILE]`.

The first composes two stages: build (only when no built image exists) and qualify. The second qualifies
an image this toolkit did not build (qualification/external.py): nothing is built, and the manifest goes
to build/external/ (or --out), never into the release input.
"""

from __future__ import annotations

import sys
from pathlib import Path

from qualify.cli.build_cmd import add_image_options
from qualify.config import targets
from qualify.core.errors import ConfigError
from qualify.core.report import Reporter
from qualify.host.engine import Engine
from qualify.imagebuild import image
from qualify.qualification import stage as qualification

REPORT = Reporter("qualify")


def configure_parser(parser) -> None:
    add_image_options(parser, target_optional=True)
    parser.add_argument("--force", action="store_true", help="qualify again even if this image was qualified by this probe")
    external = parser.add_argument_group("an image built elsewhere (--image)")
    external.add_argument("--image", metavar="REF",
                          help="qualify this image instead of our build: repository@sha256:<digest> (any registry the "
                          "engine can pull from), repository:tag (resolved to its digest once; the digest is recorded "
                          "and used) or a local image id. The profile is detected (vLLM installed or not) unless "
                          "--profile is given; --base does not apply")
    external.add_argument("--target", dest="target_option", metavar="TARGET",
                          help="the target to qualify the image for (the same as the positional TARGET)")
    external.add_argument("--gpus", default=None,
                          help="GPUs for the probe container (docker --gpus, e.g. all): every scope runs; without it "
                          "the static checks run and the GPU checks are not-run")
    external.add_argument("--out", type=Path, default=None,
                          help="the manifest to write (default: build/external/<target>-<digest>.json)")


def _target(args) -> str:
    given = [t for t in (args.target, args.target_option) if t]
    if not given:
        raise ConfigError("no target: give TARGET (or --target TARGET with --image)",
                          hint="python -m qualify targets list names them")
    if len(set(given)) > 1:
        raise ConfigError(f"two targets given: {given[0]} and --target {given[1]}", hint="give one")
    return given[0]


def execute(args) -> int:
    target = _target(args)
    tf = targets.load(args.file)
    if args.image:
        return _external(args, tf, target)
    for name in ("gpus", "out"):
        if getattr(args, name) is not None:
            raise ConfigError(f"--{name} goes with --image", hint="qualify our build of a target without it")
    opts = image.BuildOptions(target=target, base=args.base, profile=args.profile or "vllm", engine=args.engine)
    record = image.load_record(opts.target, opts.profile, opts.base)
    engine = Engine(opts.engine).check()
    if record is None or not engine.exists(record.image_reference):
        REPORT.say(f"no built {opts.profile} image of {opts.target} on the {opts.base} base: building it first")
        built = image.build(tf, opts, engine)
        if not isinstance(built, image.BuildRecord):
            raise ConfigError("nothing was built (dry run?)")
        record = built
    return qualification.report(qualification.qualify(tf, record, engine, force=args.force), sys.stdout)


def _external(args, tf, target: str) -> int:
    from qualify.qualification import external

    if args.base != "pinned":
        raise ConfigError("--base does not apply to --image: the base of an image built elsewhere is unknown")
    tf.get(target)  # an unknown target is refused before any engine work
    done = external.qualify(tf, target, args.image, Engine(args.engine).check(), profile=args.profile,
                            gpus=args.gpus, out=args.out)
    return qualification.report(done, sys.stdout)
