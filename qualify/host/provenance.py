"""Where this toolkit's output comes from: source revision, URL, build epoch."""

from __future__ import annotations

import datetime as dt
import hashlib
import os
import re
from pathlib import Path
from typing import Optional

from qualify import __version__
from qualify.config.targets import REPO_ROOT
from qualify.host import cmd


def _git(*args: str) -> Optional[str]:
    proc = cmd.ask(["git", "-C", str(REPO_ROOT), *args], timeout=10)
    return proc.stdout.strip() if proc.returncode == 0 else None


def revision() -> str:
    """HEAD's commit, with `-dirty` when tracked files differ from it."""
    head = _git("rev-parse", "HEAD") or "unknown"
    dirty = _git("status", "--porcelain", "--untracked-files=no")
    return f"{head}-dirty" if dirty else head


def public_url(remote: str) -> str:
    """A remote as a browsable https URL; '' for a local path or anything that is not a network remote
    (a label must never carry a build host's file system path)."""
    remote = remote.strip()
    m = re.fullmatch(r"(?:ssh://)?git@([\w.-]+)[:/](.+?)(?:\.git)?/?", remote)
    if m:
        return f"https://{m.group(1)}/{m.group(2)}"
    m = re.fullmatch(r"(?:https?|git)://(?:[^@/]+@)?([\w.-]+(?::\d+)?)/(.+?)(?:\.git)?/?", remote)
    return f"https://{m.group(1)}/{m.group(2)}" if m else ""


def source_url() -> str:
    """org.opencontainers.image.source: the origin remote's URL, or '' (the label is then left out)."""
    return public_url(_git("config", "--get", "remote.origin.url") or "")


def qualified_name(name: str) -> str:
    """An image name with its registry spelled out (docker.io/nvidia/cuda, docker.io/library/debian)."""
    first, _, rest = name.partition("/")
    if rest and ("." in first or ":" in first or first == "localhost"):
        return name
    return f"docker.io/{name}" if rest else f"docker.io/library/{name}"


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
