"""Which released manifest to trust for a target, and which image it names."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, List, Mapping, Optional

from qualify.config.imageref import ImageRef, ImageRefError, parse_pinned
from qualify.core import manifest as mf
from qualify.core.readlimit import read_small
from qualify.deploy.errors import DeployError, NoReleaseError


@dataclass(frozen=True)
class ReleaseFiles:
    tag: str
    manifest: Path
    signature: Path
    public_key: Path

    @property
    def directory(self) -> Path:
        return self.manifest.parent


def _version_key(tag: str) -> List[Any]:
    return [(0, int(p), "") if p.isdigit() else (1, 0, p) for p in re.split(r"(\d+)", tag) if p]


def release_tags(manifests_dir: Path, target: str) -> List[str]:
    """Release tags under manifests/ that carry a manifest for `target`, oldest first."""
    if not manifests_dir.is_dir():
        return []
    tags = [d.name for d in manifests_dir.iterdir() if (d / f"{target}.json").is_file()]
    return sorted(tags, key=_version_key)


_TAG_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,127}")


def fetch_release(manifests_dir: Path, tag: str, github_repo: str = "") -> Optional[Path]:
    """The release's files from its GitHub release (`gh release download`) into manifests/<tag>/, when this
    checkout lacks them; None when there is no gh. They are verified afterwards exactly as checked-out ones."""
    import shutil
    import subprocess
    import tempfile

    gh = shutil.which("gh")
    if gh is None:
        return None
    if not _TAG_NAME.fullmatch(tag):
        raise DeployError(f"RELEASE_TAG={tag!r} is not a tag name", hint="use the release's version tag, e.g. v1.2.0")
    dest = manifests_dir / tag
    if dest.exists():
        return None  # a folder is here: it is what the release has, never overwritten
    manifests_dir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{tag}.download-", dir=manifests_dir))  # not a release until whole
    argv = [gh, "release", "download", tag, "--dir", str(tmp)] + (["--repo", github_repo] if github_repo else [])
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        proc = None
    if proc is None or proc.returncode != 0:
        shutil.rmtree(tmp, ignore_errors=True)
        said = (proc.stderr or proc.stdout).strip()[-300:] if proc else "timed out after 600 s"
        raise DeployError(f"gh release download {tag} failed: {said}",
                          hint="check `gh auth status` and RELEASE_GITHUB_REPO, or check the release tag out")
    tmp.rename(dest)
    return dest


def release_files(manifests_dir: Path, target: str, tag: str = "") -> ReleaseFiles:
    """The manifest, signature and public key of `tag` (the newest release when empty)."""
    tags = release_tags(manifests_dir, target)
    known = ", ".join(tags) or "none"
    if not tag:
        if not tags:
            raise NoReleaseError(f"no release under {manifests_dir} has a manifest for target {target}",
                                 hint="update this checkout (git pull --tags), or point MANIFESTS_DIR at a release")
        tag = tags[-1]
    folder = manifests_dir / tag
    manifest = folder / f"{target}.json"
    if not manifest.is_file():
        raise NoReleaseError(f"release {tag} has no manifest for target {target} ({manifest} not found); "
                             f"releases with one: {known}",
                             hint="set RELEASE_TAG in .env to one of those, or leave it empty for the newest")
    files = ReleaseFiles(tag, manifest, manifest.with_name(manifest.name + ".sig"), folder / "cosign.pub")
    for path, what in ((files.signature, "signature"), (files.public_key, "public key")):
        if not path.is_file():
            raise DeployError(f"release {tag}: the {what} {path} is missing, so {manifest} cannot be verified",
                              hint="restore the release folder from the release tag or its assets")
    return files


PUBLISHED = "published.json"  # `nox -s publish` writes it beside the manifests, signed with the release key
MAX_PUBLISHED_BYTES = 4 << 20


def published_image(files: ReleaseFiles, target: str, subject: str) -> Optional[str]:
    """The reference `nox -s publish` recorded for `target` (a registry other hosts pull from), after its
    signature verified with the release key; None when the release was not published. The digest must be
    the manifest's: a publication names where the qualified image is, never another image."""
    import json

    from qualify.signing import formats  # cryptography: only once a release is being verified

    path = files.directory / PUBLISHED
    if not path.exists():
        return None
    sig = formats.signature_path(path)
    data = read_small(path, MAX_PUBLISHED_BYTES, "publication record", DeployError)
    if not sig.is_file():
        raise DeployError(f"{path} has no signature ({sig.name})",
                          hint="restore the release folder from the release tag: the publication record is signed")
    key = formats.load_public_key_file(files.public_key)
    signature = formats.decode_signature(read_small(sig, 4096, "publication record signature", DeployError), str(sig))
    if not formats.verify_bytes(key, data, signature):
        raise DeployError(f"{path}: its signature does not verify with {files.public_key}",
                          hint="do not deploy from it; restore the release folder from the release tag")
    try:
        images = json.loads(data)["images"]
        named = [i["reference"] for i in images if isinstance(i, dict) and i.get("target") == target]
    except (ValueError, KeyError, TypeError):
        raise DeployError(f"{path}: not a publication record (images[].target/reference)") from None
    if not named:
        return None
    ref = _digest_ref(str(named[0]), f"{path}'s reference for {target}")
    if ref.digest != subject:
        raise DeployError(f"{path} names {ref} for {target}, not the qualified image {subject}",
                          hint="the publication and the manifests disagree: restore the release folder")
    return str(ref)


def check_key_fingerprint(public_key: Path, pinned: str) -> str:
    """The release key's fingerprint; it must be `pinned` when one is pinned.

    The key travels in the release folder beside the manifest, so whoever can
    rewrite the manifest can swap the key too; a fingerprint pinned in .env
    (from the release announcement) closes that.
    """
    from qualify.signing import keys as cosign_keys  # needs `cryptography`; the trust gate has it, preflight need not

    actual = cosign_keys.fingerprint(cosign_keys.load_public_key(public_key.read_bytes(), what=str(public_key)))
    if pinned and pinned != actual:
        raise DeployError(f"the release key {public_key} is {actual}, not the pinned RELEASE_KEY_FINGERPRINT {pinned}",
                          hint="the release folder holds a key you did not pin: restore it from the release tag, "
                          "or pin the key of the release you mean to trust")
    return actual


def _digest_ref(text: str, what: str) -> ImageRef:
    return parse_pinned(text, what, DeployError)


def image_to_deploy(stmt: Mapping[str, Any], target: str, override: str = "") -> str:
    """The manifest's `predicate.image.reference`, or IMAGE when it is the same digest.

    Also refuses a manifest made for another target. Called before the
    signature is checked, so everything it reads is checked again by verify.
    """
    named = (mf.predicate(stmt).get("target") or {}).get("name")
    if named != target:
        raise DeployError(f"the manifest is for target {named!r}, not {target!r}",
                          hint="restore the release folder: each <target>.json must describe that target")
    subject = mf.subject_digest(stmt)
    if override:
        ref = _digest_ref(override, "IMAGE")
        if ref.digest != subject:
            raise DeployError(f"IMAGE={override} is not the image the manifest qualified ({subject})",
                              hint="remove IMAGE from .env to deploy the released image, or qualify this one")
        return str(ref)
    text = (mf.predicate(stmt).get("image") or {}).get("reference") or ""
    ref = _digest_ref(text, "the manifest's predicate.image.reference")
    if ref.digest != subject:
        raise DeployError(f"the manifest is inconsistent: its reference {text} is not its subject {subject}")
    return str(ref)


def pinned(text: str) -> bool:
    """Whether `text` is an image reference pinned by digest."""
    try:
        return ImageRef.parse(text).pinned
    except ImageRefError:
        return False
