"""Signers: the built-in one (ECDSA P-256 in-process, the format of formats.py)
and the choice between it and cosign (cosign.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from qualify.core.errors import ConfigError
from qualify.core.fsutil import write_atomic
from qualify.host import cmd
from qualify.signing import keys as cosign_keys
from qualify.signing.cosign import CosignKeySigner
from qualify.signing.formats import (
    SignedFiles,
    _read,
    _require_p256,
    bundle_bytes,
    encode_signature,
    make_bundle,
    read_password,
    sign_bytes,
)

SIGNERS = ("auto", "cosign", "builtin")


# --- signers ----------------------------------------------------------------


@dataclass(frozen=True)
class BuiltinSigner:
    """Key-pair signing in-process; the private key never leaves this object."""

    private_key: object = field(repr=False)
    name: str = "builtin"

    @classmethod
    def from_key_file(cls, key_file: Path, password: bytes) -> BuiltinSigner:
        key = cosign_keys.load_private_key(_read(key_file, "private key"), password, what=str(key_file))
        _require_p256(key, str(key_file))
        return cls(key)

    @property
    def public_key(self):
        return self.private_key.public_key()

    def sign_file(self, blob: Path, signature_out: Path, bundle_out: Path) -> SignedFiles:
        data = blob.read_bytes()
        sig = sign_bytes(self.private_key, data)
        write_atomic(signature_out, encode_signature(sig))
        write_atomic(bundle_out, bundle_bytes(make_bundle(data, sig, self.public_key)))
        return SignedFiles(blob, signature_out, bundle_out, self.name)


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


def key_signer(choice: str, key_file: Path, password: Optional[bytes] = None):
    """A signer for a cosign key file: (signer, public key object).

    The key is decrypted here in both cases: that checks the password before
    cosign runs and gives us the public key without a second cosign call.
    """
    backend = choose_backend(choice)
    password = read_password() if password is None else password
    builtin = BuiltinSigner.from_key_file(key_file, password) if backend == "builtin" else None
    if builtin is not None:
        return builtin, builtin.public_key
    public_key = cosign_keys.load_private_key(_read(key_file, "private key"), password, what=str(key_file)).public_key()
    return CosignKeySigner(Path(key_file), password, public_key), public_key
