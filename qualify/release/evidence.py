"""GPU evidence records: what a Blackwell host proved about one released image.

The deploy writes one record per run of the on-host GPU checks, beside the
release's manifest, and signs it with the host's key; `qualify promote` reads
them. A record is self-contained and bound to the image digest, the probe's
sources digest, the GPU and the probe's run id, so a release engineer can tell
what it is about without the host. Host identity and GPU UUID are hashed:
evidence travels, serial numbers need not.

What a record *declares* is never taken as written: its outcome is recomputed
from its checks with an allow-list (`outcome_of`), its time is parsed, its
checks are validated against the manifest schema's definition of a check, and
its identity (`identity`) is semantic, so the same run counts once however it
is serialised. Who may vouch for a record is the release engineer's list of
enrolled hosts (records.EnrolledHosts), checked by `signed_by`.
"""

from __future__ import annotations

import datetime as dt
import enum
import hashlib
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Dict, Generic, Mapping, Optional, Protocol, Sequence, Tuple, Type, TypeVar

from qualify.core.errors import ConfigError, QualifyError
from qualify.core.fsutil import canonical_json, write_atomic
from qualify.core.readlimit import BUNDLE_LIMIT, SCHEMA_LIMIT, SIGNATURE_LIMIT, read_json, read_small, strict_json
from qualify.probe.gpu import REQUIRED_GPU_CHECKS
from qualify.trust.gpuconfig import SINGLE_GPU, Configuration, required_checks


class _Identified(Protocol):
    @property
    def identity(self) -> str: ...


R = TypeVar("R", bound=_Identified)  # the record a handed-in signed file holds: it says which run it is

SCHEMA = "https://blackwell-qualify.dev/gpu-evidence/v1"
NO_GPU = "none"  # the GPU name and capability of a run that saw none
MAX_BYTES = 4 << 20  # a record is a few kB; refuse anything that is not one
DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
CLOCK_SKEW = dt.timedelta(minutes=10)  # a record from the future beyond this is refused
# RFC 3339 date-time (section 5.6), any offset, optional fraction; parsed, then written as UTC `...Z`.
_RFC3339 = re.compile(r"(\d{4})-(\d{2})-(\d{2})[Tt](\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,9}))?([Zz]|[+-]\d{2}:\d{2})")


class Outcome(str, enum.Enum):
    """The Blackwell support RFC: infrastructure outcomes (not-run, timeouts, no GPU) are kept apart from product failures."""

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
    time: str  # UTC, RFC 3339, seconds, `Z` (normalised when read)
    outcome: Outcome
    reason: str
    checks: Tuple[Mapping[str, Any], ...] = ()
    figures: Mapping[str, float] = field(default_factory=dict)
    run_id: str = ""  # the probe's id of the run ("" from a probe older than run ids)
    configuration: Configuration = SINGLE_GPU  # written only for several GPUs: a 1-GPU record is as before

    def as_dict(self) -> Dict[str, Any]:
        doc = asdict(self)
        doc["outcome"] = self.outcome.value
        doc["checks"] = [dict(c) for c in self.checks]
        doc["figures"] = dict(self.figures)
        if self.configuration.multi_gpu:
            doc["configuration"] = self.configuration.as_json()
        else:
            del doc["configuration"]
        return {"schema": SCHEMA, **doc}

    def to_bytes(self) -> bytes:
        return canonical_json(self.as_dict())

    def with_figures(self, **figures: float) -> Evidence:
        merged = {**self.figures, **{k: v for k, v in figures.items() if v is not None}}
        return Evidence(**{**self.__dict__, "figures": merged})

    @property
    def when(self) -> dt.datetime:
        return parse_time(self.time, "time")

    @property
    def identity(self) -> str:
        return identity(self.image_digest, self.probe_sources_digest, self.gpu.uuid_sha256, self.host_id_sha256,
                        self.run_id, self.time)


def identity(image_digest: str, probe_sources_digest: str, gpu_uuid_sha256: str, host_id_sha256: str, run_id: str,
             time: str) -> str:
    """A run's identity, the same however its record is serialised and whoever vouches for it: image, probe,
    GPU, the machine (its hashed host id, as the run recorded it: never an enrolled name, which a hosts.json
    edit can change), the probe's run id and the time (parsed, written as UTC). The one identity function of
    promote and merge."""
    fields = {"image_digest": image_digest, "probe_sources_digest": probe_sources_digest,
              "gpu_uuid_sha256": gpu_uuid_sha256, "host_id_sha256": host_id_sha256, "run_id": run_id,
              "time": normal_time(time, "time")}
    return hashlib.sha256(canonical_json(fields)).hexdigest()


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


def parse_time(text: Any, where: str) -> dt.datetime:
    """An RFC 3339 time (any offset, with or without a fraction), as an aware UTC datetime; else EvidenceError.
    Never compared as text: `1970-...`, `0` or a leading space cannot sort a record anywhere."""
    m = _RFC3339.fullmatch(text) if isinstance(text, str) else None
    if not m:
        raise EvidenceError(f"{where}: {str(text)[:60]!r} is not an RFC 3339 time (e.g. 2026-12-01T09:15:00Z)",
                            hint="hand in the file the probe or start.sh wrote, unchanged")
    year, month, day, hour, minute, second, _, offset = m.groups()
    try:
        when = dt.datetime(int(year), int(month), int(day), int(hour), int(minute), int(second),
                           tzinfo=dt.timezone.utc)
    except ValueError:
        raise EvidenceError(f"{where}: {text!r} is not a real date and time") from None
    if offset not in ("Z", "z"):
        sign = 1 if offset[0] == "+" else -1
        when -= sign * dt.timedelta(hours=int(offset[1:3]), minutes=int(offset[4:6]))
    return when


def normal_time(text: Any, where: str) -> str:
    return parse_time(text, where).strftime("%Y-%m-%dT%H:%M:%SZ")


def file_name(target: str, when: str, host_hash: str) -> str:
    """`<target>.gpu-evidence.<time>.<host>.json`: one file per run, sorted by time."""
    stamp = when.replace("-", "").replace(":", "")
    return f"{target}.gpu-evidence.{stamp}.{host_hash.split(':', 1)[1][:12]}.json"


def write(path: Path, evidence: Evidence) -> Path:
    return write_atomic(path, evidence.to_bytes())


# --- the outcome, computed here ---------------------------------------------------------------


@dataclass(frozen=True)
class ProbeOutcome:
    outcome: Outcome
    reason: str
    checks: Sequence[Mapping[str, Any]]


def _named(checks: Sequence[Mapping[str, Any]]) -> str:
    return "; ".join(f"{c.get('id')}: {c.get('status')}: {c.get('reason', '')}" for c in checks)


def outcome_of(checks: Sequence[Mapping[str, Any]], seen_capability: str, capability: str,
               required: Sequence[str] = REQUIRED_GPU_CHECKS) -> ProbeOutcome:
    """The Blackwell support RFC's outcome of one run, by an allow-list over the GPU checks required (probe/gpu.py:
    REQUIRED_GPU_CHECKS, and the NCCL check for a run on several GPUs: `required_checks`; promote passes the
    release's signed list), whatever the record says about `required`:

    - a required check that failed: a product failure;
    - every required check present and `pass`, on a GPU of the target's capability: a pass;
    - anything else (missing, not-run, warn, a timeout, a status nobody knows, another GPU): infrastructure,
      which proves nothing either way and is never a pass.
    """
    gpu_checks = [c for c in checks if str(c.get("id", "")).startswith("gpu.")]
    listed = [c for c in checks if str(c.get("id", "")) in required]
    # A check listed twice: every entry counts (the worst decides), never just the last one.
    failed = [c for c in listed if c.get("status") == "fail"]
    if failed:
        return ProbeOutcome(Outcome.PRODUCT_FAILURE, _named(failed), gpu_checks)
    missing = [i for i in required if not any(str(c.get("id")) == i for c in listed)]
    if missing:
        return ProbeOutcome(Outcome.INFRASTRUCTURE, f"required GPU checks missing: {', '.join(missing)}", gpu_checks)
    unpassed = [c for c in listed if c.get("status") != "pass"]
    if unpassed:
        return ProbeOutcome(Outcome.INFRASTRUCTURE, _named(unpassed), gpu_checks)
    if seen_capability != capability:
        return ProbeOutcome(Outcome.INFRASTRUCTURE,
                            f"the probe saw capability {seen_capability or 'none'}, not {capability}", gpu_checks)
    return ProbeOutcome(Outcome.PASS, f"{len(required)} required GPU checks passed", gpu_checks)


def probe_outcome(predicate: Mapping[str, Any], capability: str) -> ProbeOutcome:
    """The outcome of a probe run's predicate (the GPU checks run here, or a probe manifest), for the
    configuration it ran on."""
    devices = [d for d in (predicate.get("gpu") or {}).get("devices") or [] if isinstance(d, dict)]
    seen = str((devices[0] if devices else {}).get("compute_cap", ""))
    checks = [c for c in predicate.get("checks") or [] if isinstance(c, dict)]
    return outcome_of(checks, seen, capability, required_checks(Configuration.of_predicate(predicate)))


# --- reading ---------------------------------------------------------------------------------------


def _check_schema():
    """The manifest schema's definition of a check, as a validator (jsonschema; host side only)."""
    import jsonschema

    from qualify.host import paths

    schema = read_json(paths.HERE.schema, SCHEMA_LIMIT, "the manifest schema", ConfigError)
    return jsonschema.Draft202012Validator({"$defs": schema["$defs"], "type": "array",
                                            "items": {"$ref": "#/$defs/check"}})


def _valid_checks(checks: Any, where: str) -> Tuple[Mapping[str, Any], ...]:
    if not isinstance(checks, list):
        raise EvidenceError(f"{where}: field 'checks' must be a list of checks")
    errors = sorted(_check_schema().iter_errors(checks), key=lambda e: list(e.path))
    if errors:
        at = "/".join(str(p) for p in errors[0].absolute_path)
        raise EvidenceError(f"{where}: checks/{at}: {errors[0].message}",
                            hint="hand in the file start.sh or the probe wrote, unchanged")
    ids = [c["id"] for c in checks]
    twice = sorted({i for i in ids if ids.count(i) > 1})
    if twice:
        raise EvidenceError(f"{where}: check {twice[0]!r} is listed {ids.count(twice[0])} times; a run reports each "
                            "check once", hint="hand in the file start.sh or the probe wrote, unchanged")
    return tuple(checks)


def _field(doc: Mapping[str, Any], key: str, where: str, kind: type = str) -> Any:
    value = doc.get(key)
    if not isinstance(value, kind) or isinstance(value, bool) != (kind is bool) or (kind is str and not value):
        raise EvidenceError(f"{where}: field {key!r} is missing or not a {kind.__name__}",
                            hint="hand in the file start.sh wrote beside the manifest, unchanged")
    return value


def _digest_field(doc: Mapping[str, Any], key: str, where: str) -> str:
    value = _field(doc, key, where)
    if not DIGEST.fullmatch(value):
        raise EvidenceError(f"{where}: field {key!r} is not a sha256:<64 hex> digest: {value[:80]!r}")
    return value


_RECORD_KEYS = {"schema", "release", "target", "capability", "image_reference", "image_digest",
                "probe_sources_digest", "gpu", "host_id_sha256", "time", "outcome", "reason", "checks", "figures",
                "run_id", "configuration"}


def parse(data: bytes, where: str) -> Evidence:
    """A start.sh evidence record: strict JSON, every field checked, its outcome recomputed from its checks."""
    doc = strict_json(data, where, EvidenceError)
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        raise EvidenceError(f"{where}: not a GPU evidence record (schema {SCHEMA})",
                            hint="start.sh writes these as <target>.gpu-evidence.*.json beside the manifest")
    unknown = sorted(set(doc) - _RECORD_KEYS)
    if unknown:
        raise EvidenceError(f"{where}: has fields this toolkit does not know: {', '.join(unknown[:5])}",
                            hint="hand in the file start.sh wrote, unchanged")
    gpu = _field(doc, "gpu", where, dict)
    try:
        declared = Outcome(_field(doc, "outcome", where))
    except ValueError:
        raise EvidenceError(f"{where}: field 'outcome' is {doc.get('outcome')!r}; one of "
                            f"{', '.join(o.value for o in Outcome)} expected") from None
    figures = doc.get("figures") or {}
    if not isinstance(figures, dict) or not all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                                for v in figures.values()):
        raise EvidenceError(f"{where}: field 'figures' must map names to numbers")
    run_id = doc.get("run_id", "")
    if not isinstance(run_id, str):
        raise EvidenceError(f"{where}: field 'run_id' is not a string")
    record = Evidence(
        release=_field(doc, "release", where), target=_field(doc, "target", where),
        capability=_field(doc, "capability", where), image_reference=_field(doc, "image_reference", where),
        image_digest=_digest_field(doc, "image_digest", where),
        probe_sources_digest=_digest_field(doc, "probe_sources_digest", where),
        gpu=Gpu(name=_field(gpu, "name", f"{where}: gpu"), capability=_field(gpu, "capability", f"{where}: gpu"),
                uuid_sha256=_field(gpu, "uuid_sha256", f"{where}: gpu"), driver=str(gpu.get("driver") or "")),
        host_id_sha256=_digest_field(doc, "host_id_sha256", where),
        time=normal_time(doc.get("time"), f"{where}: field 'time'"), outcome=declared,
        reason=str(doc.get("reason") or ""), checks=_valid_checks(doc.get("checks"), where),
        figures={str(k): float(v) for k, v in figures.items()}, run_id=run_id,
        configuration=Configuration.parse(doc["configuration"], where, EvidenceError) if "configuration" in doc
        else SINGLE_GPU)
    return _agreed(record, outcome_of(record.checks, record.gpu.capability, record.capability,
                                      required_checks(record.configuration)), where)


def _agreed(record: Evidence, computed: ProbeOutcome, where: str) -> Evidence:
    if computed.outcome != record.outcome:
        raise EvidenceError(f"{where}: declares outcome {record.outcome.value!r}, but its checks give "
                            f"{computed.outcome.value!r} ({computed.reason}); refused",
                            hint="the outcome is computed from the checks, never taken as written")
    return Evidence(**{**record.__dict__, "reason": computed.reason})


def load(path: Path) -> Evidence:
    path = Path(path)
    return parse(_read(path), str(path))


def _read(path: Path) -> bytes:
    return read_small(path, MAX_BYTES, "evidence file", EvidenceError)


def sign(path: Path, signer) -> Path:
    """The host's own signature over the record (`signer`: a signing.signer.Signer of the host's key):
    PATH.sig and PATH.sigstore.json beside it."""
    from qualify.signing.signer import write_signature

    return write_signature(signer, path).signature


def host_signer(key_file: Path, password: Optional[bytes] = None):
    """The signer of a GPU host's own key (the built-in one: a GPU host has no cosign to rely on)."""
    from qualify.signing.signer import key_signer

    return key_signer("builtin", key_file, password)


# --- evidence from a probe Statement (qualify gpu-evidence, a Kubernetes Job, scripts/gpu-evidence.sh) -------


def from_statement(stmt: Mapping[str, Any], release: str, where: str) -> Evidence:
    """A probe manifest with GPU checks, as an evidence record: the same rule (probe_outcome) decides
    pass, product failure or infrastructure; the probe's own sources digest binds it to its probe."""
    from qualify.core import manifest as mf
    from qualify.qualification.stage import validate

    try:
        validate(dict(stmt))
    except QualifyError as exc:
        raise EvidenceError(f"{where}: {exc.message}", hint="hand in the manifest the probe wrote, unchanged") from None
    try:
        m = mf.Manifest.from_statement(stmt, where)
    except QualifyError as exc:
        raise EvidenceError(exc.message, hint="hand in the manifest the probe wrote, unchanged") from None
    pred, capability, probe = m.predicate, m.capability, m.probe_sha256
    if not DIGEST.fullmatch(probe):
        raise EvidenceError(f"{where}: the probe manifest does not name its probe's sources digest "
                            "(predicate.toolkit.probe_sha256)", hint="re-run the GPU checks with this toolkit's probe")
    devices = [d for d in (pred.get("gpu") or {}).get("devices") or [] if isinstance(d, dict)]
    device = devices[0] if devices else {}
    outcome = probe_outcome(pred, capability)
    host = str((pred.get("host") or {}).get("hostname") or "")
    run_id = pred.get("run_id", "")
    return Evidence(
        release=release, target=m.target, capability=capability, image_reference=m.subject, image_digest=m.digest,
        probe_sources_digest=probe,
        gpu=Gpu(name=str(device.get("name") or NO_GPU), capability=str(device.get("compute_cap") or NO_GPU),
                uuid_sha256=hashed(str(device.get("uuid") or "")), driver=str(device.get("driver_version") or "")),
        host_id_sha256=hashed(host), time=normal_time(pred.get("created"), f"{where}: predicate.created"),
        outcome=outcome.outcome, reason=outcome.reason, checks=tuple(outcome.checks),
        run_id=run_id if isinstance(run_id, str) else "", configuration=Configuration.of_predicate(pred))


def from_bytes(data: bytes, release: str, where: str) -> Evidence:
    """An evidence record (start.sh) or a probe manifest with GPU checks (qualify gpu-evidence, merge)."""
    from qualify.core import manifest as mf

    doc = strict_json(data, where, EvidenceError)
    if isinstance(doc, dict) and doc.get("_type") == mf.STATEMENT_TYPE:
        try:
            return from_statement(mf.parse(data, where), release, where)
        except (KeyError, IndexError, TypeError, AttributeError):
            raise EvidenceError(f"{where}: not a probe manifest with a subject and GPU checks") from None
    return parse(data, where)


def load_any(path: Path, release: str) -> Evidence:
    path = Path(path)
    return from_bytes(_read(path), release, str(path))


# --- who vouches for a record ------------------------------------------------------------------------


@dataclass(frozen=True)
class Signed(Generic[R]):
    """One signed file as it was handed in (GPU evidence, a serve-check record): its bytes (read once), their
    signature and bundle, the record parsed from those bytes, and the enrolled host whose signature verified
    ("" when none did). The record's own `identity` says which run it is."""

    source: Path
    data: bytes = field(repr=False)
    signature: Optional[bytes] = field(repr=False)
    bundle: Optional[bytes] = field(repr=False)
    record: R
    host: str
    why_unsigned: str = ""

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()

    @property
    def identity(self) -> str:
        return self.record.identity


def signed_by(hosts, data: bytes, signature: Optional[bytes], bundle: Optional[bytes]) -> Tuple[str, str]:
    """(the enrolled host whose signature verifies `data`, "") or ("", why none does). A signature that an
    enrolled key makes, with a bundle beside it that does not hold (another file's bundle, another key), is an
    EvidenceError naming the bundle: the cause is the bundle, not who signed."""
    from qualify.trust.verify import TrustedKey, check_bundle, verify_blob

    if signature is None and bundle is None:
        return "", "it has no signature (.sig or .sigstore.json beside it)"
    tried = []
    for host in (hosts.hosts if hosts else ()):
        if host.keyless:
            if bundle is not None and _keyless_ok(host, data, bundle):
                return host.name, ""
            continue
        key = TrustedKey.from_bytes(host.key_pem.encode("ascii"), f"enrolled host {host.name}")
        tried.append(host.name)
        try:
            if signature is not None:
                verify_blob(key, data, signature, None, "evidence")
            else:
                check_bundle(key, data, bundle, "evidence")
        except QualifyError:
            continue
        if signature is not None and bundle is not None:
            try:
                check_bundle(key, data, bundle, "evidence bundle")
            except QualifyError as exc:
                raise EvidenceError(f"its .sig verifies with enrolled host {host.name}'s key, but its bundle does not "
                                    f"hold: {exc.message}", hint="hand in the evidence with its own .sigstore.json "
                                    "(or without one), as the host signed it") from None
        return host.name, ""
    return "", (f"its signature is not from an enrolled host (tried {', '.join(tried)})" if tried
                else "no host is enrolled (python -m qualify hosts add NAME --key HOST.pub)")


def _keyless_ok(host, data: bytes, bundle: bytes) -> bool:
    """A keyless (Fulcio certificate) signature of the enrolled identity; needs cosign, as `verify` does."""
    import tempfile

    from qualify.host import cmd
    from qualify.signing import cosign, formats

    if not cmd.which("cosign"):
        return False
    with tempfile.TemporaryDirectory(prefix="qualify-evidence-") as tmp:
        blob, b = Path(tmp) / "evidence.json", Path(tmp) / "evidence.json.sigstore.json"
        blob.write_bytes(data)
        b.write_bytes(bundle)
        try:
            cosign.verify_blob(cosign.VerifyBlobRequest(blob=blob, signature=None, bundle=b,
                                                        bundle_is_sigstore=formats.is_sigstore_bundle(bundle),
                                                        identity=host.identity, issuer=host.issuer))
        except QualifyError:
            return False
    return True


def read_signed(path: Path, release: str, hosts, allow_unsigned: bool) -> Signed[Evidence]:
    """An evidence file and its signature, each read once; refused unless an enrolled host signed it or
    --allow-unsigned-evidence was given."""
    path = Path(path)
    data = _read(path)
    return handed_in(path, data, from_bytes(data, release, str(path)), hosts, allow_unsigned, EvidenceError,
                     "evidence", "gpu-evidence --sign-key")


def handed_in(path: Path, data: bytes, record: R, hosts, allow_unsigned: bool, error: Type[QualifyError],
              what: str, sign_with: str) -> Signed[R]:
    """`record`, parsed from `data` (the bytes of `path`, read once), with the signature and bundle beside it,
    each read once, and the enrolled host whose signature verifies those bytes; refused unless one does or
    unsigned evidence is allowed. The one signature path of every file promote is handed."""
    from qualify.signing import formats

    sig_path, bundle_path = formats.signature_path(path), formats.bundle_path(path)
    signature = read_small(sig_path, SIGNATURE_LIMIT, f"{what} signature", error) if sig_path.exists() else None
    bundle = read_small(bundle_path, BUNDLE_LIMIT, f"{what} bundle", error) if bundle_path.exists() else None
    try:
        host, why = signed_by(hosts, data, signature, bundle)
    except EvidenceError as exc:
        raise error(f"{path}: {exc.message}", hint=exc.hint) from None
    if not host and not allow_unsigned:
        raise error(f"{path}: not {what} from an enrolled host: {why}",
                    hint=f"sign it on the GPU host (EVIDENCE_SIGNING_KEY in .env, {sign_with}) and enroll that "
                    "host's key (python -m qualify hosts add NAME --key HOST.pub); or, loudly, promote "
                    "--allow-unsigned-evidence")
    return Signed(path, data, signature, bundle, record, host, why)
