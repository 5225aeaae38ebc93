"""`python -m qualify promote TAG --evidence FILE...`: the Blackwell support RFC's promotion rule over GPU evidence.

The rule is the release's own (release.json's signed policy), never a targets file: `--file` is refused.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import List, Sequence, Tuple

from qualify.core.errors import ConfigError, printable
from qualify.core.report import emit
from qualify.host import paths
from qualify.release import promote
from qualify.signing import formats
from qualify.trust.order import tag_problem
from qualify.trust.records import HOSTS_FILE


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
    parser.add_argument("--hosts-history", type=Path, default=None, metavar="DIR",
                        help="earlier versions of the hosts file (each with its .sig), where git's history and the "
                        "kept hosts.<n>.json beside it do not have them: the chain is checked link by link")
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
    release_signer, public = promote.release_signer(args.key)
    promote.check_key(public, release_dir)
    hosts_file = args.hosts or args.manifests / HOSTS_FILE
    if args.hosts is not None and not hosts_file.exists():
        raise ConfigError(f"--hosts {hosts_file}: no such file", hint="python -m qualify hosts add NAME --key HOST.pub")
    if args.allow_unsigned_evidence:
        emit("promote: WARNING: --allow-unsigned-evidence: evidence that no enrolled host signed counts; the "
             "promotion record says so")
    given, unmatched = patterns_left_by_the_shell(args.evidence)
    if unmatched:  # the README's `sm120.serve-check.*.json` matches nothing for an image with no server
        emit(f"promote: {len(unmatched)} pattern(s) matched no file (the shell passed them on as written): "
             + ", ".join(printable(str(p)) for p in unmatched)
             + "; a run whose level needs a serve-check record counts only with one")
    if not given:
        raise ConfigError("--evidence: no evidence file given (every pattern matched nothing)",
                          hint="name the <target>.gpu-evidence.*.json files start.sh saved")
    evidence, skipped = formats.beside_their_files(given)
    if skipped:  # the README's `--evidence sm120.gpu-evidence.*.json` matches each record's bundle too
        emit(f"promote: skipped {len(skipped)} signature or bundle file(s) given beside their evidence records "
             "(each record's own are read with it): " + ", ".join(printable(str(p)) for p in skipped))
    done = promote.promote(release_dir, args.tag, evidence, release_signer, public, hosts_file,
                           args.allow_unsigned_evidence, progress=lambda m: emit(printable(m)),
                           hosts_history=args.hosts_history)
    for p in done:
        print("\n".join(promote.summary_lines(p, args.allow_unsigned_evidence)))
    return 0


def patterns_left_by_the_shell(given: Sequence[Path]) -> Tuple[List[Path], List[Path]]:
    """(files, unmatched): a missing argument with a glob character in its name is a pattern the shell found no
    file for and passed on literally (bash without nullglob). It is no evidence, and not an error: the rule
    counts only what was handed in, so a missing record fails closed. Any other missing file is still an error
    from its reader."""
    files: List[Path] = []
    unmatched: List[Path] = []
    for path in given:
        pattern = any(c in path.name for c in "*?[") and not path.exists() and not path.is_symlink()
        (unmatched if pattern else files).append(path)
    return files, unmatched
