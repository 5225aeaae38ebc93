"""Signature formats: what `cosign sign-blob` writes and verifies (the `.sig`
file, the Sigstore bundle v0.3), key-file reading and the key password.

A key-pair signature is what `cosign sign-blob --key` makes: ECDSA P-256 over
SHA-256 of the blob, DER-encoded, written base64 with no newline. Beside it we
write a Sigstore bundle (protobuf-specs `Bundle`, JSON, media type v0.3) with
`messageSignature` and the public-key hint, which is what cosign v3 writes for
an offline key-pair signature (`--bundle`, no transparency log entry).

The built-in signer needs no cosign: it reads cosign's key files
(cosign_keys) and signs with `cryptography`. Its ECDSA signatures are
deterministic (RFC 6979), so re-signing the same manifest gives the same bytes.
"""

from __future__ import annotations

import base64
import getpass
import hashlib
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import List, Sequence, Tuple

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec

from qualify.core.errors import ConfigError, VerificationError
from qualify.core.readlimit import KEY_LIMIT, read_small, strict_json
from qualify.signing import keys as cosign_keys

BUNDLE_MEDIA_TYPE = "application/vnd.dev.sigstore.bundle.v0.3+json"
# Older media types a verifier must still accept (protobuf-specs sigstore_bundle.proto).
BUNDLE_MEDIA_TYPES = (
    BUNDLE_MEDIA_TYPE,
    "application/vnd.dev.sigstore.bundle+json;version=0.1",
    "application/vnd.dev.sigstore.bundle+json;version=0.2",
    "application/vnd.dev.sigstore.bundle+json;version=0.3",
)
SIGNATURE_SUFFIX = ".sig"
BUNDLE_SUFFIX = ".sigstore.json"  # the name cosign's README gives bundles
PASSWORD_ENV = "COSIGN_PASSWORD"


@dataclass(frozen=True)
class SignedFiles:
    """What signing one blob produced."""

    blob: Path
    signature: Path
    bundle: Path
    signer: str


@dataclass(frozen=True)
class BlobSignature:
    """One blob's signature as cosign's blob formats hold it: the DER signature and the Sigstore bundle's bytes;
    `signer` says who made it, for messages ("builtin", "cosign v2.4.1")."""

    der: bytes
    bundle: bytes
    signer: str = ""

    @property
    def sig_file(self) -> bytes:
        """The `.sig` file: base64 of the DER signature, no newline (as cosign writes it)."""
        return encode_signature(self.der)


def signature_path(blob: Path) -> Path:
    return blob.with_name(blob.name + SIGNATURE_SUFFIX)


def bundle_path(blob: Path) -> Path:
    return blob.with_name(blob.name + BUNDLE_SUFFIX)


def beside_their_files(given: Sequence[Path]) -> Tuple[List[Path], List[Path]]:
    """(inputs, skipped): a `.sig` or `.sigstore.json` given together with the file it signs is no input of its
    own (a glob such as `sm120-*.json` matches `sm120-x.json.sigstore.json` too); one given alone stays an
    input, and its reader says what it is."""
    names = {os.path.normpath(str(p)) for p in given}
    inputs: List[Path] = []
    skipped: List[Path] = []
    for path in given:
        name = os.path.normpath(str(path))
        signs = next((name[:-len(s)] for s in (SIGNATURE_SUFFIX, BUNDLE_SUFFIX) if name.endswith(s)), None)
        (skipped if signs in names else inputs).append(path)
    return inputs, skipped


# --- password ---------------------------------------------------------------


def read_password(confirm: bool = False) -> bytes:
    """COSIGN_PASSWORD if set (even empty, as cosign does), else the terminal.

    Never an argument: arguments show in process lists and in echoed commands.
    """
    if PASSWORD_ENV in os.environ:
        return os.environ[PASSWORD_ENV].encode("utf-8")
    if not sys.stdin.isatty():
        raise ConfigError(
            "no key password: COSIGN_PASSWORD is not set and there is no terminal to ask on",
            hint="export COSIGN_PASSWORD (for example from your CI secret store), or run from a terminal",
        )
    first = getpass.getpass("Enter password for private key: ")
    if confirm and getpass.getpass("Enter password for private key again: ") != first:
        raise ConfigError("the two passwords differ")
    return first.encode("utf-8")


# --- signature format -------------------------------------------------------


def require_p256(key, what: str) -> None:
    if not isinstance(key, (ec.EllipticCurvePrivateKey, ec.EllipticCurvePublicKey)) or not isinstance(
        key.curve, ec.SECP256R1
    ):
        raise ConfigError(f"{what}: the built-in signer handles ECDSA P-256 keys only (cosign's default)",
                          hint="use --signer cosign for RSA or Ed25519 keys")


def sign_bytes(private_key, data: bytes) -> bytes:
    """DER ECDSA-P256-SHA256 signature, deterministic (RFC 6979)."""
    require_p256(private_key, "private key")
    return private_key.sign(data, ec.ECDSA(hashes.SHA256(), deterministic_signing=True))


def verify_bytes(public_key, data: bytes, signature_der: bytes) -> bool:
    require_p256(public_key, "public key")
    try:
        public_key.verify(signature_der, data, ec.ECDSA(hashes.SHA256()))
    except InvalidSignature:
        return False
    return True


def encode_signature(signature_der: bytes) -> bytes:
    """The `.sig` file: base64 of the DER signature, no newline (as cosign writes it)."""
    return base64.b64encode(signature_der)


def decode_signature(text: bytes, what: str = "signature") -> bytes:
    try:
        der = base64.b64decode(b"".join(text.split()), validate=True)
    except ValueError:  # binascii.Error and non-ASCII input both
        raise VerificationError(f"{what}: not a base64 signature") from None
    if not der:
        raise VerificationError(f"{what}: empty signature")
    return der


def make_bundle(data: bytes, signature_der: bytes, public_key) -> dict:
    """A Sigstore bundle v0.3 for an offline key-pair signature (no tlog entry)."""
    return {
        "mediaType": BUNDLE_MEDIA_TYPE,
        "verificationMaterial": {"publicKey": {"hint": cosign_keys.key_hint(public_key)}},
        "messageSignature": {
            "messageDigest": {
                "algorithm": "SHA2_256",
                "digest": base64.b64encode(hashlib.sha256(data).digest()).decode("ascii"),
            },
            "signature": base64.b64encode(signature_der).decode("ascii"),
        },
    }


def bundle_bytes(bundle: dict) -> bytes:
    return json.dumps(bundle, separators=(",", ":")).encode("utf-8")


def load_bundle(raw: bytes, what: str = "bundle") -> dict:
    doc = strict_json(raw, what, VerificationError)
    media_type = doc.get("mediaType") if isinstance(doc, dict) else None
    if media_type not in BUNDLE_MEDIA_TYPES:
        raise VerificationError(f"{what}: not a Sigstore bundle (mediaType {media_type!r})")
    return doc


def is_sigstore_bundle(raw: bytes) -> bool:
    try:
        load_bundle(raw)
    except VerificationError:
        return False
    return True


def bundle_signature(bundle: dict, what: str = "bundle") -> bytes:
    """The raw signature in a bundle's messageSignature."""
    message = bundle.get("messageSignature")
    sig = message.get("signature") if isinstance(message, dict) else None
    if not isinstance(sig, str):
        raise VerificationError(f"{what}: has no messageSignature.signature object with a string signature "
                                "(a DSSE bundle is not a blob signature)")
    if not sig.isascii():
        raise VerificationError(f"{what}: messageSignature.signature is not base64 (non-ASCII characters)")
    return decode_signature(sig.encode("ascii"), what)


def read_key_file(path: Path, what: str) -> bytes:
    """A key file: a regular file of at most KEY_LIMIT bytes (`--key /dev/zero` fails at once)."""
    return read_small(path, KEY_LIMIT, what, ConfigError,
                      missing_hint="make a key pair with `python -m qualify sign generate-key`")


def load_public_key_file(path: Path):
    return cosign_keys.load_public_key(read_key_file(path, "public key"), what=str(path))
