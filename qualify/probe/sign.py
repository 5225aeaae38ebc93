"""`python3 -m qualify.probe.sign --key KEY FILE`: a probe that runs without the toolkit signs its evidence.

Two places run the probe with nothing of the toolkit's host side: a Kubernetes Job (the image's own python3;
its node's key mounted from a Secret as an EC P-256 private key, PKCS#8 PEM, unencrypted: the Secret is what
protects it) and scripts/gpu-evidence.sh on a bare GPU host (the host's python3 with torch and Triton; the
host's cosign key, `sign generate-key --output-key-prefix host`, password in COSIGN_PASSWORD, decrypted by
probe/cosignkey.py). The signature is cosign's blob format (base64 DER ECDSA P-256 over SHA-256, FILE.sig),
so `qualify merge` and `qualify promote` check it as they check start.sh's, against the public key enrolled
for the host. It needs cryptography (and PyNaCl for a cosign key), which the probe stages for the
interpreter (probe/staged.py, signing.lock; `qualify probe-bundle` for a bare host); without them it says
which Python it needs and exits 2.
"""

from __future__ import annotations

import argparse
import base64
import getpass
import os
import sys
from typing import List, Optional

from qualify.core.errors import ConfigError
from qualify.core.report import Reporter, emit
from qualify.probe import cosignkey

REPORT = Reporter("probe")

MAX_KEY_BYTES = 64 * 1024
NEEDS = "cryptography (and PyNaCl for a cosign key)"


def _private_key(key_pem: bytes, password: Optional[bytes]):
    from cryptography.hazmat.primitives import serialization

    pem_type, _ = cosignkey.pem_decode(key_pem, "the key")
    if pem_type in cosignkey.PRIVATE_PEM_TYPES:
        if password is None:
            raise ConfigError("the key is a cosign key and no password was given",
                              hint="set COSIGN_PASSWORD (or run on a terminal to be asked)")
        return serialization.load_der_private_key(cosignkey.cosign_key_der(key_pem, password, "the key"),
                                                  password=None)
    return serialization.load_pem_private_key(key_pem, password=None)


def sign(key_pem: bytes, data: bytes, password: Optional[bytes] = None) -> bytes:
    """The `.sig` file's bytes for `data`: a PKCS#8 PEM key, or a cosign key opened with `password`."""
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec

    key = _private_key(key_pem, password)
    if not isinstance(key, ec.EllipticCurvePrivateKey) or not isinstance(key.curve, ec.SECP256R1):
        raise ValueError("the key is not an EC P-256 private key")
    return base64.b64encode(key.sign(data, ec.ECDSA(hashes.SHA256())))


def _password() -> Optional[bytes]:
    if "COSIGN_PASSWORD" in os.environ:
        return os.environ["COSIGN_PASSWORD"].encode("utf-8")
    if sys.stdin.isatty():
        return getpass.getpass("password for the key: ").encode("utf-8")
    return None


def _missing(key_pem: bytes) -> Optional[str]:
    try:
        cosign = cosignkey.pem_decode(key_pem, "the key")[0] in cosignkey.PRIVATE_PEM_TYPES
    except ConfigError:
        cosign = False
    for name in ("cryptography", "nacl") if cosign else ("cryptography",):
        try:
            __import__(name)
        except ImportError:
            return name
    return None


def main(argv: Optional[List[str]] = None) -> int:
    from qualify.probe import staged

    staged.activate()
    parser = argparse.ArgumentParser(prog="python3 -m qualify.probe.sign", description=__doc__.splitlines()[0])
    parser.add_argument("--key", required=True,
                        help="EC P-256 private key: PKCS#8 PEM (a Kubernetes Secret) or a cosign key (COSIGN_PASSWORD)")
    parser.add_argument("file", help="the evidence to sign; FILE.sig is written beside it")
    args = parser.parse_args(argv)
    try:
        with open(args.key, "rb") as fh:
            key = fh.read(MAX_KEY_BYTES + 1)
        if len(key) > MAX_KEY_BYTES:
            raise ValueError(f"{args.key} is larger than a key")
        missing = _missing(key)
        if missing:
            emit(f"error: signing needs {NEEDS} importable by this Python ({sys.executable}), which lacks "
                 f"{missing}: {args.file} stays unsigned\n  hint: on a host with the toolkit, `python3 -m qualify "
                 f"probe-bundle --python {sys.version_info[0]}.{sys.version_info[1]} --out DIR` stages them for "
                 "this interpreter; copy DIR here and set QUALIFY_STAGED=DIR (or sign with the toolkit's Python: "
                 "QUALIFY_PYTHON)")
            return 2
        with open(args.file, "rb") as fh:
            data = fh.read()
        signature = sign(key, data, _password())
    except ConfigError as exc:
        emit(f"error: cannot sign {args.file} with {args.key}: {exc}")
        return 2
    except (OSError, ValueError, TypeError) as exc:
        emit(f"error: cannot sign {args.file}: {exc}")
        return 2
    with open(args.file + ".sig", "wb") as fh:
        fh.write(signature)
    REPORT.say(f"signed {args.file} ({args.file}.sig)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
