"""`python -m qualify build TARGET [--base pinned|hermetic] [--profile vllm|smoke] [--engine docker|podman]`."""

from __future__ import annotations

import sys

from qualify.config import targets
from qualify.host.engine import Engine
from qualify.imagebuild import image


def add_image_options(parser, target_optional: bool = False) -> None:
    """Options shared by build, qualify and repro (the same image is meant). `target_optional`: qualify, whose
    `--image` form may name the target with `--target` instead."""
    parser.add_argument("target", nargs="?" if target_optional else None, default=None,
                        help="a target of images/targets.toml, e.g. sm120")
    parser.add_argument("--base", choices=targets.BASE_KINDS, default="pinned",
                        help="pinned: the nvidia/cuda digest from targets.toml; hermetic: built here from Debian + "
                        "CUDA wheels (default: %(default)s)")
    parser.add_argument("--profile", choices=targets.PROFILES, default=None if target_optional else "vllm",
                        help="vllm: vLLM 0.33 + torch + FlashInfer, an image of about 12 GB; smoke: Triton + a tiny "
                        "CUDA extension, about 1.6 GB (default: "
                        + ("vllm; with --image: detected from what the image holds)" if target_optional
                           else "%(default)s)"))
    parser.add_argument("--engine", choices=("docker", "podman"), default="docker",
                        help="container engine (default: %(default)s)")
    parser.add_argument("--file", default=None, help="targets file (default: images/targets.toml)")


def configure_parser(parser) -> None:
    add_image_options(parser)
    parser.add_argument("--no-cache", action="store_true", help="rebuild every layer")
    parser.add_argument("--keep-cache", action="store_true",
                        help="prune none of this checkout's build cache (default: what the newest build of each "
                        "target, profile and base uses stays; older records are pruned to the budget)")
    parser.add_argument("--cache-budget", type=_gigabytes, default=None, metavar="GB",
                        help="build cache this checkout keeps beyond what its newest builds use "
                        "(default: [build] cache_budget_gb of images/targets.toml)")
    parser.add_argument("--no-qualify", action="store_true", help="do not qualify the image after the build")
    parser.add_argument("--dry-run", action="store_true", help="print the build arguments and labels only")


def _gigabytes(text: str) -> float:
    import argparse

    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of GB (e.g. 20 or 0.5)") from None
    if not 0 <= value <= 10000:
        raise argparse.ArgumentTypeError(f"{value} GB is outside 0..10000")
    return value


def execute(args) -> int:
    """Composes the build stage and, unless --no-qualify, the qualification stage."""
    tf = targets.load(args.file)
    opts = image.BuildOptions(target=args.target, base=args.base, profile=args.profile, engine=args.engine,
                              no_cache=args.no_cache, keep_cache=args.keep_cache, cache_budget_gb=args.cache_budget)
    if args.dry_run:
        print(image.plan(tf, opts).to_json())
        return 0
    engine = Engine(args.engine).check()
    record = image.build(tf, opts, engine)
    print(record.image_reference)
    if args.no_qualify:
        return 0
    from qualify.qualification import stage as qualification

    return qualification.report(qualification.qualify(tf, record, engine), sys.stdout)
