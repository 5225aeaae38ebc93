"""`python -m qualify sign MANIFEST | generate-key`."""

from __future__ import annotations

import os
from pathlib import Path

from qualify.core.errors import ConfigError, ExternalCommandError, VerificationError
from qualify.core.fsutil import create_exclusive
from qualify.core.report import emit
from qualify.host import cmd
from qualify.signing import formats, signer
from qualify.signing import keys as cosign_keys

GENERATE = "generate-key"


def configure_parser(parser) -> None:
    parser.add_argument("manifest", metavar=f"MANIFEST|{GENERATE}",
                        help=f"the manifest to sign, or `{GENERATE}` to make a cosign-compatible key pair")
    parser.add_argument("--key", type=Path, default=Path("cosign.key"),
                        help="cosign private key file (default: cosign.key); password from COSIGN_PASSWORD "
                        "or the terminal")
    parser.add_argument("--keyless", action="store_true",
                        help="sign with a Fulcio certificate instead of a key (needs cosign and network)")
    parser.add_argument("--identity-token", type=Path, metavar="FILE",
                        help="file holding the OIDC token for --keyless (default: SIGSTORE_ID_TOKEN); "
                        "never the token itself")
    parser.add_argument("--signer", choices=signer.SIGNERS, default="auto",
                        help="auto: cosign when installed, else the built-in signer")
    parser.add_argument("--signature", type=Path, help="signature output (default: MANIFEST.sig)")
    parser.add_argument("--bundle", type=Path, help="Sigstore bundle output (default: MANIFEST.sigstore.json)")
    parser.add_argument("--output-key-prefix", default="cosign",
                        help=f"{GENERATE}: write PREFIX.key and PREFIX.pub (default: cosign)")
    parser.add_argument("--force", action="store_true", help=f"{GENERATE}: overwrite existing key files")


def _warn_if_tracked(path: Path) -> None:
    """A private key inside a work tree that git does not ignore is one `git add .` from leaking."""
    where = str(path.resolve().parent)
    try:
        inside = cmd.call(["git", "rev-parse", "--is-inside-work-tree"], cwd=where, check=False).returncode == 0
        ignored = inside and cmd.call(["git", "check-ignore", "-q", str(path.resolve())], cwd=where,
                                      check=False).returncode == 0
    except ExternalCommandError:  # no git: nothing to warn about
        return
    if inside and not ignored:
        emit(f"warning: {path} is inside a git work tree and not ignored; add it to .gitignore "
             "or keep it outside the repository")


def generate_key(args) -> int:
    key_file, pub_file = Path(f"{args.output_key_prefix}.key"), Path(f"{args.output_key_prefix}.pub")
    existing = [str(p) for p in (key_file, pub_file) if p.exists()]
    if existing and not args.force:
        raise ConfigError(f"{', '.join(existing)} already exist(s)", hint="pass --force to replace the key pair")
    pair = cosign_keys.generate_key_pair(formats.read_password(confirm=True))
    _write_pair(key_file, pub_file, pair, replace=args.force)
    fingerprint = cosign_keys.fingerprint(cosign_keys.load_public_key(pair.public_pem))
    print(f"Private key written to {key_file} (keep it secret)")
    print(f"Public key written to {pub_file} ({fingerprint})")
    _warn_if_tracked(key_file)
    if key_file.name != RELEASE_KEY:
        # Not the release key (`release` and `promote` read cosign.key): e.g. a GPU host's own evidence key.
        print(f"Next, if this is a GPU host's key: set EVIDENCE_SIGNING_KEY={key_file.resolve()} in that host's .env "
              f"(start.sh signs its GPU evidence with it), and on the build host enroll the public key:\n"
              f"  python -m qualify hosts add NAME --key {pub_file} --release-key cosign.key\n"
              f"(Releases are signed with {RELEASE_KEY} unless `release` and `promote` are given --key.)")
        return 0
    print(f"Next: commit the public key, which every release copies into its folder and checks its key against:\n"
          f"  git add {pub_file} && git commit -m 'release key {fingerprint[:19]}...'\n"
          f"Deploy hosts pin it in their .env (announce it with the release):\n"
          f"  RELEASE_KEY_FINGERPRINT={fingerprint}")
    return 0


RELEASE_KEY = "cosign.key"  # what `release` and `promote` sign with by default


def _write_pair(key_file: Path, pub_file: Path, pair, replace: bool) -> None:
    """Both files of one pair, or neither: each is created exclusively, so of two runs with one prefix
    exactly one writes, and a failure on the public key takes the private key back out."""
    if replace:
        for path in (key_file, pub_file):
            path.unlink(missing_ok=True)
    written = []
    try:
        for path, data, mode in ((key_file, pair.private_pem, 0o600), (pub_file, pair.public_pem, 0o644)):
            create_exclusive(path, data, mode)
            written.append(path)
    except FileExistsError as exc:
        for path in written:
            path.unlink(missing_ok=True)
        raise ConfigError(f"{exc.filename} already exists (another run made it meanwhile?)",
                          hint="pass --force to replace the key pair") from None
    except BaseException:
        for path in written:
            path.unlink(missing_ok=True)
        raise


def _signer_for(args):
    if args.keyless:
        signer.choose_backend(args.signer, keyless=True)
        if args.identity_token is not None and not args.identity_token.is_file():
            raise ConfigError(f"--identity-token {args.identity_token}: no such file",
                              hint="pass the token in a file or in SIGSTORE_ID_TOKEN, never on the command line")
        if args.identity_token is None and "SIGSTORE_ID_TOKEN" not in os.environ:
            emit("note: no SIGSTORE_ID_TOKEN or --identity-token; cosign will look for an ambient identity")
        from qualify.signing.cosign import CosignKeylessSigner

        return CosignKeylessSigner(args.identity_token)
    return signer.key_signer(args.signer, args.key)


def execute(args) -> int:
    if args.manifest == GENERATE:
        return generate_key(args)
    blob = Path(args.manifest)
    if not blob.is_file():
        raise ConfigError(f"{blob}: no such manifest")
    chosen = _signer_for(args)
    public_key = chosen.public_key()
    done = signer.write_signature(chosen, blob, args.signature, args.bundle)
    if public_key is not None:
        from qualify.trust.verify import TrustedKey, verify_blob

        try:  # what was written, read back: the signature and its bundle both
            verify_blob(TrustedKey.of_signer(chosen, str(args.key)), blob.read_bytes(), done.signature.read_bytes(),
                        done.bundle.read_bytes(), str(blob))
        except VerificationError as exc:
            raise VerificationError(f"{done.signer} made a signature that does not verify with {args.key}: "
                                    f"{exc.message}") from None
        print(f"Signed {blob} with {done.signer} (key {cosign_keys.fingerprint(public_key)})")
    else:
        print(f"Signed {blob} with {done.signer}")
    print(f"  signature: {done.signature}")
    print(f"  bundle:    {done.bundle}")
    return 0
