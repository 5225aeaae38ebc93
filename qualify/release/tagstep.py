"""Steps 8 and 9 of a release, each done once however often the release is killed and run again: the release
commit and the annotated tag.

- The commit a run makes is named in `<git folder>/qualify-staging/release-<tag>.commit` before it is tagged.
  A run killed before its tag leaves a commit nothing refers to; the next run reuses it when it holds this
  tree on this parent with this message (it makes another only when the release changed), so re-runs add no
  unreachable commits. The name goes once the tag is made.
- A lock a killed `git tag` left (`refs/tags/<tag>.lock`) is removed when no git process holds it
  (release/gitlock.py says how that is decided). When the killed git had already written this release's tag
  object into the lock (this tag, on this commit, with this message), the update it was making is finished
  with that object, so no second tag object is made either.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from qualify.core.errors import ReleaseError
from qualify.core.fsutil import write_atomic
from qualify.core.report import Progress
from qualify.release import gitlock, install
from qualify.release.gitops import create_tag, git, release_commit, release_tree
from qualify.release.model import ReleaseOptions, ReleaseResult
from qualify.trust import records as rec


def staging_root(opts: ReleaseOptions) -> Path:
    """Inside the repository's git folder: outside the work tree, so git status never sees the record."""
    return Path(git(opts.repo, "rev-parse", "--absolute-git-dir").stdout.strip()) / "qualify-staging"


def commit_record(staging_root: Path, tag: str) -> Path:
    return staging_root / f"release-{tag}.commit"


def commit_or_resume(opts: ReleaseOptions, outcome: ReleaseResult, tagged: Optional[str], staging_root: Path) -> str:
    """The release commit: for a resumed release the tag's own commit, when it holds exactly this tree on this
    parent (else the release is another one: refused, nothing moved); else the commit an earlier run of this
    release made and was killed before tagging, when it is this release's; else a new one, named for the next
    run before anything tags it."""
    want_tree = release_tree(opts, outcome.source_revision, outcome.files)
    record = commit_record(staging_root, opts.tag)
    if tagged:
        commit = git(opts.repo, "rev-parse", f"refs/tags/{opts.tag}^{{commit}}").stdout.strip()
        have_tree = git(opts.repo, "rev-parse", f"{commit}^{{tree}}").stdout.strip()
        parent = git(opts.repo, "rev-parse", f"{commit}^", check=False).stdout.strip()
        # A publication record bound to this release but published after the tag was made is in the folder,
        # not in the tag's commit: that commit is still this release's.
        without = [n for n in outcome.files if n not in install.PUBLICATION_FILES]
        if without != outcome.files and parent == outcome.source_revision and \
                have_tree == release_tree(opts, outcome.source_revision, without):
            outcome.recovered.append(f"{rec.PUBLICATION_FILE} (bound to this release) was published after tag "
                                     f"{opts.tag} was made: it is kept in {opts.folder}/, the tag's commit left")
            record.unlink(missing_ok=True)
            return commit
        if (have_tree, parent) != (want_tree, outcome.source_revision):
            raise ReleaseError(f"tag {opts.tag} already exists and its commit {commit[:12]} holds other files than "
                               "this release writes; a release never moves a tag",
                               hint="choose a new tag, or pass --force to move it")
        record.unlink(missing_ok=True)
        return commit
    earlier = _recorded(record)
    if earlier and _is_this_release(opts, earlier, want_tree, outcome):
        outcome.recovered.append(f"release commit {earlier[:12]} was made by an earlier run of this release that "
                                 "did not tag it (killed or refused): reused")
        return earlier
    commit = release_commit(opts, outcome.source_revision, outcome.files, outcome.tag_message)
    record.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(record, commit + "\n")
    return commit


def make_tag(opts: ReleaseOptions, outcome: ReleaseResult, staging_root: Path, progress: Progress) -> str:
    """The annotated tag on the release commit; a stale lock of it is recovered first (see the module)."""
    ref = f"refs/tags/{opts.tag}"
    stale = gitlock.clear_stale(opts.repo, ref, progress)
    made = ""
    if stale and stale.object_id and _is_this_tag(opts, outcome, stale.object_id):
        git(opts.repo, "update-ref", "-m", f"release {opts.tag}", ref, stale.object_id,
            *([] if opts.force else [""]))  # '': only while the tag does not exist
        made = stale.object_id
        outcome.recovered.append(f"{stale.path} was left by a git killed while it tagged (no git process holds "
                                 f"it): finished its update of {ref} to the tag object it had made, {made[:12]}")
    elif stale:
        outcome.recovered.append(f"{stale.path} was left by a git killed while it tagged (no git process holds "
                                 "it): removed")
    if not made:
        made = create_tag(opts.repo, opts.tag, outcome.tag_message, opts.force, outcome.release_commit)
    commit_record(staging_root, opts.tag).unlink(missing_ok=True)
    return made


def _recorded(record: Path) -> str:
    try:
        text = record.read_text(encoding="ascii", errors="replace")[:200].strip()
    except OSError:
        return ""
    return text if len(text) in (40, 64) and all(c in "0123456789abcdef" for c in text) else ""


def _object(opts: ReleaseOptions, kind: str, oid: str) -> Optional[tuple]:
    """(headers, message) of a `kind` object, None when there is none by that id."""
    if git(opts.repo, "cat-file", "-t", oid, check=False).stdout.strip() != kind:
        return None
    raw = git(opts.repo, "cat-file", kind, oid).stdout
    head, _, message = raw.partition("\n\n")
    return head.splitlines(), message


def _is_this_release(opts: ReleaseOptions, commit: str, tree: str, outcome: ReleaseResult) -> bool:
    found = _object(opts, "commit", commit)
    if found is None:
        return False
    head, message = found
    parents = [line.split(" ", 1)[1] for line in head if line.startswith("parent ")]
    return f"tree {tree}" in head and parents == [outcome.source_revision] and message == outcome.tag_message


def _is_this_tag(opts: ReleaseOptions, outcome: ReleaseResult, oid: str) -> bool:
    found = _object(opts, "tag", oid)
    if found is None:
        return False
    head, message = found
    wanted = git(opts.repo, "stripspace", "--strip-comments", input_text=outcome.tag_message).stdout  # as `tag -F`
    return (f"object {outcome.release_commit}" in head and "type commit" in head and f"tag {opts.tag}" in head
            and message == wanted)
