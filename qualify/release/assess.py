"""Step 4 of a release: which qualified manifests are released and which are withheld, and why.
Each image is checked by the digest the manifest names, never through a movable tag."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple, Union

from qualify.core import manifest as mf
from qualify.core.errors import EngineError, ExternalCommandError, RegistryError, ReleaseError, VerificationError
from qualify.core.readlimit import MANIFEST_LIMIT, read_small, strict_json
from qualify.host import paths
from qualify.release.model import Candidate, ReleasedTarget, ReleaseOptions, Withheld
from qualify.release.verify import ImageResolver, match_digest, parse_manifest, target_name

Progress = Callable[[str], None]


def collect(source: Path) -> List[Candidate]:
    paths = sorted(Path(source).glob("*.json"))
    if not paths:
        raise ReleaseError(f"no manifests in {source}", hint="qualify the targets first: nox -s qualify-<target>")
    return [Candidate(p.stem, p, read_small(p, MANIFEST_LIMIT, "manifest", ReleaseError)) for p in paths]


def _policy_reason(stmt: Dict[str, Any], target: str, min_level: str) -> Optional[str]:
    pred = mf.predicate(stmt)
    named = target_name(stmt)
    if named and named != target:
        return f"the manifest is for target {named!r}, not {target!r}"
    if isinstance(pred.get("image"), dict) and pred["image"].get("origin") == "external":
        return ("it qualifies an image built elsewhere (origin external): a release holds our own builds only "
                "(keep external qualifications apart: build/external/)")
    failing = [str(c.get("id")) for c in mf.failing_checks(stmt)]
    if failing:
        return f"failing checks: {', '.join(failing)}"
    if pred.get("verdict") == "fail":
        return "verdict is fail"
    problems = mf.value_problems(stmt)
    if problems:
        return "damaged manifest: " + "; ".join(problems)
    level = pred.get("support_level")
    if mf.LEVEL_RANK[level] < mf.LEVEL_RANK[min_level]:
        return f"support level {level} is below --min-level {min_level}"
    return None


def _recorded_build_digest(repo: Path, stmt: Mapping[str, Any], target: str) -> Optional[Tuple[str, str]]:
    """(record file, digest) of the build this checkout last recorded for the manifest's target/profile/base."""
    labels = (mf.predicate(stmt).get("image") or {}).get("labels") or {}
    profile = labels.get(paths.LABEL_PROFILE)
    base_kind = labels.get(paths.LABEL_BASE_KIND)
    if not (isinstance(profile, str) and isinstance(base_kind, str)):
        return None
    record = paths.Checkout(repo).build_record(target, profile, base_kind)
    if not record.is_file():
        return None
    doc = strict_json(read_small(record, MANIFEST_LIMIT, "build record", ReleaseError), str(record), ReleaseError)
    reference = doc.get("image_reference") if isinstance(doc, dict) else None
    if not isinstance(reference, str) or "@" not in reference:
        raise ReleaseError(f"{record}: build record has no image_reference by digest", hint="rebuild the target")
    return str(record.relative_to(repo)), reference.split("@", 1)[1]


def assess(c: Candidate, min_level: str, resolve: ImageResolver, repo: Optional[Path] = None) -> Union[ReleasedTarget, Withheld]:
    try:
        stmt = parse_manifest(c.data, str(c.path))
        mf.subject_digest(stmt)
    except VerificationError as exc:
        return Withheld(c.target, exc.message)
    reason = _policy_reason(stmt, c.target, min_level)
    if reason:
        return Withheld(c.target, reason)
    pred = mf.predicate(stmt)
    reference = (pred.get("image") or {}).get("reference")
    if not isinstance(reference, str) or "@sha256:" not in reference:
        return Withheld(c.target, "the manifest records no image reference by digest")
    recorded = _recorded_build_digest(repo, stmt, c.target) if repo is not None else None
    if recorded and recorded[1] != reference.split("@", 1)[1]:
        return Withheld(c.target, f"image digest check failed: the build recorded {recorded[1]} ({recorded[0]}), "
                        f"the manifest is for {reference.split('@', 1)[1]}; re-qualify the target")
    # By digest, never by a tag another checkout can move.
    try:
        served = resolve(reference)
    except (ExternalCommandError, EngineError, RegistryError) as exc:
        raise ReleaseError(f"cannot check image {reference} of target {c.target}: {exc.message}",
                           hint="start the registry the image was pushed to, or release from the host that built it"
                           ) from None
    if served is None:
        return Withheld(c.target, f"image digest check failed: the registry no longer serves {reference}")
    try:
        match_digest(stmt, reference, served)
    except VerificationError as exc:
        return Withheld(c.target, f"{exc.message} (the registry serves {served} for {reference})")
    m = mf.Manifest.from_statement(stmt, str(c.path))
    return ReleasedTarget(c.target, reference, served, hashlib.sha256(c.data).hexdigest(), m.support_level,
                          m.verdict, m.source_revision, m.capability, m.platform, m.profile)


def assess_all(candidates: List[Candidate], opts: ReleaseOptions, resolve: ImageResolver,
               progress: Progress) -> Tuple[List[ReleasedTarget], List[Withheld]]:
    entries, withheld = [], []
    for c in candidates:
        result = assess(c, opts.min_level, resolve, opts.repo)
        if isinstance(result, Withheld):
            withheld.append(result)
            progress(f"  withheld {c.target}: {result.reason}")
        else:
            entries.append(result)
            progress(f"  {c.target}: {result.image_digest}, level {result.support_level}")
    why = "; ".join(f"{w.target}: {w.reason}" for w in withheld)
    if not entries:
        raise ReleaseError(f"nothing to release: every target is withheld ({why})")
    if withheld and not opts.allow_partial:
        raise ReleaseError(f"{len(withheld)} of {len(candidates)} target(s) withheld ({why}); "
                           "the release is not what was asked for, so nothing was signed, written or tagged",
                           hint="fix the withheld targets, or pass --allow-partial to release the others")
    return entries, withheld
