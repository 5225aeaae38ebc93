"""Promotion by evidence (seed 000): a target becomes baseline after its required GPU checks pass
in N consecutive runs on its own architecture without a product failure.

Infrastructure outcomes (not-run, timeouts, no GPU) neither count nor reset
the run; a product failure resets it, and demotes a promoted target. The
same record counts once however often it is handed in. Accepted records are
kept under manifests/<tag>/evidence/, so a promotion is re-runnable from the
release folder alone; the updated manifest and a promotion record are
written atomically and signed with the release key.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence

from qualify.config.targets import TargetsFile
from qualify.core import manifest as mf
from qualify.core.errors import ConfigError
from qualify.core.fsutil import canonical_json, write_atomic
from qualify.release import evidence as ev

EVIDENCE_DIR = "evidence"


@dataclass(frozen=True)
class Standing:
    level: str
    consecutive_passes: int
    required: int
    counted: Sequence[ev.Evidence]  # every distinct record, oldest first
    note: str


def check_binding(record: ev.Evidence, stmt: Mapping[str, Any], capability: str, where: str) -> None:
    """Evidence about another image, GPU architecture or probe is refused, naming which."""
    subject = mf.subject_digest(stmt)
    if record.image_digest != subject:
        raise ev.EvidenceError(f"{where}: the evidence is for image digest {record.image_digest}, not the released "
                               f"{record.target} image {subject}", hint="hand in evidence from a deploy of this release")
    if record.gpu.capability != capability or record.capability != capability:
        raise ev.EvidenceError(f"{where}: the evidence was taken on {record.gpu.name} with capability "
                               f"{record.gpu.capability}, not the target's capability {capability}",
                               hint="only a GPU of the target's own architecture proves it (seed 000)")
    probe = (mf.predicate(stmt).get("toolkit") or {}).get("probe_sha256")
    if probe and record.probe_sources_digest != probe:
        raise ev.EvidenceError(f"{where}: the evidence comes from a probe whose sources differ: "
                               f"{record.probe_sources_digest}, the release's probe is {probe}",
                               hint="deploy from the release's own checkout (git checkout TAG) so the probe matches")


def standing(records: Iterable[ev.Evidence], required: int, intended: str, released_level: str) -> Standing:
    unique = {r.digest: r for r in records}
    ordered = sorted(unique.values(), key=lambda r: (r.time, r.digest))
    streak, passed, notes = 0, False, []
    for r in ordered:
        if r.outcome is ev.Outcome.PASS:
            streak, passed = streak + 1, True
        elif r.outcome is ev.Outcome.PRODUCT_FAILURE:
            if streak >= required:
                notes.append(f"demoted by a product failure at {r.time}")
            streak = 0
    can_be_baseline = mf.LEVEL_RANK.get(intended, 0) >= mf.LEVEL_RANK["baseline"]
    if streak >= required and can_be_baseline:
        level = "baseline"
    elif passed:
        level = "experimental"
        if streak >= required:
            notes.append(f"the target's intended level is {intended}")
    else:
        level = released_level
    return Standing(level, streak, required, tuple(ordered), "; ".join(notes))


def _stored(folder: Path) -> List[ev.Evidence]:
    return [ev.load(p) for p in sorted(folder.glob("*.json"))] if folder.is_dir() else []


def _record(tag: str, target: str, s: Standing, released_level: str, manifest_sha256: str) -> Dict[str, Any]:
    return {"schema": "https://blackwell-qualify.dev/promotion/v1", "release": tag, "target": target,
            "released_level": released_level, "level": s.level, "consecutive_passes": s.consecutive_passes,
            "required_consecutive_passes": s.required, "note": s.note, "manifest_sha256": manifest_sha256,
            "evidence": [_summary(r) for r in s.counted]}


def _summary(r: ev.Evidence) -> Dict[str, Any]:
    return {"digest": r.digest, "file": f"{EVIDENCE_DIR}/{r.target}/{r.digest.split(':', 1)[1]}.json",
            "time": r.time, "outcome": r.outcome.value, "reason": r.reason, "gpu": r.gpu.name,
            "driver": r.gpu.driver, "host_id_sha256": r.host_id_sha256, "figures": dict(r.figures)}


@dataclass(frozen=True)
class Promoted:
    target: str
    standing: Standing
    manifest: Path
    record: Path
    new: int  # records this run added


def promote(folder: Path, tag: str, files: Sequence[Path], tf: TargetsFile, sign: Optional[Any] = None) -> List[Promoted]:
    """Apply seed 000's rule to the release in `folder` for every target the evidence names.

    `sign(path)` signs a written file (the release key); None leaves files unsigned (tests of the rule).
    """
    loaded = [(Path(f), ev.load_any(Path(f), tag)) for f in files]
    by_target: Dict[str, List[ev.Evidence]] = {}
    for path, record in loaded:
        manifest = folder / f"{record.target}.json"
        if not manifest.is_file():
            raise ev.EvidenceError(f"{path}: the evidence is for target {record.target!r}, which release {tag} does not "
                                   f"have ({manifest} not found)")
        check_binding(record, mf.load(manifest), str(tf.get(record.target).capability), str(path))
        by_target.setdefault(record.target, []).append(record)
    return [_promote_target(folder, tag, target, records, tf, sign) for target, records in sorted(by_target.items())]


def _promote_target(folder: Path, tag: str, target: str, new: List[ev.Evidence], tf: TargetsFile,
                    sign: Optional[Any]) -> Promoted:
    manifest_path = folder / f"{target}.json"
    stmt = mf.load(manifest_path)
    pred = mf.predicate(stmt)
    store = folder / EVIDENCE_DIR / target
    stored = _stored(store)
    for r in stored:  # what is kept was checked when it came; check again against this manifest
        check_binding(r, stmt, str(tf.get(target).capability), str(store))
    released = (pred.get("promotion") or {}).get("released_level") or pred.get("support_level") or "unverified"
    known = {r.digest for r in stored}
    added = [r for r in {r.digest: r for r in new}.values() if r.digest not in known]
    for r in added:
        write_atomic(store / f"{r.digest.split(':', 1)[1]}.json", r.to_bytes())
    s = standing(stored + added, tf.promotion_passes, tf.get(target).support_level, released)
    pred["support_level"] = s.level
    pred["promotion"] = {"released_level": released, "level": s.level, "consecutive_passes": s.consecutive_passes,
                         "required_consecutive_passes": s.required, "note": s.note,
                         "evidence": [_summary(r) for r in s.counted]}
    mf.write(manifest_path, stmt)
    import hashlib

    record_path = folder / f"{target}.promotion.json"
    write_atomic(record_path, canonical_json(_record(tag, target, s, released,
                                                     hashlib.sha256(manifest_path.read_bytes()).hexdigest())))
    if sign is not None:
        sign(manifest_path)
        sign(record_path)
    return Promoted(target, s, manifest_path, record_path, len(added))


def release_signer(key_file: Path):
    """Signs with the release key (cosign when installed, else the built-in signer), as a release does."""
    from qualify.signing.signer import key_signer

    if not key_file.is_file():
        raise ConfigError(f"{key_file}: release key not found", hint="pass --key with the key the release was signed with")
    signer, _ = key_signer("auto", key_file)

    def sign(path: Path) -> None:
        signer.sign_file(path, path.with_name(path.name + ".sig"), path.with_name(path.name + ".bundle"))

    return sign
