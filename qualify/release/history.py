"""The releases a repository already has, read from its tags and verified with the release key: where a
new release stands among them (its sequence number and predecessor) and which one the changelog compares
with. Each tag's `manifests/<tag>/` is read through one `git cat-file --batch` (trust/sources.py:
GitTagSource) and verified by the one verifier (trust/verify.py: verify_release) as a whole release; tags
whose release does not verify with this key (another key, an older toolkit's unsigned index) are not
releases of this key and are passed over."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional, Tuple

from qualify.core.errors import QualifyError
from qualify.host import cmd
from qualify.trust import records as rec
from qualify.trust.order import ReleaseOrder, tag_problem
from qualify.trust.sources import GitObjects, GitTagSource, tags
from qualify.trust.verify import KeyAnchor, TrustedKey, VerifiedRelease, verify_release

MAX_TAGS = 5000


@dataclass(frozen=True)
class Released:
    release: VerifiedRelease

    @property
    def index(self) -> rec.ReleaseIndex:
        return self.release.index

    @property
    def sha256(self) -> str:
        return self.release.index_sha256

    @property
    def order(self) -> ReleaseOrder:
        return self.index.order


def tagged_release(objects: GitObjects, root: str, tag: str, anchor: KeyAnchor) -> Optional[VerifiedRelease]:
    """The release tag `tag` carries at `<root>/<tag>/`, verified with `anchor`; None when the tag has no
    such folder. A folder that does not verify is a VerificationError."""
    source = GitTagSource.of(objects, root, tag)
    return verify_release(source, anchor) if source is not None else None


def released(repo: Path, root: str, key: TrustedKey) -> List[Released]:
    found = []
    with GitObjects(repo) as objects:
        for tag in tags(repo, MAX_TAGS):
            if tag_problem(tag):
                continue
            try:
                release = tagged_release(objects, root, tag, KeyAnchor(trusted=key))
            except QualifyError:
                continue  # not a release of this key
            if release is not None:
                found.append(Released(release))
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

    out = cmd.output(["git", "show", "-s", "--format=%ct", revision], cwd=str(repo), timeout=60)
    text = out.stdout.decode("ascii", "replace").strip() if out.returncode == 0 else ""
    seconds = int(text) if text.isdigit() else 0
    return rec.format_time(dt.datetime.fromtimestamp(seconds, dt.timezone.utc))
