"""The enrolled-hosts chain (`qualify hosts add|remove`): manifests/hosts.json, one version after another.

Each version is signed with the release key, has a sequence one higher than the version before it and names
that version's sha256. Every change holds the hosts file's lock and re-checks, inside it, that the file is
still the bytes it read; the promoter's high-water mark (highwater.PromoterState) is raised by every version
this host writes or reads, so an older file (a removed host re-enrolled by restoring it) is refused here and
by promote. A lost file is never replaced by a new chain at sequence 1 silently: when this host saw the
chain, or git has the file, `--new-chain` is needed, and the new chain starts above everything seen.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional

from qualify.core.errors import ConfigError
from qualify.core.fsutil import write_atomic
from qualify.signing import formats
from qualify.signing.signer import Signer
from qualify.trust import journal
from qualify.trust import records as rec
from qualify.trust.folder import kept_hosts_name, lineage, read_hosts_file
from qualify.trust.highwater import PromoterState
from qualify.trust.verify import TrustedKey, sha256


@dataclass(frozen=True)
class Changed:
    hosts: rec.EnrolledHosts
    written: bool
    notes: List[str]


def _in_git(path: Path) -> bool:
    """Whether git's history has the file (a lost file there is restored, not started over)."""
    from qualify.host import cmd

    done = cmd.ask(["git", "log", "-n1", "--format=%H", "--", path.name], cwd=str(path.parent), timeout=120)
    return done.returncode == 0 and bool(done.stdout.strip())  # no git, no repository: nothing to restore from


def _floor(marks: PromoterState, key: TrustedKey):
    def floor(hosts: rec.EnrolledHosts, sha: str) -> str:
        return marks.hosts_problem(key.fingerprint, hosts.sequence, sha, hosts.previous_sha256)
    return floor


def recover(path: Path, key: TrustedKey, state: Optional[Path] = None) -> List[str]:
    """Finish what a killed `hosts add/remove` staged completely (or remove what it had not), under the hosts
    file's lock: notes for the user, which the command prints before it goes on (and fails, maybe)."""
    path = Path(path)
    with journal.hosts_lock(path), PromoterState(state) as marks:
        return journal.recover_journals(path.parent, journal.hosts_check(path, key, _floor(marks, key)))


def finished_a_write(notes: List[str]) -> bool:
    return any(n.startswith(journal.FINISHED) for n in notes)


def _keep(path: Path, vh) -> None:
    """The version about to be replaced, kept beside the file as hosts.<sequence>.json with the signatures it was
    verified with (as promote keeps each promotion record it replaces): every link of the chain stays at hand
    for a verifier, even where git does not have it. A kill after this leaves a copy of the current version
    (an ancestor at hand, harmless)."""
    kept = path.parent / kept_hosts_name(path.name, vh.hosts.sequence)
    if kept.exists() or kept.is_symlink():
        if not kept.is_symlink() and kept.is_file() and kept.read_bytes() == vh.signed.data:
            return
        raise ConfigError(f"{kept} is kept as sequence {vh.hosts.sequence} of the chain, but it is not {path} "
                          f"(sequence {vh.hosts.sequence}, sha256 {vh.sha256[:12]}...): two versions of one sequence "
                          "(a fork of the chain)", hint=f"look at both; keep the one the chain was made from, and "
                          f"move {kept} away")
    write_atomic(kept, vh.signed.data)
    write_atomic(formats.signature_path(kept), vh.signed.signature)
    if vh.signed.bundle is not None:
        write_atomic(formats.bundle_path(kept), vh.signed.bundle)


def change(path: Path, signer: Signer, key: TrustedKey, add: Optional[rec.EnrolledHost] = None, remove: str = "",
           new_chain: bool = False, replace: bool = False, state: Optional[Path] = None,
           recovered: bool = False, history: Optional[Path] = None) -> Changed:
    """Enroll `add` or withdraw `remove` in the hosts file at `path`, as the next version of its chain.
    `recovered`: the caller has just finished an interrupted write (recover), which may be this very change."""
    path = Path(path)
    with journal.hosts_lock(path), PromoterState(state) as marks:
        notes = journal.recover_journals(path.parent, journal.hosts_check(path, key, _floor(marks, key)))
        recovered = recovered or finished_a_write(notes)
        mark = marks.key(key.fingerprint).hosts
        vh = None
        if path.exists() or path.is_symlink():
            if new_chain:
                raise ConfigError(f"--new-chain: {path} exists; a new chain starts only when the file is lost",
                                  hint="drop --new-chain")
            vh = read_hosts_file(path, key)
            marks.observe_hosts(key.fingerprint, vh.hosts.sequence, vh.sha256, vh.hosts.previous_sha256, str(path),
                                lineage(vh, key, path, history))
            current, previous = vh.hosts, vh.sha256
        elif new_chain:
            base = mark.sequence if mark else 0
            current, previous = rec.EnrolledHosts(base, ()), None
            notes.append(f"--new-chain: {path} starts a NEW chain at sequence {base + 1}" + (
                f", above sequence {base} this host saw" if mark else "") + "; hosts enrolled before are not carried "
                "over (enroll each again)")
        elif mark is not None or _in_git(path):
            seen = f"this host saw sequence {mark.sequence} of it" if mark else "git's history has it"
            raise ConfigError(f"{path} is missing, but {seen}: starting again at sequence 1 would let every older "
                              "signed version count again",
                              hint=f"restore it (git checkout -- {path}); or, to start over on purpose, pass "
                              "--new-chain (the new chain starts above every sequence seen)")
        else:
            current, previous = rec.EnrolledHosts(0, ()), None
            notes.append(f"{path}: the first enrolled-hosts file of release key {key.fingerprint} (sequence 1)")
        hosts = list(current.hosts)
        if add is not None:
            existing = current.host(add.name)
            if existing is not None and existing.same_signer(add):
                notes.append(f"{add.name} is already enrolled with this key; nothing changed")
                return Changed(current, False, notes)
            if existing is not None and not replace:
                raise ConfigError(f"{add.name} is already enrolled in {path} with another key ("
                                  f"{existing.fingerprint or existing.identity}); refusing to replace it silently",
                                  hint="pass --replace to enroll the new key in its place, or choose another name")
            if existing is not None:
                notes.append(f"{add.name}: its key is REPLACED ({existing.fingerprint or existing.identity} -> "
                             f"{add.fingerprint or add.identity}); evidence it signed with the old key no longer counts")
            hosts = [h for h in hosts if h.name != add.name] + [add]
        if remove:
            if current.host(remove) is None and recovered:  # the same command again, after a kill: converged
                notes.append(f"{remove} is not enrolled in {path} (sequence {current.sequence}): the interrupted "
                             "write finished above removed it; nothing changed")
                return Changed(current, False, notes)
            if current.host(remove) is None:
                names = ", ".join(h.name for h in current.hosts) or "none"
                raise ConfigError(f"{remove} is not enrolled in {path} (sequence {current.sequence}; enrolled: {names})",
                                  hint="check the name with: python -m qualify hosts list --key cosign.pub")
            hosts = [h for h in hosts if h.name != remove]
        new = rec.EnrolledHosts(current.sequence + 1, tuple(hosts), previous_sha256=previous)
        data = new.to_bytes()
        if vh is not None:
            _keep(path, vh)
        journal.write_signed_files(path.parent, [(path.name, data)], signer, key, replaces={path.name: previous})
        marks.observe_hosts(key.fingerprint, new.sequence, sha256(data), new.previous_sha256, str(path),
                            new_chain=new_chain)
        return Changed(new, True, notes)
