"""Qualify a built image: run the probe in a container (container.py), wrap
its predicate into the manifest, validate it against the schema, write it
once, atomically. Building is not this stage's business: the CLI composes.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Optional, TextIO

from qualify.config.imageref import ImageRef
from qualify.config.targets import REPO_ROOT, TargetsFile
from qualify.core import killpoint, manifest
from qualify.core.enums import Origin, Verdict
from qualify.core.errors import ConfigError, QualifyError
from qualify.core.fsutil import write_atomic
from qualify.core.readlimit import SCHEMA_LIMIT, read_json
from qualify.core.report import Reporter
from qualify.host import paths, provenance
from qualify.host.engine import Engine
from qualify.imagebuild import image
from qualify.qualification.container import ProbeRun, probe_sources_digest, probe_target, run_probe

REPORT = Reporter("qualify")


def validate(doc: Dict[str, Any]) -> None:
    import jsonschema

    schema = read_json(paths.HERE.schema, SCHEMA_LIMIT, "the manifest schema", ConfigError)
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
    doc = manifest.statement(ImageRef.parse(record.image_reference).tagged, record.digest, predicate)
    validate(doc)
    return doc


@dataclass(frozen=True)
class Qualified:
    """What qualifying gives back: where the manifest is and what it says, parsed once from the bytes written
    (or, for a reused qualification, the bytes read), so the report does not read the file again.
    `recovered`: what a reused qualification found unfinished and finished (the release input's hand-off)."""

    path: Path
    manifest: manifest.Manifest
    reused: bool = False
    recovered: str = ""


def qualified_path(record: image.BuildRecord) -> Path:
    return paths.HERE.qualified(record.target, record.profile, record.base_kind)


def already_qualified(record: image.BuildRecord) -> Optional[Qualified]:
    """This build's qualification by this probe, read once: the manifest and the bytes it was parsed from."""
    path = qualified_path(record)
    if not path.exists():
        return None
    try:
        data = manifest.read(path)
        found = manifest.Manifest.parse(data, str(path))
    except QualifyError:
        return None  # damaged or from another toolkit: qualify again
    same = (found.digest, found.probe_sha256) == (record.digest, probe_sources_digest())
    return Qualified(path, found, reused=True, recovered=hand_over(record.target, data)) if same else None


def hand_over(target: str, data: bytes) -> str:
    """Make `build/manifests/<target>.json` (what `release` reads) hold these manifest bytes. The qualification
    is written first and handed over second, so a qualify killed between the two leaves its manifest and the
    release input of an earlier run: a re-run finds it here and finishes the hand-off. '' when it was done
    already, else what it found and did."""
    dest = paths.HERE.release_input(target)
    try:
        held = manifest.read(dest) if dest.is_file() or dest.is_symlink() else None
    except QualifyError:
        held = b""  # not a manifest file we could read: replaced, as a fresh qualification would
    if held == data:
        return ""
    write_atomic(dest, data)
    if held is None:
        return f"{_shown(dest)} was missing (a qualify killed before it handed over): written from this qualification"
    try:
        before = f"image {manifest.Manifest.parse(held, str(dest)).digest}"
    except QualifyError:
        before = "a file that is no manifest"
    return (f"{_shown(dest)} held {before}, not this qualification (a qualify killed before it handed over, or "
            "another profile or base qualified since): it holds this one now")


def _shown(path: Path) -> str:
    resolved = path.resolve()
    return str(resolved.relative_to(REPO_ROOT)) if resolved.is_relative_to(REPO_ROOT) else str(path)


def qualify(tf: TargetsFile, record: image.BuildRecord, engine: Engine, force: bool = False) -> Qualified:
    target = tf.get(record.target)
    existing = None if force else already_qualified(record)
    if existing:
        REPORT.say(f"{record.image_reference} already qualified by this probe: {existing.path}")
        if existing.recovered:
            REPORT.say(f"recovered: {existing.recovered}")
        return existing
    start = time.monotonic()
    emulated = target.platform != engine.native_platform()
    run = run_probe(engine, record.image_reference, probe_target(target, record.profile, emulated))
    doc = assemble(record, run)
    data = manifest.dumps(doc)
    path = write_atomic(qualified_path(record), data)
    killpoint.reached("qualify:written")  # the interruption tests: killed before the hand-off
    hand_over(record.target, data)
    REPORT.say(f"{path} ({time.monotonic() - start:.1f} s)")
    return Qualified(path, manifest.Manifest.from_statement(doc, str(path)))  # what was written, not read back


def summary_line(m: manifest.Manifest) -> str:
    parts = ", ".join(f"{n} {s}" for s, n in sorted(m.status_counts().items()))
    return f"{m.target}: verdict {m.verdict}, support level {m.support_level} ({parts})"


def report(done: Qualified, file: TextIO) -> int:
    """Summary for people; exit 1 when the verdict is fail."""
    print(summary_line(done.manifest), file=file)
    print(f"manifest: {_shown(done.path)}", file=file)
    return 1 if done.manifest.verdict == Verdict.FAIL else 0
