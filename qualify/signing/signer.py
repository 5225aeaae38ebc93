"""The one signer interface, and its implementations: the built-in signer (ECDSA P-256 in-process, the format
of formats.py) and cosign (cosign.py: a key pair, or keyless).

Everything the toolkit signs goes through a `Signer` (sigstore-python's shape: one object that signs
artifacts and DSSE): the release folder, promotion records, the enrolled-hosts file, what publish writes
(published.json, the attestations' DSSE envelopes, referrer bundles) and a GPU host's evidence. The CLI
makes one per command, so the key's password is read once, and a KMS or keyless signer is one more
implementation, never a change to the stages.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Protocol

from qualify.core.errors import ConfigError
from qualify.core.fsutil import write_atomic
from qualify.host import cmd
from qualify.signing import formats
from qualify.signing import keys as cosign_keys

SIGNERS = ("auto", "cosign", "builtin")


BlobSignature = formats.BlobSignature


class Signer(Protocol):
    name: str

    def public_key(self):
        """The public key whose signatures this signer makes (a cryptography key); None for keyless."""

    def sign_blob(self, data: bytes) -> BlobSignature:
        """`data` signed as `cosign sign-blob` signs it: the `.sig` and the Sigstore bundle."""

    def sign_dsse(self, pae: bytes) -> bytes:
        """The DER signature over DSSE's pre-authentication encoding (publish/dsse.py makes `pae`)."""


# --- the built-in signer --------------------------------------------------------------------------------


@dataclass(frozen=True)
class BuiltinSigner:
    """Key-pair signing in-process; the private key never leaves this object. Deterministic (RFC 6979): the
    same bytes give the same signature, so a re-run writes what the first run wrote."""

    private_key: object = field(repr=False)
    name: str = "builtin"

    @classmethod
    def from_key_file(cls, key_file: Path, password: bytes) -> BuiltinSigner:
        key = cosign_keys.load_private_key(formats.read_key_file(key_file, "private key"), password, what=str(key_file))
        formats.require_p256(key, str(key_file))
        return cls(key)

    def public_key(self):
        return self.private_key.public_key()

    def sign_blob(self, data: bytes) -> BlobSignature:
        der = formats.sign_bytes(self.private_key, data)
        return BlobSignature(der, formats.bundle_bytes(formats.make_bundle(data, der, self.public_key())), self.name)

    def sign_dsse(self, pae: bytes) -> bytes:
        return formats.sign_bytes(self.private_key, pae)


# --- choosing one ------------------------------------------------------------------------------------


def choose_backend(choice: str, keyless: bool = False) -> str:
    """`auto` means cosign when it is on PATH; keyless always needs cosign."""
    if choice not in SIGNERS:
        raise ConfigError(f"unknown signer {choice!r}; choose one of {', '.join(SIGNERS)}")
    if keyless:
        if choice == "builtin" or not cmd.which("cosign"):
            raise ConfigError("keyless signing needs cosign (Fulcio and Rekor); the built-in signer signs with a key",
                              hint="install cosign v2 or v3, or sign with --key")
        return "cosign"
    if choice == "auto":
        return "cosign" if cmd.which("cosign") else "builtin"
    if choice == "cosign" and not cmd.which("cosign"):
        raise ConfigError("--signer cosign: cosign is not on PATH",
                          hint="install cosign v2 or v3, or use --signer builtin (same signature format)")
    return choice


def key_signer(choice: str, key_file: Path, password: Optional[bytes] = None) -> Signer:
    """The signer of a cosign key file. The key is decrypted here for either backend: that checks the password
    before cosign runs and gives the public key without a second cosign call. The password is read here, once
    (COSIGN_PASSWORD or the terminal), unless given."""
    from qualify.signing.cosign import CosignKeySigner

    backend = choose_backend(choice)
    password = formats.read_password() if password is None else password
    if backend == "builtin":
        return BuiltinSigner.from_key_file(key_file, password)
    private = cosign_keys.load_private_key(formats.read_key_file(key_file, "private key"), password, what=str(key_file))
    return CosignKeySigner(Path(key_file), password, private.public_key())


def public_pem(signer: Signer) -> bytes:
    """The PEM of the signer's public key; a keyless signer has none to compare a release's key with."""
    public = signer.public_key()
    if public is None:
        raise ConfigError(f"the {signer.name} signer has no public key: a release, its promotion records and what "
                          "publish writes are signed with the release key", hint="sign with --key cosign.key")
    return cosign_keys.public_key_pem(public)


def write_signature(signer: Signer, blob: Path, signature_out: Optional[Path] = None,
                    bundle_out: Optional[Path] = None) -> formats.SignedFiles:
    """Sign the file at `blob` (read once) and write its `.sig` and Sigstore bundle (beside it by default)."""
    data = blob.read_bytes()
    signature_out = signature_out or formats.signature_path(blob)
    bundle_out = bundle_out or formats.bundle_path(blob)
    done = signer.sign_blob(data)
    write_atomic(signature_out, done.sig_file)
    write_atomic(bundle_out, done.bundle)
    return formats.SignedFiles(blob, signature_out, bundle_out, done.signer or signer.name)
