"""`python3 -m qualify.probe.sign --key KEY.pem FILE`: a probe that runs without the toolkit signs its evidence.

A Kubernetes Job runs the probe with the image's own python3 and nothing of the host's; its node's key is
mounted from a Secret (an EC P-256 private key, PKCS#8 PEM, unencrypted: the Secret is what protects it).
The signature is cosign's blob format (base64 DER ECDSA P-256 over SHA-256, FILE.sig), so `qualify merge`
and `qualify promote` check it as they check start.sh's, against the public key enrolled for the cluster
(`python -m qualify hosts add NAME --key cluster.pub`). It needs cryptography, which the probe bundle
stages for the image's interpreter (probe/staged.py, signing.lock); without it, it says so and exits 2.
"""

from __future__ import annotations

import argparse
import base64
import sys
from typing import List, Optional

from qualify.core.report import Reporter, emit

REPORT = Reporter("probe")

MAX_KEY_BYTES = 64 * 1024


def sign(key_pem: bytes, data: bytes) -> bytes:
    """The `.sig` file's bytes for `data`."""
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    key = serialization.load_pem_private_key(key_pem, password=None)
    if not isinstance(key, ec.EllipticCurvePrivateKey) or not isinstance(key.curve, ec.SECP256R1):
        raise ValueError("the key is not an EC P-256 private key")
    return base64.b64encode(key.sign(data, ec.ECDSA(hashes.SHA256())))


def main(argv: Optional[List[str]] = None) -> int:
    from qualify.probe import staged

    staged.activate()
    parser = argparse.ArgumentParser(prog="python3 -m qualify.probe.sign", description=__doc__.splitlines()[0])
    parser.add_argument("--key", required=True, help="EC P-256 private key, PKCS#8 PEM (a Kubernetes Secret)")
    parser.add_argument("file", help="the evidence to sign; FILE.sig is written beside it")
    args = parser.parse_args(argv)
    try:
        import cryptography  # noqa: F401
    except ImportError:
        emit("error: cryptography is not staged for this interpreter (the probe bundle carries it for the "
             "interpreters of the targets' images): the evidence stays unsigned")
        return 2
    try:
        with open(args.key, "rb") as fh:
            key = fh.read(MAX_KEY_BYTES + 1)
        if len(key) > MAX_KEY_BYTES:
            raise ValueError(f"{args.key} is larger than a key")
        with open(args.file, "rb") as fh:
            data = fh.read()
        signature = sign(key, data)
    except (OSError, ValueError, TypeError) as exc:
        emit(f"error: cannot sign {args.file}: {exc}")
        return 2
    with open(args.file + ".sig", "wb") as fh:
        fh.write(signature)
    REPORT.say(f"signed {args.file} ({args.file}.sig)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
