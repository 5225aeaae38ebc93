"""`nox -s attest-interop`: our DSSE envelopes and Sigstore bundles checked by
implementations we did not write.

1. openssl: `openssl dgst -sha256 -verify cosign.pub` over the PAE bytes
   (rebuilt here from the envelope) must accept the signature, and reject it
   for a changed payload.
2. sigstore-js (@sigstore/bundle + @sigstore/verify from npm, installed into a
   work folder of the state folder, removed on exit): bundleFromJSON, toSignedEntity, and Verifier with a public
   key found through a key finder, transparency-log and timestamp thresholds 0.

Exit 0 only when both ran and agreed; a check that cannot run fails the
session and says why (it is not a pass).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Iterator

from qualify.core import manifest as mf
from qualify.core.fsutil import canonical_json
from qualify.host import workdirs
from qualify.publish import dsse
from qualify.signing import formats
from qualify.signing import keys as cosign_keys

NPM_PACKAGES = ("@sigstore/verify@3.1.1", "@sigstore/bundle@4.0.0")
SCRATCH_ENV = "QUALIFY_SIGSTORE_JS_DIR"  # reuse an installed scratch folder

_VERIFY_JS = r"""
const fs = require('fs');
const crypto = require('crypto');
const { bundleFromJSON } = require('@sigstore/bundle');
const { Verifier, toSignedEntity, toTrustMaterial } = require('@sigstore/verify');
const [bundlePath, keyPath] = process.argv.slice(2);
const bundle = bundleFromJSON(JSON.parse(fs.readFileSync(bundlePath, 'utf8')));
const pem = fs.readFileSync(keyPath, 'utf8');
const keyFinder = (hint) => ({ publicKey: crypto.createPublicKey(pem), validFor: () => true });
const trust = toTrustMaterial({ mediaType: 'application/vnd.dev.sigstore.trustedroot+json;version=0.1',
  tlogs: [], ctlogs: [], certificateAuthorities: [], timestampAuthorities: [] }, keyFinder);
const verifier = new Verifier(trust, { tlogThreshold: 0, ctlogThreshold: 0, timestampThreshold: 0 });
try {
  verifier.verify(toSignedEntity(bundle));
  console.log('sigstore-js: verified');
} catch (e) {
  console.log('sigstore-js: REJECTED: ' + e.message);
  process.exit(3);
}
"""


def _sample(private_key) -> dsse.Envelope:
    stmt = mf.statement("registry.example/blackwell/sm120", "sha256:" + "ab" * 32,
                        {"schema_version": 1, "verdict": "pass", "checks": []})
    from qualify.signing.signer import BuiltinSigner

    return dsse.sign(BuiltinSigner(private_key), canonical_json(stmt))


def openssl_check(folder: Path, envelope: dsse.Envelope, pub: Path) -> str:
    if not shutil.which("openssl"):
        raise SystemExit("attest-interop: openssl is not installed; cannot run the PAE check (not a pass)")
    (folder / "pae.bin").write_bytes(dsse.pae(envelope.payload_type, envelope.payload))
    (folder / "sig.der").write_bytes(envelope.signatures[0].sig)
    ok = subprocess.run(["openssl", "dgst", "-sha256", "-verify", str(pub), "-signature", str(folder / "sig.der"),
                         str(folder / "pae.bin")], capture_output=True, text=True)
    (folder / "bad.bin").write_bytes(dsse.pae(envelope.payload_type, envelope.payload + b" "))
    bad = subprocess.run(["openssl", "dgst", "-sha256", "-verify", str(pub), "-signature", str(folder / "sig.der"),
                          str(folder / "bad.bin")], capture_output=True, text=True)
    if ok.returncode != 0 or bad.returncode == 0:
        raise SystemExit(f"attest-interop: openssl disagrees: good={ok.stdout.strip()} changed={bad.stdout.strip()}")
    return "openssl: PAE signature verified; changed payload rejected"


@contextlib.contextmanager
def _sigstore_js_dir() -> Iterator[Path]:
    """sigstore-js installed by npm for this run, in a work folder of the state folder removed when the run
    ends (a killed run's is removed by the next one); or the installed folder QUALIFY_SIGSTORE_JS_DIR names."""
    given = os.environ.get(SCRATCH_ENV)
    if given and (Path(given) / "node_modules" / "@sigstore" / "verify").is_dir():
        yield Path(given)
        return
    if not shutil.which("node") or not shutil.which("npm"):
        raise SystemExit("attest-interop: node/npm are not installed; sigstore-js cannot run (not a pass)")
    workdirs.sweep(("sigstore-js", "interop"))
    with workdirs.scratch("sigstore-js") as scratch:
        proc = subprocess.run(["npm", "install", "--silent", "--no-audit", "--no-fund", *NPM_PACKAGES], cwd=scratch,
                              capture_output=True, text=True, timeout=600)
        if proc.returncode != 0:
            raise SystemExit(f"attest-interop: npm install {' '.join(NPM_PACKAGES)} failed (not a pass):\n"
                             + proc.stderr[-2000:])
        yield scratch


def sigstore_js_check(folder: Path, envelope: dsse.Envelope, public_key, pub: Path) -> str:
    with _sigstore_js_dir() as scratch:
        return _sigstore_js_verify(scratch, folder, envelope, public_key, pub)


def _sigstore_js_verify(scratch: Path, folder: Path, envelope: dsse.Envelope, public_key, pub: Path) -> str:
    (scratch / "verify.js").write_text(_VERIFY_JS)
    good, bad = folder / "bundle.json", folder / "tampered.json"
    good.write_bytes(formats.bundle_bytes(dsse.sigstore_bundle(envelope, public_key)))
    tampered = dsse.Envelope(envelope.payload_type, envelope.payload.replace(b'"pass"', b'"fail"'),
                             envelope.signatures)
    bad.write_bytes(formats.bundle_bytes(dsse.sigstore_bundle(tampered, public_key)))
    ok = subprocess.run(["node", str(scratch / "verify.js"), str(good), str(pub)], capture_output=True, text=True,
                        cwd=scratch, timeout=120)
    no = subprocess.run(["node", str(scratch / "verify.js"), str(bad), str(pub)], capture_output=True, text=True,
                        cwd=scratch, timeout=120)
    if ok.returncode != 0:
        raise SystemExit(f"attest-interop: sigstore-js rejected our bundle:\n{ok.stdout}{ok.stderr[-2000:]}")
    if no.returncode != 3:
        raise SystemExit(f"attest-interop: sigstore-js did not reject a tampered bundle:\n{no.stdout}{no.stderr}")
    return "sigstore-js: DSSE bundle v0.3 verified with the public key; tampered payload rejected"


def main() -> int:
    pair = cosign_keys.generate_key_pair(b"interop")
    private_key = cosign_keys.load_private_key(pair.private_pem, b"interop")
    envelope = _sample(private_key)
    with workdirs.scratch("interop") as folder:
        pub = folder / "cosign.pub"
        pub.write_bytes(pair.public_pem)
        results = [openssl_check(folder, envelope, pub),
                   sigstore_js_check(folder, envelope, private_key.public_key(), pub)]
    print("\n".join(results))
    print(json.dumps({"ok": True, "checks": len(results)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
