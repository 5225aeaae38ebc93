"""cosign's key files, written without cosign, and read through probe/cosignkey.py (the one reader, which a
probe that runs without the toolkit uses too; its docstring gives the format). The public key file is a PKIX
`PUBLIC KEY` PEM.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
from dataclasses import dataclass

from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from nacl.secret import SecretBox

from qualify.core.errors import ConfigError
from qualify.probe import cosignkey
from qualify.probe.cosignkey import SIGSTORE_PEM_TYPE, STANDARD, PasswordLike, ScryptParams

_SALT_SIZE = 32


@dataclass(frozen=True)
class KeyPair:
    private_pem: bytes
    public_pem: bytes


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def pem_encode(pem_type: str, body: bytes) -> bytes:
    """PEM as Go's pem.EncodeToMemory writes it: 64-character base64 lines."""
    text = _b64(body)
    lines = [text[i : i + 64] for i in range(0, len(text), 64)]
    return ("\n".join([f"-----BEGIN {pem_type}-----", *lines, f"-----END {pem_type}-----"]) + "\n").encode("ascii")


def encrypt_pkcs8(der: bytes, password: PasswordLike, params: ScryptParams = STANDARD) -> bytes:
    """The JSON body of an encrypted key, as go-securesystemslib `encrypted.Encrypt` writes it."""
    salt = os.urandom(_SALT_SIZE)
    nonce = os.urandom(cosignkey.NONCE_SIZE)
    box = SecretBox(cosignkey.scrypt(cosignkey.as_bytes(password), salt, params))
    ciphertext = box.encrypt(der, nonce).ciphertext
    # Field order and compact separators as Go's json.Marshal writes the struct.
    doc = {
        "kdf": {"name": "scrypt", "params": params.as_json(), "salt": _b64(salt)},
        "cipher": {"name": "nacl/secretbox", "nonce": _b64(nonce)},
        "ciphertext": _b64(ciphertext),
    }
    return json.dumps(doc, separators=(",", ":")).encode("ascii")


def load_private_key(pem: bytes, password: PasswordLike, what: str = "private key"):
    """A cosign encrypted private key file -> cryptography private key object."""
    return serialization.load_der_private_key(cosignkey.cosign_key_der(pem, password, what), password=None)


def private_key_pem(key, password: PasswordLike, params: ScryptParams = STANDARD,
                    pem_type: str = SIGSTORE_PEM_TYPE) -> bytes:
    der = key.private_bytes(serialization.Encoding.DER, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption())
    return pem_encode(pem_type, encrypt_pkcs8(der, password, params))


def public_key_pem(public_key) -> bytes:
    return public_key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)


def load_public_key(pem: bytes, what: str = "public key"):
    pem_type, _ = cosignkey.pem_decode(pem, what)
    if pem_type != "PUBLIC KEY":
        raise ConfigError(f"{what}: PEM type {pem_type!r} is not PUBLIC KEY")
    try:
        return serialization.load_pem_public_key(pem)
    except (ValueError, TypeError, UnsupportedAlgorithm) as exc:
        raise ConfigError(f"{what}: not a public key: {exc}") from None


def generate_key_pair(password: PasswordLike, params: ScryptParams = STANDARD) -> KeyPair:
    """An ECDSA P-256 key pair, as `cosign generate-key-pair` makes by default."""
    key = ec.generate_private_key(ec.SECP256R1())
    return KeyPair(private_key_pem(key, password, params), public_key_pem(key.public_key()))


def key_hint(public_key) -> str:
    """base64(SHA-256(PKIX DER)): cosign's public-key hint in Sigstore bundles."""
    der = public_key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return _b64(hashlib.sha256(der).digest())


def fingerprint(public_key) -> str:
    """`sha256:<hex>` of the PKIX DER public key, for humans and tag messages."""
    der = public_key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return "sha256:" + hashlib.sha256(der).hexdigest()
