"""What this deploy host accepted before: per target the newest verified release, per release its ledger.

TUF's rule against rollback: a client remembers the highest version it accepted and refuses older
metadata. `<DEPLOY_DIR>/accepted-releases.json` remembers

- per target (`targets`), the newest release order accepted (version, release sequence, promotion
  sequence), the sha256 of the release index and manifest and the key that signed them: an older release,
  the same release with other content, or another key is refused, saying what this host saw before;
  `RELEASE_TAG` with `--allow-downgrade` goes back to an older release on purpose, `RELEASE_KEY_FINGERPRINT`
  accepts a new key;
- per release key and tag (`releases`, release/highwater.py's marks), the release's sequence and sha256 and
  per target the newest promotion record seen (sequence and sha256): an older promotion of a release (a
  demotion undone by restoring files), another record at the same sequence, or a newer one whose ledger does
  not lead through the one seen (a rewritten ledger) is refused, and --allow-downgrade does not change that;
- every release key it accepted (`keys`): a target this host never deployed is still refused under a key
  other than the ones it accepted, unless the key is pinned.

A host with no state trusts on first use (ARCHITECTURE.md, threat model). `seed` (`python -m qualify deploy
seed`, with RELEASE_TAG and RELEASE_KEY_FINGERPRINT pinned) records a known release for every target it has
before the first deploy, so that first deploy is judged against it.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, Optional, Tuple

from qualify.core.errors import VerificationError
from qualify.core.fsutil import canonical_json, file_lock, write_atomic
from qualify.core.readlimit import read_small, strict_json
from qualify.trust import highwater
from qualify.trust.fields import HEX, Fields, format_time
from qualify.trust.order import ReleaseOrder

STATE_FILE = "accepted-releases.json"
SCHEMA = "https://blackwell-qualify.dev/deploy-state/v2"
SCHEMA_V1 = "https://blackwell-qualify.dev/deploy-state/v1"  # per target only: read, then written as v2
MAX_BYTES = 1 << 20


class StateError(VerificationError):
    """The host's remembered releases refuse this one (or the state file is damaged)."""


@dataclass(frozen=True)
class Accepted:
    target: str
    tag: str
    sequence: int
    promotion: int
    release_sha256: str  # the release index (a folder's release.json, or the registry's release statement)
    manifest_sha256: str
    key_fingerprint: str
    accepted_at: str = ""
    promotion_sha256: str = ""  # the newest promotion record's ("" when none, or from the registry)
    chain: Callable[[int], Optional[str]] = field(default=lambda sequence: None, repr=False, compare=False)

    @property
    def order(self) -> ReleaseOrder:
        return ReleaseOrder.of(self.tag, self.sequence, self.promotion)

    def describe(self) -> str:
        promoted = f", promotion {self.promotion}" if self.promotion else ""
        return f"{self.tag} (sequence {self.sequence}{promoted})"

    def as_json(self) -> Dict[str, object]:
        return {"tag": self.tag, "sequence": self.sequence, "promotion": self.promotion,
                "release_sha256": self.release_sha256, "manifest_sha256": self.manifest_sha256,
                "key_fingerprint": self.key_fingerprint, "accepted_at": self.accepted_at}

    @property
    def seen(self) -> highwater.Seen:
        return highwater.Seen(self.tag, self.sequence, self.release_sha256, self.target, self.promotion,
                              self.promotion_sha256, self.manifest_sha256, self.chain)


@dataclass
class Known:
    """The whole state file."""

    targets: Dict[str, Accepted] = field(default_factory=dict)
    releases: Dict[Tuple[str, str], highwater.ReleaseMark] = field(default_factory=dict)  # (key, tag) -> mark

    def get(self, target: str) -> Optional[Accepted]:  # what callers of the per-target state used
        return self.targets.get(target)

    def __getitem__(self, target: str) -> Accepted:
        return self.targets[target]

    @property
    def keys(self) -> set:
        return {a.key_fingerprint for a in self.targets.values()} | {k for k, _ in self.releases}


def state_path(deploy_dir: Path) -> Path:
    return Path(deploy_dir) / STATE_FILE


def load(deploy_dir: Path) -> Known:
    path = state_path(deploy_dir)
    if not path.exists() and not path.is_symlink():
        return Known()
    where = str(path)
    doc = Fields(strict_json(read_small(path, MAX_BYTES, "deploy state", StateError), where, StateError), where,
                 StateError)
    if doc.doc.get("schema") not in (SCHEMA, SCHEMA_V1):
        raise StateError(f"{where}: not this toolkit's deploy state", hint=f"look at it; remove {path} to start over")
    doc.only("schema", "targets", *(("releases",) if doc.doc.get("schema") == SCHEMA else ()))
    out = Known()
    for name, entry in sorted(doc.obj("targets").doc.items()):
        f = Fields(entry, f"{where}: targets.{name}", StateError).only(
            "tag", "sequence", "promotion", "release_sha256", "manifest_sha256", "key_fingerprint", "accepted_at")
        out.targets[name] = Accepted(name, f.text("tag"), f.integer("sequence", 1), f.integer("promotion"),
                                     f.text("release_sha256", HEX), f.text("manifest_sha256", HEX),
                                     f.text("key_fingerprint"), f.text("accepted_at", empty=True))
    if doc.doc.get("schema") == SCHEMA:
        for fp, tags in sorted(doc.obj("releases").doc.items()):
            for tag, mark in sorted(Fields(tags, f"{where}: releases.{fp}", StateError).doc.items()):
                out.releases[(fp, tag)] = highwater.parse_release_mark(
                    Fields(mark, f"{where}: releases.{fp}.{tag}", StateError))
    return out


def judge(before: Optional[Accepted], now: Accepted, key_pinned: bool, tag_pinned: bool,
          allow_downgrade: bool, known: Optional[Known] = None) -> str:
    """A note for the log when `now` may be accepted after `before`; StateError when it may not."""
    known = known or Known()
    ledger = highwater.problem(known.releases.get((now.key_fingerprint, now.tag)), now.seen)
    if ledger:
        raise StateError(f"refusing a rollback: {ledger} (this host's {STATE_FILE})",
                         hint="restore the release folder from where it was promoted; --allow-downgrade goes back to "
                         "an older release, never to an older promotion of one")
    if before is None:
        others = sorted(known.keys - {now.key_fingerprint})
        if others and not key_pinned:
            raise StateError(f"{now.target}: {now.describe()} is signed by {now.key_fingerprint}, but every release this "
                             f"host accepted is signed by {', '.join(others)}",
                             hint=f"if the release key really changed, set RELEASE_KEY_FINGERPRINT={now.key_fingerprint}")
        return (f"{now.target}: the first release this host accepts ({now.describe()}); it is trusted on first use"
                + ("" if key_pinned else " of its key (pin RELEASE_KEY_FINGERPRINT to close that)"))
    if now.key_fingerprint != before.key_fingerprint and not key_pinned:
        raise StateError(f"{now.describe()} is signed by {now.key_fingerprint}, but this host accepted {before.describe()} "
                         f"signed by {before.key_fingerprint} on {before.accepted_at or 'an earlier run'}",
                         hint=f"if the release key really changed, set RELEASE_KEY_FINGERPRINT={now.key_fingerprint}")
    back = now.order < before.order
    other = now.order == before.order and (now.release_sha256, now.manifest_sha256) != \
        (before.release_sha256, before.manifest_sha256)
    if not (back or other):
        if now.order == before.order:
            return f"{now.target}: {now.describe()}, as accepted before"
        return f"{now.target}: {now.describe()}, newer than {before.describe()} accepted on {before.accepted_at}"
    what = (f"{now.describe()} is older than {before.describe()}" if back else
            f"{now.describe()} has other content than the {before.describe()}")
    if tag_pinned and allow_downgrade and now.tag != before.tag:
        return f"{now.target}: DOWNGRADE on purpose (--allow-downgrade): {what}, which this host accepted before"
    raise StateError(f"refusing a rollback: {what} that this host accepted on {before.accepted_at or 'an earlier run'}",
                     hint=f"to go back on purpose: set RELEASE_TAG={now.tag} and pass --allow-downgrade"
                     if now.tag != before.tag else "restore the release folder from where it was promoted")


def of_release(release, target: str) -> Accepted:
    """What accepting `target` of a verified release (folder.VerifiedRelease) means to this host."""
    t = release.target(target)
    return Accepted(target, release.tag, release.index.sequence, t.promotion_sequence, release.index_sha256,
                    t.manifest_sha256, release.key.fingerprint, promotion_sha256=t.promotion_sha256 or "",
                    chain=t.chain_sha256)


def seed(deploy_dir: Path, release) -> list:
    """Remember every target of a release verified with a pinned key and tag, as a deploy would (judged first:
    seeding never lowers what the host knows). Notes for the user."""
    notes = []
    for t in release.targets:
        now = of_release(release, t.target)
        known = load(deploy_dir)
        notes.append(judge(known.get(t.target), now, key_pinned=True, tag_pinned=True, allow_downgrade=False,
                           known=known))
        remember(deploy_dir, now)
    return notes


def remember(deploy_dir: Path, now: Accepted) -> Path:
    """Record `now`: the newest accepted release for its target, and its release's mark. Never lowered: after a
    downgrade on purpose the host still knows the newer release, so going back stays an explicit choice."""
    path = state_path(deploy_dir)
    with file_lock(path.with_name(path.name + ".lock")):
        known = load(deploy_dir)
        before = known.targets.get(now.target)
        stamp = format_time(dt.datetime.now(dt.timezone.utc))
        if before is None or before.order < now.order:
            known.targets[now.target] = Accepted(now.target, now.tag, now.sequence, now.promotion, now.release_sha256,
                                                 now.manifest_sha256, now.key_fingerprint, stamp)
        key = (now.key_fingerprint, now.tag)
        if not highwater.problem(known.releases.get(key), now.seen):
            known.releases[key] = highwater.raised(known.releases.get(key), now.seen)
        releases: Dict[str, Dict[str, object]] = {}
        for (fp, tag), mark in sorted(known.releases.items()):
            releases.setdefault(fp, {})[tag] = mark.as_json()
        doc = {"schema": SCHEMA, "targets": {k: v.as_json() for k, v in sorted(known.targets.items())},
               "releases": releases}
        return write_atomic(path, canonical_json(doc))
