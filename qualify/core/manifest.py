"""The release manifest: an in-toto Statement v1 whose subject is the image.

Layout (the JSON Schema is manifests/manifest.schema.json):

    {
      "_type": "https://in-toto.io/Statement/v1",
      "subject": [{"name": "<image repository>", "digest": {"sha256": "<hex>"}}],
      "predicateType": PREDICATE_TYPE,
      "predicate": {
        "schema_version": 1,
        "target": {...}, "image": {...}, "base": {...}, "toolkit": {...},
        "checks": [{"id", "title", "status", "required", "reason", "evidence"}],
        "verdict": "pass" | "warn" | "fail" | "incomplete",
        "support_level": "baseline" | "optimized" | "experimental" | "unsupported" | "unverified",
        ...
      }
    }

The file is canonical JSON (fsutil.canonical_json), so its bytes, and so its
signature, depend only on its content.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, Iterable, List, Mapping, Optional

from qualify.core.enums import CheckStatus, SupportLevel, Verdict
from qualify.core.errors import VerificationError
from qualify.core.fsutil import canonical_json, write_atomic
from qualify.core.readlimit import MANIFEST_LIMIT, read_small, strict_json

STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "https://blackwell-qualify.dev/qualification/v1"
SCHEMA_VERSION = 1

# The host side (release, deploy, CLI) reads these two; the enums are the source.
LEVELS = SupportLevel.values()
# Order for --min-level comparisons: higher is stronger evidence.
LEVEL_RANK = {level.value: level.rank for level in sorted(SupportLevel, key=lambda lv: lv.rank)}


def verdict(checks: Iterable[Mapping[str, Any]]) -> Verdict:
    """fail if a required check failed; incomplete if a required check did not run
    (not-run never counts as a pass); warn if anything warned; else pass."""
    checks = list(checks)
    if any(c["status"] == CheckStatus.FAIL and c.get("required", True) for c in checks):
        return Verdict.FAIL
    if any(c["status"] == CheckStatus.NOT_RUN and c.get("required", True) for c in checks):
        return Verdict.INCOMPLETE
    if any(c["status"] in (CheckStatus.WARN, CheckStatus.FAIL) for c in checks):
        return Verdict.WARN
    return Verdict.PASS


def support_level(verdict_: str, intended: str, gpu_evidence_on_target: bool, recognised: bool = True) -> SupportLevel:
    """A level above `unverified` needs GPU evidence on the target's own architecture."""
    if verdict_ == Verdict.FAIL or not recognised:
        return SupportLevel.UNSUPPORTED
    if not gpu_evidence_on_target or verdict_ == Verdict.INCOMPLETE:
        return SupportLevel.UNVERIFIED
    return SupportLevel(intended)


def statement(image_name: str, image_digest: str, predicate: Mapping[str, Any]) -> Dict[str, Any]:
    if not image_digest.startswith("sha256:"):
        raise ValueError(f"image digest must start with sha256: ({image_digest!r})")
    return {
        "_type": STATEMENT_TYPE,
        "subject": [{"name": image_name, "digest": {"sha256": image_digest.split(":", 1)[1]}}],
        "predicateType": PREDICATE_TYPE,
        "predicate": dict(predicate),
    }


def dumps(stmt: Mapping[str, Any]) -> bytes:
    return canonical_json(stmt)


def write(path: Path, stmt: Mapping[str, Any]) -> Path:
    return write_atomic(path, dumps(stmt))


def parse(data: bytes, where: str) -> Dict[str, Any]:
    """The statement in `data` (strict JSON: no duplicate keys, bounded nesting), checked to be ours."""
    stmt = strict_json(data, where, VerificationError)
    kind = (stmt.get("_type"), stmt.get("predicateType")) if isinstance(stmt, dict) else None
    if kind != (STATEMENT_TYPE, PREDICATE_TYPE):
        raise VerificationError(f"{where}: not a qualification manifest (in-toto Statement v1 with {PREDICATE_TYPE})")
    if not isinstance(stmt.get("predicate"), dict):
        raise VerificationError(f"{where}: manifest has no predicate")
    return stmt


def read(path: Path) -> bytes:
    """A manifest file's bytes: a regular file, bounded in size."""
    return read_small(path, MANIFEST_LIMIT, "manifest", VerificationError)


def load(path: Path) -> Dict[str, Any]:
    return parse(read(path), str(path))


def value_problems(stmt: Mapping[str, Any]) -> List[str]:
    """What in the predicate is not one of the known values: a verdict, a support level, check
    statuses, and a verdict that the checks do not give. Damage is never read as a better verdict."""
    pred = predicate(stmt)
    problems = []
    checks = pred.get("checks")
    if not isinstance(checks, list) or not all(isinstance(c, dict) for c in checks):
        return ["checks is not a list of objects"]
    for c in checks:
        if c.get("status") not in CheckStatus.values():
            problems.append(f"check {c.get('id')!r} has unknown status {c.get('status')!r} "
                            f"(known: {', '.join(CheckStatus.values())})")
        if not isinstance(c.get("required", True), bool):
            problems.append(f"check {c.get('id')!r}: required is {c.get('required')!r}, not true/false")
    if pred.get("verdict") not in Verdict.values():
        problems.append(f"unknown verdict {pred.get('verdict')!r} (known: {', '.join(Verdict.values())})")
    elif not problems and verdict(checks) != pred["verdict"]:
        problems.append(f"verdict {pred['verdict']!r} is not what its checks give ({verdict(checks)!r})")
    if pred.get("support_level") not in LEVELS:
        problems.append(f"unknown support level {pred.get('support_level')!r} (known: {', '.join(LEVELS)})")
    return problems


def subject_digest(stmt: Mapping[str, Any]) -> str:
    """`sha256:<hex>` of the image the manifest is about."""
    try:
        return "sha256:" + stmt["subject"][0]["digest"]["sha256"]
    except (KeyError, IndexError, TypeError):
        raise VerificationError("manifest has no subject digest") from None


def subject_name(stmt: Mapping[str, Any]) -> str:
    return stmt["subject"][0]["name"]


def predicate(stmt: Mapping[str, Any]) -> Dict[str, Any]:
    return stmt["predicate"]


def failing_checks(stmt: Mapping[str, Any]) -> List[Mapping[str, Any]]:
    checks = predicate(stmt).get("checks", [])
    return [c for c in checks if isinstance(c, dict) and c.get("status") == CheckStatus.FAIL] if isinstance(checks, list) else []


def check(stmt: Mapping[str, Any], check_id: str) -> Optional[Mapping[str, Any]]:
    for c in predicate(stmt).get("checks", []):
        if c.get("id") == check_id:
            return c
    return None
