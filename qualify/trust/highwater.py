"""High-water marks: the newest of each signed chain a host has seen, which only ever rise (TUF's rule).

Two hosts keep them, each in its own file, both keyed by the release key's fingerprint and the tag:

- the promoter (`qualify promote`, `qualify hosts`): `<QUALIFY_TRUST_DIR, default STATE_DIR/trust>/
  promoter-state.json`, with the highest enrolled-hosts sequence (and its sha256) per release key and, per
  release, its sequence, release.json sha256 and per target the newest promotion record's sequence and
  sha256. `nox -s clean` never removes it (not even with --all: host/paths.py STATE_NEVER_REMOVED).
- the deploy host: `DEPLOY_DIR/accepted-releases.json` (deploy/state.py), the same release marks.

`problem` judges one target of a release against a mark: an older release sequence, other content at the
same sequence, an older promotion (restored files: a demotion undone), or a newer promotion whose ledger
does not lead through the one seen (a ledger rewritten: a fork) is refused, naming what was seen.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Dict, Mapping, Optional

from qualify.core.errors import VerificationError
from qualify.core.fsutil import canonical_json, file_lock, write_atomic
from qualify.core.readlimit import read_small, strict_json
from qualify.host import paths
from qualify.trust.fields import HEX, Fields, format_time

SCHEMA = "https://blackwell-qualify.dev/promoter-state/v1"
STATE_FILE = "promoter-state.json"
MAX_BYTES = 16 << 20


class RollbackError(VerificationError):
    """A signed file older than what this host has seen of its chain, or a fork of it."""


@dataclass(frozen=True)
class TargetMark:
    promotion: int  # the newest promotion record's sequence (0: never promoted)
    sha256: str = ""  # that record's sha256 ("" when unknown: the registry's release statement names none)
    manifest_sha256: str = ""

    def as_json(self) -> Dict[str, Any]:
        return {"promotion": self.promotion, "sha256": self.sha256, "manifest_sha256": self.manifest_sha256}


@dataclass(frozen=True)
class ReleaseMark:
    sequence: int
    release_sha256: str
    targets: Mapping[str, TargetMark] = field(default_factory=dict)

    def as_json(self) -> Dict[str, Any]:
        return {"sequence": self.sequence, "release_sha256": self.release_sha256,
                "targets": {t: m.as_json() for t, m in sorted(self.targets.items())}}


@dataclass(frozen=True)
class Seen:
    """One target of one release as a reader verified it."""

    tag: str
    sequence: int
    release_sha256: str
    target: str
    promotion: int
    promotion_sha256: str
    manifest_sha256: str
    chain: Callable[[int], Optional[str]] = lambda sequence: None  # the ledger's sha256 of a sequence, if known


def problem(mark: Optional[ReleaseMark], seen: Seen) -> str:
    """Why `seen` is older than, or a fork of, what `mark` remembers ("" when it is not)."""
    if mark is None:
        return ""
    if seen.sequence < mark.sequence:
        return (f"release {seen.tag} is sequence {seen.sequence} here, but sequence {mark.sequence} of it was seen "
                "before: an older copy of a release made again with --force")
    if seen.sequence > mark.sequence:
        return ""
    if seen.release_sha256 != mark.release_sha256:
        return (f"release {seen.tag} (sequence {seen.sequence}) has other content (release.json sha256 "
                f"{seen.release_sha256[:12]}...) than the one seen before ({mark.release_sha256[:12]}...)")
    before = mark.targets.get(seen.target)
    if before is None:
        return ""
    what = f"{seen.target} of release {seen.tag}"
    if seen.promotion < before.promotion:
        return (f"the newest promotion record of {what} here is promotion {seen.promotion or 'none'}, but promotion "
                f"{before.promotion} was seen before: older promotion files were restored (a demotion undone?)")
    if seen.promotion == before.promotion:
        if (before.sha256 and seen.promotion_sha256 != before.sha256) or \
                (before.manifest_sha256 and seen.manifest_sha256 != before.manifest_sha256):
            return f"promotion {seen.promotion} of {what} is not the one seen before (another record, same sequence)"
        return ""
    behind = seen.chain(before.promotion)
    if before.sha256 and behind is not None and behind != before.sha256:
        return (f"promotion {seen.promotion} of {what} does not descend from promotion {before.promotion} as seen "
                "before: its ledger was rewritten (a fork)")
    return ""


def raised(mark: Optional[ReleaseMark], seen: Seen) -> ReleaseMark:
    """`mark` raised to `seen` (which `problem` accepted); never lowered."""
    if mark is None or seen.sequence > mark.sequence:
        mark = ReleaseMark(seen.sequence, seen.release_sha256, {})
    before = mark.targets.get(seen.target)
    if before is None or seen.promotion > before.promotion or (seen.promotion == before.promotion and not before.sha256):
        targets = {**mark.targets, seen.target: TargetMark(seen.promotion, seen.promotion_sha256, seen.manifest_sha256)}
        mark = replace(mark, targets=targets)
    return mark


def parse_release_mark(f: Fields) -> ReleaseMark:
    f.only("sequence", "release_sha256", "targets")
    targets = {}
    for name, entry in sorted(f.obj("targets").doc.items()):
        t = Fields(entry, f"{f.where}: targets.{name}", f.error).only("promotion", "sha256", "manifest_sha256")
        targets[name] = TargetMark(t.integer("promotion"), t.text("sha256", HEX, empty=True),
                                   t.text("manifest_sha256", HEX, empty=True))
    return ReleaseMark(f.integer("sequence", 1), f.text("release_sha256", HEX), targets)


# --- the promoter's state -----------------------------------------------------------------------


@dataclass(frozen=True)
class HostsMark:
    sequence: int
    sha256: str


@dataclass
class KeyState:
    hosts: Optional[HostsMark] = None
    releases: Dict[str, ReleaseMark] = field(default_factory=dict)


def state_dir() -> Path:
    """Where the promoter's marks live: QUALIFY_TRUST_DIR, else STATE_DIR/trust (never cleaned)."""
    return paths.trust_state()


class PromoterState:
    """The promoter's high-water marks, read and written under one lock (`with PromoterState() as s:`)."""

    def __init__(self, folder: Optional[Path] = None) -> None:
        self.path = Path(folder or state_dir()) / STATE_FILE
        self.keys: Dict[str, KeyState] = {}
        self._lock = None

    def __enter__(self) -> PromoterState:
        self._lock = file_lock(self.path.with_name(self.path.name + ".lock"))
        self._lock.__enter__()
        self.keys = self._load()
        return self

    def __exit__(self, *exc: object) -> None:
        self._lock.__exit__(*exc)

    def _load(self) -> Dict[str, KeyState]:
        if not self.path.exists() and not self.path.is_symlink():
            return {}
        where = str(self.path)
        doc = Fields(strict_json(read_small(self.path, MAX_BYTES, "promoter state", RollbackError), where,
                                 RollbackError), where, RollbackError).only("schema", "keys", "updated")
        if doc.doc.get("schema") != SCHEMA:
            raise RollbackError(f"{where}: not this toolkit's promoter state",
                                hint="look at it: it is what this host saw of each release key's ledgers")
        out = {}
        for fp, entry in sorted(doc.obj("keys").doc.items()):
            k = Fields(entry, f"{where}: keys.{fp}", RollbackError).only("hosts", "releases")
            hosts = k.optional_obj("hosts")
            out[fp] = KeyState(
                HostsMark(hosts.only("sequence", "sha256").integer("sequence", 1), hosts.text("sha256", HEX))
                if hosts else None,
                {tag: parse_release_mark(Fields(m, f"{where}: keys.{fp}.releases.{tag}", RollbackError))
                 for tag, m in sorted(k.obj("releases").doc.items())})
        return out

    def save(self) -> Path:
        doc = {"schema": SCHEMA, "updated": format_time(dt.datetime.now(dt.timezone.utc)), "keys": {
            fp: {"hosts": {"sequence": k.hosts.sequence, "sha256": k.hosts.sha256} if k.hosts else None,
                 "releases": {t: m.as_json() for t, m in sorted(k.releases.items())}}
            for fp, k in sorted(self.keys.items())}}
        return write_atomic(self.path, canonical_json(doc), mode=0o600)

    def key(self, fingerprint: str) -> KeyState:
        return self.keys.setdefault(fingerprint, KeyState())

    # --- the enrolled-hosts chain -----------------------------------------------------------------

    def hosts_problem(self, fingerprint: str, sequence: int, sha: str, previous: Optional[str],
                      lineage: Optional[Callable[[int], Mapping[int, str]]] = None, new_chain: bool = False) -> str:
        """Why the hosts version (`sequence`, `sha`, naming `previous`) is older than, or not a descendant of, the
        one this host saw ("" when it is neither). Above the mark every link down to it is checked: `lineage(m)`
        gives the offered version's chain down to sequence m (sequence -> sha256), verified link by link
        (hostchain.hosts_lineage), and raises when a version between is not at hand. `new_chain`: this host itself
        starts a new chain above the mark (qualify hosts --new-chain)."""
        mark = self.keys.get(fingerprint, KeyState()).hosts
        if mark is None:
            return ""
        if sequence < mark.sequence:
            return (f"it is sequence {sequence}, but this host has seen sequence {mark.sequence} of the enrolled "
                    f"hosts for release key {fingerprint}: an older file (a removed host re-enrolled?)")
        if sequence == mark.sequence:
            return f"it is another file at sequence {sequence} than the one this host saw (a fork of the chain)" \
                if sha != mark.sha256 else ""
        if new_chain:
            return ""
        if sequence == mark.sequence + 1:
            if previous is None:
                return (f"sequence {sequence} names no predecessor (previous_sha256 null: a new chain), but this host "
                        f"saw sequence {mark.sequence}: a new chain would re-enroll whatever it lists")
            if previous != mark.sha256:
                return (f"it names a predecessor other than the sequence {mark.sequence} this host saw (a fork of the "
                        "chain)")
            return ""
        if lineage is None:
            return (f"it is sequence {sequence}, this host saw sequence {mark.sequence}: the versions between cannot "
                    "be checked here")
        chain = lineage(mark.sequence)
        if chain.get(mark.sequence) != mark.sha256:
            return (f"sequence {sequence} does not descend from sequence {mark.sequence} (sha256 "
                    f"{mark.sha256[:12]}...) that this host saw: its chain leads through another sequence "
                    f"{mark.sequence} (sha256 {(chain.get(mark.sequence) or '?')[:12]}...), a fork of the chain "
                    "(a removed host re-enrolled by a second admin's versions?)")
        return ""

    def observe_hosts(self, fingerprint: str, sequence: int, sha: str, previous: Optional[str], where: str,
                      lineage: Optional[Callable[[int], Mapping[int, str]]] = None, new_chain: bool = False) -> None:
        """Remember a verified hosts file (raising the mark), or refuse it as older than one seen, or as not
        descending from it link by link (the mark stays)."""
        try:
            why = self.hosts_problem(fingerprint, sequence, sha, previous, lineage, new_chain)
        except VerificationError as exc:  # a version between the mark and the one offered is not at hand
            raise RollbackError(f"refusing the enrolled hosts {where}: {exc.message}", hint=exc.hint) from None
        if why:
            raise RollbackError(f"refusing the enrolled hosts {where}: {why}",
                                hint="restore the newest manifests/hosts.json (git log -- manifests/hosts.json)")
        k = self.key(fingerprint)
        if k.hosts is None or sequence > k.hosts.sequence:
            k.hosts = HostsMark(sequence, sha)
            self.save()

    # --- release ledgers ------------------------------------------------------------------------------

    def observe_release(self, fingerprint: str, seen: Seen, where: str) -> None:
        k = self.key(fingerprint)
        mark = k.releases.get(seen.tag)
        why = problem(mark, seen)
        if why:
            raise RollbackError(f"refusing {where}: {why}",
                                hint="restore the release folder (its newest promotion files) from where it was last "
                                "promoted; promote never continues from an older state")
        new = raised(mark, seen)
        if new != mark:
            k.releases[seen.tag] = new
            self.save()
