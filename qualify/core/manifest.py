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

import re
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Dict, Iterable, List, Mapping, Optional, Tuple

from qualify.core.enums import CPU_CAPABILITY, CheckStatus, Origin, SupportLevel, Verdict
from qualify.core.errors import VerificationError
from qualify.core.fsutil import canonical_json, write_atomic
from qualify.core.readlimit import MANIFEST_LIMIT, read_small, strict_json

STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "https://blackwell-qualify.dev/qualification/v1"
SCHEMA_VERSION = 1

# The one rule for a target's name (targets file, manifests, release folders, publication records):
# it becomes an image repository, a file and a folder name. config/targets.py imports it.
TARGET_NAME_MAX = 32
TARGET_NAME = re.compile(r"[a-z0-9][a-z0-9-]{0,31}")  # 1 + at most TARGET_NAME_MAX - 1
DIGEST = re.compile(r"sha256:[0-9a-f]{64}")

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
    """What one probe run can claim. A level above `unverified` needs GPU evidence on the target's own
    architecture, and one run is at most `experimental`: baseline (and optimized) come only from the promotion
    rule over many runs (`qualify promote`, the Blackwell support RFC), never from the run that qualified the image."""
    if verdict_ == Verdict.FAIL or not recognised:
        return SupportLevel.UNSUPPORTED
    if not gpu_evidence_on_target or verdict_ == Verdict.INCOMPLETE:
        return SupportLevel.UNVERIFIED
    SupportLevel(intended)  # an intended level this toolkit does not know is an error, as before
    return SupportLevel.EXPERIMENTAL


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


def with_subject_name(data: bytes, name: str, where: str) -> bytes:
    """The Statement in `data` with its one subject named `name` (the same digest, the same predicate), as
    canonical JSON. Publish signs the released manifest renamed to the repository it publishes to; renamed back
    to the released name it gives the released manifest's own bytes (which are canonical JSON): that is how the
    release statement binds the two (release/records.py: ReleaseStatement)."""
    stmt = strict_json(data, where, VerificationError)
    subjects = stmt.get("subject") if isinstance(stmt, dict) else None
    if not isinstance(subjects, list) or len(subjects) != 1 or not isinstance(subjects[0], dict):
        raise VerificationError(f"{where}: not a Statement about one subject")
    return canonical_json({**stmt, "subject": [{**subjects[0], "name": name}]})


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


def subject_digest(stmt: Mapping[str, Any], where: str = "") -> str:
    """`sha256:<hex>` of the image an in-toto Statement (a manifest, or any attestation) is about."""
    try:
        return "sha256:" + stmt["subject"][0]["digest"]["sha256"]
    except (KeyError, IndexError, TypeError):
        raise VerificationError(f"{where}: the Statement has no subject digest" if where
                                else "manifest has no subject digest") from None


def subject_name(stmt: Mapping[str, Any]) -> str:
    return stmt["subject"][0]["name"]


def predicate(stmt: Mapping[str, Any]) -> Dict[str, Any]:
    return stmt["predicate"]


# --- the typed manifest -------------------------------------------------------------


@dataclass(frozen=True)
class Check:
    id: str
    status: str  # as written; `known` says whether it is one of CheckStatus
    required: bool
    reason: str

    @property
    def known(self) -> bool:
        return self.status in CheckStatus.values()


@dataclass(frozen=True)
class Manifest:
    """A qualification manifest as every stage reads it: built once from the bytes that were read (and,
    where a signature is involved, verified: release/folder.py's VerifiedTarget holds one), so no stage
    digs `predicate[...]` apart by hand.

    Values are kept as written; `problems` lists what is not one of the known values (a verdict, a level,
    a check status, a verdict its checks do not give), so damage is never read as a better verdict.
    """

    target: str
    capability: str
    platform: str
    profile: str  # "" when the manifest does not record it
    base_kind: str  # "" when not recorded ("unknown" for an external image)
    subject_name: str
    digest: str  # sha256:<hex>, the Statement's subject
    reference: str  # predicate.image.reference, "" when absent
    verdict: str
    support_level: str
    checks: Tuple[Check, ...]
    probe_sha256: str
    source_revision: str
    problems: Tuple[str, ...]
    statement: Mapping[str, Any] = field(compare=False, repr=False)  # the parsed Statement (show, diff, promote)
    origin: str = Origin.BUILT.value  # manifests from before issue 34 are our builds
    base_image: str = ""
    labels: Mapping[str, str] = field(default_factory=dict, compare=False, repr=False)  # the image's labels
    packages: Mapping[str, str] = field(default_factory=dict, compare=False, repr=False)  # versions.packages

    @classmethod
    def parse(cls, data: bytes, where: str) -> Manifest:
        return cls.from_statement(parse(data, where), where)

    @classmethod
    def load(cls, path: Path) -> Manifest:
        """The manifest file at `path`, read once (bounded) and parsed."""
        return cls.parse(read(path), str(path))

    @classmethod
    def from_statement(cls, stmt: Mapping[str, Any], where: str) -> Manifest:
        pred = predicate(stmt)
        target = _mapping(pred.get("target"), f"{where}: predicate.target")
        name = target.get("name")
        if not isinstance(name, str) or not TARGET_NAME.fullmatch(name):
            raise VerificationError(f"{where}: predicate.target.name {name!r} is not a target name "
                                    f"(lower-case letters, digits and '-', at most {TARGET_NAME_MAX})")
        digest = subject_digest(stmt)
        if not DIGEST.fullmatch(digest):
            raise VerificationError(f"{where}: the subject digest {digest[:80]!r} is not sha256:<64 hex>")
        image = _mapping(pred.get("image") or {}, f"{where}: predicate.image")
        recorded = image.get("digest")
        if recorded is not None and recorded != digest:
            raise VerificationError(f"image digest check failed: {where} is inconsistent: subject {digest}, "
                                    f"predicate image digest {recorded}")
        origin = image.get("origin") or Origin.BUILT.value
        if origin not in Origin.values():
            raise VerificationError(f"{where}: predicate.image.origin {origin!r} is not one of "
                                    f"{', '.join(Origin.values())}")
        toolkit = _mapping(pred.get("toolkit") or {}, f"{where}: predicate.toolkit")
        base = _mapping(pred.get("base") or {}, f"{where}: predicate.base")
        versions = _mapping(pred.get("versions") or {}, f"{where}: predicate.versions")
        subject = stmt["subject"][0]
        raw_checks = pred.get("checks")
        checks = tuple(Check(str(c.get("id")), str(c.get("status")), c.get("required", True) is not False,
                             str(c.get("reason") or ""))
                       for c in raw_checks if isinstance(c, dict)) if isinstance(raw_checks, list) else ()
        return cls(
            target=name, capability=_text(target.get("capability")), platform=_text(target.get("platform")),
            profile=_text(target.get("profile")), base_kind=_text(base.get("kind")),
            subject_name=_text(subject.get("name") if isinstance(subject, dict) else ""), digest=digest,
            reference=_text(image.get("reference")), verdict=_text(pred.get("verdict")),
            support_level=_text(pred.get("support_level")), checks=checks,
            probe_sha256=_text(toolkit.get("probe_sha256")), source_revision=_text(toolkit.get("source_revision")),
            problems=tuple(value_problems(stmt)), statement=stmt, origin=str(origin),
            base_image=_text(base.get("image")),
            labels=_strings(image.get("labels") or {}, f"{where}: predicate.image.labels"),
            packages=_strings(versions.get("packages") or {}, f"{where}: predicate.versions.packages"))

    @property
    def predicate(self) -> Mapping[str, Any]:
        """The predicate as written, for the reports that show all of it (show, diff, compare's census rows)."""
        return MappingProxyType(self.statement["predicate"])

    @property
    def subject(self) -> str:
        """`name@sha256:<hex>`: the image the manifest is about."""
        return f"{self.subject_name}@{self.digest}"

    @property
    def external(self) -> bool:
        return self.origin == Origin.EXTERNAL

    @property
    def is_cpu(self) -> bool:
        """A cpu target's manifest (no GPU: `cpu` where a GPU target's has its capability)."""
        return self.capability == CPU_CAPABILITY

    @property
    def failing(self) -> Tuple[str, ...]:
        return tuple(c.id for c in self.checks if c.status == CheckStatus.FAIL)

    def status_counts(self) -> Dict[str, int]:
        """How many checks have each status."""
        counts: Dict[str, int] = {}
        for c in self.checks:
            counts[c.status] = counts.get(c.status, 0) + 1
        return counts

    @property
    def passes(self) -> bool:
        """What `verify --require-pass` accepts: known values only, a verdict its checks give, none failing."""
        return not self.problems and self.verdict != Verdict.FAIL and not self.failing and bool(self.verdict)

    def verdict_refusal(self) -> str:
        """Why `--require-pass` refuses it ("" when it does not)."""
        if self.problems:
            return "; ".join(self.problems)
        if not self.passes:
            detail = f"; failing checks: {', '.join(self.failing)}" if self.failing else ""
            return f"verdict is {self.verdict or 'missing'}{detail}"
        return ""


def _mapping(value: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(value, dict):
        raise VerificationError(f"{where} is not an object")
    return value


def _strings(value: Any, where: str) -> Mapping[str, str]:
    """A name -> text map (labels, package versions), read-only."""
    value = _mapping(value, where)
    return MappingProxyType({str(k): _text(v) for k, v in value.items()})


def _text(value: Any) -> str:
    return "" if value is None else str(value)


@dataclass(frozen=True)
class RuntimeFacts:
    """predicate.runtime (the probe's runtime_env): who the image runs as, the CUDA it carries, and the
    libcuda its loader finds first. `recorded` is False for a manifest from before the probe wrote it.
    `compat_unknown`: the first libcuda is CUDA's forward-compatibility library but its version is unknown
    (null): it cannot be compared with the host driver, which is no reason to skip the check."""

    recorded: bool
    user_uid: Optional[int]
    user_name: str
    cuda: str  # "13.0"; "" when not recorded
    libcuda_first: str  # the libcuda.so.1 the loader finds first in the image; "" when none
    compat_libcuda: str  # its version when that one is CUDA's forward-compatibility library; "" otherwise
    compat_unknown: bool = False

    @classmethod
    def of(cls, m: Manifest) -> RuntimeFacts:
        runtime = m.predicate.get("runtime")
        if not isinstance(runtime, dict):
            return cls(False, None, "", "", "", "")
        where = f"{m.target}: predicate.runtime"
        user = _mapping(runtime.get("user") or {}, f"{where}.user")
        cuda = _mapping(runtime.get("cuda") or {}, f"{where}.cuda")
        first = _mapping(_mapping(runtime.get("libcuda") or {}, f"{where}.libcuda").get("first") or {},
                         f"{where}.libcuda.first")
        uid = user.get("uid")
        compat = first.get("compat") is True
        version = _text(first.get("version")) if compat else ""
        return cls(True, uid if isinstance(uid, int) and not isinstance(uid, bool) else None,
                   _text(user.get("name")), _text(cuda.get("version")), _text(first.get("path")),
                   version, compat and not version)
