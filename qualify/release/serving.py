"""Serve-check records: what the serving correctness matrix measured against one deployed server.

`python -m qualify serve-check` (deploy/servecheck/) writes one per run, an in-toto Statement about the served
image (predicate type SERVE_TYPE; manifests/serve-check.schema.json), beside the release's manifest, and
signs it with the host's key as start.sh signs GPU evidence; `qualify promote` reads them (servecount.py).

As with GPU evidence (evidence.py), nothing a record declares is taken as written: it is validated against
the schema, its outcome is recomputed from its checks, its time is parsed, and its identity is semantic
(image, probe, host, run id, time), so the same run counts once however it is serialised.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple

from qualify.core import manifest as mf
from qualify.core.fsutil import canonical_json, write_atomic
from qualify.core.readlimit import SCHEMA_LIMIT, read_json, strict_json
from qualify.release import evidence as ev

SERVE_TYPE = "https://blackwell-qualify.dev/serve-check/v1"
SCHEMA_FILE = "serve-check.schema.json"  # beside manifest.schema.json
SCHEMA_VERSION = 1
MAX_BYTES = 4 << 20


class ServeRecordError(ev.EvidenceError):
    """A file that is not a usable serve-check record; the message names the file and the field."""


@dataclass(frozen=True)
class GpuLink:
    """The GPU evidence start.sh saved for the deployment the matrix ran against (deployment.json)."""

    run_id: str
    time: str
    host_id_sha256: str
    outcome: str
    file: str = ""
    # Issue 49: which GPU run of that deployment (two runs may share run id, time and host: 1 GPU and tp2): the
    # hashed UUID of its (first) GPU and its tensor-parallel size ("" and 0 in records written before).
    gpu_uuid_sha256: str = ""
    tensor_parallel_size: int = 0

    def as_json(self) -> Dict[str, Any]:
        return {"run_id": self.run_id, "time": self.time, "host_id_sha256": self.host_id_sha256,
                "outcome": self.outcome, **({"file": self.file} if self.file else {}),
                **({"gpu_uuid_sha256": self.gpu_uuid_sha256} if self.gpu_uuid_sha256 else {}),
                **({"tensor_parallel_size": self.tensor_parallel_size} if self.tensor_parallel_size else {})}


@dataclass(frozen=True)
class ServeRecord:
    release: str
    target: str
    capability: str
    image: Optional[str]  # name@sha256:...; None when the server's image is not known
    subject_name: str
    subject_digest: str  # sha256:<hex>
    time: str  # UTC, RFC 3339, `Z`
    run_id: str
    host_id_sha256: str
    toolkit_version: str
    probe_sources_digest: str
    matrix_version: int
    matrix_sha256: str
    server: Mapping[str, Any]
    gpu_evidence: Optional[GpuLink]
    checks: Tuple[Mapping[str, Any], ...]
    figures: Mapping[str, float]
    outcome: ev.Outcome
    reason: str

    @property
    def image_digest(self) -> str:
        return self.subject_digest if self.image else ""

    @property
    def when(self):
        return ev.parse_time(self.time, "created")

    def statement(self) -> Dict[str, Any]:
        predicate = {
            "schema_version": SCHEMA_VERSION, "release": self.release, "target": self.target,
            "capability": self.capability, "image": self.image, "created": self.time, "run_id": self.run_id,
            "host": {"id_sha256": self.host_id_sha256},
            "toolkit": {"version": self.toolkit_version, "probe_sha256": self.probe_sources_digest},
            "matrix": {"version": self.matrix_version, "sha256": self.matrix_sha256}, "server": dict(self.server),
            "gpu_evidence": self.gpu_evidence.as_json() if self.gpu_evidence else None,
            "checks": [dict(c) for c in self.checks], "figures": dict(self.figures), "outcome": self.outcome.value,
            "reason": self.reason}
        return {"_type": mf.STATEMENT_TYPE,
                "subject": [{"name": self.subject_name, "digest": {"sha256": self.subject_digest.split(":", 1)[1]}}],
                "predicateType": SERVE_TYPE, "predicate": predicate}

    def to_bytes(self) -> bytes:
        return canonical_json(self.statement())

    def check(self, check_id: str) -> Optional[Mapping[str, Any]]:
        return next((c for c in self.checks if c.get("id") == check_id), None)

    @property
    def identity(self) -> str:
        return identity(self)


def identity(record: ServeRecord) -> str:
    """One run of the matrix, however its record is serialised: image, probe, host, run id, time."""
    fields = {"kind": "serve-check", "image_digest": record.subject_digest,
              "probe_sources_digest": record.probe_sources_digest, "host_id_sha256": record.host_id_sha256,
              "run_id": record.run_id, "time": ev.normal_time(record.time, "time")}
    return hashlib.sha256(canonical_json(fields)).hexdigest()


# --- the outcome ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ServeOutcome:
    outcome: ev.Outcome
    reason: str


def outcome_of(checks: Sequence[Mapping[str, Any]], required: Sequence[str]) -> ServeOutcome:
    """The Blackwell support RFC's outcome of one matrix run over the checks `required` (an allow-list, whatever a check says
    of itself): one that failed is a product failure; every one present and `pass` is a pass; anything else
    (missing, not-run, warn, a status nobody knows) is infrastructure, never a pass. A check listed twice
    counts at its worst."""
    if not required:
        return ServeOutcome(ev.Outcome.INFRASTRUCTURE, "no serving check is required: nothing to count")
    listed = [c for c in checks if str(c.get("id", "")) in required]
    failed = [c for c in listed if c.get("status") == "fail"]
    if failed:
        return ServeOutcome(ev.Outcome.PRODUCT_FAILURE, _named(failed))
    missing = [i for i in required if not any(c.get("id") == i for c in listed)]
    if missing:
        return ServeOutcome(ev.Outcome.INFRASTRUCTURE, f"serving checks missing: {', '.join(missing)}")
    unpassed = [c for c in listed if c.get("status") != "pass"]
    if unpassed:
        return ServeOutcome(ev.Outcome.INFRASTRUCTURE, _named(unpassed))
    return ServeOutcome(ev.Outcome.PASS, f"{len(required)} required serving checks passed")


def declared_outcome(checks: Sequence[Mapping[str, Any]]) -> ServeOutcome:
    """The outcome serve-check writes: over the checks it marked required (the matrix's baseline list)."""
    return outcome_of(checks, [str(c.get("id")) for c in checks if c.get("required") is True])


def _named(checks: Sequence[Mapping[str, Any]]) -> str:
    return "; ".join(f"{c.get('id')}: {c.get('status')}: {c.get('reason', '')}" for c in checks)


# --- reading -----------------------------------------------------------------------------------------------


def _validator():
    """manifests/serve-check.schema.json, its checks by the manifest schema's own definition (jsonschema)."""
    import jsonschema
    from referencing import Registry, Resource

    from qualify.host import paths

    schema = read_json(paths.HERE.releases / SCHEMA_FILE, SCHEMA_LIMIT, "the serve-check schema", ServeRecordError)
    check = read_json(paths.HERE.schema, SCHEMA_LIMIT, "the manifest schema", ServeRecordError)
    registry = Registry().with_resources([(check["$id"], Resource.from_contents(check))])
    return jsonschema.Draft202012Validator(schema, registry=registry)


def is_serve_record(doc: Any) -> bool:
    return isinstance(doc, dict) and doc.get("_type") == mf.STATEMENT_TYPE and doc.get("predicateType") == SERVE_TYPE


def parse(data: bytes, where: str) -> ServeRecord:
    """A serve-check record: strict JSON, the schema, every field typed, its declared outcome recomputed."""
    doc = strict_json(data, where, ServeRecordError)
    if not is_serve_record(doc):
        raise ServeRecordError(f"{where}: not a serve-check record (in-toto Statement with {SERVE_TYPE})",
                               hint="`python -m qualify serve-check` writes these beside the release's manifest")
    errors = sorted(_validator().iter_errors(doc), key=lambda e: list(e.absolute_path))
    if errors:
        at = "/".join(str(p) for p in errors[0].absolute_path) or "top level"
        raise ServeRecordError(f"{where}: {at}: {errors[0].message[:300]}",
                               hint="hand in the file serve-check wrote, unchanged")
    p = doc["predicate"]
    ids = [c["id"] for c in p["checks"]]
    twice = sorted({i for i in ids if ids.count(i) > 1})
    if twice:
        raise ServeRecordError(f"{where}: check {twice[0]!r} is listed {ids.count(twice[0])} times")
    subject = doc["subject"][0]
    digest = "sha256:" + subject["digest"]["sha256"]
    image = p["image"]
    if image is not None and image != f"{subject['name']}@{digest}":
        raise ServeRecordError(f"{where}: predicate.image {image!r} is not the subject {subject['name']}@{digest}")
    link = p["gpu_evidence"]
    record = ServeRecord(
        release=p["release"], target=p["target"], capability=p["capability"], image=image,
        subject_name=subject["name"], subject_digest=digest, time=ev.normal_time(p["created"], f"{where}: created"),
        run_id=p["run_id"], host_id_sha256=p["host"]["id_sha256"], toolkit_version=p["toolkit"]["version"],
        probe_sources_digest=p["toolkit"]["probe_sha256"], matrix_version=p["matrix"]["version"],
        matrix_sha256=p["matrix"]["sha256"], server=p["server"],
        gpu_evidence=GpuLink(link["run_id"], ev.normal_time(link["time"], f"{where}: gpu_evidence.time"),
                             link["host_id_sha256"], link["outcome"], link.get("file", ""),
                             link.get("gpu_uuid_sha256", ""), link.get("tensor_parallel_size", 0)) if link else None,
        checks=tuple(p["checks"]), figures={str(k): float(v) for k, v in p["figures"].items()},
        outcome=ev.Outcome(p["outcome"]), reason=p["reason"])
    computed = declared_outcome(record.checks)
    if computed.outcome is not record.outcome:
        raise ServeRecordError(f"{where}: declares outcome {record.outcome.value!r}, but its checks give "
                               f"{computed.outcome.value!r} ({computed.reason}); refused",
                               hint="the outcome is computed from the checks, never taken as written")
    return record


def write(path: Path, record: ServeRecord) -> Path:
    return write_atomic(path, record.to_bytes())


def file_name(target: str, when: str, host_hash: str) -> str:
    """`<target>.serve-check.<time>.<host>.json`, beside `<target>.gpu-evidence.<time>.<host>.json`."""
    stamp = when.replace("-", "").replace(":", "")
    return f"{target}.serve-check.{stamp}.{host_hash.split(':', 1)[1][:12]}.json"


SignedServe = ev.Signed[ServeRecord]  # a handed-in serve-check file: the one handed-in type, GPU evidence's too
