"""cosign's private key files, read (image side: the standard library, and PyNaCl imported when a key is
decrypted). signing/keys.py writes them and reads them through this module, so there is one reader.

The file is what `cosign generate-key-pair` writes (sigstore/cosign pkg/cosign/keys.go, `marshalKeyPair`/
`LoadPrivateKey`): a PEM block of type `ENCRYPTED SIGSTORE PRIVATE KEY` (older keys: `ENCRYPTED COSIGN
PRIVATE KEY`) whose body is the JSON of go-securesystemslib `encrypted.Encrypt`:

    {"kdf":{"name":"scrypt","params":{"N":65536,"r":8,"p":1},"salt":"<b64>"},
     "cipher":{"name":"nacl/secretbox","nonce":"<b64>"},"ciphertext":"<b64>"}

The key is scrypt(password, salt, N, r, p, 32 bytes); the ciphertext is a NaCl secretbox of the PKCS#8 DER
private key. Only the three scrypt parameter sets go-securesystemslib accepts are read, so a tampered file
cannot make us burn unbounded memory. Here so that a probe that runs without the toolkit (probe/sign.py,
scripts/gpu-evidence.sh on a bare GPU host) signs with the same host key start.sh uses.
"""

from __future__ import annotations

import base64
import hashlib
from dataclasses import dataclass
from typing import Union

from qualify.core.errors import ConfigError
from qualify.core.readlimit import strict_json

SIGSTORE_PEM_TYPE = "ENCRYPTED SIGSTORE PRIVATE KEY"
COSIGN_PEM_TYPE = "ENCRYPTED COSIGN PRIVATE KEY"
PRIVATE_PEM_TYPES = (SIGSTORE_PEM_TYPE, COSIGN_PEM_TYPE)
KEY_SIZE = 32  # nacl.secret.SecretBox.KEY_SIZE
NONCE_SIZE = 24  # nacl.secret.SecretBox.NONCE_SIZE
# scrypt needs 128 * r * N bytes; N=2^17 (the largest accepted) needs 128 MiB.
_SCRYPT_MAXMEM = 256 * 1024 * 1024
PasswordLike = Union[bytes, str]


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


def as_bytes(password: PasswordLike) -> bytes:
    return password.encode("utf-8") if isinstance(password, str) else bytes(password)


def scrypt(password: bytes, salt: bytes, params: ScryptParams) -> bytes:
    return hashlib.scrypt(password, salt=salt, n=params.n, r=params.r, p=params.p, dklen=KEY_SIZE,
                          maxmem=_SCRYPT_MAXMEM)


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
    from nacl.exceptions import CryptoError
    from nacl.secret import SecretBox

    doc = strict_json(body, f"{what}: encrypted key body", ConfigError)
    if not isinstance(doc, dict):
        raise ConfigError(f"{what}: encrypted key body is not a JSON object")
    params = _params_of(doc, what)
    salt = _field_b64(doc, "kdf", "salt", what=what)
    nonce = _field_b64(doc, "cipher", "nonce", what=what)
    ciphertext = _field_b64(doc, "ciphertext", what=what)
    if len(nonce) != NONCE_SIZE:
        raise ConfigError(f"{what}: nonce is {len(nonce)} bytes, expected {NONCE_SIZE}")
    try:
        return SecretBox(scrypt(as_bytes(password), salt, params)).decrypt(ciphertext, nonce)
    except CryptoError:
        raise ConfigError(
            f"{what}: wrong password (the key could not be decrypted)",
            hint="set COSIGN_PASSWORD to the key's password, or unset it to be asked on the terminal",
        ) from None


def is_pkcs8(der: bytes) -> bool:
    # PKCS#8 is SEQUENCE { INTEGER 0, SEQUENCE AlgorithmIdentifier, ... }; SEC1
    # ("EC PRIVATE KEY") is SEQUENCE { INTEGER 1, OCTET STRING, ... }. cosign
    # uses x509.ParsePKCS8PrivateKey and so refuses SEC1; so do we.
    if len(der) < 8 or der[0] != 0x30:
        return False
    i = 2 + (der[1] & 0x7F if der[1] & 0x80 else 0)
    return der[i : i + 4] == b"\x02\x01\x00\x30"


def cosign_key_der(pem: bytes, password: PasswordLike, what: str = "private key") -> bytes:
    """The PKCS#8 DER of a cosign encrypted private key file."""
    pem_type, body = pem_decode(pem, what)
    if pem_type not in PRIVATE_PEM_TYPES:
        raise ConfigError(
            f"{what}: PEM type {pem_type!r} is not a cosign key ({' or '.join(PRIVATE_PEM_TYPES)})",
            hint="make one with `python -m qualify sign generate-key` or `cosign generate-key-pair`",
        )
    der = decrypt_pkcs8(body, password, what)
    if not is_pkcs8(der):
        raise ConfigError(f"{what}: decrypted key is not PKCS#8 (cosign refuses it too)")
    return der
