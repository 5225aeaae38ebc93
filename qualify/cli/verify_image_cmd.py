"""`python -m qualify verify-image --image REF --key cosign.pub [--require-pass]`
(also `verify --image REF --key ...` without a manifest): the attestation is
fetched from the image's registry, nothing local is needed."""

from __future__ import annotations

import json
from pathlib import Path

from qualify.core.errors import ConfigError, VerificationError
from qualify.publish import attestation_verify


def configure_parser(parser) -> None:
    parser.add_argument("--image", required=True, help="name[:tag][@sha256:...] in a registry")
    parser.add_argument("--key", type=Path, required=True, help="the release's public key (cosign.pub)")
    parser.add_argument("--require-pass", action="store_true",
                        help="refuse an image whose verdict is fail/incomplete or that has failing checks")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")


def execute(args) -> int:
    if not getattr(args, "image", None) or not getattr(args, "key", None):
        raise ConfigError("verify without a manifest needs --image REF and --key cosign.pub",
                          hint="or give the manifest: verify MANIFEST --key cosign.pub")
    try:
        result = attestation_verify.verify_image(args.image, args.key, require_pass=args.require_pass)
    except VerificationError as exc:
        if args.json:
            print(json.dumps({"ok": False, "error": exc.message}, indent=2))
        raise
    if args.json:
        print(json.dumps({"ok": True, **result.as_dict()}, indent=2, sort_keys=True))
    else:
        attestation_verify.print_human(result)
    return 0
