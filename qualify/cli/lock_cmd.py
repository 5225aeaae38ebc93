"""`python -m qualify lock TARGET [--base pinned|hermetic] [--profile P]`: regenerate locks."""

from __future__ import annotations

from qualify.config import targets
from qualify.core.errors import ConfigError
from qualify.imagebuild import locks, wheelhouse


def configure_parser(parser) -> None:
    parser.add_argument("target")
    parser.add_argument("--base", choices=targets.BASE_KINDS + ("all",), default="all",
                        help="whose Python to lock for (default: both)")
    parser.add_argument("--profile", choices=targets.PROFILES + ("all",), default="all")
    parser.add_argument("--file", default=None, help="targets file (default images/targets.toml)")


def execute(args) -> int:
    tf = targets.load(args.file)
    t = tf.get(args.target)
    kinds = targets.BASE_KINDS if args.base == "all" else (args.base,)
    profiles = t.profiles if args.profile == "all" else (args.profile,)
    if any(p not in t.profiles for p in profiles):
        raise ConfigError(f"target {t.name} has no {args.profile} profile", hint=f"its profiles: {', '.join(t.profiles)}")
    pythons = sorted({t.python_for(k, tf.hermetic) for k in kinds})
    sources = wheelhouse.cpu_torch_sources() if t.is_cpu else None
    for profile in profiles:
        for python in pythons:
            out = t.lock_path(profile, python)
            changes = locks.compile_lock(t.lock_profile(profile), t.platform, python, out, f"nox -s lock-{t.name}",
                                         sources)
            locks.print_changes(out, changes)
    hermetic = locks.hermetic_lock_path(t.platform)
    if "hermetic" in kinds and not t.is_cpu:  # a cpu target's hermetic base carries no CUDA
        changes = locks.compile_lock("hermetic-cuda", t.platform, tf.hermetic.python, hermetic, f"nox -s lock-{t.name}")
        locks.print_changes(hermetic, changes)
    return 0
