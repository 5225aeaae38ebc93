"""Step 4 of a release: which qualified manifests are released and which are withheld, and why.
Each image is checked by the digest the manifest names, never through a movable tag."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Dict, List, Optional, Tuple, Union

from qualify.core import manifest as mf
from qualify.core.enums import Verdict
from qualify.core.errors import EngineError, ExternalCommandError, RegistryError, ReleaseError, VerificationError
from qualify.core.readlimit import MANIFEST_LIMIT, read_small
from qualify.core.report import Progress
from qualify.host import paths
from qualify.imagebuild import image
from qualify.release import policy
from qualify.release.model import Candidate, ReleasedTarget, ReleaseOptions, Withheld
from qualify.release.verify import ImageResolver, match_digest


def collect(source: Path) -> List[Candidate]:
    """Every manifest in `source`, read once (bounded) and parsed; each target once."""
    paths = sorted(Path(source).glob("*.json"))
    if not paths:
        raise ReleaseError(f"no manifests in {source}", hint="qualify the targets first: nox -s qualify-<target>")
    found = [Candidate.of(p, read_small(p, MANIFEST_LIMIT, "manifest", ReleaseError)) for p in paths]
    files: Dict[str, List[str]] = {}
    for c in found:
        files.setdefault(c.target, []).append(c.path.name)
    twice = {t: names for t, names in files.items() if len(names) > 1}
    if twice:
        raise ReleaseError(f"{source}: more than one manifest for a target (" + "; ".join(
            f"{t}: {', '.join(names)}" for t, names in sorted(twice.items())) + ")",
            hint="keep one manifest per target: `qualify TARGET` writes build/manifests/<target>.json")
    return found


def _policy_reason(m: mf.Manifest, min_level: str) -> Optional[str]:
    if m.external:
        return ("it qualifies an image built elsewhere (origin external): a release holds our own builds only "
                "(keep external qualifications apart: build/external/)")
    if m.failing:
        return f"failing checks: {', '.join(m.failing)}"
    if m.verdict == Verdict.FAIL:
        return "verdict is fail"
    if m.problems:
        return "damaged manifest: " + "; ".join(m.problems)
    if mf.LEVEL_RANK[m.support_level] > mf.LEVEL_RANK["experimental"]:
        return (f"support level {m.support_level} without the promotion rule: a release ships at most experimental, "
                "and baseline comes only from `qualify promote` (the signed rule's consecutive passes on the "
                "target's GPU); re-qualify the image with this toolkit")
    if mf.LEVEL_RANK[m.support_level] < mf.LEVEL_RANK[min_level]:
        return f"support level {m.support_level} is below --min-level {min_level}"
    return None


def _recorded_build_digest(repo: Path, m: mf.Manifest) -> Optional[Tuple[str, str]]:
    """(record file, digest) of the build this checkout last recorded for the manifest's target/profile/base."""
    if not (m.profile and m.base_kind):
        return None
    path = paths.Checkout(repo).build_record(m.target, m.profile, m.base_kind)
    if not path.is_file():
        return None
    return str(path.relative_to(repo)), image.read_record(path, ReleaseError).digest


def assess(c: Candidate, min_level: str, resolve: ImageResolver, repo: Optional[Path] = None) -> Union[ReleasedTarget, Withheld]:
    if c.problem:
        return Withheld(c.target, c.problem)
    try:
        m = c.manifest or mf.Manifest.parse(c.data, str(c.path))
    except VerificationError as exc:
        return Withheld(c.target, exc.message)
    reason = _policy_reason(m, min_level)
    if reason:
        return Withheld(c.target, reason)
    reference = m.reference
    if "@sha256:" not in reference:
        return Withheld(c.target, "the manifest records no image reference by digest")
    recorded = _recorded_build_digest(repo, m) if repo is not None else None
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
        match_digest(m, reference, served)
    except VerificationError as exc:
        return Withheld(c.target, f"{exc.message} (the registry serves {served} for {reference})")
    return ReleasedTarget(c.target, reference, served, hashlib.sha256(c.data).hexdigest(), m.support_level,
                          m.verdict, m.source_revision, m.capability, m.platform, m.profile,
                          policy.recorded_intended(m.predicate) or "")


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
            progress(f"  {c.target}: {result.digest}, level {result.support_level}")
    why = "; ".join(f"{w.target}: {w.reason}" for w in withheld)
    if not entries:
        raise ReleaseError(f"nothing to release: every target is withheld ({why})")
    if withheld and not opts.allow_partial:
        raise ReleaseError(f"{len(withheld)} of {len(candidates)} target(s) withheld ({why}); "
                           "the release is not what was asked for, so nothing was signed, written or tagged",
                           hint="fix the withheld targets, or pass --allow-partial to release the others")
    return entries, withheld
