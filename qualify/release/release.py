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
import shutil
from pathlib import Path
from typing import Callable, List, Optional, Sequence, Tuple

from qualify.core import killpoint
from qualify.core.report import Progress, Reporter
from qualify.core.steps import Steps
from qualify.release import changelog, history, install, tagstep
from qualify.release.assess import assess_all, collect
from qualify.release.checks import (
    check_committed_key,
    check_tag,
    check_tree,
    dirty_paths,
    source_revision,
)
from qualify.release.gitops import existing_tag, git
from qualify.release.index import release_files, release_index
from qualify.release.messages import dry_run_lines, tag_message  # noqa: F401 (dry_run_lines: the CLI's)
from qualify.release.model import Candidate, ReleaseOptions, ReleaseResult
from qualify.release.upload import create_command, push, push_command, upload, upload_command
from qualify.release.verify import ImageResolver, registry_digest
from qualify.signing import keys as cosign_keys
from qualify.signing.signer import Signer
from qualify.trust import records as rec
from qualify.trust.journal import release_lock
from qualify.trust.verify import TrustedKey, sha256

INDEX_FILE = rec.INDEX_FILE
PUBLIC_KEY_FILE = rec.PUBLIC_KEY_FILE

SignerFactory = Callable[[], Signer]  # the key step: loads the key and checks its password, once

stderr_progress = Reporter("release")


# --- orchestration ------------------------------------------------------------


def _remove_stale_staging(opts: ReleaseOptions) -> None:
    """Staging folders older toolkits left (in the git folder, or beside manifests/ in the work tree); they
    never hold anything released. This toolkit stages in a journal inside the release folder (install.py)."""
    git_dir = Path(git(opts.repo, "rev-parse", "--absolute-git-dir").stdout.strip())
    prefix = glob.escape(f"release-{opts.tag}.staging-")
    for parent in (git_dir / "qualify-staging", opts.out_root.parent):
        for stale in glob.glob(str(parent / (prefix + "*"))) + glob.glob(str(parent / ("." + prefix + "*"))):
            shutil.rmtree(stale, ignore_errors=True)


def _recover(outcome: ReleaseResult, steps: Steps, note: str) -> None:
    outcome.recovered.append(note)
    steps.recover(note)  # the step that took it over (the last one outside a step) keeps it too


def _files_for_upload(opts: ReleaseOptions, names: Sequence[str]) -> List[str]:
    return [f"{opts.folder}/{n}" for n in names]


# Publishing to a registry, composed in by the CLI (qualify/publish; stages do not call each other): it signs
# with the release's own signer (the password is read once) -> (tag message lines, files it wrote).
RegistryPublish = Callable[[Signer], Tuple[List[str], List[str]]]


def run_release(opts: ReleaseOptions, make_signer: SignerFactory, resolve: ImageResolver = registry_digest,
                progress: Progress = stderr_progress, registry_publish: Optional[RegistryPublish] = None) -> ReleaseResult:
    outcome = ReleaseResult(opts.tag, str(opts.directory), dry_run=opts.dry_run)
    steps = Steps(progress, outcome.steps)  # outcome.steps is the list the steps are recorded in
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
        steps.skip("tag", f"{opts.tag} already points at this release commit (an earlier run made it)")
        _recover(outcome, steps, f"tag {opts.tag} ({resumed[:12]}) was already made by an earlier run")
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


def _write(opts: ReleaseOptions, outcome: ReleaseResult, steps: Steps, candidates: List[Candidate], signer: Signer,
           key: TrustedKey, sequence: int, predecessor: Optional[rec.Predecessor], when: str) -> str:
    """Sign and write the release folder through the one writer (install.py); the sha256 of its release.json."""
    by_target = {c.target: c for c in candidates}
    dest = opts.directory
    entries = {(e.target, sha256(by_target[e.target].data)) for e in outcome.released}

    def mine(view) -> bool:
        return install.identity(view)[1:] == (sequence, tuple(sorted(entries)))

    taken_over = []  # the sign step takes over what an interrupted run staged
    for note in install.recover(dest, key, mine):
        steps.progress(f"  {note}")
        if not note.startswith("LEFT"):
            taken_over.append(note)
    found = install.before(dest, key)
    write = install.open_write(dest, signer, key)
    index_sha = ""
    try:
        def stage() -> None:
            nonlocal index_sha
            for note in taken_over:
                _recover(outcome, steps, note)
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
        _recover(outcome, steps, f"{len(outcome.unchanged)} file(s) of {opts.folder}/ were already written, identical")
    if plan.kept:
        _recover(outcome, steps, f"{rec.PUBLICATION_FILE} in {opts.folder}/ is bound to this release (a publish "
                 "since, or an interrupted --publish-to): kept as part of it")
        outcome.files = sorted(set(outcome.files) | set(plan.kept))
    killpoint.reached("release:written")
    return index_sha
