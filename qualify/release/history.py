"""The releases a repository already has, read from its tags and verified with the release key: where a
new release stands among them (its sequence number and predecessor) and which one the changelog compares
with. Tags whose release.json does not verify with this key (another key, an older toolkit's unsigned
index) are not releases of this key and are passed over."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional, Tuple

from qualify.core.errors import QualifyError
from qualify.core.readlimit import SIGNATURE_LIMIT
from qualify.release import records as rec
from qualify.release.folder import RECORD_LIMIT, TrustedKey, sha256, verify_blob
from qualify.release.order import ReleaseOrder, tag_problem
from qualify.signing import formats

MAX_TAGS = 5000


@dataclass(frozen=True)
class Released:
    index: rec.ReleaseIndex
    sha256: str

    @property
    def order(self) -> ReleaseOrder:
        return self.index.order


def _git_bytes(repo: Path, *args: str) -> Optional[bytes]:
    try:
        proc = subprocess.run(["git", *args], cwd=str(repo), capture_output=True, timeout=60, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout if proc.returncode == 0 else None


def tagged_release(repo: Path, root: str, tag: str, key: TrustedKey) -> Optional[Released]:
    """The release index tag `tag` carries at `<root>/<tag>/release.json`, verified with `key`; else None."""
    path = f"{root}/{tag}/{rec.INDEX_FILE}"
    data = _git_bytes(repo, "show", f"refs/tags/{tag}:{path}")
    signature = _git_bytes(repo, "show", f"refs/tags/{tag}:{path}{formats.SIGNATURE_SUFFIX}")
    if data is None or signature is None or len(data) > RECORD_LIMIT or len(signature) > SIGNATURE_LIMIT:
        return None
    try:
        verify_blob(key, data, signature, None, f"{tag}:{path}")
        index = rec.ReleaseIndex.parse(data, f"{tag}:{path}")
    except QualifyError:
        return None
    return Released(index, sha256(data)) if index.tag == tag else None


def released(repo: Path, root: str, key: TrustedKey) -> List[Released]:
    out = (_git_bytes(repo, "tag", "-l") or b"").decode("utf-8", "replace").split()
    found = []
    for tag in out[:MAX_TAGS]:
        if not tag_problem(tag):
            r = tagged_release(repo, root, tag, key)
            if r is not None:
                found.append(r)
    return sorted(found, key=lambda r: r.order)


def place(tag: str, history: List[Released], forced: bool) -> Tuple[int, Optional[rec.Predecessor]]:
    """(sequence, predecessor) of a new release `tag` among `history`. A re-run of the same release (its tag
    not made yet) gives the same answer; `--force` over an existing tag gives it a higher sequence, so hosts
    that accepted the old one take the new one as newer."""
    others = [r for r in history if r.index.tag != tag or forced]
    sequence = 1 + max((r.index.sequence for r in others), default=0)
    mine = ReleaseOrder.of(tag, sequence)
    below = [r for r in history if r.index.tag != tag and r.order < mine]
    if not below:
        return sequence, None
    p = below[-1]
    return sequence, rec.Predecessor(p.index.tag, p.index.sequence, p.sha256)


def source_time(repo: Path, revision: str) -> str:
    """The source commit's committer time, UTC: a release's time that a re-run gives again."""
    import datetime as dt

    out = _git_bytes(repo, "show", "-s", "--format=%ct", revision)
    seconds = int(out.decode().strip()) if out and out.decode().strip().isdigit() else 0
    return rec.format_time(dt.datetime.fromtimestamp(seconds, dt.timezone.utc))
