"""Evidence from many hosts, gathered into the input of `qualify promote`.

Input: probe manifests (in-toto Statements, manifests/manifest.schema.json)
as files, directories of them (searched recursively for *.json), or pod logs
(*.log, the Statement between the markers k8s.py's Job prints). Output: one
canonical JSON file per distinct piece of evidence in a directory, the list
`promote --evidence` takes.

- Same evidence once: identity is the run's (release/evidence.py: identity,
  the one promote uses): image, probe, GPU, host, the probe's run id and the
  parsed time, so a copy, a re-serialised copy (`201.0` for `201`, `+00:00`
  for `Z`) or the same pod log collected twice count once. Of two copies of
  one run the signed one is kept (an unsigned copy never displaces it); two
  copies whose checks give different outcomes are refused, naming both.
- Every evidence block of a pod log is read; a log whose blocks disagree on
  target or image digest is refused.
- A file's signature (`.sig`, `.sigstore.json` beside it) travels with it:
  the bytes are written as they came, so `promote` can check who signed them.
- One image per target: every Statement about an image of a target must
  name the same image digest; two digests are refused, naming both files.
- Host evidence (subject `host:<name>`, written by `qualify probe` on a bare
  host) is about a machine, not an image: it is kept, de-duplicated, and not
  held to the image digest.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Tuple

from qualify.core import manifest
from qualify.core.errors import ConfigError, QualifyError, VerificationError
from qualify.core.fsutil import write_atomic
from qualify.core.readlimit import BUNDLE_LIMIT, MANIFEST_LIMIT, SIGNATURE_LIMIT, read_small, strict_json
from qualify.release import evidence as ev

MAX_BYTES = MANIFEST_LIMIT  # a probe manifest, or a pod log of a few of them
BUNDLE_SUFFIX = ".sigstore.json"
HOST_PREFIX = "host:"


class MergeError(ConfigError):
    """Evidence that cannot be merged; the message names the files."""


@dataclass(frozen=True)
class EvidenceFile:
    source: Path
    target: str
    subject: str  # name
    digest: str  # sha256:<hex> of the subject
    identity: str  # the run's (evidence.identity)
    data: bytes  # the bytes as they came (a signature is over these)
    signature: Optional[bytes] = None
    bundle: Optional[bytes] = None
    outcome: str = ""  # what its checks give (evidence.probe_outcome): copies of one run must agree

    @property
    def signed(self) -> bool:
        return self.signature is not None or self.bundle is not None

    @property
    def is_host(self) -> bool:
        return self.subject.startswith(HOST_PREFIX)

    @property
    def file_name(self) -> str:
        return f"{self.target}.{self.identity[:16]}.json"


@dataclass(frozen=True)
class Merged:
    evidence: Tuple[EvidenceFile, ...]  # distinct, in file-name order
    duplicates: Tuple[Tuple[Path, Path], ...]  # (dropped, kept)


def _read(path: Path) -> bytes:
    return read_small(path, MAX_BYTES, "evidence file", MergeError)


def _statement(data: bytes, where: str) -> Dict[str, Any]:
    from qualify.qualification.stage import validate  # the manifest schema, checked in one place

    doc = strict_json(data, where, MergeError)
    if not isinstance(doc, dict) or doc.get("_type") != manifest.STATEMENT_TYPE \
            or doc.get("predicateType") != manifest.PREDICATE_TYPE:
        raise MergeError(f"{where}: not a probe manifest (in-toto Statement v1 with {manifest.PREDICATE_TYPE})")
    try:
        validate(doc)
    except QualifyError as exc:  # the schema's message, with the file named
        raise MergeError(f"{where}: {exc}") from None
    return doc


def _run_identity(m: manifest.Manifest, where: str) -> str:
    """The run's identity as promote computes it (evidence.identity), from the manifest's run facts; a probe
    digest may be missing here (evidence from before it was recorded): promote, not merge, refuses that."""
    pred = m.predicate
    devices = [d for d in (pred.get("gpu") or {}).get("devices") or [] if isinstance(d, dict)]
    device = devices[0] if devices else {}
    host = str((pred.get("host") or {}).get("hostname") or "")
    try:
        return ev.identity(m.digest, m.probe_sha256, ev.hashed(str(device.get("uuid") or "")),
                           ev.hashed(host), str(pred.get("run_id") or ""), pred.get("created"))
    except ev.EvidenceError as exc:
        raise MergeError(f"{where}: {exc.message}") from None


def _evidence(path: Path, data: bytes, where: str, signature=None, bundle=None) -> EvidenceFile:
    try:
        m = manifest.Manifest.from_statement(_statement(data, where), where)
    except VerificationError as exc:
        raise MergeError(exc.message) from None
    outcome = ev.probe_outcome(m.predicate, m.capability).outcome.value
    return EvidenceFile(path, m.target, m.subject_name, m.digest, _run_identity(m, where), data, signature, bundle,
                        outcome)


def parse(path: Path) -> List[EvidenceFile]:
    """The evidence in one file: a probe manifest (with its signature, when one is beside it), or every
    block of a pod log, which must agree on target and image."""
    from qualify.signing import formats

    data = _read(path)
    if path.suffix == ".log":
        from qualify.scaleout.k8s import evidence_blocks

        found = [_evidence(path, block, f"{path} (evidence block {i + 1})", signature)
                 for i, (block, signature) in enumerate(evidence_blocks(data.decode("utf-8", "replace"), str(path)))]
        about = {(e.target, e.digest) for e in found}
        if len(about) > 1:
            raise MergeError(f"{path}: its evidence blocks disagree: " + "; ".join(
                f"block {i + 1} is {e.target} {e.digest}" for i, e in enumerate(found)),
                hint="a pod log is about one target and one image; collect each Job's log on its own")
        return found
    sig_path, bundle_path = formats.signature_path(path), formats.bundle_path(path)
    signature = read_small(sig_path, SIGNATURE_LIMIT, "signature", MergeError) if sig_path.exists() else None
    bundle = read_small(bundle_path, BUNDLE_LIMIT, "bundle", MergeError) if bundle_path.exists() else None
    return [_evidence(path, data, str(path), signature, bundle)]


def collect(inputs: Iterable[Path]) -> List[Path]:
    files: List[Path] = []
    for item in inputs:
        item = Path(item)
        if item.is_dir():  # a bundle (`.sigstore.json`) travels with its file; it is no evidence of its own
            files.extend(sorted(p for p in item.rglob("*") if p.is_file() and p.suffix in (".json", ".log")
                                and not p.name.endswith(BUNDLE_SUFFIX)))
        elif item.is_file():
            files.append(item)
        else:
            raise MergeError(f"{item}: no such file or directory")
    if not files:
        raise MergeError("no evidence files found (*.json manifests or *.log pod logs)")
    return files


def merge(inputs: Iterable[Path]) -> Merged:
    kept: Dict[str, EvidenceFile] = {}
    duplicates: List[Tuple[Path, Path]] = []
    image_of: Dict[str, EvidenceFile] = {}  # target -> first image evidence seen
    for path in collect(inputs):
        for found in parse(path):
            if found.identity in kept:
                before = kept[found.identity]
                if before.outcome != found.outcome:
                    raise MergeError(f"{before.source} and {found.source} are the same run (image, probe, GPU, host, "
                                     f"run id, time) with different results ({before.outcome} and {found.outcome}): "
                                     "one was changed", hint="keep the copy the GPU host signed; drop the other")
                if found.signed and not before.signed:  # the signed copy is kept, never the unsigned one
                    kept[found.identity] = found
                    duplicates.append((before.source, path))
                else:
                    duplicates.append((path, before.source))
                continue
            if not found.is_host:
                first = image_of.setdefault(found.target, found)
                if first.digest != found.digest:
                    raise MergeError(
                        f"evidence for target {found.target} is about two images: {first.source} "
                        f"({first.subject}@{first.digest}) and {found.source} ({found.subject}@{found.digest})",
                        hint="merge the evidence of one release at a time; drop the files of the other image")
            kept[found.identity] = found
    return Merged(tuple(sorted(kept.values(), key=lambda e: e.file_name)), tuple(duplicates))


def write(merged: Merged, out: Path) -> List[Path]:
    """One file per distinct evidence in `out`, with its signature beside it; a file there that this merge did
    not make is refused."""
    from qualify.signing import formats

    out.mkdir(parents=True, exist_ok=True)
    names = {n for e in merged.evidence for n in (e.file_name, e.file_name + formats.SIGNATURE_SUFFIX,
                                                    e.file_name + formats.BUNDLE_SUFFIX)}
    strangers = sorted(p.name for p in out.iterdir() if p.name not in names)
    if strangers:
        raise MergeError(f"{out}: holds files this merge did not make: {', '.join(strangers[:5])}",
                         hint="give an empty or new --out directory (promote takes every file in it)")
    written = []
    for e in merged.evidence:
        path = write_atomic(out / e.file_name, e.data)
        for data, extra in ((e.signature, formats.signature_path(path)), (e.bundle, formats.bundle_path(path))):
            if data is not None:
                write_atomic(extra, data)
        written.append(path)
    return written
