"""DSSE v1 envelopes (secure-systems-lab/dsse envelope.md), signed with the
release key through the one Signer (signing/signer.py: `sign_dsse` over the PAE bytes), and the one
verifier of a registry's DSSE payloads (`verify`).

The signature covers the pre-authentication encoding, never the payload alone:
    PAE(type, body) = "DSSEv1" SP LEN(type) SP type SP LEN(body) SP body
with LEN the decimal byte length. That is what makes an envelope's payload
type part of what is signed.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass
from typing import Tuple

from qualify.core.errors import VerificationError
from qualify.core.readlimit import strict_json
from qualify.signing import formats
from qualify.signing import keys as cosign_keys

IN_TOTO_PAYLOAD_TYPE = "application/vnd.in-toto+json"
ENVELOPE_MEDIA_TYPE = "application/vnd.dsse.envelope.v1+json"
MAX_ENVELOPE_BYTES = 16 * 1024 * 1024  # an SBOM of ~500 packages is < 1 MiB


def pae(payload_type: str, body: bytes) -> bytes:
    t = payload_type.encode("utf-8")
    return b"DSSEv1 %d %s %d %s" % (len(t), t, len(body), body)


@dataclass(frozen=True)
class Signature:
    sig: bytes  # DER ECDSA
    keyid: str = ""


@dataclass(frozen=True)
class Envelope:
    payload_type: str
    payload: bytes
    signatures: Tuple[Signature, ...]

    def to_json(self) -> bytes:
        doc = {
            "payloadType": self.payload_type,
            "payload": base64.b64encode(self.payload).decode("ascii"),
            "signatures": [{"keyid": s.keyid, "sig": base64.b64encode(s.sig).decode("ascii")}
                           for s in self.signatures],
        }
        return json.dumps(doc, separators=(",", ":"), sort_keys=True).encode("utf-8")

    def as_bundle_dsse(self) -> dict:
        """The protobuf-specs `Envelope` message (camelCase JSON), as a bundle holds it."""
        return {
            "payload": base64.b64encode(self.payload).decode("ascii"),
            "payloadType": self.payload_type,
            "signatures": [{"sig": base64.b64encode(s.sig).decode("ascii"), "keyid": s.keyid}
                           for s in self.signatures],
        }


def sign(signer, payload: bytes, payload_type: str = IN_TOTO_PAYLOAD_TYPE) -> Envelope:
    """An envelope of `payload` signed by `signer` (a signing.signer.Signer)."""
    sig = signer.sign_dsse(pae(payload_type, payload))
    # keyid: the key's fingerprint. Unsigned, so only a hint: it lets a failed check say whether
    # another key signed or the payload changed; cosign and sigstore-js do not need it.
    return Envelope(payload_type, payload, (Signature(sig, cosign_keys.fingerprint(signer.public_key())),))


def _b64(value: object, what: str) -> bytes:
    if not isinstance(value, str):
        raise VerificationError(f"{what}: not a base64 string")
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise VerificationError(f"{what}: not valid base64") from None


def parse(raw: bytes, what: str = "DSSE envelope") -> Envelope:
    if len(raw) > MAX_ENVELOPE_BYTES:
        raise VerificationError(f"{what}: {len(raw)} bytes, more than the {MAX_ENVELOPE_BYTES} allowed")
    doc = strict_json(raw, what, VerificationError)
    if not isinstance(doc, dict) or not isinstance(doc.get("payloadType"), str):
        raise VerificationError(f"{what}: no payloadType (not a DSSE envelope)")
    sigs = doc.get("signatures")
    if not isinstance(sigs, list) or not sigs:
        raise VerificationError(f"{what}: no signatures")
    parsed = []
    for i, s in enumerate(sigs):
        if not isinstance(s, dict):
            raise VerificationError(f"{what}: signature {i} is not an object")
        keyid = s.get("keyid") or ""
        parsed.append(Signature(_b64(s.get("sig"), f"{what}: signature {i}"), str(keyid)))
    return Envelope(doc["payloadType"], _b64(doc.get("payload"), f"{what}: payload"), tuple(parsed))


def verify(envelope: Envelope, public_key, what: str = "DSSE envelope") -> bytes:
    """The payload, if one signature verifies over its PAE with `public_key`; else VerificationError."""
    if envelope.payload_type != IN_TOTO_PAYLOAD_TYPE:
        raise VerificationError(f"{what}: payloadType {envelope.payload_type!r}, expected {IN_TOTO_PAYLOAD_TYPE!r}")
    message = pae(envelope.payload_type, envelope.payload)
    if any(formats.verify_bytes(public_key, message, s.sig) for s in envelope.signatures):
        return envelope.payload
    mine = cosign_keys.fingerprint(public_key)
    hints = {s.keyid for s in envelope.signatures if s.keyid}
    if hints and mine not in hints:
        raise VerificationError(f"{what}: signature check failed: signed by another key ({', '.join(sorted(hints))}),"
                                f" not {mine}")
    raise VerificationError(f"{what}: signature check failed: the signature does not match the payload for key {mine}"
                            " (the payload or signature was changed after signing)")


def sigstore_bundle(envelope: Envelope, public_key) -> dict:
    """A Sigstore bundle (v0.3 shape) around `envelope`, naming the key by its hint; no log entries (a key,
    not keyless signing)."""
    return {"mediaType": formats.BUNDLE_MEDIA_TYPE,
            "verificationMaterial": {"publicKey": {"hint": cosign_keys.key_hint(public_key)},
                                     "tlogEntries": [], "timestampVerificationData": {"rfc3161Timestamps": []}},
            "dsseEnvelope": envelope.as_bundle_dsse()}
