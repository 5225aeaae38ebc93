"""Verify an image from its registry alone: fetch its cosign-layout attestation
(`sha256-<hex>.att`), verify the DSSE signature with the release key, check the
Statement is about this image's digest, and report the qualification verdict.
No local manifest is needed (start.sh on another host).

Anyone who can push to the repository can also push an attestation image: of the layers that verify with
the release key, the newest signed release statement (by release order) decides which qualification
statement counts; two different statements at the same place are refused, never chosen between."""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Tuple

from qualify.config.imageref import ImageRef, ImageRefError
from qualify.core import manifest as mf
from qualify.core.errors import ConfigError, RegistryError, VerificationError, printable
from qualify.core.readlimit import strict_json
from qualify.host import skopeo
from qualify.host.registry import Registry
from qualify.publish import dsse, oci
from qualify.release.folder import TrustedKey
from qualify.release.records import RELEASE_STATEMENT_TYPE, ReleaseStatement
from qualify.release.verify import check_verdict

_HEX = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True)
class ImageVerifyResult:
    """An image's qualification as its registry attests it, every value from verified bytes."""

    image: str
    digest: str
    attestation: str
    key: str  # the release key's fingerprint
    manifest: mf.Manifest
    release: ReleaseStatement  # the newest signed release statement, which chose the manifest
    release_statements: int  # how many verified release statements the attestations held
    predicate_types: Tuple[str, ...] = ()
    subject: str = ""  # the name the qualification statement gives its subject: the repository it was published to

    @property
    def require_pass_ok(self) -> bool:
        return self.manifest.passes

    def as_dict(self) -> Dict[str, Any]:
        m = self.manifest
        return {"image": self.image, "digest": self.digest, "attestation": self.attestation, "key": self.key,
                "target": m.target, "capability": m.capability, "platform": m.platform, "profile": m.profile,
                "verdict": m.verdict, "support_level": m.support_level, "failing_checks": list(m.failing),
                "predicate_types": list(self.predicate_types), "require_pass_ok": self.require_pass_ok,
                "subject": self.subject,
                "release": {"tag": self.release.tag, "sequence": self.release.sequence,
                            "promotion": self.release.promotion, "release_sha256": self.release.release_sha256,
                            "manifest_sha256": self.release.manifest_sha256,
                            "statement_sha256": self.release.statement_sha256},
                "release_statements": self.release_statements}


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


def _verified_payloads(layers: List[tuple], key: TrustedKey, digest: str, att_ref: str) -> tuple:
    """[(predicateType, payload bytes, Statement)] of every layer whose DSSE signature verifies with the key
    and whose Statement is about this image; and why the others did not count."""
    good, errors = [], []
    for layer, data in layers:
        what = f"attestation {layer.digest[:19]}... at {att_ref}"
        try:
            payload = dsse.verify(dsse.parse(data, what), key.key, what)
            stmt = _statement(payload, what, layer.predicate_type)
            subject = mf.subject_digest(stmt, what)
            if subject != digest:
                raise VerificationError(f"image digest check failed: {what} is about {subject}, not the image's "
                                        f"{digest} (an attestation copied from another image)")
            good.append((layer.predicate_type, payload, stmt))
        except VerificationError as exc:
            errors.append(exc.message)
    return good, errors


def choose_release(good: List[tuple], att_ref: str, errors: List[str]) -> ReleaseStatement:
    """The newest signed release statement (release order: version, sequence, promotion); two different
    statements at the same place are ambiguity, refused."""
    statements = [ReleaseStatement.from_predicate(stmt.get("predicate"), f"release statement at {att_ref}")
                  for ptype, _, stmt in good if ptype == RELEASE_STATEMENT_TYPE]
    if not statements:
        why = f" (layers that did not verify: {'; '.join(errors)})" if errors else ""
        raise VerificationError(f"no signed release statement at {att_ref}{why}: published by an older toolkit, or "
                                "its attestations were replaced", hint="publish the release again: nox -s publish -- TAG")
    best = max(statements, key=lambda r: r.order)
    rivals = {r for r in statements if r.order == best.order and r != best}
    if rivals:
        raise VerificationError(f"{att_ref}: two different signed release statements claim {best.describe()} "
                                f"(manifests {best.manifest_sha256[:12]}... and {next(iter(rivals)).manifest_sha256[:12]}...);"
                                " refusing to choose", hint="re-publish the release from its release folder")
    return best


def verify_image(image: str, key, require_pass: bool = False) -> ImageVerifyResult:
    """`key`: the release key (a TrustedKey already read, or the path of cosign.pub)."""
    try:
        ref = ImageRef.parse(image)
    except ImageRefError as exc:
        raise ConfigError(f"--image: {exc}", hint="name[:tag][@sha256:...], e.g. ghcr.io/acme/sm120@sha256:...") from None
    key = key if isinstance(key, TrustedKey) else TrustedKey.read(Path(key))
    digest = resolve(ref)
    att_ref = f"{ref.name}:{oci.att_tag(digest)}"
    layers = fetch_layers(ref.name, digest)
    good, errors = _verified_payloads(layers, key, digest, att_ref)
    release = choose_release(good, att_ref, errors)
    chosen = [payload for ptype, payload, _ in good
              if ptype == mf.PREDICATE_TYPE and hashlib.sha256(payload).hexdigest() == release.statement_sha256]
    if not chosen:
        why = f" (layers that did not verify: {'; '.join(errors)})" if errors else ""
        raise VerificationError(f"{att_ref}: no signed qualification statement is the one release "
                                f"{release.describe()} names (sha256 {release.statement_sha256[:12]}...){why}",
                                hint="publish the release again: nox -s publish -- TAG" if not errors else
                                "a layer beside it is damaged or forged (see why above); publish the release again")
    where = f"qualification statement at {att_ref}"
    released = hashlib.sha256(mf.with_subject_name(chosen[0], release.manifest_subject, where)).hexdigest()
    if released != release.manifest_sha256:
        raise VerificationError(f"{att_ref}: the signed qualification statement, named {release.manifest_subject} as "
                                f"released, is not the released manifest the release statement names (sha256 "
                                f"{released[:12]}..., expected {release.manifest_sha256[:12]}...)",
                                hint="publish the release again from its release folder: nox -s publish -- TAG")
    manifest = mf.Manifest.parse(chosen[0], where)
    if manifest.target != release.target:
        raise VerificationError(f"{att_ref}: the release statement is for {release.target}, its manifest for "
                                f"{manifest.target}")
    check_verdict(manifest, require_pass)
    return ImageVerifyResult(image=image, digest=digest, attestation=att_ref, key=key.fingerprint, manifest=manifest,
                             subject=mf.subject_name(manifest.statement),
                             release=release, release_statements=sum(1 for p, _, _ in good
                                                                     if p == RELEASE_STATEMENT_TYPE),
                             predicate_types=tuple(sorted({layer.predicate_type for layer, _ in layers})))


def _statement(payload: bytes, what: str, predicate_type: str) -> Dict[str, Any]:
    stmt = strict_json(payload, f"{what}: the signed payload", VerificationError)
    if not isinstance(stmt, dict) or stmt.get("_type") != mf.STATEMENT_TYPE:
        raise VerificationError(f"{what}: the signed payload is not an in-toto Statement v1")
    if stmt.get("predicateType") != predicate_type:
        raise VerificationError(f"{what}: the signed predicateType is {stmt.get('predicateType')!r}, "
                                f"the layer says {predicate_type!r}")
    return stmt


def print_human(r: ImageVerifyResult, out=None) -> None:
    m = r.manifest
    lines = [f"{r.image}: verified from the registry",
             f"  image digest:  {r.digest}",
             f"  attestation:   {r.attestation} ({', '.join(r.predicate_types)})",
             f"  signature:     OK (DSSE, key {r.key})",
             f"  release:       {r.release.describe()}, the newest of {r.release_statements} signed release "
             "statement(s) there",
             f"  subject:       OK (the Statement names {r.subject}@{r.digest}; as released, the manifest "
             f"{r.release.manifest_sha256[:12]}...)",
             f"  target:        {m.target} (capability {m.capability}, {m.platform})",
             f"  verdict:       {m.verdict}" + (f" (failing checks: {', '.join(m.failing)})" if m.failing else ""),
             f"  support level: {m.support_level}"]
    print("\n".join(printable(line) for line in lines), file=out)
