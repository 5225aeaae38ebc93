"""The release's git operations: the release commit built in a private index (the work tree, the index
and the branches stay as they are), the annotated tag, and the questions asked of the repository."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import List, Mapping, Optional, Sequence

from qualify.core.errors import ExternalCommandError, ReleaseError
from qualify.host import cmd
from qualify.release.model import ReleaseOptions


def git(repo: Path, *args: str, check: bool = True, input_text: Optional[str] = None,
        env: Optional[Mapping[str, str]] = None) -> cmd.Result:
    result = cmd.call(["git", *args], cwd=str(repo), check=False, input_text=input_text, timeout=120, env=env)
    if check and result.returncode != 0:
        said = brief(result.stderr or result.stdout)
        if any(m in said.lower() for m in ("no space left", "out of diskspace", "disk quota")):
            raise ReleaseError(f"the disk under {repo} is full: git {args[0]} could not write ({said})",
                               hint="free space, then run the release again: what it wrote is kept and checked")
        raise ExternalCommandError(f"command failed (exit {result.returncode}): git {cmd.quote(args)}\n{said}")
    return result


def brief(text: str, lines: int = 5) -> str:
    """What git said, briefly: its `fatal:`/`error:` lines, which name the file (a lock's path), then its last
    lines (git's advice after a failed lock is five lines on its own)."""
    said = text.rstrip().splitlines()
    first = [i for i, line in enumerate(said) if line.startswith(("fatal:", "error:"))][:3]
    return "\n".join(said[i] for i in sorted(set(first) | set(range(max(0, len(said) - lines), len(said)))))


def git_root(start: Path) -> Path:
    if not Path(start).is_dir():
        raise ReleaseError(f"{start} is not a folder")
    result = git(start, "rev-parse", "--show-toplevel", check=False)
    if result.returncode != 0:
        raise ReleaseError(f"{start} is not in a git work tree", hint="run the release from the repository")
    return Path(result.stdout.strip())



def existing_tag(repo: Path, tag: str) -> Optional[str]:
    result = git(repo, "rev-parse", "-q", "--verify", f"refs/tags/{tag}", check=False)
    return result.stdout.strip() or None



def is_commit(repo: Path, rev: str) -> bool:
    return git(repo, "rev-parse", "-q", "--verify", f"{rev}^{{commit}}", check=False).returncode == 0



def tracked_under(repo: Path, rev: str, folder: str) -> List[str]:
    out = git(repo, "ls-tree", "-r", "--name-only", "-z", rev, "--", folder + "/", check=False).stdout
    return [p for p in out.split("\0") if p]



def release_tree(opts: ReleaseOptions, parent: str, files: Sequence[str]) -> str:
    """The parent's tree plus the release folder's files, built in a private index: the work tree, the
    index and every branch stay as they are."""
    with tempfile.TemporaryDirectory(prefix="qualify-release-index-") as tmp:
        env = {"GIT_INDEX_FILE": str(Path(tmp) / "index")}
        git(opts.repo, "read-tree", parent, env=env)
        git(opts.repo, "rm", "-r", "-q", "--cached", "--ignore-unmatch", "--", opts.folder, env=env)
        for name in files:
            blob = git(opts.repo, "hash-object", "-w", "--", str(opts.directory / name)).stdout.strip()
            git(opts.repo, "update-index", "--add", "--cacheinfo", f"100644,{blob},{opts.folder}/{name}", env=env)
        return git(opts.repo, "write-tree", env=env).stdout.strip()


def release_commit(opts: ReleaseOptions, parent: str, files: Sequence[str], message: str) -> str:
    """A commit of release_tree on top of the parent; no branch moves."""
    tree = release_tree(opts, parent, files)
    return git(opts.repo, "commit-tree", tree, "-p", parent, "-F", "-", input_text=message).stdout.strip()



def create_tag(repo: Path, tag: str, message: str, force: bool, commit: str = "HEAD") -> str:
    done = git(repo, "tag", "-a", *(["-f"] if force else []), tag, commit, "-F", "-", input_text=message, check=False)
    if done.returncode != 0:
        now = existing_tag(repo, tag)
        if now and not force:  # two releases of one tag at once: the other made it between our check and here
            raise ReleaseError(f"tag {tag} was made by another run while this one worked ({now[:12]}); nothing of "
                               "this run was tagged", hint=f"run the release again: it checks the tag {tag} holds "
                               "these manifests and finishes what is left, or says which release it holds")
        raise ReleaseError(f"git tag {tag} failed: {brief(done.stderr or done.stdout)}")
    return existing_tag(repo, tag) or ""
