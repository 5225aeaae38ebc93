"""`python -m qualify verify MANIFEST (--key PUB | --identity ID --issuer URL) [--image REF]`."""

from __future__ import annotations

import json
from pathlib import Path

from qualify.core.errors import VerificationError, printable
from qualify.release import verify


def configure_parser(parser) -> None:
    parser.add_argument("manifest", type=Path, nargs="?",
                        help="signed manifest; without it, --image is verified from its registry (verify-image)")
    who = parser.add_argument_group("whose signature to trust (one is required)")
    who.add_argument("--key", type=Path, help="public key (cosign.pub) of a key-pair signature")
    who.add_argument("--identity", help="keyless: the certificate identity (needs cosign)")
    who.add_argument("--issuer", help="keyless: the certificate's OIDC issuer URL")
    parser.add_argument("--signature", type=Path, help="signature file (default: MANIFEST.sig)")
    parser.add_argument("--bundle", type=Path, help="Sigstore bundle (default: MANIFEST.sigstore.json)")
    parser.add_argument("--image", help="the image to deploy: name@sha256:... compares directly, "
                        "any other reference is resolved with docker")
    parser.add_argument("--require-pass", action="store_true",
                        help="refuse a manifest whose verdict is fail or that has failing checks")
    parser.add_argument("--hosts", type=Path, default=None,
                        help="a release folder's enrolled hosts (default: hosts.json beside the release folder)")
    parser.add_argument("--hosts-history", type=Path, default=None, metavar="DIR",
                        help="earlier versions of the hosts file (each with its .sig), where git's history and the "
                        "kept hosts.<n>.json beside it do not have them")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")


def _failed_check(message: str) -> str:
    for check in ("signature", "image digest", "verdict"):
        if message.startswith(f"{check} check failed"):
            return check
    return "manifest"


def _print_human(r: verify.VerifyResult) -> None:
    """Every line with its control characters escaped: names and values come from the files verified."""
    lines = [f"{r.manifest}: verified", f"  target:        {r.target or '(not recorded)'}",
             f"  signature:     OK ({r.signature})",
             f"  image digest:  OK ({r.image} is {r.image_digest})" if r.image else
             f"  image digest:  not checked (no --image); the manifest is for {r.subject_digest}"]
    failing = f" (failing checks: {', '.join(r.failing_checks)})" if r.failing_checks else ""
    lines += [f"  verdict:       {r.verdict}{failing}", f"  support level: {r.support_level}"]
    print("\n".join(printable(line) for line in lines))


def execute(args) -> int:
    if args.manifest is None:  # no local manifest: the registry's attestation (qualify/publish/)
        from qualify.cli import verify_image_cmd

        return verify_image_cmd.execute(args)
    opts = verify.VerifyOptions(
        manifest=args.manifest, key=args.key, identity=args.identity, issuer=args.issuer,
        signature=args.signature, bundle=args.bundle, image=args.image, require_pass=args.require_pass,
        hosts=getattr(args, "hosts", None), hosts_history=getattr(args, "hosts_history", None),
    )
    try:
        result = verify.verify(opts)
    except VerificationError as exc:
        if args.json:
            print(json.dumps({"ok": False, "failed": _failed_check(exc.message), "error": exc.message}, indent=2))
        raise
    if args.json:
        print(json.dumps({"ok": True, **result.as_dict()}, indent=2, sort_keys=True))
    else:
        _print_human(result)
    return 0
