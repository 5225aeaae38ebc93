"""`nox -s cosign-interop`: the built-in signer against a REAL cosign binary.

cosign cannot be installed on the build hosts this project grew on (not in
Debian 12, GitHub unreachable), so this is a session to run where it is, not
a test that would only ever skip:
1. cosign verify-blob accepts a signature and bundle made by the built-in signer;
2. a key pair made by `cosign generate-key-pair` loads in the built-in signer.
Exit 0 when both hold; 7 when cosign is missing.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from qualify.core import manifest
from qualify.core.errors import ExternalCommandError, QualifyError
from qualify.core.report import emit
from qualify.signing import cosign, formats, signer
from qualify.signing import keys as cosign_keys

PASSWORD = "interop-check-password"


def run(work: Path) -> None:
    if shutil.which("cosign") is None:
        raise ExternalCommandError("cosign is not on PATH", hint="install cosign v2 or v3 and run again")
    version = cosign.detect_version()
    pair = cosign_keys.generate_key_pair(PASSWORD)
    key, pub = work / "ours.key", work / "ours.pub"
    key.write_bytes(pair.private_pem)
    pub.write_bytes(pair.public_pem)
    blob = manifest.write(work / "m.json", manifest.statement("example/image", "sha256:" + "a1" * 32,
                                                              {"schema_version": 1, "checks": []}))
    signer.write_signature(signer.BuiltinSigner.from_key_file(key, PASSWORD.encode()), blob)
    req = cosign.VerifyBlobRequest(blob, signature=formats.signature_path(blob), bundle=formats.bundle_path(blob), key=pub)
    subprocess.run(cosign.verify_blob_args(version, req), check=True, stdin=subprocess.DEVNULL)
    print(f"1. cosign {version} verified the built-in signer's signature")
    subprocess.run(["cosign", "generate-key-pair"], cwd=work, check=True, stdin=subprocess.DEVNULL,
                   env={**os.environ, "COSIGN_PASSWORD": PASSWORD})
    theirs = cosign_keys.load_private_key((work / "cosign.key").read_bytes(), PASSWORD)
    if cosign_keys.fingerprint(theirs.public_key()) != cosign_keys.fingerprint(
            cosign_keys.load_public_key((work / "cosign.pub").read_bytes())):
        raise QualifyError("cosign's key pair loaded, but its public key does not match")
    print("2. a cosign-generated key pair loads in the built-in signer")


def main() -> int:
    try:
        with tempfile.TemporaryDirectory() as tmp:
            run(Path(tmp))
        return 0
    except QualifyError as exc:
        emit(f"error: {exc}")
        return exc.exit_code


if __name__ == "__main__":
    sys.exit(main())
