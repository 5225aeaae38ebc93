"""Which verified release the deploy trusts for a target, and which image it names.

Releases come from release/folder.py, read and verified once; nothing here opens a release file. The
newest is chosen by the release order (semver, then signed sequence; release/order.py), never by a
folder name or a file time, and is never a pre-release (`v1.2.0-rc.1` deploys only when RELEASE_TAG names
it). A folder that does not verify, or that holds a release's files but no release.json, is never skipped
silently: with no RELEASE_TAG it stops the deploy, since passing over it could mean deploying an older
release; with one it is reported.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Callable, Optional

from qualify.config.imageref import ImageRef, ImageRefError, parse_pinned
from qualify.core import manifest as mf
from qualify.core.errors import QualifyError
from qualify.deploy.errors import DeployError, NoReleaseError
from qualify.host import cmd
from qualify.trust.folder import list_releases, read_release
from qualify.trust.order import is_prerelease, tag_problem
from qualify.trust.verify import KeyAnchor, VerifiedRelease


def fetch_release(manifests_dir: Path, tag: str, github_repo: str = "") -> Optional[Path]:
    """The release's files from its GitHub release (`gh release download`) into manifests/<tag>/, when this
    checkout lacks them; None when there is no gh. They are verified afterwards exactly as checked-out ones."""
    gh = shutil.which("gh")
    if gh is None:
        return None
    if tag_problem(tag):
        raise DeployError(f"RELEASE_TAG: {tag_problem(tag)}", hint="use the release's version tag, e.g. v1.2.0")
    dest = manifests_dir / tag
    if dest.exists() or dest.is_symlink():
        return None  # a folder is here: it is what the release has, never overwritten
    manifests_dir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{tag}.download-", dir=manifests_dir))  # not a release until whole
    argv = [gh, "release", "download", tag, "--dir", str(tmp)] + (["--repo", github_repo] if github_repo else [])
    proc = cmd.ask(argv, timeout=600)
    if proc.returncode != 0:
        shutil.rmtree(tmp, ignore_errors=True)
        said = (proc.stderr or proc.stdout).strip()[-300:]
        raise DeployError(f"gh release download {tag} failed: {said}",
                          hint="check `gh auth status` and RELEASE_GITHUB_REPO, or check the release tag out")
    tmp.rename(dest)
    return dest


def choose_release(manifests_dir: Path, target: str, tag: str, anchor: KeyAnchor,
                   fetch: Optional[callable] = None, warn: Callable[[str], None] = lambda m: None) -> VerifiedRelease:
    """The verified release to deploy `target` from: RELEASE_TAG's, else the newest that has the target.

    NoReleaseError only when no release folder here has anything for the target (and none failed to
    verify): only then may the registry's attestation, or --allow-unqualified, stand in."""
    manifests_dir = Path(manifests_dir)
    if tag:
        return _pinned(manifests_dir, target, tag, anchor, fetch, warn)
    listing = list_releases(manifests_dir, anchor, target)
    if listing.broken:
        name, why = listing.broken[0]
        more = f" (and {len(listing.broken) - 1} more)" if len(listing.broken) > 1 else ""
        raise DeployError(f"release folder {manifests_dir / name} does not verify{more}: {why}",
                          hint="restore it from its tag or remove it; or set RELEASE_TAG to the release to deploy "
                          "(a release that does not verify is never passed over silently: it may be the newest)")
    if not listing.releases:
        raise NoReleaseError(f"no release under {manifests_dir} has a manifest for target {target}",
                             hint="update this checkout (git pull --tags), or point MANIFESTS_DIR at a release")
    final = [r for r in listing.releases if not is_prerelease(r.tag)]
    if not final:
        raise DeployError(f"the releases under {manifests_dir} with target {target} are pre-releases only "
                          f"({', '.join(listing.tags())}); a pre-release is deployed only when named",
                          hint=f"set RELEASE_TAG={listing.releases[-1].tag} to deploy it")
    if final[-1] is not listing.releases[-1]:
        warn(f"{listing.releases[-1].tag} is a pre-release: deploying the newest release, {final[-1].tag} "
             "(RELEASE_TAG names a pre-release to deploy it)")
    return final[-1]


def _pinned(manifests_dir: Path, target: str, tag: str, anchor: KeyAnchor, fetch, warn) -> VerifiedRelease:
    problem = tag_problem(tag)
    if problem:
        raise DeployError(f"RELEASE_TAG: {problem}", hint="set RELEASE_TAG to a release's tag, e.g. v1.2.0")
    folder = manifests_dir / tag
    if not folder.exists() and not folder.is_symlink() and fetch is not None:
        fetch(tag)
    if not folder.exists() and not folder.is_symlink():
        try:
            known = list_releases(manifests_dir, anchor, target).tags()
        except QualifyError:
            known = []
        raise DeployError(f"RELEASE_TAG={tag}: there is no release folder {folder}; releases here with target "
                          f"{target}: {', '.join(known) or 'none'}",
                          hint="set RELEASE_TAG to one of those, or leave it empty for the newest")
    release = read_release(folder, anchor)
    try:
        others = list_releases(manifests_dir, anchor).broken
    except QualifyError:
        others = ()
    for name, why in others:
        if name != tag:
            warn(f"release folder {manifests_dir / name} does not verify (RELEASE_TAG={tag} is deployed): {why}")
    if not release.has(target):
        raise DeployError(f"release {tag} has no manifest for target {target} "
                          f"(it has: {', '.join(t.target for t in release.targets) or 'none'})",
                          hint="set RELEASE_TAG in .env to a release with this target, or leave it empty for the newest")
    return release


def check_for_gpu(m: mf.Manifest, target: str, capability: str, platform: str) -> None:
    """The verified manifest must be for this GPU's target: name, capability and platform, all three."""
    said, wanted = (m.target, m.capability, m.platform), (target, capability, platform)
    if said != wanted:
        raise DeployError(f"the verified manifest is for {m.target} (capability {m.capability}, {m.platform}), not "
                          f"this GPU's {target} (capability {capability}, {platform})",
                          hint="restore the release folder: each <target>.json must describe that target")


def _digest_ref(text: str, what: str) -> ImageRef:
    return parse_pinned(text, what, DeployError)


def image_to_deploy(m: mf.Manifest, override: str = "", published: Optional[str] = None) -> str:
    """IMAGE when it is the manifest's digest, else the published reference, else the manifest's own
    `predicate.image.reference`: always the digest the verified manifest names."""
    if override:
        ref = _digest_ref(override, "IMAGE")
        if ref.digest != m.digest:
            raise DeployError(f"IMAGE={override} is not the image the manifest qualified ({m.digest})",
                              hint="remove IMAGE from .env to deploy the released image, or qualify this one")
        return str(ref)
    text = published or m.reference
    ref = _digest_ref(text, "the published reference" if published else "the manifest's predicate.image.reference")
    if ref.digest != m.digest:
        raise DeployError(f"the manifest is inconsistent: its reference {text} is not its subject {m.digest}")
    return str(ref)


def pinned(text: str) -> bool:
    """Whether `text` is an image reference pinned by digest."""
    try:
        return ImageRef.parse(text).pinned
    except ImageRefError:
        return False
