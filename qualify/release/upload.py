"""Steps 10 and 11 of a release: push the tag, publish the files on the GitHub release (gh)."""

from __future__ import annotations

from typing import List, Tuple

from qualify.core import killpoint
from qualify.core.errors import ExternalCommandError, ReleaseError
from qualify.core.report import Progress
from qualify.host import cmd

INDEX_FILE = "release.json"


def push_command(opts) -> List[str]:
    return ["git", "push", *(["--force"] if opts.force else []), opts.remote, f"refs/tags/{opts.tag}"]


def push(opts) -> str:
    if not opts.push:
        return "not pushed (pass --push, or run the command)"
    killpoint.reached("release:pushing")
    try:
        cmd.call(push_command(opts), cwd=str(opts.repo), timeout=300)
    except ExternalCommandError as exc:
        raise ReleaseError(f"the release is tagged locally, but the push failed: {exc.message}",
                           hint=f"run: {cmd.quote(push_command(opts))}") from None
    return "pushed"


def upload_command(opts, files: List[str]) -> List[str]:
    return ["gh", "release", "upload", opts.tag, *files, *(["--clobber"] if opts.force else [])]


def create_command(opts, files: List[str]) -> List[str]:
    return ["gh", "release", "create", opts.tag, "--verify-tag", "--title", opts.tag,
            "--notes", f"Qualification release {opts.tag}: see the tag message and {opts.folder}/{INDEX_FILE}", *files]


def gh_ready(repo) -> bool:
    """gh on PATH and logged in (`gh auth status` exits 0)."""
    if not cmd.which("gh"):
        return False
    return cmd.call(["gh", "auth", "status"], cwd=str(repo), check=False, timeout=60).returncode == 0


def upload(opts, files: List[str], progress: Progress) -> Tuple[str, List[str]]:
    """Upload to the GitHub release, creating it when `gh release view` says it does not exist."""
    command = upload_command(opts, files)
    if not opts.upload:
        return "skipped (--no-upload)", command
    if not gh_ready(opts.repo):
        progress("gh is not installed or not logged in: the assets are not uploaded")
        return "not uploaded: gh unavailable", command
    done = cmd.call(command, cwd=str(opts.repo), echo=True, check=False, timeout=600)
    if done.returncode == 0:
        return "uploaded", command
    exists = cmd.call(["gh", "release", "view", opts.tag], cwd=str(opts.repo), check=False, timeout=60)
    if exists.returncode != 0:
        create = create_command(opts, files)
        made = cmd.call(create, cwd=str(opts.repo), echo=True, check=False, timeout=600)
        if made.returncode == 0:
            return "created the GitHub release and uploaded", create
        command, done = create, made
    raise ReleaseError(
        f"the release is tagged and written, but the upload failed: {cmd.tail(done.stderr or done.stdout)}",
        hint=f"push the tag ({cmd.quote(push_command(opts))}), then run: {cmd.quote(command)}",
    )
