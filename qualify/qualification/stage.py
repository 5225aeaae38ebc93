"""Qualify a built image: run the probe in a container (container.py), wrap
its predicate into the manifest, validate it against the schema, write it
once, atomically. Building is not this stage's business: the CLI composes.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Optional, TextIO

from qualify.config.targets import REPO_ROOT, TargetsFile
from qualify.core import manifest
from qualify.core.enums import Origin, Verdict
from qualify.core.errors import QualifyError
from qualify.core.fsutil import write_atomic
from qualify.core.report import Reporter
from qualify.host import paths, provenance
from qualify.host.engine import Engine
from qualify.imagebuild import image
from qualify.qualification.container import ProbeRun, probe_sources_digest, probe_target, run_probe

REPORT = Reporter("qualify")


def validate(doc: Dict[str, Any]) -> None:
    import jsonschema

    schema = json.loads(paths.HERE.schema.read_text())
    errors = sorted(jsonschema.Draft202012Validator(schema).iter_errors(doc), key=lambda e: list(e.path))
    if errors:
        first = errors[0]
        where = "/".join(str(p) for p in first.absolute_path)
        raise QualifyError(f"manifest does not match {paths.HERE.schema.name} at /{where}: {first.message}")


def assemble(record: image.BuildRecord, run: ProbeRun) -> Dict[str, Any]:
    predicate = dict(run.predicate)
    predicate["image"] = {"reference": record.image_reference, "digest": record.digest, "id": record.image_id,
                          "tag": record.image_tag, "origin": Origin.BUILT, "labels": record.labels}
    predicate["base"] = {"kind": record.base_kind, "image": record.base_image}
    predicate["build"] = {"engine": record.engine, "builder": record.builder, "seconds": record.build_seconds}
    predicate["toolkit"] = {**predicate.get("toolkit", {}), "source_revision": provenance.revision(),
                            "probe_sha256": run.probe_sha256}  # the digest of what was mounted
    doc = manifest.statement(record.image_reference.split("@", 1)[0], record.digest, predicate)
    validate(doc)
    return doc


@dataclass(frozen=True)
class Qualified:
    """What qualifying gives back: where the manifest is and what it says, parsed once from the bytes written
    (or, for a reused qualification, the bytes read), so the report does not read the file again."""

    path: Path
    manifest: manifest.Manifest
    reused: bool = False


def qualified_path(record: image.BuildRecord) -> Path:
    return paths.HERE.qualified(record.target, record.profile, record.base_kind)


def already_qualified(record: image.BuildRecord) -> Optional[Qualified]:
    path = qualified_path(record)
    if not path.exists():
        return None
    try:
        found = manifest.Manifest.load(path)
    except QualifyError:
        return None  # damaged or from another toolkit: qualify again
    same = (found.digest, found.probe_sha256) == (record.digest, probe_sources_digest())
    return Qualified(path, found, reused=True) if same else None


def qualify(tf: TargetsFile, record: image.BuildRecord, engine: Engine, force: bool = False) -> Qualified:
    target = tf.get(record.target)
    existing = None if force else already_qualified(record)
    if existing:
        REPORT.say(f"{record.image_reference} already qualified by this probe: {existing.path}")
        return existing
    start = time.monotonic()
    emulated = target.platform != engine.native_platform()
    run = run_probe(engine, record.image_reference, probe_target(target, record.profile, emulated))
    doc = assemble(record, run)
    data = manifest.dumps(doc)
    path = write_atomic(qualified_path(record), data)
    write_atomic(paths.HERE.release_input(record.target), data)
    REPORT.say(f"{path} ({time.monotonic() - start:.1f} s)")
    return Qualified(path, manifest.Manifest.from_statement(doc, str(path)))  # what was written, not read back


def summary_line(m: manifest.Manifest) -> str:
    parts = ", ".join(f"{n} {s}" for s, n in sorted(m.status_counts().items()))
    return f"{m.target}: verdict {m.verdict}, support level {m.support_level} ({parts})"


def report(done: Qualified, file: TextIO) -> int:
    """Summary for people; exit 1 when the verdict is fail."""
    print(summary_line(done.manifest), file=file)
    path = done.path
    shown = path.resolve().relative_to(REPO_ROOT) if path.resolve().is_relative_to(REPO_ROOT) else path
    print(f"manifest: {shown}", file=file)
    return 1 if done.manifest.verdict == Verdict.FAIL else 0
