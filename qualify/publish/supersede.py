"""What a publish finds at an image's attestation tag (`sha256-<hex>.att`) before it pushes its own, and what
it does with it.

The tag names one attestation image, so pushing replaces what a consumer pulling by tag sees. Before that:
- layers of our predicate types that verify with the release key are superseded by the new ones (a publish
  after `promote` replaces the older level's statements) and named in the report, unless one of them is a
  release statement newer than ours (a later release of the same image): then the registry is left as it is,
  since the newest statement decides anyway and ours would hide it;
- layers of our types that do not verify with the release key are dropped (they are not ours: anyone who can
  push can put them there), and said so;
- layers of other predicate types (another tool's `cosign attest`) are kept, after ours;
- our verified SLSA provenance and SBOM are carried over when this publish makes none (a publish after
  `promote` from a host without the build record): they are about the same image digest;
- a tag that holds no readable attestation image is replaced, and said so.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

from qualify.core import manifest as mf
from qualify.core.errors import QualifyError, VerificationError
from qualify.core.readlimit import strict_json
from qualify.publish import attestation_verify, dsse, sbom, slsa
from qualify.trust.order import ReleaseOrder
from qualify.trust.records import RELEASE_STATEMENT_TYPE, ReleaseStatement
from qualify.trust.verify import TrustedKey

RELEASE_STATEMENT_V1 = "https://blackwell-qualify.dev/release-statement/v1"
OURS = {mf.PREDICATE_TYPE: "qualification statement", RELEASE_STATEMENT_TYPE: "release statement",
        RELEASE_STATEMENT_V1: "release statement (v1)", slsa.PREDICATE_TYPE: "SLSA provenance",
        sbom.PREDICATE_TYPE: "CycloneDX SBOM"}
CARRIED = (slsa.PREDICATE_TYPE, sbom.PREDICATE_TYPE)  # about the image's build, not its release or level


@dataclass(frozen=True)
class Found:
    """One layer at the attestation tag before this publish."""

    predicate_type: str
    envelope: bytes
    payload: Optional[bytes]  # the verified payload (None: it did not verify with the release key)
    description: str
    unreadable: bool = False  # the tag's manifest or a layer could not be read as an attestation image

    @property
    def ours(self) -> bool:
        return self.predicate_type in OURS


@dataclass(frozen=True)
class Plan:
    """What this publish does at the tag: push (keeping `kept`), or leave a newer release's attestations."""

    push: bool
    kept: Tuple[Tuple[bytes, str], ...]  # (envelope, predicateType) pushed after ours: other tools', carried over
    superseded: Tuple[str, ...]  # descriptions of our verified layers this publish replaces
    dropped: Tuple[str, ...]  # layers of our types that did not verify with the release key, or unreadable
    newer: Optional[str] = None  # the newer release statement that made this publish leave the tag alone
    carried: Tuple[str, ...] = ()  # our verified SLSA/SBOM layers kept because this publish made none

    def lines(self, target: str, att_ref: str) -> List[str]:
        if self.newer:
            return [f"  {target}: {att_ref} holds a newer release's attestations ({self.newer}): left as they are"]
        out = []
        if self.superseded:
            out.append(f"  {target}: superseded at {att_ref}: {'; '.join(self.superseded)}")
        if self.dropped:
            out.append(f"  {target}: dropped from {att_ref} (not signed with the release key): {'; '.join(self.dropped)}")
        others = sorted({p for _, p in self.kept if p not in OURS})
        if others:
            out.append(f"  {target}: kept {sum(1 for _, p in self.kept if p not in OURS)} attestation(s) of other "
                       f"tools at {att_ref}: {', '.join(others)}")
        if self.carried:
            out.append(f"  {target}: carried over (this publish made none): {'; '.join(self.carried)}")
        return out


def _describe(ptype: str, payload: bytes, what: str) -> Tuple[str, Optional[ReleaseOrder]]:
    """A verified layer in words (and a release statement's order)."""
    stmt = strict_json(payload, what, VerificationError)
    pred = stmt.get("predicate") if isinstance(stmt, dict) else None
    pred = pred if isinstance(pred, dict) else {}
    if ptype == RELEASE_STATEMENT_TYPE:
        r = ReleaseStatement.from_predicate(pred, what)
        return f"release statement {r.describe()}", r.order
    if ptype == RELEASE_STATEMENT_V1:
        tag, seq, prom = pred.get("tag"), pred.get("sequence"), pred.get("promotion")
        ok = isinstance(tag, str) and isinstance(seq, int) and isinstance(prom, int)
        order = ReleaseOrder.of(tag, seq, prom) if ok else None
        return f"release statement (v1) {tag} (sequence {seq}, promotion {prom})", order
    if ptype == mf.PREDICATE_TYPE:
        return (f"qualification statement (level {pred.get('support_level')}, verdict {pred.get('verdict')}, "
                f"subject {stmt['subject'][0].get('name') if stmt.get('subject') else '?'})"), None
    return f"{OURS[ptype]} ({hashlib.sha256(payload).hexdigest()[:12]}...)", None


def found(name: str, digest: str, key: TrustedKey) -> List[Found]:
    """The layers at `name`'s attestation tag for `digest`, each verified with the release key; [] when
    there is none."""
    try:
        layers = attestation_verify.fetch_layers(name, digest)
    except VerificationError as exc:
        if exc.message.startswith("no attestation:"):
            return []
        return [Found("", b"", None, f"an unreadable attestation image ({exc.message})", unreadable=True)]
    out = []
    for layer, data in layers:
        what = f"attestation {layer.digest[:19]}... at {name}"
        payload, description = None, OURS.get(layer.predicate_type, layer.predicate_type)
        if layer.predicate_type in OURS:
            try:
                payload = dsse.verify(dsse.parse(data, what), key.key, what)
                description, _ = _describe(layer.predicate_type, payload, what)
            except QualifyError as exc:
                payload, description = None, f"{description}: {exc.message}"
        out.append(Found(layer.predicate_type, data, payload, description))
    return out


def plan(existing: Sequence[Found], new: Sequence[Tuple[bytes, str]], ours: ReleaseStatement, what: str) -> Plan:
    """`new`: (payload, predicateType) of this publish's statements."""
    kept = tuple((f.envelope, f.predicate_type) for f in existing if not f.ours and not f.unreadable)
    dropped = tuple(f.description for f in existing if (f.ours and f.payload is None) or f.unreadable)
    for f in existing:
        if f.ours and f.payload is not None and f.predicate_type in (RELEASE_STATEMENT_TYPE, RELEASE_STATEMENT_V1):
            description, order = _describe(f.predicate_type, f.payload, what)
            if order is not None and order > ours.order:
                return Plan(False, kept, (), dropped, newer=description)
    made = {t for _, t in new}
    carry = [f for f in existing if f.payload is not None and f.predicate_type in CARRIED and f.predicate_type not in made]
    payloads = {p for p, _ in new}
    superseded = tuple(f.description for f in existing if f.ours and f.payload is not None and f.payload not in payloads
                       and f not in carry)
    return Plan(True, tuple((f.envelope, f.predicate_type) for f in carry) + kept, superseded, dropped,
                carried=tuple(f.description for f in carry))
