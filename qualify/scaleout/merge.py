"""Evidence from many hosts, gathered into the input of `qualify promote`.

Input: probe manifests (in-toto Statements, manifests/manifest.schema.json)
as files, directories of them (searched recursively for *.json), or pod logs
(*.log, the Statement between the markers k8s.py's Job prints). Output: one
canonical JSON file per distinct piece of evidence in a directory, the list
`promote --evidence` takes.

- Same evidence once: identity is the sha256 of the canonical JSON, so a
  copy, a re-indented copy or the same pod log collected twice count once.
- One image per target: every Statement about an image of a target must
  name the same image digest; two digests are refused, naming both files.
- Host evidence (subject `host:<name>`, written by `qualify probe` on a bare
  host) is about a machine, not an image: it is kept, de-duplicated, and not
  held to the image digest.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Iterable, List, Tuple

from qualify.core import manifest
from qualify.core.errors import ConfigError, QualifyError
from qualify.core.fsutil import canonical_json, write_atomic
from qualify.core.readlimit import read_small

MAX_BYTES = 64 << 20  # a manifest is tens of kB; a pod log a few MB at most
HOST_PREFIX = "host:"


class MergeError(ConfigError):
    """Evidence that cannot be merged; the message names the files."""


@dataclass(frozen=True)
class EvidenceFile:
    source: Path
    target: str
    subject: str  # name
    digest: str  # sha256:<hex> of the subject
    identity: str  # sha256:<hex> of the canonical JSON
    data: bytes  # canonical JSON

    @property
    def is_host(self) -> bool:
        return self.subject.startswith(HOST_PREFIX)

    @property
    def file_name(self) -> str:
        return f"{self.target}.{self.identity.split(':', 1)[1][:16]}.json"


@dataclass(frozen=True)
class Merged:
    evidence: Tuple[EvidenceFile, ...]  # distinct, in file-name order
    duplicates: Tuple[Tuple[Path, Path], ...]  # (dropped, kept)


def _read(path: Path) -> bytes:
    return read_small(path, MAX_BYTES, "evidence file", MergeError)


def parse(path: Path) -> EvidenceFile:
    from qualify.qualification.stage import validate  # the manifest schema, checked in one place

    data = _read(path)
    if path.suffix == ".log":
        from qualify.scaleout.k8s import evidence_from_log

        data = evidence_from_log(data.decode("utf-8", "replace"), str(path))
    try:
        doc: Any = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise MergeError(f"{path}: not JSON: {exc}") from None
    if not isinstance(doc, dict) or doc.get("_type") != manifest.STATEMENT_TYPE \
            or doc.get("predicateType") != manifest.PREDICATE_TYPE:
        raise MergeError(f"{path}: not a probe manifest (in-toto Statement v1 with {manifest.PREDICATE_TYPE})")
    try:
        validate(doc)
    except QualifyError as exc:  # the schema's message, with the file named
        raise MergeError(f"{path}: {exc}") from None
    canonical = canonical_json(doc)
    target = manifest.predicate(doc).get("target", {}).get("name")
    if not isinstance(target, str) or not target:
        raise MergeError(f"{path}: predicate.target.name is missing")
    return EvidenceFile(path, target, manifest.subject_name(doc), manifest.subject_digest(doc),
                    "sha256:" + hashlib.sha256(canonical).hexdigest(), canonical)


def collect(inputs: Iterable[Path]) -> List[Path]:
    files: List[Path] = []
    for item in inputs:
        item = Path(item)
        if item.is_dir():
            files.extend(sorted(p for p in item.rglob("*") if p.is_file() and p.suffix in (".json", ".log")))
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
        ev = parse(path)
        if ev.identity in kept:
            duplicates.append((path, kept[ev.identity].source))
            continue
        if not ev.is_host:
            first = image_of.setdefault(ev.target, ev)
            if first.digest != ev.digest:
                raise MergeError(
                    f"evidence for target {ev.target} is about two images: {first.source} ({first.subject}@{first.digest}) "
                    f"and {ev.source} ({ev.subject}@{ev.digest})",
                    hint="merge the evidence of one release at a time; drop the files of the other image")
        kept[ev.identity] = ev
    return Merged(tuple(sorted(kept.values(), key=lambda e: e.file_name)), tuple(duplicates))


def write(merged: Merged, out: Path) -> List[Path]:
    """One file per distinct evidence in `out`; a file there that this merge did not make is refused."""
    out.mkdir(parents=True, exist_ok=True)
    names = {e.file_name for e in merged.evidence}
    strangers = sorted(p.name for p in out.iterdir() if p.name not in names)
    if strangers:
        raise MergeError(f"{out}: holds files this merge did not make: {', '.join(strangers[:5])}",
                         hint="give an empty or new --out directory (promote takes every file in it)")
    return [write_atomic(out / e.file_name, e.data) for e in merged.evidence]
