"""Where this toolkit's output comes from: source revision, URL, build epoch."""

from __future__ import annotations

import datetime as dt
import hashlib
import os
import subprocess
from pathlib import Path
from typing import Optional

from qualify import __version__
from qualify.config.targets import REPO_ROOT

PROJECT_URL = "https://github.com/blackwell-qualify/blackwell-qualify"


def _git(*args: str) -> Optional[str]:
    try:
        proc = subprocess.run(["git", "-C", str(REPO_ROOT), *args], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout.strip() if proc.returncode == 0 else None


def revision() -> str:
    """HEAD's commit, with `-dirty` when tracked files differ from it."""
    head = _git("rev-parse", "HEAD") or "unknown"
    dirty = _git("status", "--porcelain", "--untracked-files=no")
    return f"{head}-dirty" if dirty else head


def source_url() -> str:
    return _git("config", "--get", "remote.origin.url") or PROJECT_URL


def source_date_epoch() -> str:
    """SOURCE_DATE_EPOCH if set, else HEAD's commit time (same commit, same labels)."""
    return os.environ.get("SOURCE_DATE_EPOCH") or _git("log", "-1", "--format=%ct") or "0"


def iso(epoch: str) -> str:
    return dt.datetime.fromtimestamp(int(epoch), dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def toolkit_version() -> str:
    return __version__


def sha256sums_digest(path: Path = REPO_ROOT / "SHA256SUMS") -> str:
    """Digest of SHA256SUMS, recorded in image labels (empty when the file is absent)."""
    return "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest() if path.exists() else ""
