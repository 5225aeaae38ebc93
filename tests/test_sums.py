"""SHA256SUMS: the release inputs, in exactly sha256sum's format, in a temporary git repository."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from signing_helpers import run_qualify

from qualify.core.errors import ConfigError, VerificationError
from qualify.release import sums

INPUTS = [
    ".env.example",
    "images/allocator/triton_allocator_hook.py",
    "images/locks/sm120/vllm.txt",
    "images/sm120/Dockerfile",
    "images/targets.toml",
    "noxfile.py",
    "pyproject.toml",
    "qualify/__init__.py",
    "qualify/manifest.py",
    "qualify/probe/__init__.py",
    "qualify/probe/fatbin.py",
    "scripts/setup-host.sh",
    "start.sh",
]
NOT_INPUTS = [
    "README.md",  # documentation, not a release input
    "qualify/cli/sign_cmd.py",  # host-side command, not imported by the probe
    "tests/test_x.py",
    "manifests/v1/sm120.json",
]


def git(root: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=root, check=True, capture_output=True, text=True).stdout


@pytest.fixture
def tree(tmp_path) -> Path:
    root = tmp_path / "repo"
    for rel in INPUTS + NOT_INPUTS:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(f"# content of {rel}\n")
    (root / "qualify/__pycache__").mkdir()
    (root / "qualify/__pycache__/manifest.cpython-311.pyc").write_bytes(b"\0pyc")
    (root / "images/build-cache").mkdir()
    (root / "images/build-cache/layer.tar").write_bytes(b"ignored")
    (root / ".gitignore").write_text("__pycache__/\n*.pyc\nimages/build-cache/\n")
    return root


@pytest.fixture
def repo(tree) -> Path:
    git(tree, "init", "-q", "-b", "main")
    git(tree, "add", "-A")
    git(tree, "-c", "user.name=T", "-c", "user.email=t@example.invalid", "commit", "-q", "-m", "inputs")
    return tree


def test_inputs_are_exactly_the_release_inputs(repo):
    (repo / "scripts/new-untracked.sh").write_text("echo new\n")  # present and not ignored: an input
    assert sums.input_files(repo) == sorted(INPUTS + ["scripts/new-untracked.sh"])


def test_written_file_is_what_sha256sum_writes_and_checks(repo):
    path = sums.write(repo)
    assert path == repo / "SHA256SUMS"
    expected = subprocess.run(["sha256sum", *INPUTS], cwd=repo, check=True, capture_output=True, text=True).stdout
    assert path.read_text() == expected  # same bytes, same order
    result = subprocess.run(["sha256sum", "--check", "--strict", "SHA256SUMS"], cwd=repo, capture_output=True,
                            text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert not list(repo.glob(".SHA256SUMS.*"))  # the atomic write left no temporary file
    assert sums.check(repo).ok


def test_check_reports_missing_changed_and_unlisted(repo):
    sums.write(repo)
    (repo / "start.sh").write_text("changed\n")
    (repo / "images/targets.toml").unlink()
    (repo / "images/sm121").mkdir()
    (repo / "images/sm121/Dockerfile").write_text("FROM scratch\n")
    report = sums.check(repo)
    assert report.missing == ["images/targets.toml"]
    assert report.changed == ["start.sh"]
    assert report.unlisted == ["images/sm121/Dockerfile"]
    assert list(report.lines()) == ["missing: images/targets.toml", "changed: start.sh",
                                    "unlisted: images/sm121/Dockerfile"]


def test_walks_when_not_in_git(tree):
    # No git repository: the input folders are walked; caches are still skipped.
    assert sums.input_files(tree) == sorted(INPUTS + ["images/build-cache/layer.tar"])


def test_parse_accepts_both_modes_and_rejects_garbage():
    line = "ab" * 32
    assert sums.parse(f"{line}  start.sh\n{line} *pyproject.toml\n") == {"start.sh": line, "pyproject.toml": line}
    with pytest.raises(ConfigError, match="SHA256SUMS:1"):
        sums.parse("not a checksum line\n")


def test_cli_write_and_check(repo):
    # Run from outside: the fake tree has its own `qualify/` that would shadow the real package.
    root = ["--root", str(repo)]
    written = run_qualify(["sums", "write", *root], repo.parent)
    assert written.returncode == 0 and f"{len(INPUTS)} files" in written.stdout, written.stderr
    ok = run_qualify(["sums", "check", *root], repo.parent)
    assert ok.returncode == 0 and "SHA256SUMS: OK" in ok.stdout
    (repo / "noxfile.py").write_text("# edited\n")
    bad = run_qualify(["sums", "check", "--json", *root], repo.parent)
    assert bad.returncode == VerificationError.exit_code and '"changed": [\n    "noxfile.py"' in bad.stdout
    assert "1 changed" in bad.stderr


def test_deleted_tracked_file_is_not_an_input(repo):
    (repo / "scripts/setup-host.sh").unlink()  # still in git's index
    assert "scripts/setup-host.sh" not in sums.input_files(repo)


def test_repository_sha256sums_matches_the_release_inputs():
    """What CI checks with `sha256sum --check SHA256SUMS`: regenerate with `nox -s sums`."""
    import subprocess
    from pathlib import Path

    repo = Path(__file__).resolve().parent.parent
    out = subprocess.run(["sha256sum", "--quiet", "--check", "SHA256SUMS"], cwd=repo, capture_output=True, text=True)
    report = sums.check(repo)
    assert out.returncode == 0 and report.ok, ("\n".join(report.lines()) + "\nrun `python3 -m qualify sums write` "
                                               "(or commit through scripts/git-hooks/pre-commit, which does it)")
    listed = {line.split("  ", 1)[1] for line in (repo / "SHA256SUMS").read_text().splitlines()}
    for must in ("images/targets.toml", "images/Dockerfile", "start.sh", "noxfile.py", "qualify/probe/runner.py",
                 "scripts/setup-host.sh", "images/triton-allocator/blackwell_triton_allocator.py"):
        assert must in listed, must


def test_the_pre_commit_hook_records_what_the_commit_holds(tmp_path):
    """Issue 28: an edit to a release input no longer fails CI until `nox -s sums`. The hook (real git, the
    repository's hook script) sums the index, so a half-staged edit and an untracked file do not leak in."""
    import shutil
    import subprocess
    from pathlib import Path

    repo = Path(__file__).resolve().parent.parent
    work = tmp_path / "work"
    (work / "images").mkdir(parents=True)
    (work / "scripts" / "git-hooks").mkdir(parents=True)
    shutil.copy(repo / "scripts" / "git-hooks" / "pre-commit", work / "scripts" / "git-hooks" / "pre-commit")
    shutil.copytree(repo / "qualify", work / "qualify", ignore=shutil.ignore_patterns("__pycache__"))
    (work / "images" / "targets.toml").write_text("one\n")

    def git(*args):
        return subprocess.run(["git", *args], cwd=work, capture_output=True, text=True, timeout=120, check=True)

    git("init", "-q")
    git("config", "user.email", "t@example.invalid")
    git("config", "user.name", "T")
    git("config", "core.hooksPath", "scripts/git-hooks")
    git("add", "-A")
    git("commit", "-q", "-m", "first")
    (work / "images" / "targets.toml").write_text("two\n")
    git("add", "images/targets.toml")
    (work / "images" / "targets.toml").write_text("three, not staged\n")
    (work / "images" / "untracked.txt").write_text("not in the commit\n")
    git("commit", "-q", "-m", "second")
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(work), str(clone)], check=True, timeout=120)
    check = subprocess.run(["sha256sum", "--quiet", "--check", "SHA256SUMS"], cwd=clone, capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    listed = (clone / "SHA256SUMS").read_text()
    assert "images/targets.toml" in listed and "untracked.txt" not in listed
    assert git("status", "--porcelain", "SHA256SUMS").stdout == ""  # the commit took it; nothing left over
