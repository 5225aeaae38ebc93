"""The release's read-only checks, before anything is signed: the tag (1), the work tree (2), the source
revision (5) and the signing key against the committed one (6). Each raises ReleaseError naming what to do."""

from __future__ import annotations

import re
from typing import List, Optional, Sequence

from qualify.core import manifest as mf
from qualify.core.errors import QualifyError, ReleaseError
from qualify.release import history
from qualify.release.assess import collect
from qualify.release.gitops import existing_tag, git, is_commit, tracked_under
from qualify.release.model import ReleasedTarget, ReleaseOptions
from qualify.trust import records as rec
from qualify.trust.order import SEMVER, tag_problem
from qualify.trust.sources import GitObjects
from qualify.trust.verify import KeyAnchor, TrustedKey, sha256

INDEX_FILE = rec.INDEX_FILE
PUBLIC_KEY_FILE = rec.PUBLIC_KEY_FILE
_DIRTY = "-dirty"


# --- 1. tag -------------------------------------------------------------------


def check_tag_name(tag: str, any_tag: bool) -> None:
    problem = tag_problem(tag)
    if problem:
        raise ReleaseError(f"{problem}", hint="name the release as a version, e.g. v1.2.0")
    if not any_tag and not SEMVER.fullmatch(tag):
        raise ReleaseError(f"{tag!r} is not a version tag (semver: v1.2.3 or v1.2.3-rc.1)",
                           hint="name the release as a version, or pass --any-tag for another name")


def _folder_collision(opts: ReleaseOptions) -> Optional[str]:
    """Why manifests/<tag> is not this release's folder, if it is not."""
    dest = opts.directory
    if dest.is_symlink() or (dest.exists() and not dest.is_dir()):
        return f"{dest} exists and is not a folder"
    tracked = tracked_under(opts.repo, "HEAD", opts.folder)
    if tracked:
        return f"{opts.folder}/ holds files committed on this branch ({', '.join(tracked[:3])}), not a release of {opts.tag}"
    if not dest.is_dir():
        return None
    others = [p.name for p in dest.iterdir() if (p.is_symlink() or not p.is_file()) and not p.name.startswith(".")]
    if others:
        return f"{dest} holds folders or links ({', '.join(sorted(others)[:3])}) that no release writes"
    return None


def check_tag(opts: ReleaseOptions) -> str:
    check_tag_name(opts.tag, opts.any_tag)
    if opts.min_level not in mf.LEVEL_RANK:
        raise ReleaseError(f"--min-level {opts.min_level!r} is not one of {', '.join(mf.LEVEL_RANK)}")
    if mf.LEVEL_RANK[opts.min_level] > mf.LEVEL_RANK["experimental"]:
        raise ReleaseError(f"--min-level {opts.min_level}: a release ships targets at experimental at most; "
                           "baseline comes only from `qualify promote` (the release's signed promotion rule)",
                           hint="release with --min-level experimental (or lower), then promote by GPU evidence")
    if not opts.directory.resolve().is_relative_to(opts.repo.resolve()):
        raise ReleaseError(f"the release folder {opts.directory} is outside the repository {opts.repo}")
    if git(opts.repo, "rev-parse", "-q", "--verify", "HEAD^{commit}", check=False).returncode != 0:
        raise ReleaseError(f"{opts.repo} has no commit to tag")
    found = existing_tag(opts.repo, opts.tag)
    if found and not opts.force:
        differs = _differs_from_tag(opts)
        if differs:
            raise ReleaseError(
                f"tag {opts.tag} already exists ({found[:12]}) and holds another release ({differs}); "
                "a release never moves a tag",
                hint="choose a new tag, or pass --force to re-sign, rewrite the release's own files and move the tag",
            )
    collision = _folder_collision(opts)
    if collision:
        raise ReleaseError(f"tag {opts.tag} collides with an existing folder: {collision}",
                           hint="choose another tag name; a release only writes manifests/<tag>/ for itself")
    if found and not opts.force:
        return f"{opts.tag} exists and holds these manifests: resuming it (the steps left are done, the rest checked)"
    return f"{opts.tag}" + (" (exists; --force moves it)" if found else "")


def _committed_anchor(opts: ReleaseOptions) -> KeyAnchor:
    """The repository's committed cosign.pub, when it has one (the release key, check_committed_key); else the
    key in the tagged folder itself, which proves only that the tag's files hold together."""
    committed = opts.repo / PUBLIC_KEY_FILE
    try:
        return KeyAnchor(trusted=TrustedKey.read(committed, ReleaseError)) if committed.is_file() else KeyAnchor()
    except QualifyError:
        return KeyAnchor()


def _differs_from_tag(opts: ReleaseOptions) -> str:
    """Why the release the tag holds is not the one build/manifests would make ("" when it is the same:
    a re-run after an interruption, which resumes). The tagged release is verified as a whole (one
    `git cat-file --batch`, the one verifier), before any key is asked for; the resumed run's commit is then
    compared tree for tree with the tag's (`tagstep.commit_or_resume`)."""
    root = opts.out_root.relative_to(opts.repo).as_posix()
    try:
        with GitObjects(opts.repo) as objects:
            tagged = history.tagged_release(objects, root, opts.tag, _committed_anchor(opts))
    except QualifyError as exc:
        return f"its release does not verify: {exc.message}"
    if tagged is None:
        return f"its commit has no {root}/{opts.tag}/{INDEX_FILE}"
    index = tagged.index
    tagged_sha = {e.target: e.manifest_sha256 for e in index.targets}
    withheld = {t for t, _ in index.withheld}  # withheld again or not: the commit's tree decides later
    try:
        here = {c.target: sha256(c.data) for c in collect(opts.source) if c.target not in withheld}
    except ReleaseError as exc:
        return exc.message
    if here != tagged_sha:
        changed = sorted(t for t in set(here) | set(tagged_sha) if here.get(t) != tagged_sha.get(t))
        return f"other manifests for {', '.join(changed)}"
    return ""


# --- 2. tree ------------------------------------------------------------------


def dirty_paths(opts: ReleaseOptions) -> List[str]:
    """Changed or untracked paths, except release folders of existing tags (they stay untracked here)."""
    out = git(opts.repo, "status", "--porcelain=v1", "-z", "--untracked-files=all").stdout
    entries = [e[3:] for e in out.split("\0") if len(e) > 3]
    root = opts.out_root.relative_to(opts.repo).as_posix() + "/"
    tags = set(git(opts.repo, "tag", "-l").stdout.split()) | {opts.tag}

    def release_folder(path: str) -> bool:
        return path.startswith(root) and path[len(root):].split("/", 1)[0] in tags

    return [p for p in entries if not release_folder(p)]


def check_tree(opts: ReleaseOptions) -> List[str]:
    dirty = dirty_paths(opts)
    if dirty and not opts.allow_dirty:
        hint = "commit or stash the changes, or pass --allow-dirty (recorded in the release)"
        if PUBLIC_KEY_FILE in dirty:
            hint = (f"commit the release's public key first (git add {PUBLIC_KEY_FILE} && git commit -m 'release key'): "
                    "every release checks its key against it; then " + hint)
        raise ReleaseError(f"the work tree is not clean: {', '.join(dirty[:5])}"
                           + (f" and {len(dirty) - 5} more" if len(dirty) > 5 else ""), hint=hint)
    return dirty


# --- 5. source ----------------------------------------------------------------


def source_revision(opts: ReleaseOptions, entries: Sequence[ReleasedTarget]) -> str:
    """The one commit the released manifests were built from: the release commit's parent."""
    named = {e.source_revision for e in entries}
    if len(named) != 1:
        listing = ", ".join(f"{e.target} {e.source_revision or '(none)'}" for e in entries)
        raise ReleaseError(f"the manifests name different source revisions ({listing})",
                           hint="qualify every target from one commit, then release")
    revision = named.pop()
    clean = revision[: -len(_DIRTY)] if revision.endswith(_DIRTY) else revision
    if not re.fullmatch(r"[0-9a-f]{40}", clean) or not is_commit(opts.repo, clean):
        raise ReleaseError(f"the manifests name source revision {revision!r}, which is not a commit in {opts.repo}",
                           hint="release from the repository the images were built from (git fetch)")
    if clean != revision and not opts.allow_dirty:
        raise ReleaseError(f"the images were built from a dirty tree ({revision})",
                           hint="rebuild from a clean commit, or pass --allow-dirty (recorded in the release)")
    return clean


# --- 6. sign ------------------------------------------------------------------


def check_committed_key(opts: ReleaseOptions, key: TrustedKey) -> None:
    """The repository's committed cosign.pub (generate-key says to commit it) is the release key: a release
    signed with another key is refused before anything is signed."""
    committed = opts.repo / PUBLIC_KEY_FILE
    if not committed.is_file():
        return
    mine = TrustedKey.read(committed, ReleaseError)
    if mine.fingerprint != key.fingerprint:
        raise ReleaseError(f"the signing key is {key.fingerprint}, but the repository's {PUBLIC_KEY_FILE} is "
                           f"{mine.fingerprint}", hint="sign with the release key (--key), or commit the new "
                           f"key's {PUBLIC_KEY_FILE} if the release key really changed")
