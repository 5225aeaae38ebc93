"""`python -m qualify bake [--check] [--env] [--stage TARGET] [--record TARGET --metadata FILE]`.

Writes docker-bake.json from images/targets.toml (the default), or checks the
committed one; prints this checkout's bake variables; stages a target's
build context and the probe bundle for `docker buildx bake`; turns bake's
metadata into the build record `qualify qualify` reads.
"""

from __future__ import annotations

from pathlib import Path

from qualify.config import targets
from qualify.core.errors import ConfigError
from qualify.core.fsutil import write_atomic
from qualify.core.report import Reporter, emit
from qualify.scaleout import bake

REPORT = Reporter("bake")


def configure_parser(parser) -> None:
    parser.add_argument("--file", default=None, help="targets file (default images/targets.toml)")
    parser.add_argument("--out", type=Path, default=bake.BAKE_FILE, help="bake file (default docker-bake.json)")
    parser.add_argument("--check", action="store_true", help="exit 2 when the bake file is not what the targets file gives")
    parser.add_argument("--env", action="store_true", help="print the bake variables of this checkout as NAME=VALUE")
    parser.add_argument("--stage", metavar="TARGET", help="lay out TARGET's build context and the probe bundle")
    parser.add_argument("--record", metavar="TARGET", help="write TARGET's build record from --metadata; print its reference")
    parser.add_argument("--metadata", type=Path, help="docker buildx bake --metadata-file output (with --record)")
    parser.add_argument("--profile", choices=targets.PROFILES, default="vllm", help="with --stage / --record")


def _bake_target(tf, name: str, profile: str) -> bake.BakeTarget:
    return bake.BakeTarget(tf.get(name), profile)


def execute(args) -> int:
    tf = targets.load(args.file)
    if args.env:
        for name, value in bake.current_variables().items():
            print(f"{name}={value}")
        return 0
    if args.stage:
        from qualify.scaleout import bakestage

        print(bakestage.stage(tf, _bake_target(tf, args.stage, args.profile)))
        print(bakestage.stage_probe())
        return 0
    if args.record:
        if not args.metadata:
            raise ConfigError("--record needs --metadata FILE (docker buildx bake --metadata-file FILE)")
        from qualify.imagebuild import image
        from qualify.scaleout import bakestage

        path = bakestage.record(tf, _bake_target(tf, args.record, args.profile), args.metadata, bake.current_variables())
        print(image.load_record(args.record, args.profile, bake.BASE_KIND).image_reference)
        REPORT.say(f"build record {path}")
        return 0
    if args.check:
        bake.check(args.out, tf)
        emit(f"{args.out}: matches {tf.path}")
        return 0
    write_atomic(args.out, bake.dumps(bake.generate(tf)))
    REPORT.say(f"wrote {args.out}")
    return 0
