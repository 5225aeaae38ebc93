"""cosign's key files, read and written without cosign.

The private key file is what `cosign generate-key-pair` writes (sigstore/cosign
pkg/cosign/keys.go, `marshalKeyPair`/`LoadPrivateKey`): a PEM block of type
`ENCRYPTED SIGSTORE PRIVATE KEY` (older keys: `ENCRYPTED COSIGN PRIVATE KEY`)
whose body is the JSON of go-securesystemslib `encrypted.Encrypt`:

    {"kdf":{"name":"scrypt","params":{"N":65536,"r":8,"p":1},"salt":"<b64>"},
     "cipher":{"name":"nacl/secretbox","nonce":"<b64>"},"ciphertext":"<b64>"}

The key is scrypt(password, salt, N, r, p, 32 bytes); the ciphertext is a NaCl
secretbox of the PKCS#8 DER private key. Readers accept only the three scrypt
parameter sets go-securesystemslib accepts, so a tampered file cannot make us
burn unbounded memory. The public key file is a PKIX `PUBLIC KEY` PEM.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
from dataclasses import dataclass
from typing import Union

from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from nacl.exceptions import CryptoError
from nacl.secret import SecretBox

from qualify.core.errors import ConfigError
from qualify.core.readlimit import strict_json

SIGSTORE_PEM_TYPE = "ENCRYPTED SIGSTORE PRIVATE KEY"
COSIGN_PEM_TYPE = "ENCRYPTED COSIGN PRIVATE KEY"
PRIVATE_PEM_TYPES = (SIGSTORE_PEM_TYPE, COSIGN_PEM_TYPE)

_SALT_SIZE = 32
_KEY_SIZE = SecretBox.KEY_SIZE  # 32
_NONCE_SIZE = SecretBox.NONCE_SIZE  # 24
# scrypt needs 128 * r * N bytes; N=2^17 (the largest accepted) needs 128 MiB.
_SCRYPT_MAXMEM = 256 * 1024 * 1024


@dataclass(frozen=True)
class ScryptParams:
    n: int
    r: int
    p: int

    def as_json(self) -> dict:
        return {"N": self.n, "r": self.r, "p": self.p}


# go-securesystemslib encrypted.go: Legacy (what cosign < 2.2 wrote and the
# only set it reads), Standard (the default since), OWASP.
LEGACY = ScryptParams(32768, 8, 1)
STANDARD = ScryptParams(65536, 8, 1)
OWASP = ScryptParams(131072, 8, 1)
ACCEPTED_PARAMS = (LEGACY, STANDARD, OWASP)


@dataclass(frozen=True)
class KeyPair:
    private_pem: bytes
    public_pem: bytes


PasswordLike = Union[bytes, str]


def _as_bytes(password: PasswordLike) -> bytes:
    return password.encode("utf-8") if isinstance(password, str) else bytes(password)


def _scrypt(password: bytes, salt: bytes, params: ScryptParams) -> bytes:
    return hashlib.scrypt(
        password, salt=salt, n=params.n, r=params.r, p=params.p, dklen=_KEY_SIZE, maxmem=_SCRYPT_MAXMEM
    )


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def pem_encode(pem_type: str, body: bytes) -> bytes:
    """PEM as Go's pem.EncodeToMemory writes it: 64-character base64 lines."""
    text = _b64(body)
    lines = [text[i : i + 64] for i in range(0, len(text), 64)]
    return ("\n".join([f"-----BEGIN {pem_type}-----", *lines, f"-----END {pem_type}-----"]) + "\n").encode("ascii")


def pem_decode(data: bytes, what: str) -> tuple:
    """(type, body) of the first PEM block in `data`."""
    text = data.decode("ascii", errors="replace")
    start = text.find("-----BEGIN ")
    if start < 0:
        raise ConfigError(f"{what}: no PEM block found")
    header_end = text.find("-----", start + 11)
    pem_type = text[start + 11 : header_end]
    footer = f"-----END {pem_type}-----"
    end = text.find(footer, header_end)
    if header_end < 0 or end < 0:
        raise ConfigError(f"{what}: truncated PEM block")
    try:
        body = base64.b64decode("".join(text[header_end + 5 : end].split()), validate=True)
    except ValueError:
        raise ConfigError(f"{what}: PEM body is not base64") from None
    return pem_type, body


def encrypt_pkcs8(der: bytes, password: PasswordLike, params: ScryptParams = STANDARD) -> bytes:
    """The JSON body of an encrypted key, as go-securesystemslib `encrypted.Encrypt` writes it."""
    salt = os.urandom(_SALT_SIZE)
    nonce = os.urandom(_NONCE_SIZE)
    box = SecretBox(_scrypt(_as_bytes(password), salt, params))
    ciphertext = box.encrypt(der, nonce).ciphertext
    # Field order and compact separators as Go's json.Marshal writes the struct.
    doc = {
        "kdf": {"name": "scrypt", "params": params.as_json(), "salt": _b64(salt)},
        "cipher": {"name": "nacl/secretbox", "nonce": _b64(nonce)},
        "ciphertext": _b64(ciphertext),
    }
    return json.dumps(doc, separators=(",", ":")).encode("ascii")


def _field_b64(doc: dict, *path: str, what: str) -> bytes:
    node = doc
    for key in path:
        node = node.get(key) if isinstance(node, dict) else None
    if not isinstance(node, str):
        raise ConfigError(f"{what}: encrypted key has no {'.'.join(path)}")
    try:
        return base64.b64decode(node, validate=True)
    except ValueError:
        raise ConfigError(f"{what}: {'.'.join(path)} is not base64") from None


def _params_of(doc: dict, what: str) -> ScryptParams:
    kdf, cipher = doc.get("kdf"), doc.get("cipher")
    kdf, cipher = (kdf if isinstance(kdf, dict) else {}), (cipher if isinstance(cipher, dict) else {})
    if kdf.get("name") != "scrypt":
        raise ConfigError(f"{what}: unknown kdf {kdf.get('name')!r} (expected scrypt)")
    if cipher.get("name") != "nacl/secretbox":
        raise ConfigError(f"{what}: unknown cipher {cipher.get('name')!r} (expected nacl/secretbox)")
    raw = kdf.get("params")
    raw = raw if isinstance(raw, dict) else {}
    params = ScryptParams(raw.get("N"), raw.get("r"), raw.get("p"))
    if params not in ACCEPTED_PARAMS:
        raise ConfigError(f"{what}: unsupported scrypt parameters {raw} (cosign accepts N=2^15..2^17, r=8, p=1)")
    return params


def decrypt_pkcs8(body: bytes, password: PasswordLike, what: str = "private key") -> bytes:
    """The PKCS#8 DER inside an encrypted key body; ConfigError on a wrong password."""
    doc = strict_json(body, f"{what}: encrypted key body", ConfigError)
    if not isinstance(doc, dict):
        raise ConfigError(f"{what}: encrypted key body is not a JSON object")
    params = _params_of(doc, what)
    salt = _field_b64(doc, "kdf", "salt", what=what)
    nonce = _field_b64(doc, "cipher", "nonce", what=what)
    ciphertext = _field_b64(doc, "ciphertext", what=what)
    if len(nonce) != _NONCE_SIZE:
        raise ConfigError(f"{what}: nonce is {len(nonce)} bytes, expected {_NONCE_SIZE}")
    try:
        return SecretBox(_scrypt(_as_bytes(password), salt, params)).decrypt(ciphertext, nonce)
    except CryptoError:
        raise ConfigError(
            f"{what}: wrong password (the key could not be decrypted)",
            hint="set COSIGN_PASSWORD to the key's password, or unset it to be asked on the terminal",
        ) from None


def _is_pkcs8(der: bytes) -> bool:
    # PKCS#8 is SEQUENCE { INTEGER 0, SEQUENCE AlgorithmIdentifier, ... }; SEC1
    # ("EC PRIVATE KEY") is SEQUENCE { INTEGER 1, OCTET STRING, ... }. cosign
    # uses x509.ParsePKCS8PrivateKey and so refuses SEC1; so do we.
    if len(der) < 8 or der[0] != 0x30:
        return False
    i = 2 + (der[1] & 0x7F if der[1] & 0x80 else 0)
    return der[i : i + 4] == b"\x02\x01\x00\x30"


def load_private_key(pem: bytes, password: PasswordLike, what: str = "private key"):
    """A cosign encrypted private key file -> cryptography private key object."""
    pem_type, body = pem_decode(pem, what)
    if pem_type not in PRIVATE_PEM_TYPES:
        raise ConfigError(
            f"{what}: PEM type {pem_type!r} is not a cosign key ({' or '.join(PRIVATE_PEM_TYPES)})",
            hint="make one with `python -m qualify sign generate-key` or `cosign generate-key-pair`",
        )
    der = decrypt_pkcs8(body, password, what)
    if not _is_pkcs8(der):
        raise ConfigError(f"{what}: decrypted key is not PKCS#8 (cosign refuses it too)")
    return serialization.load_der_private_key(der, password=None)


def private_key_pem(key, password: PasswordLike, params: ScryptParams = STANDARD,
                    pem_type: str = SIGSTORE_PEM_TYPE) -> bytes:
    der = key.private_bytes(serialization.Encoding.DER, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption())
    return pem_encode(pem_type, encrypt_pkcs8(der, password, params))


def public_key_pem(public_key) -> bytes:
    return public_key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)


def load_public_key(pem: bytes, what: str = "public key"):
    pem_type, _ = pem_decode(pem, what)
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
