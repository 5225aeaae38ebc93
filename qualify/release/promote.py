"""Promotion by evidence (the Blackwell support RFC): a target becomes baseline after its required GPU checks pass
in N consecutive runs on its own architecture without a product failure.

Everything starts from verified state and signed policy. The release is read through the one reader with
the release key (the public half of `--key` must be the release's own key), so a manifest whose signature
does not verify is refused, never re-signed; the rule (N, the required GPU checks, the intended level, the
capability and platform) is the release's own (`VerifiedRelease.rule`: release.json's policy, else the
implied rule of an older release), never a targets file. Evidence counts only when an enrolled host signed
it (manifests/hosts.json, signed with the release key), or, loudly and on the record, with
--allow-unsigned-evidence. Each record's outcome is recomputed from its checks under the release's list of
required checks, its time parsed, its identity semantic (the same run once, however it is serialised and
whoever vouches for it).

Serving evidence (issue 39, servecount.py): where the release's signed policy names serving checks for a level
(`level_checks`), a run of a serving target counts toward it only with a verified serve-check record of the
same deployment that passes them (the cpu target: the record alone); without one it does not count.

The ledger only moves forward. Promote holds the release folder's lock and the hosts file's lock, finishes
an interrupted write only when what it would make verifies (journal.release_check), and refuses a folder
whose newest promotion record is older than what this host has seen (highwater.PromoterState: never
cleaned) or whose kept records do not chain (folder.read_release), and an enrolled-hosts file older than the
one this host, or the newest promotion record, saw. What counts is what an earlier promote accepted: the
signed promotion record lists the sha256 of every accepted record kept under manifests/<tag>/evidence/
<target>/; a file there that the record does not name never counts and is listed. A product failure always
lowers the level. The new promotion record (sequence one higher, naming the one it replaces) and the replaced
record, kept as `<target>.promotion.<n>.json`, are written together (journal.write_signed_files: staged, signed,
verified, re-checked, then renamed). The manifest is never rewritten (issue 52): the level lives in the signed
promotion record only, and the manifest stays the bytes release.json names. A release/v2 folder (made before)
is promoted as it was then, its manifest rewritten with the level, so verifiers of that time still read it.
"""

from __future__ import annotations

import copy
import datetime as dt
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

from qualify.core import killpoint
from qualify.core import manifest as mf
from qualify.core.enums import SupportLevel
from qualify.core.errors import ConfigError, QualifyError, VerificationError
from qualify.core.fsutil import write_atomic
from qualify.core.readlimit import read_small, strict_json
from qualify.release import evidence as ev
from qualify.release import rows, servecount, serving
from qualify.signing import formats
from qualify.signing.signer import Signer
from qualify.trust import gpuconfig, journal
from qualify.trust import records as rec
from qualify.trust.folder import HostsAtHand, hosts_chain_check, lineage, read_hosts_file, read_release
from qualify.trust.gpuconfig import SINGLE_GPU, ConfigurationRow
from qualify.trust.highwater import PromoterState, RollbackError, Seen
from qualify.trust.hostchain import check_accepted_signatures
from qualify.trust.policy import TargetRule
from qualify.trust.verify import (
    EVIDENCE,
    EVIDENCE_DIR,
    KeyAnchor,
    TrustedKey,
    VerifiedHosts,
    VerifiedRelease,
    VerifiedTarget,
    sha256,
)

LOWER = {"optimized": "experimental", "baseline": "experimental", "experimental": "unverified"}


@dataclass(frozen=True)
class Counted:
    """One accepted run: its record, the sha256 of the file kept for it, who vouched, its identity, and its
    outcome under the release's rule; where serving evidence counts (servecount.py), the serve-check record
    it counted with (its sha256 and record), why, and whether it lifts an unverified target."""

    record: ev.Evidence
    sha256: str
    host: str  # enrolled host name, or "unsigned"
    identity: str
    outcome: ev.Outcome
    serving_sha256: Optional[str] = None
    served: Optional[serving.ServeRecord] = None
    reason: Optional[str] = None  # None: the record's own (the signed floor or serving evidence may change it)
    lifts: Optional[bool] = None  # None: a pass lifts
    gpu_outcome: Optional[ev.Outcome] = None  # before serving evidence was weighed (None: `outcome` is it)

    @property
    def own_outcome(self) -> ev.Outcome:
        return self.gpu_outcome or self.outcome

    def summary(self) -> rec.CountedEvidence:
        r = self.record
        return rec.CountedEvidence(self.sha256, self.identity, r.time, self.outcome.value,
                                   r.reason if self.reason is None else self.reason, r.gpu.name, r.gpu.driver,
                                   self.host, tuple(sorted(r.figures.items())), r.configuration.key,
                                   self.serving_sha256)

    def judged(self, rule: servecount.ServingRule) -> Counted:
        """This GPU run under the serving rule, with the serve-check record of its deployment it holds."""
        if not rule.counts_serving:
            return self
        own = self.own_outcome
        c = servecount.combine(own, self.record.reason if self.reason is None else self.reason,
                               [self.served] if self.served else [], rule)
        return replace(self, outcome=c.outcome, reason=c.reason, lifts=c.lifts, gpu_outcome=own)


@dataclass(frozen=True)
class Standing:
    level: str
    consecutive_passes: int
    required: int
    counted: Sequence[Counted]  # every distinct run, oldest first
    note: str


def check_binding(record: ev.Evidence, m: mf.Manifest, rule: TargetRule, release: rec.ReleaseIndex, where: str,
                  now: dt.datetime) -> None:
    """Evidence about another release, image, GPU architecture or probe, or from a time it cannot be from,
    is refused, naming which. The capability is the release's signed one (rule), never a targets file's."""
    capability = rule.capability
    if record.release and record.release != release.tag:
        raise ev.EvidenceError(f"{where}: the evidence is for release {record.release}, not {release.tag}",
                               hint="hand in evidence from a deploy of this release")
    if record.image_digest != m.digest:
        raise ev.EvidenceError(f"{where}: the evidence is for image digest {record.image_digest}, not the released "
                               f"{record.target} image {m.digest}", hint="hand in evidence from a deploy of this release")
    if record.capability != capability:
        raise ev.EvidenceError(f"{where}: the evidence is for capability {record.capability}, not capability "
                               f"{capability}, which release {release.tag} signs for {record.target}",
                               hint="hand in evidence from a deploy of this target")
    # A run that saw no GPU on the target's host is an infrastructure failure, reported apart from product
    # failures (the Blackwell support RFC): it is kept, and neither counts nor resets. A run on another GPU proves nothing.
    if record.gpu.capability not in (capability, ev.NO_GPU):
        raise ev.EvidenceError(f"{where}: the evidence was taken on {record.gpu.name} with capability "
                               f"{record.gpu.capability}, not the target's capability {capability}",
                               hint="only a GPU of the target's own architecture proves it (the Blackwell support RFC)")
    if m.probe_sha256 and record.probe_sources_digest != m.probe_sha256:
        raise ev.EvidenceError(f"{where}: the evidence comes from a probe whose sources differ: "
                               f"{record.probe_sources_digest}, the release's probe is {m.probe_sha256}",
                               hint="deploy from the release's own checkout (git checkout TAG) so the probe matches")
    when = record.when
    if when > now + ev.CLOCK_SKEW:
        raise ev.EvidenceError(f"{where}: the evidence is dated {record.time}, in the future (now {rec.format_time(now)})",
                               hint="check the GPU host's clock; evidence from the future is refused")
    released = rec.parse_time(release.time, "release time")
    if when < released:
        raise ev.EvidenceError(f"{where}: the evidence is dated {record.time}, before release {release.tag}'s source "
                               f"({release.time}): it cannot be about this release")


def standing(counted: Iterable[Counted], rule: TargetRule, released_level: str) -> Standing:
    """The Blackwell support RFC's rule over the runs in time order, from the level the target was released at: N passes in a
    row make it baseline (when its intended level allows); a pass lifts an unverified target to experimental;
    a product failure resets the run and always lowers the level (baseline to experimental, experimental to
    unverified, the lowest evidence can give); infrastructure outcomes neither count nor reset."""
    unique = {c.identity: c for c in counted}
    ordered = sorted(unique.values(), key=lambda c: (c.record.when, c.identity))
    required = rule.consecutive_passes
    can_be_baseline = mf.LEVEL_RANK.get(rule.intended_level, 0) >= mf.LEVEL_RANK["baseline"]
    level, streak, notes = released_level, 0, []
    for c in ordered:
        if c.outcome is ev.Outcome.PASS:
            streak += 1
            if streak >= required and can_be_baseline and mf.LEVEL_RANK.get(level, 0) < mf.LEVEL_RANK["baseline"]:
                level = "baseline"
            elif mf.LEVEL_RANK.get(level, 0) < mf.LEVEL_RANK["experimental"]:
                level = "experimental"
        elif c.lifts and mf.LEVEL_RANK.get(level, 0) < mf.LEVEL_RANK["experimental"]:
            level = "experimental"  # its GPU checks passed, its serving evidence is missing: no streak
        elif c.outcome is ev.Outcome.PRODUCT_FAILURE:
            lowered = LOWER.get(level, level)
            notes.append(f"a product failure at {c.record.time} " + (f"lowered {level} to {lowered}" if lowered != level
                                                                       else f"keeps it {level}"))
            level, streak = lowered, 0
    if streak >= required and not can_be_baseline:
        notes.append(f"the target's intended level is {rule.intended_level}")
    return Standing(level, streak, required, tuple(ordered), "; ".join(notes[-3:]))


def configuration_rows(counted: Sequence[Counted], rule: TargetRule, released_level: str
                       ) -> Tuple[List[Counted], Tuple[Counted, ...], Tuple[ConfigurationRow, ...]]:
    """The Blackwell support RFC's rows: the 1-GPU runs (the target's level, from `released_level`) and one row per multi-GPU
    configuration, each standing on its own runs from unverified; also every run, oldest first. A multi-GPU
    run's outcome was already judged by the release's signed all-reduce floors (`_judged`)."""
    grouped = rows.by_configuration(counted)
    single = grouped.pop(SINGLE_GPU.key)
    everything = standing(counted, rule, released_level).counted
    others = []
    for group in grouped.values():
        s = standing(group, rule, SupportLevel.UNVERIFIED.value)
        others.append(ConfigurationRow(group[0].record.configuration, s.level, s.consecutive_passes, s.required,
                                       len(s.counted), s.note))
    return single, everything, tuple(sorted(others, key=lambda r: r.configuration.key))


@dataclass(frozen=True)
class Promoted:
    target: str
    standing: Standing
    manifest: Path
    record: Path
    new: int  # files this run kept: GPU evidence and serve-check records
    sequence: int  # the promotion record's sequence (unchanged when nothing was added)
    ignored: Tuple[str, ...] = ()  # files in evidence/<target>/ the signed record does not name
    written: bool = True
    added: Tuple[Counted, ...] = ()  # the runs this promotion took in, each with its outcome
    rule: Optional[TargetRule] = None
    configurations: Tuple[ConfigurationRow, ...] = ()  # the multi-GPU rows beside the 1-GPU row (`standing`)
    serving: Optional[servecount.ServingRule] = None
    new_serving: int = 0  # of `new`, serve-check records that completed a GPU run (never a run of their own)
    manifest_rewritten: bool = False  # a release/v2 folder: the manifest was rewritten with the level too


def _store(folder: Path, target: str, create: bool = False) -> Path:
    """evidence/<target>/ of a release folder; a symbolic link at either level is refused, never followed."""
    store = folder / EVIDENCE_DIR / target
    for part in (folder / EVIDENCE_DIR, store):
        if part.is_symlink() or (part.exists() and not part.is_dir()):
            raise ConfigError(f"{part} is a symbolic link or not a folder; refused (promote keeps evidence only in "
                              "the release folder itself)", hint=f"remove {part} and hand the evidence in again")
        if create:
            part.mkdir(exist_ok=True)
    return store


def accepted(release: VerifiedRelease, vt: VerifiedTarget, rule: TargetRule) -> Tuple[List[Counted], Tuple[str, ...]]:
    """The runs the signed promotion record accepted (the verified release carries their files, each
    sha-checked: trust/verify.py), parsed; and the names of files in the evidence folder it does not name
    (dropped in by hand, or kept by a promote killed before it signed: they never count). A listed serve-check
    record is re-read and re-judged under the release's serving rule: the cpu target's run itself, or the record
    a GPU run counted with."""
    serve_rule = servecount.rule_for(vt.manifest, rule)
    out = []
    completes: Dict[str, str] = {}  # serve-check record -> the GPU run it completes (each one run, once)
    for a in vt.accepted:
        if a.serving_sha256 and a.serving_sha256 != a.sha256:
            if a.serving_sha256 in completes:
                raise ev.EvidenceError(
                    f"{release.path}/{EVIDENCE_DIR}/{vt.target}/{a.serving_sha256}.json: serve-check record "
                    f"{a.serving_sha256[:12]}... completes two GPU runs ({completes[a.serving_sha256][:12]}... and "
                    f"{a.sha256[:12]}...) in the signed promotion record: one serving test completes one run, once",
                    hint="restore the release folder from where it was promoted")
            completes[a.serving_sha256] = a.sha256
    for a in vt.accepted:
        where = f"{release.path}/{EVIDENCE_DIR}/{vt.target}/{a.sha256}.json"
        if serving.is_serve_record(strict_json(a.data, where, ev.EvidenceError)):
            served = serving.parse(a.data, where)
            run = servecount.as_run(served, serve_rule)
            out.append(Counted(run, a.sha256, a.host, a.identity, run.outcome, a.sha256, served))
            continue
        record = ev.from_bytes(a.data, release.tag, where)
        served = serving.parse(a.serving_data, f"{release.path}/{EVIDENCE_DIR}/{vt.target}/{a.serving_sha256}.json") \
            if a.serving_sha256 and a.serving_data is not None else None
        if served is not None:
            swhere = f"{release.path}/{EVIDENCE_DIR}/{vt.target}/{a.serving_sha256}.json"
            if not servecount.pairs_with(record, served):
                raise ev.EvidenceError(f"{swhere}: the serve-check record GPU run {a.sha256[:12]}... counted with was "
                                       "not made against that run (its gpu_evidence names another run id, host, time, "
                                       "GPU or tensor-parallel size)", hint="restore the release folder from where it "
                                       "was promoted")
        out.append(replace(_counted(record, a.sha256, a.host, record.identity, rule),
                           serving_sha256=a.serving_sha256, served=served).judged(serve_rule))
    return out, vt.unlisted


def _judged(record: ev.Evidence, rule: TargetRule) -> Tuple[ev.Outcome, str]:
    """A run's outcome under the release's signed rule, recomputed from its checks: the required GPU checks (and
    for several GPUs the NCCL check), then a multi-GPU pass against the signed all-reduce floor for its
    configuration (rows.by_floor); with the reason when the floor changed it ("" otherwise)."""
    required = gpuconfig.required_checks(record.configuration, rule.required_gpu_checks)
    outcome = ev.outcome_of(record.checks, record.gpu.capability, rule.capability, required).outcome
    return rows.by_floor(record, outcome, rule.allreduce_floors)


def _outcome(record: ev.Evidence, rule: TargetRule) -> ev.Outcome:
    return _judged(record, rule)[0]


def _counted(record: ev.Evidence, sha: str, host: str, identity: str, rule: TargetRule) -> Counted:
    outcome, reason = _judged(record, rule)
    return Counted(record, sha, host, identity, outcome, reason=reason or None)


def _seen(release: VerifiedRelease, vt: VerifiedTarget) -> Seen:
    return Seen(release.tag, release.index.sequence, release.index_sha256, vt.target, vt.promotion_sequence,
                vt.promotion_sha256 or "", vt.manifest_sha256, vt.chain_sha256)


def _floor(marks: PromoterState, key: TrustedKey):
    """A journal's view of the folder must not be older than what this host saw (journal.release_check)."""
    from qualify.trust.highwater import problem

    def floor(release: VerifiedRelease) -> str:
        mark = marks.keys.get(key.fingerprint)
        for vt in release.targets:
            why = problem(mark.releases.get(release.tag) if mark else None, _seen(release, vt))
            if why:
                return why
        return ""

    return floor


def _hosts(marks: PromoterState, release: VerifiedRelease, hosts_file: Optional[Path],
           key: TrustedKey, history: Optional[Path] = None) -> Optional[VerifiedHosts]:
    """The enrolled hosts, verified and held to the chain: never older than what this host saw (recorded at
    once, whatever promote decides later) or than what the newest promotion records were checked against, and
    descending link by link from each (every version between at hand: kept beside it, in `history`, or in
    git's history of the file)."""
    mark = marks.key(key.fingerprint).hosts
    bound = max((t.promotion.hosts_sequence for t in release.targets if t.promotion), default=0)
    if hosts_file is None or not (hosts_file.exists() or hosts_file.is_symlink()):
        if mark is not None or bound:
            raise RollbackError(f"the enrolled-hosts file {hosts_file or 'manifests/hosts.json'} is missing, but "
                                f"sequence {max(mark.sequence if mark else 0, bound)} of it was seen for release key "
                                f"{key.fingerprint}", hint="restore manifests/hosts.json (git checkout -- "
                                "manifests/hosts.json), or pass --hosts with it")
        return None
    try:
        vh = read_hosts_file(hosts_file, key)
    except QualifyError as exc:
        raise ConfigError(f"the enrolled hosts cannot be used: {exc.message}", hint=exc.hint) from None
    marks.observe_hosts(key.fingerprint, vh.hosts.sequence, vh.sha256, vh.hosts.previous_sha256, str(hosts_file),
                        lineage(vh, key, hosts_file, history))
    for t in release.targets:
        p = t.promotion
        if p and (p.hosts_sequence > vh.hosts.sequence or (p.hosts_sequence == vh.hosts.sequence and p.hosts_sha256
                                                          and p.hosts_sha256 != vh.sha256)):
            raise RollbackError(f"refusing the enrolled hosts {hosts_file}: it is sequence {vh.hosts.sequence} "
                                f"(sha256 {vh.sha256[:12]}...), but promotion {p.sequence} of {t.target} was checked "
                                f"against sequence {p.hosts_sequence} ({(p.hosts_sha256 or '')[:12]}...): an older file",
                                hint="restore the newest manifests/hosts.json (git log -- manifests/hosts.json)")
    seen = [(t.promotion.hosts_sequence, t.promotion.hosts_sha256 or "", f"promotion {t.promotion.sequence} of "
             f"{t.target}") for t in release.targets if t.promotion and t.promotion.hosts_sha256]
    try:
        hosts_chain_check(vh, key, hosts_file, seen, history)
    except VerificationError as exc:
        raise RollbackError(f"refusing the enrolled hosts {hosts_file}: {exc.message}", hint=exc.hint) from None
    return vh


def promote(folder: Path, tag: str, files: Sequence[Path], signer: Signer, release_key: TrustedKey,
            hosts_file: Optional[Path], allow_unsigned: bool = False, now: Optional[dt.datetime] = None,
            progress=lambda m: None, state: Optional[Path] = None,
            hosts_history: Optional[Path] = None) -> List[Promoted]:
    """Apply the release's signed rule to the release in `folder` for every target the evidence names."""
    folder = Path(folder)
    hosts_lock = journal.hosts_lock(hosts_file) if hosts_file else journal.hosts_lock(folder.parent / rec.HOSTS_FILE)
    with journal.release_lock(folder), hosts_lock, PromoterState(state) as marks:
        check = journal.release_check(folder, release_key, _floor(marks, release_key))
        for note in journal.recover_journals(folder, check):
            progress(f"recovered: {note}" if not note.startswith("LEFT") else note)
        release = read_release(folder, KeyAnchor(trusted=release_key), through=EVIDENCE)
        if release.tag != tag:
            raise ConfigError(f"{folder} is release {release.tag}, not {tag}")
        for vt in release.targets:
            marks.observe_release(release_key.fingerprint, _seen(release, vt), f"release folder {folder}")
        hosts = _hosts(marks, release, hosts_file, release_key, hosts_history)
        at = HostsAtHand(hosts, release_key, hosts_file or folder.parent / rec.HOSTS_FILE, hosts_history)
        for vt in release.targets:  # who vouched for what the ledger accepted, as the recipe checks it (step 7)
            for note in check_accepted_signatures(str(folder), vt, at.at):
                progress(f"not checked here: {note}")
        now = now or dt.datetime.now(dt.timezone.utc)
        by_target: Dict[str, List[ev.Signed]] = {}
        served: Dict[str, List[serving.SignedServe]] = {}
        for path in files:  # GPU evidence and serve-check records, told apart by what each file holds
            matrix = servecount.read_signed(Path(path), hosts.hosts if hosts else None, allow_unsigned)
            signed = ev.read_signed(Path(path), tag, hosts.hosts if hosts else None, allow_unsigned) \
                if matrix is None else None
            record = matrix.record if matrix is not None else signed.record
            if not release.has(record.target):
                raise ev.EvidenceError(f"{path}: the evidence is for target {record.target!r}, which release {tag} "
                                       f"does not have (it has: {', '.join(t.target for t in release.targets)})")
            vt = release.target(record.target)
            if matrix is not None:
                servecount.check_binding(matrix.record, vt.manifest, release.index, str(path), now)
                served.setdefault(record.target, []).append(matrix)
                continue
            check_binding(record, vt.manifest, release.rule(record.target), release.index, str(path), now)
            by_target.setdefault(record.target, []).append(signed)
        return [_promote_target(release, release.target(t), by_target.get(t, []), signer, allow_unsigned, hosts,
                                marks, served.get(t, []), progress) for t in sorted(set(by_target) | set(served))]


def _manifest_bytes(vt: VerifiedTarget, s: Standing, sequence: int, released: str, everything: Sequence[Counted],
                    others: Sequence[ConfigurationRow]) -> bytes:
    stmt = copy.deepcopy(dict(vt.manifest.statement))  # what the verified bytes hold, rewritten
    pred = mf.predicate(stmt)
    pred["support_level"] = s.level
    pred["promotion"] = {"released_level": released, "level": s.level, "consecutive_passes": s.consecutive_passes,
                         "required_consecutive_passes": s.required, "note": s.note, "sequence": sequence,
                         "evidence": [c.summary().as_json(vt.target) for c in everything],
                         **({"configurations": [r.as_json() for r in others]} if others else {})}
    return mf.dumps(stmt)


def _keep(store: Path, signed: ev.Signed) -> None:
    """The accepted file, content-addressed, with its signature: what the signed record names is what is kept."""
    path = store / f"{signed.sha256}.json"
    write_atomic(path, signed.data)
    if signed.signature is not None:
        write_atomic(formats.signature_path(path), signed.signature)
    if signed.bundle is not None:
        write_atomic(formats.bundle_path(path), signed.bundle)


def _new_runs(new: List[ev.Signed], old: Sequence[Counted], rule: TargetRule) -> List[ev.Signed]:
    """Each run once: of several copies of one run the one an enrolled host signed; copies whose checks give
    different outcomes (one was changed), or a run already accepted with another outcome, are refused."""
    known = {c.identity: c for c in old}
    chosen: Dict[str, ev.Signed] = {}
    for s in new:
        outcome = _outcome(s.record, rule)
        before = known.get(s.identity)
        if before is not None and before.own_outcome is not outcome:
            raise ev.EvidenceError(f"{s.source}: the same run as accepted evidence {before.sha256[:12]}... (image, probe, "
                                   f"GPU, host, run id, time), but its checks give {outcome.value}, not "
                                   f"{before.own_outcome.value}: one of them was changed")
        other = chosen.get(s.identity)
        if other is not None and _outcome(other.record, rule) is not outcome:
            raise ev.EvidenceError(f"{other.source} and {s.source} are the same run with different results "
                                   f"({_outcome(other.record, rule).value} and {outcome.value}): one was changed",
                                   hint="hand in the copy the GPU host signed, unchanged")
        if before is None and (other is None or (s.host and not other.host)):
            chosen[s.identity] = s
    return list(chosen.values())


def _with_serving(old: List[Counted], runs: List[Counted], new: List[serving.SignedServe],
                  rule: servecount.ServingRule, progress) -> Tuple[List[Counted], List[serving.SignedServe]]:
    """Every run, each judged with the serve-check record of its deployment that decides it (servecount.choose);
    and the handed-in records newly counted (to keep). The cpu target: each new record is a run of its own."""
    known = {c.identity for c in old + runs}
    if rule.alone:
        fresh = [s for i, s in enumerate(new) if s.identity not in known
                 and s.identity not in {x.identity for x in new[:i]}]
        for s in fresh:
            run = servecount.as_run(s.record, rule)
            runs.append(Counted(run, s.sha256, s.host or "unsigned", s.identity, run.outcome, s.sha256, s.record))
        return old + runs, fresh
    if not rule.counts_serving:
        if new:
            progress(f"{len(new)} serve-check record(s) not counted: this release's rule is {rule.source}")
        return old + runs, []
    out, taken = [], []
    # Each record completes one GPU run, once (issue 49): one already counted with a run is never paired again,
    # and a record completes only a run of the host that signed it (the GPU host signs its own matrix).
    used = {c.serving_sha256 for c in old if c.serving_sha256}
    for c in old + runs:
        paired = [s for s in new if servecount.pairs_with(c.record, s.record)]
        for s in paired:
            if (s.host or "unsigned") != c.host:
                progress(f"{s.source}: a serve-check record signed by {s.host or 'no enrolled host'}, not by {c.host}, "
                         "the host of the GPU run it names: not counted (the GPU host signs its own matrix)")
        mine = [s for s in paired if (s.host or "unsigned") == c.host
                and (s.sha256 not in used or s.sha256 == c.serving_sha256)]
        pick = servecount.choose([c.served] if c.served else [], [s.record for s in mine], rule)
        chosen = next((s for s in mine if s.record is pick), None)
        if chosen is not None and chosen.sha256 != c.serving_sha256:
            taken.append(chosen)
            used.add(chosen.sha256)
            c = replace(c, serving_sha256=chosen.sha256, served=chosen.record)
        out.append(c.judged(rule))
    left = servecount.unpaired(new, [c.record for c in out])
    if left:
        progress(f"{len(left)} serve-check record(s) pair with no GPU run handed in or accepted (the GPU evidence "
                 f"of their deployment is missing): {', '.join(str(s.source) for s in left[:3])}")
    return out, taken


def _promote_target(release: VerifiedRelease, vt: VerifiedTarget, new: List[ev.Signed], signer: Signer,
                    allow_unsigned: bool, hosts: Optional[VerifiedHosts], marks: PromoterState,
                    served: Sequence[serving.SignedServe] = (), progress=lambda m: None) -> Promoted:
    folder, target, rule = release.path, vt.target, release.rule(vt.target)
    serve_rule = servecount.rule_for(vt.manifest, rule)
    old, ignored = accepted(release, vt, rule)
    added = _new_runs(new, old, rule)
    runs = [_counted(s.record, s.sha256, s.host or "unsigned", s.identity, rule) for s in added]
    counted, matrices = _with_serving(old, runs, list(served), serve_rule, progress)
    released = vt.entry.support_level
    single, everything, others = configuration_rows(counted, rule, released)
    s = standing(single, rule, released)
    manifest_path, record_path = folder / vt.entry.manifest_file, folder / rec.promotion_file(target)
    previous = vt.promotion_sequence
    if not added and not matrices:
        return Promoted(target, s, manifest_path, record_path, 0, previous, ignored, written=False, rule=rule,
                        configurations=others, serving=serve_rule)
    store = _store(folder, target, create=True)
    for signed in [*added, *matrices]:
        _keep(store, signed)
    killpoint.reached("promote:kept")  # a kill here leaves files the record does not name: listed, never counted
    ignored = tuple(n for n in ignored if n not in {f"{a.sha256}.json" for a in [*added, *matrices]})
    # release/v3 (issue 52): the manifest stays the released bytes, the level lives in the promotion record
    # only; a release/v2 folder is promoted as it always was (its manifest rewritten), so older verifiers still read it.
    rewrite = release.index.manifest_rewritten_by_promote
    manifest = _manifest_bytes(vt, s, previous + 1, released, everything, others) if rewrite else vt.manifest_bytes
    unsigned = (allow_unsigned and any(not c.host for c in [*added, *matrices])) or \
        bool(vt.promotion and vt.promotion.unsigned_evidence_allowed)
    record = rec.PromotionRecord(
        release=release.tag, release_sha256=release.index_sha256, target=target, sequence=previous + 1,
        previous_sha256=vt.promotion_sha256, released_level=released, level=s.level,
        consecutive_passes=s.consecutive_passes, required_consecutive_passes=s.required, note=s.note,
        manifest_sha256=sha256(manifest), evidence=tuple(c.summary() for c in everything),
        unsigned_evidence_allowed=unsigned, hosts_sha256=hosts.sha256 if hosts else None,
        hosts_sequence=hosts.hosts.sequence if hosts else 0, policy_version=rule.version, configurations=others)
    files = [(rec.promotion_file(target), record.to_bytes())]
    replaces: Dict[str, Optional[str]] = {rec.promotion_file(target): vt.promotion_sha256}
    if rewrite:
        files.insert(0, (vt.entry.manifest_file, manifest))
        replaces[vt.entry.manifest_file] = vt.manifest_sha256
    if vt.promotion:  # the record it replaces is kept: the ledger is never overwritten
        kept = rec.history_file(target, previous)
        files.append((kept, vt.promotion_bytes))
        replaces[kept] = None
    journal.write_signed_files(folder, files, signer, release.key, replaces)
    new_seen = replace(_seen(release, vt), promotion=previous + 1, promotion_sha256=sha256(record.to_bytes()),
                       manifest_sha256=sha256(manifest))
    marks.observe_release(release.key.fingerprint, new_seen, f"release folder {folder}")
    fresh = {a.identity for a in added} | {m.identity for m in matrices if serve_rule.alone}
    taken = tuple(c for c in counted if c.identity in fresh or c.serving_sha256 in {m.sha256 for m in matrices})
    return Promoted(target, s, manifest_path, record_path, len(added) + len(matrices), previous + 1, ignored,
                    added=taken, rule=rule, configurations=others, serving=serve_rule,
                    new_serving=0 if serve_rule.alone else len(matrices), manifest_rewritten=rewrite)


def release_signer(key_file: Path) -> Tuple[Signer, TrustedKey]:
    """The release key's signer (cosign when installed, else the built-in signer; the password read once) and
    the key's public half, which the release's own key must be."""
    from qualify.signing.signer import key_signer

    if not key_file.is_file():
        raise ConfigError(f"{key_file}: release key not found", hint="pass --key with the key the release was signed with")
    signer = key_signer("auto", key_file)
    return signer, TrustedKey.of_signer(signer, f"the public half of {key_file}")


def _of_them_serving(p: Promoted) -> str:
    return f", {p.new_serving} of them serve-check records" if p.new_serving else ""


def summary_lines(p: Promoted, allow_unsigned: bool) -> List[str]:
    """For people; every line with its control characters escaped (a GPU name or reason is the host's text)."""
    from qualify.core.errors import printable

    s = p.standing
    lines = [f"{p.target}: {s.level} ({s.consecutive_passes} of {s.required} consecutive passes; "
             f"{len(s.counted)} records, {p.new} new{_of_them_serving(p)}){'; ' + s.note if s.note else ''}"]
    if p.rule is not None:
        lines.append(f"  rule: {p.rule.describe()}")
    if p.configurations:  # the Blackwell support RFC's matrix: each multi-GPU configuration is a row of its own
        lines[0] = lines[0].replace(f"{p.target}: ", f"{p.target} ({SINGLE_GPU.key}): ", 1)
    for r in p.configurations:
        lines.append(f"{p.target} ({r.configuration.key}): {r.level} ({r.consecutive_passes} of "
                     f"{r.required_consecutive_passes} consecutive passes; {r.runs} records)"
                     + (f"; {r.note}" if r.note else ""))
    if p.serving is not None and (p.serving.counts_serving or p.serving.alone):
        lines.append(f"  serving: {p.serving.source}")
    for c in p.added[:10]:  # what each new run was: a pass, a product failure, or infrastructure (the Blackwell support RFC)
        why = c.record.reason if c.reason is None else c.reason
        lines.append(f"  new: {c.record.time} {c.host} on {c.record.gpu.name}: {c.outcome.value}"
                     + (f" ({why})" if why else ""))
    if len(p.added) > 10:
        lines.append(f"  new: {len(p.added) - 10} more")
    if p.written and p.manifest_rewritten:
        lines.append(f"  wrote {p.manifest} and {p.record} (promotion {p.sequence}, signed; a release/v2 folder, "
                     "whose manifest carries the level too)")
    elif p.written:
        lines.append(f"  wrote {p.record} (promotion {p.sequence}, signed); {p.manifest} unchanged, as released")
    else:
        lines.append(f"  nothing new: {p.record} unchanged (promotion {p.sequence})")
    if p.ignored:
        lines.append(f"  ignored {len(p.ignored)} file(s) in {EVIDENCE_DIR}/{p.target}/ that the signed promotion "
                     f"record does not name: {', '.join(p.ignored[:3])}")
    if allow_unsigned:
        lines.append("  --allow-unsigned-evidence: unsigned evidence counted; the promotion record says so")
    return [printable(line) for line in lines]


def check_key(key: TrustedKey, folder: Path) -> None:
    """Refuse a --key whose public half is not the release's key before anything is read or written."""
    from qualify.core.readlimit import KEY_LIMIT

    try:
        pem = read_small(folder / rec.PUBLIC_KEY_FILE, KEY_LIMIT, "release key", ConfigError)
        KeyAnchor(trusted=key).accept(pem, str(folder / rec.PUBLIC_KEY_FILE))
    except QualifyError as exc:
        raise ConfigError(f"--key is not this release's key: {exc.message}",
                          hint="pass --key with the private key the release was signed with") from None
