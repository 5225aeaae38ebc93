"""Verify an image from its registry alone: fetch its cosign-layout attestation
(`sha256-<hex>.att`), verify the DSSE signature with the release key, check the
Statement is about this image's digest, and report the qualification verdict.
No local manifest is needed (start.sh on another host)."""

from __future__ import annotations

import json
import os
import re
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Dict, List

from qualify import skopeo
from qualify.build.registry import Registry
from qualify.config.imageref import ImageRef, ImageRefError
from qualify.core import manifest as mf
from qualify.core.errors import ConfigError, RegistryError, VerificationError
from qualify.publish import dsse, oci
from qualify.signing import formats
from qualify.signing import keys as cosign_keys

_HEX = re.compile(r"[0-9a-f]{64}")


@dataclass
class ImageVerifyResult:
    image: str
    digest: str
    attestation: str
    key: str
    target: str
    verdict: str
    support_level: str
    failing_checks: List[str] = field(default_factory=list)
    predicate_types: List[str] = field(default_factory=list)
    profile: str = ""
    require_pass_ok: bool = False  # what `--require-pass` would say (known values only, no failing check)

    def as_dict(self) -> Dict[str, Any]:
        return asdict(self)


def _insecure() -> tuple:
    return (Registry.from_env().address,)


def resolve(ref: ImageRef) -> str:
    """The digest the registry serves for `ref`; a pinned digest must be the one served."""
    target = f"docker://{ref.name}@{ref.digest}" if ref.digest else f"docker://{ref.tagged}"
    try:
        raw = skopeo.inspect_raw(target, _insecure(), what=f"image {ref}")
    except RegistryError as exc:
        raise VerificationError(f"image digest check failed: {exc.message}") from None
    served = oci.digest_of(raw)
    if ref.digest and served != ref.digest:
        raise VerificationError(f"image digest check failed: the registry serves {served} for {ref}")
    return served


def fetch_layers(name: str, digest: str) -> List[tuple]:
    """[(AttLayer, bytes)] of the image's `.att` manifest, each blob's digest checked."""
    att_ref = f"{name}:{oci.att_tag(digest)}"
    try:
        raw = skopeo.inspect_raw(f"docker://{att_ref}", _insecure(), what=f"attestations {att_ref}")
    except RegistryError as exc:
        if "not found" in exc.message:
            raise VerificationError(f"no attestation: {att_ref} is not in the registry (the image was not "
                                    "published with attestations)") from None
        raise
    layers = oci.parse_attestation_image(raw, att_ref)
    for layer in layers:
        if layer.size > dsse.MAX_ENVELOPE_BYTES:
            raise VerificationError(f"{att_ref}: layer {layer.digest} is {layer.size} bytes, over the limit")
    out = []
    with tempfile.TemporaryDirectory(prefix="qualify-att-") as tmp:
        skopeo.copy(f"docker://{att_ref}", f"dir:{tmp}", label="attestations", progress=lambda _m: None,
                    insecure_hosts=_insecure())
        for layer in layers:
            hexpart = layer.digest.split(":", 1)[-1]
            path = Path(tmp) / hexpart
            if not _HEX.fullmatch(hexpart) or not path.is_file() or os.path.getsize(path) > dsse.MAX_ENVELOPE_BYTES:
                raise VerificationError(f"{att_ref}: layer {layer.digest} is missing or too large")
            data = path.read_bytes()
            if oci.digest_of(data) != layer.digest:
                raise VerificationError(f"{att_ref}: layer {layer.digest} does not match its content")
            out.append((layer, data))
    return out


def verify_image(image: str, key: Path, require_pass: bool = False,
                 predicate_type: str = mf.PREDICATE_TYPE) -> ImageVerifyResult:
    try:
        ref = ImageRef.parse(image)
    except ImageRefError as exc:
        raise ConfigError(f"--image: {exc}", hint="name[:tag][@sha256:...], e.g. ghcr.io/acme/sm120@sha256:...") from None
    public_key = formats.load_public_key_file(key)
    digest = resolve(ref)
    att_ref = f"{ref.name}:{oci.att_tag(digest)}"
    layers = fetch_layers(ref.name, digest)
    chosen = [(layer, data) for layer, data in layers if layer.predicate_type == predicate_type]
    if not chosen:
        have = ", ".join(sorted({layer.predicate_type or "(none)" for layer, _ in layers}))
        raise VerificationError(f"no attestation of type {predicate_type} at {att_ref} (it holds: {have})")
    errors = []
    for layer, data in chosen:
        what = f"attestation {layer.digest[:19]}... at {att_ref}"
        try:
            payload = dsse.verify(dsse.parse(data, what), public_key, what)
            stmt = _statement(payload, what, predicate_type)
            subject = _subject_digest(stmt, what)
            if subject != digest:
                raise VerificationError(f"image digest check failed: {what} is about {subject}, not the image's "
                                        f"{digest} (an attestation copied from another image)")
            return _result(image, digest, att_ref, public_key, stmt, require_pass, layers)
        except VerificationError as exc:
            errors.append(exc.message)
    raise VerificationError("; ".join(errors))


def _statement(payload: bytes, what: str, predicate_type: str) -> Dict[str, Any]:
    try:
        stmt = json.loads(payload)
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise VerificationError(f"{what}: the signed payload is not JSON") from None
    if not isinstance(stmt, dict) or stmt.get("_type") != mf.STATEMENT_TYPE:
        raise VerificationError(f"{what}: the signed payload is not an in-toto Statement v1")
    if stmt.get("predicateType") != predicate_type:
        raise VerificationError(f"{what}: the signed predicateType is {stmt.get('predicateType')!r}, "
                                f"the layer says {predicate_type!r}")
    return stmt


def _subject_digest(stmt: Dict[str, Any], what: str) -> str:
    try:
        return "sha256:" + stmt["subject"][0]["digest"]["sha256"]
    except (KeyError, IndexError, TypeError):
        raise VerificationError(f"{what}: the Statement has no subject digest") from None


def _result(image: str, digest: str, att_ref: str, public_key, stmt: Dict[str, Any], require_pass: bool,
            layers: list) -> ImageVerifyResult:
    """The same verdict rules as `qualify verify` of a manifest file (an allow-list of known values)."""
    from qualify.release.verify import check_verdict

    pred = stmt.get("predicate") or {}
    failing = check_verdict(stmt, require_pass)
    try:
        check_verdict(stmt, True)
        passes = True
    except VerificationError:
        passes = False
    return ImageVerifyResult(image=image, digest=digest, attestation=att_ref,
                             key=cosign_keys.fingerprint(public_key),
                             target=str((pred.get("target") or {}).get("name", "")),
                             verdict=str(pred.get("verdict", "unknown")),
                             support_level=str(pred.get("support_level", "")), failing_checks=failing,
                             predicate_types=sorted({layer.predicate_type for layer, _ in layers}),
                             profile=str((pred.get("target") or {}).get("profile", "")), require_pass_ok=passes)


def print_human(r: ImageVerifyResult, out=None) -> None:
    lines = [f"{r.image}: verified from the registry",
             f"  image digest:  {r.digest}",
             f"  attestation:   {r.attestation} ({', '.join(r.predicate_types)})",
             f"  signature:     OK (DSSE, key {r.key})",
             f"  subject:       OK (the Statement names {r.digest})",
             f"  target:        {r.target or '(not recorded)'}",
             f"  verdict:       {r.verdict}" + (f" (failing checks: {', '.join(r.failing_checks)})"
                                                 if r.failing_checks else ""),
             f"  support level: {r.support_level}"]
    print("\n".join(lines), file=out)
