"""SHA256SUMS over every release input, in exactly the format `sha256sum` writes.

`<64 hex>  <relative path>` per line, sorted by path, so `sha256sum --check
SHA256SUMS` works in the repository root. In a git work tree the inputs are
the files git tracks plus untracked files it does not ignore (`git ls-files
-c -o --exclude-standard`); elsewhere the input folders are walked. Standard
library only.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Iterable, List

from qualify.core.errors import ConfigError, ExternalCommandError, VerificationError
from qualify.core.fsutil import sha256_file, write_atomic
from qualify.host import cmd

SUMS_FILE = "SHA256SUMS"
INPUT_DIRS = ("images", "scripts")
INPUT_FILES = ("start.sh", ".env.example", "noxfile.py", "pyproject.toml")
# Every module of the toolkit is an input (the image side runs inside images,
# the host side decides what is built, signed and deployed) except the CLI's
# command modules, which only parse arguments and hand over.
PACKAGE_DIR = "qualify"
CLI_DIR = "qualify/cli/"
# Data the package ships that decides what is deployed: the committed tiny model's files.
DATA_DIRS = ("qualify/tinymodel/model/",)
_SKIP_DIRS = {"__pycache__", ".git", ".nox", ".venv"}


def is_release_input(rel: str) -> bool:
    parts = rel.split("/")
    if any(p in _SKIP_DIRS for p in parts[:-1]) or rel.endswith((".pyc", ".pyo")):
        return False
    if rel in INPUT_FILES or any(rel.startswith(d + "/") for d in INPUT_DIRS):
        return True
    if rel.startswith(DATA_DIRS):
        return True
    return parts[0] == PACKAGE_DIR and rel.endswith(".py") and not rel.startswith(CLI_DIR)


def _git_files(root: Path) -> List[str]:
    out = cmd.call(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=str(root)).stdout
    return [p for p in out.split("\0") if p]


def _in_git_work_tree(root: Path) -> bool:
    try:
        result = cmd.call(["git", "rev-parse", "--is-inside-work-tree"], cwd=str(root), check=False)
    except ExternalCommandError:  # no git at all: walk instead
        return False
    return result.returncode == 0 and result.stdout.strip() == "true"


def _walked_files(root: Path) -> List[str]:
    found = [f for f in INPUT_FILES if (root / f).is_file()]
    for top in ("images", "scripts", PACKAGE_DIR):
        for dirpath, dirnames, filenames in os.walk(root / top):
            dirnames[:] = [d for d in dirnames if d not in _SKIP_DIRS and not d.startswith(".")]
            rel_dir = Path(dirpath).relative_to(root).as_posix()
            found += [f"{rel_dir}/{name}" for name in filenames]
    return found


def input_files(root: Path) -> List[str]:
    """Relative POSIX paths of the release inputs present under `root`, sorted."""
    root = Path(root)
    names = _git_files(root) if _in_git_work_tree(root) else _walked_files(root)
    # git lists tracked files that were deleted from disk; those are not inputs now.
    picked = sorted({n for n in names if is_release_input(n) and (root / n).is_file()})
    for name in picked:
        if "\n" in name or "\\" in name:
            raise ConfigError(f"{name!r}: sha256sum would escape this file name; rename it")
    return picked


def compute(root: Path) -> Dict[str, str]:
    root = Path(root)
    return {name: sha256_file(root / name) for name in input_files(root)}


def render(sums: Dict[str, str]) -> str:
    return "".join(f"{sums[name]}  {name}\n" for name in sorted(sums))


def parse(text: str, source: str = SUMS_FILE) -> Dict[str, str]:
    """Lines of `sha256sum` output (text `  ` or binary ` *` mode)."""
    sums: Dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        digest, sep, name = line[:64], line[64:66], line[66:]
        if len(digest) != 64 or sep not in ("  ", " *") or not name or any(c not in "0123456789abcdef" for c in digest):
            raise ConfigError(f"{source}:{number}: not a sha256sum line: {line!r}")
        sums[name] = digest
    return sums


@dataclass(frozen=True)
class SumsReport:
    missing: List[str] = field(default_factory=list)  # listed, not on disk
    changed: List[str] = field(default_factory=list)  # listed, content differs
    unlisted: List[str] = field(default_factory=list)  # an input the file does not list

    @property
    def ok(self) -> bool:
        return not (self.missing or self.changed or self.unlisted)

    def lines(self) -> Iterable[str]:
        for kind in ("missing", "changed", "unlisted"):
            for name in getattr(self, kind):
                yield f"{kind}: {name}"


def compare(listed: Dict[str, str], root: Path) -> SumsReport:
    root = Path(root)
    current = input_files(root)
    missing = sorted(n for n in listed if not (root / n).is_file())
    changed = sorted(n for n in listed if n not in missing and sha256_file(root / n) != listed[n])
    unlisted = sorted(n for n in current if n not in listed)
    return SumsReport(missing, changed, unlisted)


def write(root: Path, out: Path = None) -> Path:
    root = Path(root)
    return write_atomic(out or root / SUMS_FILE, render(compute(root)))


def check(root: Path, sums_file: Path = None) -> SumsReport:
    root = Path(root)
    sums_file = Path(sums_file or root / SUMS_FILE)
    try:
        text = sums_file.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise VerificationError(f"{sums_file} not found", hint="write it with `nox -s sums`") from None
    return compare(parse(text, str(sums_file)), root)


def staged(root: Path) -> Dict[str, str]:
    """Sums of the release inputs as git's index holds them: exactly what the next commit records, whatever the
    work tree holds besides (a half-staged edit, an untracked file). One `git cat-file --batch` reads them."""
    import hashlib

    root = Path(root)
    out = cmd.call(["git", "ls-files", "-z", "--cached"], cwd=str(root)).stdout
    names = sorted(n for n in out.split("\0") if n and is_release_input(n) and n != SUMS_FILE)
    if not names:
        return {}
    proc = cmd.output(["git", "cat-file", "--batch"], cwd=str(root), timeout=300,
                      input_bytes="".join(f":{n}\n" for n in names).encode())
    if proc.returncode != 0:
        raise ExternalCommandError(f"git cat-file --batch failed: {proc.stderr.decode(errors='replace')[-300:]}")
    data, pos, sums = proc.stdout, 0, {}
    for name in names:
        header_end = data.index(b"\n", pos)
        header = data[pos:header_end].split()
        if len(header) != 3 or header[1] != b"blob":  # "<name> missing": deleted from the index
            pos = header_end + 1
            continue
        size = int(header[2])
        body = data[header_end + 1: header_end + 1 + size]
        sums[name] = hashlib.sha256(body).hexdigest()
        pos = header_end + 1 + size + 1
    return sums


def write_staged(root: Path) -> Path:
    """SHA256SUMS of the index's release inputs, written and added to the index (the pre-commit hook)."""
    root = Path(root)
    path = write_atomic(root / SUMS_FILE, render(staged(root)))
    cmd.call(["git", "add", "--", SUMS_FILE], cwd=str(root))
    return path
