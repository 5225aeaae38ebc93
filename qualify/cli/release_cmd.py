"""`python -m qualify release TAG`: sign qualified manifests and release them to a git tag."""

from __future__ import annotations

import json
from pathlib import Path

from qualify import cmd
from qualify.core.manifest import LEVEL_RANK
from qualify.release import release
from qualify.signing import signer


def configure_parser(parser) -> None:
    parser.add_argument("tag", help="the git tag to create, e.g. v2026.11.0")
    parser.add_argument("--from", dest="source", type=Path,
                        help="folder of qualified manifests <target>.json (default: build/manifests)")
    parser.add_argument("--min-level", choices=list(LEVEL_RANK), default=release.DEFAULT_MIN_LEVEL,
                        help="withhold targets below this support level (default: unverified)")
    parser.add_argument("--key", type=Path, default=Path("cosign.key"),
                        help="cosign private key (default: cosign.key); password from COSIGN_PASSWORD "
                        "or the terminal")
    parser.add_argument("--signer", choices=signer.SIGNERS, default="auto",
                        help="auto: cosign when installed, else the built-in signer")
    parser.add_argument("--force", action="store_true",
                        help="re-sign, overwrite existing assets and move an existing tag")
    parser.add_argument("--repo", type=Path, default=Path("."), help="the git repository (default: here)")
    parser.add_argument("--no-upload", action="store_true", help="do not run gh release upload")
    parser.add_argument("--json", action="store_true", help="print a machine-readable summary")


def _print_human(o: release.Outcome) -> None:
    print(f"Released {o.tag}: {len(o.released)} target(s) in {o.directory}")
    for e in o.released:
        print(f"  {e.target:<12} {e.support_level:<13} {e.image_digest}  manifest sha256:{e.manifest_sha256}")
    for w in o.withheld:
        print(f"  {w.target:<12} WITHHELD      {w.reason}")
    print(f"Tag {o.tag} ({o.tag_object[:12]}); files written: {len(o.written)}, unchanged: {len(o.unchanged)}")
    print(f"Upload: {o.upload}")
    if o.upload != "uploaded":
        print(f"  {cmd.quote(o.upload_command)}")


def execute(args) -> int:
    repo = release.git_root(args.repo)
    opts = release.ReleaseOptions(
        tag=args.tag,
        repo=repo,
        source=(args.source or repo / "build" / "manifests").resolve(),
        out_root=repo / "manifests",
        min_level=args.min_level,
        force=args.force,
        upload=not args.no_upload,
    )
    outcome = release.run_release(opts, lambda: signer.key_signer(args.signer, args.key))
    if args.json:
        print(json.dumps(outcome.as_dict(), indent=2, sort_keys=True))
    else:
        _print_human(outcome)
    return 0
