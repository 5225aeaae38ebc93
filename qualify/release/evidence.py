"""GPU evidence records: what a Blackwell host proved about one released image.

The deploy writes one record per run of the on-host GPU checks, beside the
release's manifest; `qualify promote` reads them. A record is self-contained
and bound to the image digest, the probe's sources digest and the GPU, so a
release engineer can tell what it is about without the host. Host identity
and GPU UUID are hashed: evidence travels, serial numbers need not.
"""

from __future__ import annotations

import datetime as dt
import enum
import hashlib
import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from qualify.core.errors import ConfigError
from qualify.core.fsutil import canonical_json, write_atomic
from qualify.core.readlimit import read_small

SCHEMA = "https://blackwell-qualify.dev/gpu-evidence/v1"
MAX_BYTES = 4 << 20  # a record is a few kB; refuse anything that is not one
DIGEST = re.compile(r"sha256:[0-9a-f]{64}")


class Outcome(str, enum.Enum):
    """Seed 000: infrastructure outcomes (not-run, timeouts, no GPU) are kept apart from product failures."""

    PASS = "pass"
    PRODUCT_FAILURE = "product-failure"
    INFRASTRUCTURE = "infrastructure"


class EvidenceError(ConfigError):
    """A file that is not usable GPU evidence; the message names the file and the field."""


@dataclass(frozen=True)
class Gpu:
    name: str
    capability: str
    uuid_sha256: str
    driver: str


@dataclass(frozen=True)
class Evidence:
    release: str
    target: str
    capability: str  # the target's
    image_reference: str
    image_digest: str
    probe_sources_digest: str
    gpu: Gpu
    host_id_sha256: str
    time: str  # UTC, RFC 3339, seconds
    outcome: Outcome
    reason: str
    checks: Tuple[Mapping[str, Any], ...] = ()
    figures: Mapping[str, float] = field(default_factory=dict)

    def as_dict(self) -> Dict[str, Any]:
        doc = asdict(self)
        doc["outcome"] = self.outcome.value
        doc["checks"] = [dict(c) for c in self.checks]
        doc["figures"] = dict(self.figures)
        return {"schema": SCHEMA, **doc}

    def to_bytes(self) -> bytes:
        return canonical_json(self.as_dict())

    @property
    def digest(self) -> str:
        """Its identity: the same record, however often it is handed in, counts once."""
        return "sha256:" + hashlib.sha256(self.to_bytes()).hexdigest()

    def with_figures(self, **figures: float) -> Evidence:
        merged = {**self.figures, **{k: v for k, v in figures.items() if v is not None}}
        return Evidence(**{**self.__dict__, "figures": merged})


def hashed(text: str) -> str:
    return "sha256:" + hashlib.sha256(text.strip().encode()).hexdigest()


def host_id(machine_id: Path = Path("/etc/machine-id")) -> str:
    """A hash of the host's identity (machine-id, else the hostname)."""
    import socket

    try:
        text = machine_id.read_text(encoding="ascii")[:256].strip()
    except (OSError, UnicodeDecodeError):
        text = ""
    return hashed(text or socket.gethostname())


def now() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def file_name(target: str, when: str, host_hash: str) -> str:
    """`<target>.gpu-evidence.<time>.<host>.json`: one file per run, sorted by time."""
    stamp = when.replace("-", "").replace(":", "")
    return f"{target}.gpu-evidence.{stamp}.{host_hash.split(':', 1)[1][:12]}.json"


def write(path: Path, evidence: Evidence) -> Path:
    return write_atomic(path, evidence.to_bytes())


# --- reading ---------------------------------------------------------------------


def _field(doc: Mapping[str, Any], key: str, where: str, kind: type = str) -> Any:
    value = doc.get(key)
    if not isinstance(value, kind) or (kind is str and not value):
        raise EvidenceError(f"{where}: field {key!r} is missing or not a {kind.__name__}",
                            hint="hand in the file start.sh wrote beside the manifest, unchanged")
    return value


def _digest_field(doc: Mapping[str, Any], key: str, where: str) -> str:
    value = _field(doc, key, where)
    if not DIGEST.fullmatch(value):
        raise EvidenceError(f"{where}: field {key!r} is not a sha256:<64 hex> digest: {value[:80]!r}")
    return value


def parse(data: bytes, where: str) -> Evidence:
    try:
        doc = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise EvidenceError(f"{where}: not a JSON evidence record: {exc}") from None
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        raise EvidenceError(f"{where}: not a GPU evidence record (schema {SCHEMA})",
                            hint="start.sh writes these as <target>.gpu-evidence.*.json beside the manifest")
    gpu = _field(doc, "gpu", where, dict)
    try:
        outcome = Outcome(_field(doc, "outcome", where))
    except ValueError:
        raise EvidenceError(f"{where}: field 'outcome' is {doc.get('outcome')!r}; one of "
                            f"{', '.join(o.value for o in Outcome)} expected") from None
    figures = doc.get("figures") or {}
    if not isinstance(figures, dict) or not all(isinstance(v, (int, float)) for v in figures.values()):
        raise EvidenceError(f"{where}: field 'figures' must map names to numbers")
    checks = doc.get("checks") or []
    if not isinstance(checks, list) or not all(isinstance(c, dict) for c in checks):
        raise EvidenceError(f"{where}: field 'checks' must be a list of objects")
    ev = Evidence(
        release=_field(doc, "release", where), target=_field(doc, "target", where),
        capability=_field(doc, "capability", where), image_reference=_field(doc, "image_reference", where),
        image_digest=_digest_field(doc, "image_digest", where),
        probe_sources_digest=_digest_field(doc, "probe_sources_digest", where),
        gpu=Gpu(name=_field(gpu, "name", f"{where}: gpu"), capability=_field(gpu, "capability", f"{where}: gpu"),
                uuid_sha256=_field(gpu, "uuid_sha256", f"{where}: gpu"), driver=str(gpu.get("driver") or "")),
        host_id_sha256=_digest_field(doc, "host_id_sha256", where), time=_field(doc, "time", where),
        outcome=outcome, reason=str(doc.get("reason") or ""), checks=tuple(checks), figures=figures,
    )
    if ev.to_bytes() != canonical_json(doc):
        raise EvidenceError(f"{where}: has fields this toolkit does not know",
                            hint="hand in the file start.sh wrote, unchanged")
    return ev


def load(path: Path) -> Evidence:
    path = Path(path)
    return parse(_read(path), str(path))


def _read(path: Path) -> bytes:
    return read_small(path, MAX_BYTES, "evidence file", EvidenceError)


def sign(path: Path, key_file: Path, password: Optional[bytes] = None) -> Path:
    """The host's own signature over the record (optional): PATH.sig beside it."""
    from qualify.signing.signer import key_signer

    signer, _ = key_signer("builtin", key_file, password)
    signer.sign_file(path, path.with_name(path.name + ".sig"), path.with_name(path.name + ".bundle"))
    return path.with_name(path.name + ".sig")


def checks_summary(checks: List[Mapping[str, Any]]) -> str:
    return ", ".join(f"{c.get('id')} {c.get('status')}" for c in checks)


# --- the GPU checks run here ---------------------------------------------------


@dataclass(frozen=True)
class ProbeOutcome:
    outcome: Outcome
    reason: str
    checks: Sequence[Mapping[str, Any]]


def _gpu_checks(predicate: Mapping[str, Any]) -> List[Mapping[str, Any]]:
    return [c for c in predicate.get("checks") or [] if str(c.get("id", "")).startswith("gpu.")]


def _named(checks: Sequence[Mapping[str, Any]]) -> str:
    return "; ".join(f"{c.get('id')}: {c.get('status')}: {c.get('reason', '')}" for c in checks)


def probe_outcome(predicate: Mapping[str, Any], capability: str) -> ProbeOutcome:
    """Pass only when every required GPU check passed on a GPU of the target's capability.

    A required check that failed is a product failure; one that did not run
    (no GPU visible, a timeout) is infrastructure: it proves nothing either way.
    """
    checks = _gpu_checks(predicate)
    required = [c for c in checks if c.get("required", True)]
    failed = [c for c in required if c.get("status") == "fail"]
    if failed:
        return ProbeOutcome(Outcome.PRODUCT_FAILURE, _named(failed), checks)
    not_run = [c for c in required if c.get("status") == "not-run"]
    if not_run:
        return ProbeOutcome(Outcome.INFRASTRUCTURE, _named(not_run), checks)
    if not required:
        return ProbeOutcome(Outcome.INFRASTRUCTURE, "the probe reported no required GPU check", checks)
    devices = (predicate.get("gpu") or {}).get("devices") or []
    seen = str((devices[0] if devices else {}).get("compute_cap", ""))
    if seen != capability:
        return ProbeOutcome(Outcome.INFRASTRUCTURE, f"the probe saw capability {seen or 'none'}, not {capability}",
                            checks)
    return ProbeOutcome(Outcome.PASS, f"{len(required)} required GPU checks passed", checks)


# --- evidence from a probe Statement (qualify gpu-evidence, a Kubernetes Job, scripts/gpu-evidence.sh) -------


def from_statement(stmt: Mapping[str, Any], release: str, where: str) -> Evidence:
    """A probe manifest with GPU checks, as an evidence record: the same rule (probe_outcome) decides
    pass, product failure or infrastructure; the probe's own sources digest binds it to its probe."""
    from qualify.core import manifest as mf

    pred = mf.predicate(stmt)
    target = pred.get("target") or {}
    capability = str(target.get("capability") or "")
    probe = (pred.get("toolkit") or {}).get("probe_sha256")
    if not isinstance(probe, str) or not DIGEST.fullmatch(probe):
        raise EvidenceError(f"{where}: the probe manifest does not name its probe's sources digest "
                            "(predicate.toolkit.probe_sha256)", hint="re-run the GPU checks with this toolkit's probe")
    devices = [d for d in (pred.get("gpu") or {}).get("devices") or [] if isinstance(d, dict)]
    device = devices[0] if devices else {}
    outcome = probe_outcome(pred, capability)
    digest = mf.subject_digest(stmt)
    host = str((pred.get("host") or {}).get("hostname") or "")
    return Evidence(
        release=release, target=str(target.get("name") or ""), capability=capability,
        image_reference=f"{stmt['subject'][0].get('name')}@{digest}", image_digest=digest,
        probe_sources_digest=probe,
        gpu=Gpu(name=str(device.get("name") or "none"), capability=str(device.get("compute_cap") or "none"),
                uuid_sha256=hashed(str(device.get("uuid") or "")), driver=str(device.get("driver_version") or "")),
        host_id_sha256=hashed(host), time=str(pred.get("created") or ""), outcome=outcome.outcome,
        reason=outcome.reason, checks=tuple(outcome.checks))


def load_any(path: Path, release: str) -> Evidence:
    """An evidence record (start.sh) or a probe manifest with GPU checks (qualify gpu-evidence, qualify merge)."""
    from qualify.core import manifest as mf

    path = Path(path)
    data = _read(path)
    try:
        doc = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise EvidenceError(f"{path}: not JSON: {exc}") from None
    if isinstance(doc, dict) and doc.get("_type") == mf.STATEMENT_TYPE:
        try:
            return from_statement(mf.parse(data, str(path)), release, str(path))
        except (KeyError, IndexError, TypeError, AttributeError):
            raise EvidenceError(f"{path}: not a probe manifest with a subject and GPU checks") from None
    return parse(data, str(path))
