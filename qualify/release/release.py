"""Release qualified manifests to a git tag: an ordered list of steps, each done or skipped with a reason.

Steps (as goreleaser's pipes; `STEPS` below is the order):

1. tag: a version tag (semver, optional pre-release; any git-safe name with
   --any-tag); an existing tag is refused unless --force; a name colliding
   with a folder under manifests/ that no release wrote (e.g. `evidence`) is
   refused. Nothing is read, signed or written before this.
2. tree: a dirty work tree is refused unless --allow-dirty (recorded in the
   release). Untracked release folders of existing tags do not count.
3. key: the signing key is loaded and its password checked, before any image work.
4. manifests: every `build/manifests/<target>.json` is assessed. A target is
   withheld, with the reason, when the digest its build recorded is not the
   manifest's, the registry no longer serves that digest (by digest, never a
   movable tag), a check failed, or its level is below --min-level. Any
   withheld target fails the release unless --allow-partial.
5. source: the one source revision the released manifests name; the release
   commit goes on top of it.
6. sign: the exact manifest bytes, `.sig`, Sigstore bundle, `cosign.pub` and
   `release.json` (which lists every file the release wrote) are staged.
7. write: staged files move into `manifests/<tag>/`. Files there must be
   identical (an interrupted run continues), else --force overwrites the
   files this release writes and removes those an earlier release recorded;
   files no release wrote are never touched.
8. commit: a commit of its own (the source tree + the release folder), so
   `git clone --branch <tag>` holds the signed release.
9. tag: an annotated tag on that commit: digests, manifest sha256s and a
   changelog since the previous release. Only for a release that is what was asked for.
10. push: `git push <remote> refs/tags/<tag>` with --push, else printed.
11. publish: `gh release upload` (the GitHub release is created when missing),
    else the commands are printed.

--dry-run runs the read-only steps and prints what would be signed, written,
tagged, pushed and uploaded.
"""

from __future__ import annotations

import glob
import re
import shutil
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from qualify.core import killpoint
from qualify.core import manifest as mf
from qualify.core.errors import QualifyError, ReleaseError
from qualify.core.report import Progress, Reporter
from qualify.release import changelog, history, install, tagstep
from qualify.release.assess import assess_all, collect
from qualify.release.gitops import (
    existing_tag,
    git,
    is_commit,
    tracked_under,
)
from qualify.release.messages import dry_run_lines, tag_message  # noqa: F401 (dry_run_lines: the CLI's)
from qualify.release.model import (
    Candidate,
    ReleasedTarget,
    ReleaseOptions,
    ReleaseResult,
    StepResult,
    Withheld,
)
from qualify.release.upload import create_command, push, push_command, upload, upload_command
from qualify.release.verify import ImageResolver, registry_digest
from qualify.signing import formats
from qualify.signing import keys as cosign_keys
from qualify.signing.signer import Signer
from qualify.trust import deployfacts, policy
from qualify.trust import records as rec
from qualify.trust.journal import release_lock
from qualify.trust.order import SEMVER, tag_problem
from qualify.trust.policy import ReleasePolicy
from qualify.trust.sources import GitObjects
from qualify.trust.verify import KeyAnchor, TrustedKey, sha256

INDEX_FILE = rec.INDEX_FILE
PUBLIC_KEY_FILE = rec.PUBLIC_KEY_FILE
_DIRTY = "-dirty"

SignerFactory = Callable[[], Signer]  # the key step: loads the key and checks its password, once

stderr_progress = Reporter("release")


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


def release_files(entries: Sequence[ReleasedTarget]) -> List[str]:
    """Every file the release writes into its folder (release.json lists them all but its own three)."""
    return sorted([PUBLIC_KEY_FILE, INDEX_FILE, INDEX_FILE + formats.SIGNATURE_SUFFIX,
                   INDEX_FILE + formats.BUNDLE_SUFFIX] + [f for e in entries for f in e.files])


def release_policy(opts: ReleaseOptions, entries: Sequence[ReleasedTarget]) -> ReleasePolicy:
    """The promotion rule this release signs: the targets file's pass count, all-reduce floors ([allreduce],
    as policy.AllReduceFloor entries: promote and the deploy apply only these) and PTX JIT table ([ptx_jit],
    issue 51: the deploy's PTX gate reads only this copy), and per target the intended
    level its manifest recorded (else the targets file's, else experimental). And the target facts the deploy
    uses (issue 52, trust/deployfacts.py): each released target's and every cpu target's, with [drivers]; the
    deploy reads them only from here, never a deploy host's targets file."""
    from qualify.config import targets

    tf = targets.load(opts.targets_file) if opts.targets_file else targets.load()
    unknown = sorted(e.target for e in entries if e.target not in tf.targets)
    if unknown:
        raise ReleaseError(f"{tf.path} has no target {', '.join(unknown)}, so the release cannot sign what the "
                           "deploy needs of it (its capability, driver floor, memory, user)",
                           hint="release from the checkout whose targets file built these manifests")
    chosen = [tf.get(e.target) for e in entries] + [t for t in tf.cpu_targets() if t.name not in {e.target for e in entries}]
    return policy.for_release({e.target: e.intended_level or tf.get(e.target).support_level for e in entries},
                              tf.promotion_passes, tf.allreduce_floors, tf.promotion_level_checks, tf.ptx_jit,
                              deployfacts.of_targets(chosen, tf.drivers))


def release_index(opts: ReleaseOptions, revision: str, entries: List[ReleasedTarget], withheld: List[Withheld],
                  key: TrustedKey, files: Dict[str, bytes], dirty: Sequence[str], sequence: int,
                  predecessor: Optional[rec.Predecessor], time_: str) -> rec.ReleaseIndex:
    from qualify.trust.folder import released_files

    return rec.ReleaseIndex(policy=release_policy(opts, entries),
        tag=opts.tag, sequence=sequence, time=time_, source_revision=revision, min_level=opts.min_level,
        key_fingerprint=key.fingerprint, key_hint=cosign_keys.key_hint(key.key),
        targets=tuple(e.entry() for e in entries), files=released_files(files), predecessor=predecessor,
        withheld=tuple((w.target, w.reason) for w in withheld), dirty_paths=tuple(dirty),
        dirty_allowed=opts.allow_dirty)


# --- orchestration ------------------------------------------------------------


def _remove_stale_staging(opts: ReleaseOptions) -> None:
    """Staging folders older toolkits left (in the git folder, or beside manifests/ in the work tree); they
    never hold anything released. This toolkit stages in a journal inside the release folder (install.py)."""
    git_dir = Path(git(opts.repo, "rev-parse", "--absolute-git-dir").stdout.strip())
    prefix = glob.escape(f"release-{opts.tag}.staging-")
    for parent in (git_dir / "qualify-staging", opts.out_root.parent):
        for stale in glob.glob(str(parent / (prefix + "*"))) + glob.glob(str(parent / ("." + prefix + "*"))):
            shutil.rmtree(stale, ignore_errors=True)


class _Steps:
    """Runs the ordered steps, timing each and recording it as done or skipped with the reason."""

    def __init__(self, outcome: ReleaseResult, progress: Progress) -> None:
        self.outcome, self.progress = outcome, progress

    def run(self, name: str, what: str, fn: Callable[[], Any], detail: Callable[[Any], str] = str) -> Any:
        start = time.monotonic()
        self.progress(f"- {name}: {what} ...")
        result = fn()
        text = detail(result)
        self.outcome.steps.append(StepResult(name, "done", text))
        self.progress(f"  done: {name} ({time.monotonic() - start:.1f} s){': ' + text if text else ''}")
        return result

    def skip(self, name: str, reason: str) -> None:
        self.outcome.steps.append(StepResult(name, "skipped", reason))
        self.progress(f"- {name}: skipped ({reason})")


def _files_for_upload(opts: ReleaseOptions, names: Sequence[str]) -> List[str]:
    return [f"{opts.folder}/{n}" for n in names]


# Publishing to a registry, composed in by the CLI (qualify/publish; stages do not call each other): it signs
# with the release's own signer (the password is read once) -> (tag message lines, files it wrote).
RegistryPublish = Callable[[Signer], Tuple[List[str], List[str]]]


def run_release(opts: ReleaseOptions, make_signer: SignerFactory, resolve: ImageResolver = registry_digest,
                progress: Progress = stderr_progress, registry_publish: Optional[RegistryPublish] = None) -> ReleaseResult:
    outcome = ReleaseResult(opts.tag, str(opts.directory), dry_run=opts.dry_run)
    steps = _Steps(outcome, progress)
    steps.run("tag", f"check the tag name {opts.tag}", lambda: check_tag(opts))
    _remove_stale_staging(opts)  # before the tree check: a killed run's staging is no change of the user's
    if opts.allow_dirty:
        outcome.dirty = steps.run("tree", "note the work tree's changes (--allow-dirty)", lambda: dirty_paths(opts),
                                  lambda d: f"{len(d)} changed path(s) recorded")
    else:
        steps.run("tree", "check the work tree is clean", lambda: check_tree(opts), lambda d: "clean")
    # A dry run checks the key and its password too, as it promises: a run that would fail there says so now.
    signer = steps.run("key", "load the signing key and check its password" + (" (--dry-run: nothing is signed)"
                                                                                if opts.dry_run else ""),
                       make_signer, lambda s: cosign_keys.fingerprint(s.public_key()))
    key = TrustedKey.of_signer(signer, "the release key")
    check_committed_key(opts, key)
    candidates = collect(opts.source)
    by_target = {c.target: c for c in candidates}
    outcome.released, outcome.withheld = steps.run(
        "manifests", f"check {len(candidates)} manifest(s) in {opts.source} against their images, by digest",
        lambda: assess_all(candidates, opts, resolve, progress),
        lambda r: f"{len(r[0])} released, {len(r[1])} withheld")
    outcome.source_revision = steps.run("source", "find the source revision the manifests name",
                                        lambda: source_revision(opts, outcome.released))
    past = history.released(opts.repo, opts.out_root.relative_to(opts.repo).as_posix(), key)
    sequence, predecessor = history.place(opts.tag, past, forced=opts.force)
    outcome.sequence, outcome.predecessor = sequence, predecessor.tag if predecessor else ""
    outcome.files = release_files(outcome.released)
    previous = next((r for r in past if predecessor and r.index.tag == predecessor.tag), None)
    changes = changelog.changelog(opts, outcome.released, {t: c.data for t, c in by_target.items()}, previous)
    outcome.push_command = push_command(opts)
    outcome.upload_command = upload_command(opts, _files_for_upload(opts, outcome.files))
    outcome.create_command = create_command(opts, _files_for_upload(opts, outcome.files))
    if opts.dry_run:
        for name in ("sign", "write", "registry", "commit", "tag", "push", "publish"):
            steps.skip(name, "--dry-run")
        outcome.tag_message = tag_message(opts, outcome.released, outcome.withheld, key, "<sha256>", changes)
        return outcome
    when = history.source_time(opts.repo, outcome.source_revision)
    with release_lock(opts.directory):  # one writer of the folder at a time (release, promote, publish)
        index_sha = _write(opts, outcome, steps, candidates, signer, key, sequence, predecessor, when)
    published: List[str] = []
    if registry_publish is None:
        steps.skip("registry", "no --publish-to: the images stay where they were built")
    else:
        published, extra = steps.run("registry", "copy the images by digest, with their attestations, to the registry",
                                     lambda: registry_publish(signer), lambda r: f"{len(r[1])} file(s) written")
        killpoint.reached("release:published")
        outcome.files = sorted(set(outcome.files) | set(extra))
    outcome.tag_message = tag_message(opts, outcome.released, outcome.withheld, key, index_sha,
                                      [*changes, *([""] if changes and published else []), *published])
    resumed = existing_tag(opts.repo, opts.tag) if not opts.force else None
    staging_root = tagstep.staging_root(opts)
    outcome.release_commit = steps.run(
        "commit", f"commit {opts.folder}/ on top of {outcome.source_revision[:12]}",
        lambda: tagstep.commit_or_resume(opts, outcome, resumed, staging_root), lambda c: c[:12] + (
            " (the tag's own commit: an earlier run made it)" if resumed else ""))
    killpoint.reached("release:committed")
    if resumed:
        outcome.tag_object = resumed
        outcome.recovered.append(f"tag {opts.tag} ({resumed[:12]}) was already made by an earlier run")
        steps.skip("tag", f"{opts.tag} already points at this release commit (an earlier run made it)")
    else:
        outcome.tag_object = steps.run("tag", f"annotated tag {opts.tag} on the release commit",
                                       lambda: tagstep.make_tag(opts, outcome, staging_root, progress))
    killpoint.reached("release:tagged")
    outcome.push = steps.run("push", f"push the tag to {opts.remote}", lambda: push(opts))
    upload_result = steps.run("publish", "upload the release files",
                              lambda: upload(opts, _files_for_upload(opts, outcome.files), progress),
                              lambda r: r[0])
    outcome.upload, outcome.upload_command = upload_result
    return outcome


def _write(opts: ReleaseOptions, outcome: ReleaseResult, steps: _Steps, candidates: List[Candidate], signer: Signer,
           key: TrustedKey, sequence: int, predecessor: Optional[rec.Predecessor], when: str) -> str:
    """Sign and write the release folder through the one writer (install.py); the sha256 of its release.json."""
    by_target = {c.target: c for c in candidates}
    dest = opts.directory
    entries = {(e.target, sha256(by_target[e.target].data)) for e in outcome.released}

    def mine(view) -> bool:
        return install.identity(view)[1:] == (sequence, tuple(sorted(entries)))

    for note in install.recover(dest, key, mine):
        steps.progress(f"  {note}")
        if not note.startswith("LEFT"):
            outcome.recovered.append(note)
    found = install.before(dest, key)
    write = install.open_write(dest, signer, key)
    index_sha = ""
    try:
        def stage() -> None:
            nonlocal index_sha
            listed = [(PUBLIC_KEY_FILE, key.pem, False, PUBLIC_KEY_FILE)]
            listed += [(e.manifest_file, by_target[e.target].data, True, e.target) for e in outcome.released]
            files = dict(install.stage(write, listed, found, opts.force, steps.progress))
            index = release_index(opts, outcome.source_revision, outcome.released, outcome.withheld, key, files,
                                  outcome.dirty, sequence, predecessor, when)
            data = index.to_bytes()
            label = f"{INDEX_FILE} (sequence {sequence}" + (f", after {predecessor.tag}" if predecessor else
                                                            ", the first release") + ")"
            install.stage(write, [(INDEX_FILE, data, True, label)], found, opts.force, steps.progress)
            index_sha = sha256(data)

        steps.run("sign", f"sign {len(outcome.released)} manifest(s) and the release index", stage, lambda _: "")

        def do_write() -> install.Plan:
            plan = install.plan(write, dest, found, index_sha, opts.force)
            outcome.written = install.install(write, dest, plan, opts.force)
            outcome.unchanged = plan.same
            outcome.removed = plan.removable if opts.force else []
            outcome.left_untouched = plan.untouchable
            return plan

        plan = steps.run("write", f"write {dest}", do_write,
                         lambda p: f"{len(outcome.written)} written, {len(p.same)} unchanged"
                         + (" (already there, identical: written by an earlier run)" if p.same and not p.differ else "")
                         + (f", kept: {', '.join(p.kept)} (bound to this release)" if p.kept else "")
                         + (f", left untouched (no release wrote them): {', '.join(p.untouchable)}"
                            if p.untouchable else ""))
    finally:
        write.abandon()
    if outcome.unchanged:
        outcome.recovered.append(f"{len(outcome.unchanged)} file(s) of {opts.folder}/ were already written, identical")
    if plan.kept:
        outcome.recovered.append(f"{rec.PUBLICATION_FILE} in {opts.folder}/ is bound to this release (a publish "
                                 "since, or an interrupted --publish-to): kept as part of it")
        outcome.files = sorted(set(outcome.files) | set(plan.kept))
    killpoint.reached("release:written")
    return index_sha
