"""`python -m qualify publish TAG [--to REGISTRY/NAMESPACE]` (nox -s publish -- TAG ...)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from qualify.core.errors import ConfigError
from qualify.publish import publish as pub
from qualify.publish.record import tag_message_lines
from qualify.signing import signer


def configure_parser(parser) -> None:
    parser.add_argument("tag", help="the release to publish (manifests/TAG/)")
    parser.add_argument("--to", help=f"REGISTRY/NAMESPACE, e.g. ghcr.io/acme/blackwell (default: ${pub.DESTINATION_ENV})")
    parser.add_argument("--key", type=Path, default=Path("cosign.key"),
                        help="the release's cosign private key (password from COSIGN_PASSWORD or the terminal)")
    parser.add_argument("--signer", choices=signer.SIGNERS, default="auto",
                        help="auto: cosign when installed, else the built-in signer (default: %(default)s)")
    parser.add_argument("--manifests", type=Path, default=Path("manifests"), help="release folders (default: manifests)")
    parser.add_argument("--no-build-attestations", action="store_true",
                        help="attach only the qualification attestation (no SLSA provenance or SBOM)")
    parser.add_argument("--json", action="store_true", help="print the publication record as JSON")


def execute(args) -> int:
    where = "--to" if args.to else f"${pub.DESTINATION_ENV}"
    text = args.to or os.environ.get(pub.DESTINATION_ENV, "")
    if not text:
        raise ConfigError("no destination registry", hint=f"pass --to REGISTRY/NAMESPACE or set {pub.DESTINATION_ENV}")
    opts = pub.PublishOptions(tag=args.tag, destination=pub.Destination.parse(text, where),
                              release_root=args.manifests, signer=signer.key_signer(args.signer, args.key),
                              attest_build=not args.no_build_attestations)
    record = pub.publish(opts).record
    if args.json:
        print(json.dumps(record.as_json(), indent=2, sort_keys=True))
    else:
        print("\n".join(tag_message_lines(record)))
    return 0
