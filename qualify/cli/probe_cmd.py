"""`python -m qualify probe`: run the qualification checks on this host.

The image side's own entry point is `python3 -m qualify.probe` (what runs in
containers); this command adds `--target NAME`, resolved from the targets
file here on the host, and hands over.
"""

from __future__ import annotations

from qualify.probe import cli as probe_cli


def configure_parser(parser) -> None:
    probe_cli.configure_parser(parser, target_required=False)
    parser.add_argument("--target", help="a target of images/targets.toml (instead of --target-json)")
    parser.add_argument("--file", default=None, help="targets file (with --target)")


def execute(args) -> int:
    from qualify.probe import staged

    staged.activate()  # QUALIFY_STAGED (a bare GPU host: `qualify probe-bundle`), before the census imports elftools
    if bool(args.target) == bool(args.target_json):
        from qualify.core.errors import ConfigError

        raise ConfigError("give exactly one of --target NAME or --target-json JSON")
    if args.target:
        from qualify.config import targets
        from qualify.qualification.container import probe_target

        tf = targets.load(args.file)
        args.target_json = probe_target(tf.get(args.target), args.profile,
                                        allreduce_floors=tf.allreduce_floors).to_json()
    return probe_cli.execute(args, probe_cli.probe_target(args))
