"""`python -m qualify promote TAG --evidence FILE...`: seed 000's promotion rule over GPU evidence."""

from __future__ import annotations

from pathlib import Path

from qualify.config import targets
from qualify.release import promote


def configure_parser(parser) -> None:
    parser.add_argument("tag", help="the release: manifests/TAG/")
    parser.add_argument("--evidence", type=Path, nargs="+", required=True,
                        help="GPU evidence files start.sh saved (<target>.gpu-evidence.*.json)")
    parser.add_argument("--manifests", type=Path, default=targets.REPO_ROOT / "manifests")
    parser.add_argument("--key", type=Path, default=Path("cosign.key"),
                        help="the release key (password from COSIGN_PASSWORD or the terminal)")
    parser.add_argument("--file", type=Path, default=targets.DEFAULT_TARGETS_FILE)


def execute(args) -> int:
    folder = args.manifests / args.tag
    if not folder.is_dir() or "/" in args.tag or args.tag in (".", ".."):
        from qualify.core.errors import ConfigError

        raise ConfigError(f"{folder}: no such release folder", hint="name a tag under manifests/")
    tf = targets.load(args.file)
    for p in promote.promote(folder, args.tag, args.evidence, tf, promote.release_signer(args.key)):
        s = p.standing
        print(f"{p.target}: {s.level} ({s.consecutive_passes} of {s.required} consecutive passes; "
              f"{len(s.counted)} records, {p.new} new){'; ' + s.note if s.note else ''}")
        print(f"  wrote {p.manifest} and {p.record} (signed)")
    return 0
