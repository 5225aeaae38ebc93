"""`python -m qualify promote TAG --evidence FILE...`: seed 000's promotion rule over GPU evidence.

The rule is the release's own (release.json's signed policy), never a targets file: `--file` is refused.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from qualify.core.errors import ConfigError, printable
from qualify.host import paths
from qualify.release import promote
from qualify.release.order import tag_problem
from qualify.release.records import HOSTS_FILE
from qualify.signing import formats


def configure_parser(parser) -> None:
    parser.add_argument("tag", help="the release: manifests/TAG/")
    parser.add_argument("--evidence", type=Path, nargs="+", required=True,
                        help="GPU evidence files start.sh saved (<target>.gpu-evidence.*.json), each with its "
                        ".sig/.sigstore.json beside it, or probe manifests (qualify gpu-evidence, qualify merge)")
    parser.add_argument("--manifests", type=Path, default=paths.HERE.releases)
    parser.add_argument("--key", type=Path, default=Path("cosign.key"),
                        help="the release key (password from COSIGN_PASSWORD or the terminal); its public half "
                        "must be the release's cosign.pub")
    parser.add_argument("--hosts", type=Path, default=None,
                        help=f"the enrolled hosts, signed with the release key (default: MANIFESTS/{HOSTS_FILE}; "
                        "python -m qualify hosts add)")
    parser.add_argument("--allow-unsigned-evidence", action="store_true",
                        help="count evidence no enrolled host signed (recorded in the promotion record)")
    parser.add_argument("--file", type=Path, default=None, help=argparse.SUPPRESS)  # refused: see execute


def execute(args) -> int:
    if args.file is not None:
        raise ConfigError(f"--file {args.file}: promote takes its rule (passes, capability, intended level) from the "
                          "release's signed release.json, never from a targets file",
                          hint="drop --file; to change the rule, make a new release")
    if tag_problem(args.tag):
        raise ConfigError(f"TAG: {tag_problem(args.tag)}", hint="name a release under manifests/")
    release_dir = args.manifests / args.tag
    if not release_dir.is_dir():
        raise ConfigError(f"{release_dir}: no such release folder", hint="name a tag under manifests/")
    sign, public = promote.release_signer(args.key)
    promote.check_key(public, release_dir)
    hosts_file = args.hosts or args.manifests / HOSTS_FILE
    if args.hosts is not None and not hosts_file.exists():
        raise ConfigError(f"--hosts {hosts_file}: no such file", hint="python -m qualify hosts add NAME --key HOST.pub")
    if args.allow_unsigned_evidence:
        print("promote: WARNING: --allow-unsigned-evidence: evidence that no enrolled host signed counts; the "
              "promotion record says so", file=sys.stderr)
    evidence, skipped = formats.beside_their_files(args.evidence)
    if skipped:  # the README's `--evidence sm120.gpu-evidence.*.json` matches each record's bundle too
        print(f"promote: skipped {len(skipped)} signature or bundle file(s) given beside their evidence records "
              "(each record's own are read with it): " + ", ".join(printable(str(p)) for p in skipped), file=sys.stderr)
    done = promote.promote(release_dir, args.tag, evidence, sign, public, hosts_file,
                           args.allow_unsigned_evidence, progress=lambda m: print(printable(m), file=sys.stderr))
    for p in done:
        print("\n".join(promote.summary_lines(p, args.allow_unsigned_evidence)))
    return 0
