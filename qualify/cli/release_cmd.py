"""`python -m qualify release TAG`: sign qualified manifests and release them to a git tag."""

from __future__ import annotations

import json
from pathlib import Path

from qualify.core.manifest import LEVEL_RANK
from qualify.host import cmd, paths
from qualify.release import gitops, model, release
from qualify.release.verify import registry_digest
from qualify.signing import signer


def configure_parser(parser) -> None:
    parser.add_argument("tag", help="the version tag to create, e.g. v1.2.0 or v1.2.0-rc.1 (semver)")
    parser.add_argument("--from", dest="source", type=Path,
                        help="folder of qualified manifests <target>.json (default: build/manifests)")
    parser.add_argument("--min-level", choices=list(LEVEL_RANK), default=model.DEFAULT_MIN_LEVEL,
                        help="withhold targets below this support level (default: %(default)s)")
    parser.add_argument("--key", type=Path, default=Path("cosign.key"),
                        help="cosign private key (default: %(default)s); password from COSIGN_PASSWORD "
                        "or the terminal, checked before any image work")
    parser.add_argument("--signer", choices=signer.SIGNERS, default="auto",
                        help="auto: cosign when installed, else the built-in signer (default: %(default)s)")
    parser.add_argument("--force", action="store_true",
                        help="re-sign, overwrite the files this release writes in manifests/TAG/, remove files an "
                        "earlier release of TAG recorded, and move an existing tag (files no release wrote are "
                        "never touched)")
    parser.add_argument("--allow-partial", action="store_true",
                        help="release the other targets when some are withheld (default: a withheld target fails "
                        "the release and nothing is tagged)")
    parser.add_argument("--allow-dirty", action="store_true",
                        help="release from a work tree with changes (recorded in release.json)")
    parser.add_argument("--any-tag", action="store_true", help="allow a tag name that is not a semver version")
    parser.add_argument("--dry-run", action="store_true",
                        help="print what would be signed, written, tagged, pushed and uploaded; change nothing")
    parser.add_argument("--push", action="store_true", help="push the tag to --remote after tagging")
    parser.add_argument("--remote", default=model.DEFAULT_REMOTE, help="git remote to push to (default: %(default)s)")
    parser.add_argument("--repo", type=Path, default=Path("."), help="the git repository (default: here)")
    parser.add_argument("--no-upload", action="store_true", help="do not run gh release create/upload")
    parser.add_argument("--json", action="store_true", help="print a machine-readable summary")
    parser.add_argument("--publish-to", metavar="REGISTRY/NAMESPACE",
                        help="also copy the images by digest, with signed attestations, to this registry before "
                        "tagging (nox -s publish; credentials from docker's config.json); the tag message and "
                        "published.json name the published references")


def _print_human(o: model.ReleaseResult) -> None:
    print(f"Released {o.tag}: {len(o.released)} target(s) in {o.directory}")
    for e in o.released:
        print(f"  {e.target:<12} {e.support_level:<13} {e.digest}  manifest sha256:{e.manifest_sha256}")
    for w in o.withheld:
        print(f"  {w.target:<12} WITHHELD      {w.reason}")
    print(f"Release commit {o.release_commit[:12]} on top of {o.source_revision[:12]}; "
          f"tag {o.tag} ({o.tag_object[:12]}); files written: {len(o.written)}, unchanged: {len(o.unchanged)}")
    if o.recovered:
        print("Recovered from an earlier, interrupted run: " + "; ".join(o.recovered))
    if o.left_untouched:
        print(f"Left untouched (no release wrote them, not part of the release): {', '.join(o.left_untouched)}")
    if o.dirty:
        print(f"Released from a dirty tree (--allow-dirty, recorded): {', '.join(o.dirty)}")
    print(f"Push: {o.push}")
    if o.push != "pushed":
        print(f"  {cmd.quote(o.push_command)}")
    print(f"Upload: {o.upload}")
    if not o.upload.startswith(("uploaded", "created")):
        print(f"  {cmd.quote(o.upload_command)}")
        print(f"  (when the GitHub release does not exist yet: {cmd.quote(o.create_command)})")


def _registry_publish(args, opts: release.ReleaseOptions):
    """The publish stage, composed into the release between writing its folder and tagging; it signs with the
    release's own signer (cosign or built-in, as --signer chose; the password was read once, at the key step)."""

    def run(release_signer):
        from qualify.publish import publish, record
        from qualify.signing import formats

        popts = publish.PublishOptions(tag=opts.tag, destination=publish.Destination.parse(args.publish_to),
                                       release_root=opts.out_root, signer=release_signer)
        rec = publish.publish(popts).record
        path = opts.directory / record.RECORD_FILE
        written = [p.name for p in (path, formats.signature_path(path), formats.bundle_path(path)) if p.exists()]
        return record.tag_message_lines(rec), written

    return run


def execute(args) -> int:
    repo = gitops.git_root(args.repo)
    opts = release.ReleaseOptions(
        tag=args.tag,
        repo=repo,
        source=(args.source or paths.Checkout(repo).release_inputs).resolve(),
        out_root=paths.Checkout(repo).releases,
        min_level=args.min_level,
        force=args.force,
        upload=not args.no_upload,
        allow_partial=args.allow_partial,
        allow_dirty=args.allow_dirty,
        any_tag=args.any_tag,
        dry_run=args.dry_run,
        push=args.push,
        remote=args.remote,
    )
    outcome = release.run_release(opts, lambda: signer.key_signer(args.signer, args.key), registry_digest,
                                  registry_publish=_registry_publish(args, opts) if args.publish_to else None)
    if args.json:
        print(json.dumps(outcome.as_dict(), indent=2, sort_keys=True))
    elif args.dry_run:
        print("\n".join(release.dry_run_lines(outcome, opts)))
    else:
        _print_human(outcome)
    return 0
