"""What this deploy host accepted before, per target: the newest verified release, its promotion, its key.

TUF's rule against rollback: a client remembers the highest version it accepted and refuses older
metadata. Here `<DEPLOY_DIR>/accepted-releases.json` remembers, per target, the release order (version,
release sequence, promotion sequence), the sha256 of the release index and manifest it accepted and the
key that signed them. An older release, an older promotion of the same release (a demotion undone by
restoring old files), the same release with other content, or another key is refused, saying what this
host saw before; `RELEASE_TAG` with `--allow-downgrade` goes back on purpose, `RELEASE_KEY_FINGERPRINT`
accepts a new key. A host with no state trusts on first use (ARCHITECTURE.md, threat model).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Optional

from qualify.core.errors import VerificationError
from qualify.core.fsutil import canonical_json, file_lock, write_atomic
from qualify.core.readlimit import read_small, strict_json
from qualify.release.order import ReleaseOrder
from qualify.release.records import HEX, Fields, format_time

STATE_FILE = "accepted-releases.json"
SCHEMA = "https://blackwell-qualify.dev/deploy-state/v1"
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


def state_path(deploy_dir: Path) -> Path:
    return Path(deploy_dir) / STATE_FILE


def load(deploy_dir: Path) -> Dict[str, Accepted]:
    path = state_path(deploy_dir)
    if not path.exists() and not path.is_symlink():
        return {}
    where = str(path)
    doc = Fields(strict_json(read_small(path, MAX_BYTES, "deploy state", StateError), where, StateError), where,
                 StateError)
    if doc.doc.get("schema") != SCHEMA:
        raise StateError(f"{where}: not this toolkit's deploy state", hint=f"look at it; remove {path} to start over")
    out = {}
    for name, entry in sorted(doc.obj("targets").doc.items()):
        f = Fields(entry, f"{where}: targets.{name}", StateError).only(
            "tag", "sequence", "promotion", "release_sha256", "manifest_sha256", "key_fingerprint", "accepted_at")
        out[name] = Accepted(name, f.text("tag"), f.integer("sequence", 1), f.integer("promotion"),
                             f.text("release_sha256", HEX), f.text("manifest_sha256", HEX), f.text("key_fingerprint"),
                             f.text("accepted_at", empty=True))
    return out


def judge(before: Optional[Accepted], now: Accepted, key_pinned: bool, tag_pinned: bool,
          allow_downgrade: bool) -> str:
    """A note for the log when `now` may be accepted after `before`; StateError when it may not."""
    if before is None:
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
    if tag_pinned and allow_downgrade:
        return f"{now.target}: DOWNGRADE on purpose (--allow-downgrade): {what}, which this host accepted before"
    raise StateError(f"refusing a rollback: {what} that this host accepted on {before.accepted_at or 'an earlier run'}",
                     hint=f"to go back on purpose: set RELEASE_TAG={now.tag} and pass --allow-downgrade")


def remember(deploy_dir: Path, now: Accepted) -> Path:
    """Record `now` as the newest accepted release for its target. Never lowered: after a downgrade on
    purpose the host still knows the newer release, so going back stays an explicit choice each time."""
    path = state_path(deploy_dir)
    with file_lock(path.with_name(path.name + ".lock")):
        known = load(deploy_dir)
        before = known.get(now.target)
        if before is None or before.order < now.order:
            stamp = format_time(dt.datetime.now(dt.timezone.utc))
            known[now.target] = Accepted(**{**now.__dict__, "accepted_at": stamp})
        doc = {"schema": SCHEMA, "targets": {k: v.as_json() for k, v in sorted(known.items())}}
        return write_atomic(path, canonical_json(doc))
