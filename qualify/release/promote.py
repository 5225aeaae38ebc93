"""Promotion by evidence (seed 000): a target becomes baseline after its required GPU checks pass
in N consecutive runs on its own architecture without a product failure.

Everything starts from verified state: the release is read through the one reader with the release key
(the public half of `--key` must be the release's own key), so a manifest whose signature does not verify
is refused, never re-signed. Evidence counts only when an enrolled host signed it (manifests/hosts.json,
itself signed with the release key), or, loudly and on the record, with --allow-unsigned-evidence. Each
record's outcome is recomputed from its checks (evidence.outcome_of), its time parsed, its identity
semantic (the same run once, however it is serialised).

What counts is what an earlier promote accepted: the signed promotion record lists the sha256 of every
accepted record kept under manifests/<tag>/evidence/<target>/; a file there that the record does not name
does not count. Infrastructure outcomes neither count nor reset the run; a product failure resets it and
demotes a promoted target. The rewritten manifest and the new promotion record (sequence one higher,
naming the one it replaces) are written together (folder.write_signed_files: staged, signed, verified,
then renamed; a killed promote is finished or undone by the next one).
"""

from __future__ import annotations

import copy
import datetime as dt
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

from qualify.config.targets import TargetsFile
from qualify.core import manifest as mf
from qualify.core.errors import ConfigError, QualifyError
from qualify.core.fsutil import write_atomic
from qualify.core.readlimit import read_small, strict_json
from qualify.release import evidence as ev
from qualify.release import records as rec
from qualify.release import servecount, serving
from qualify.release.folder import (
    KeyAnchor,
    Sign,
    TrustedKey,
    VerifiedRelease,
    VerifiedTarget,
    read_release,
    recover_journals,
    sha256,
    write_signed_files,
)
from qualify.signing import formats

EVIDENCE_DIR = "evidence"


@dataclass(frozen=True)
class Counted:
    """One accepted run: its record, the sha256 of the file kept for it, who vouched, its identity; and, where
    serving evidence counts (servecount.py), the serve-check record it counted with, and the outcome of both."""

    record: ev.Evidence
    sha256: str
    host: str  # enrolled host name, or "unsigned"
    identity: str
    serving_sha256: Optional[str] = None
    combined: Optional[servecount.Combined] = None  # None: the GPU evidence alone decides
    served: Optional[serving.ServeRecord] = None  # the serve-check record `serving_sha256` names

    @property
    def outcome(self) -> ev.Outcome:
        return self.combined.outcome if self.combined else self.record.outcome

    @property
    def lifts(self) -> bool:
        return self.combined.lifts if self.combined else self.record.outcome is ev.Outcome.PASS

    def summary(self) -> rec.CountedEvidence:
        r = self.record
        return rec.CountedEvidence(self.sha256, self.identity, r.time, self.outcome.value,
                                   self.combined.reason if self.combined else r.reason, r.gpu.name, r.gpu.driver,
                                   self.host, tuple(sorted(r.figures.items())), self.serving_sha256)


@dataclass(frozen=True)
class Standing:
    level: str
    consecutive_passes: int
    required: int
    counted: Sequence[Counted]  # every distinct run, oldest first
    note: str


def check_binding(record: ev.Evidence, m: mf.Manifest, capability: str, release: rec.ReleaseIndex, where: str,
                  now: dt.datetime) -> None:
    """Evidence about another release, image, GPU architecture or probe, or from a time it cannot be from,
    is refused, naming which."""
    if record.release and record.release != release.tag:
        raise ev.EvidenceError(f"{where}: the evidence is for release {record.release}, not {release.tag}",
                               hint="hand in evidence from a deploy of this release")
    if record.image_digest != m.digest:
        raise ev.EvidenceError(f"{where}: the evidence is for image digest {record.image_digest}, not the released "
                               f"{record.target} image {m.digest}", hint="hand in evidence from a deploy of this release")
    if record.capability != capability:
        raise ev.EvidenceError(f"{where}: the evidence is for capability {record.capability}, not the target's "
                               f"capability {capability}", hint="hand in evidence from a deploy of this target")
    # A run that saw no GPU on the target's host is an infrastructure failure, reported apart from product
    # failures (seed 000): it is kept, and neither counts nor resets. A run on another GPU proves nothing.
    if record.gpu.capability not in (capability, ev.NO_GPU):
        raise ev.EvidenceError(f"{where}: the evidence was taken on {record.gpu.name} with capability "
                               f"{record.gpu.capability}, not the target's capability {capability}",
                               hint="only a GPU of the target's own architecture proves it (seed 000)")
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


def standing(counted: Iterable[Counted], required: int, intended: str, released_level: str) -> Standing:
    unique = {c.identity: c for c in counted}
    ordered = sorted(unique.values(), key=lambda c: (c.record.when, c.identity))
    streak, passed, notes = 0, False, []
    for c in ordered:
        if c.outcome is ev.Outcome.PASS:
            streak, passed = streak + 1, True
        elif c.outcome is ev.Outcome.PRODUCT_FAILURE:
            if streak >= required:
                notes.append(f"demoted by a product failure at {c.record.time}")
            streak = 0
        elif c.lifts:  # its GPU checks passed, its serving evidence is missing: experimental, no streak
            passed = True
    can_be_baseline = mf.LEVEL_RANK.get(intended, 0) >= mf.LEVEL_RANK["baseline"]
    if streak >= required and can_be_baseline:
        level = "baseline"
    elif passed:
        level = "experimental"
        if streak >= required:
            notes.append(f"the target's intended level is {intended}")
    else:
        level = released_level
    return Standing(level, streak, required, tuple(ordered), "; ".join(notes))


@dataclass(frozen=True)
class Promoted:
    target: str
    standing: Standing
    manifest: Path
    record: Path
    new: int  # records this run added
    sequence: int  # the promotion record's sequence (unchanged when nothing was added)
    ignored: Tuple[str, ...] = ()  # files in evidence/<target>/ the signed record does not name
    written: bool = True
    added: Tuple[Counted, ...] = ()  # the runs this promotion took in, each with its outcome


def _store(folder: Path, target: str) -> Path:
    return folder / EVIDENCE_DIR / target


def _read_kept(store: Path, sha: str) -> bytes:
    path = store / f"{sha}.json"
    data = read_small(path, ev.MAX_BYTES, "accepted evidence", ev.EvidenceError,
                      missing_hint="restore the release folder's evidence/ from where it was promoted")
    if sha256(data) != sha:
        raise ev.EvidenceError(f"{path}: not the evidence the signed promotion record accepted (sha256 differs)",
                               hint="restore the release folder's evidence/ from where it was promoted")
    return data


def _counted(release: VerifiedRelease, store: Path, e: rec.CountedEvidence, rule: servecount.ServingRule) -> Counted:
    """One run the signed promotion record lists, re-read and re-judged: GPU evidence (with the serve-check
    record it counted with), or, for the cpu target, a serve-check record that is the run itself."""
    data, where = _read_kept(store, e.sha256), str(store / f"{e.sha256}.json")
    if serving.is_serve_record(strict_json(data, where, ev.EvidenceError)):
        served = serving.parse(data, where)
        run = servecount.as_run(served, rule)
        return Counted(run, e.sha256, e.host, e.identity, e.sha256,
                       servecount.Combined(run.outcome, run.reason, run.outcome is ev.Outcome.PASS), served)
    record = ev.from_bytes(data, release.tag, where)
    served = serving.parse(_read_kept(store, e.serving_sha256), str(store / f"{e.serving_sha256}.json")) \
        if e.serving_sha256 else None
    combined = servecount.combine(record.outcome, record.reason, [served] if served else [], rule) \
        if rule.counts_serving else None
    return Counted(record, e.sha256, e.host, e.identity, e.serving_sha256, combined, served)


def accepted(release: VerifiedRelease, vt: VerifiedTarget,
             rule: Optional[servecount.ServingRule] = None) -> Tuple[List[Counted], Tuple[str, ...]]:
    """The runs the signed promotion record accepted, each file's sha256 checked; and the names of files in
    the evidence folder it does not name (dropped in by hand: they do not count)."""
    store = _store(release.path, vt.target)
    rule = rule or servecount.rule_for(vt.manifest)
    listed = vt.promotion.evidence if vt.promotion else ()
    out = [_counted(release, store, e, rule) for e in listed]
    names = {f"{e.sha256}.json" for e in listed} | {f"{e.serving_sha256}.json" for e in listed if e.serving_sha256}
    present = sorted(p.name for p in store.iterdir() if p.suffix == ".json"
                     and not p.name.endswith(formats.BUNDLE_SUFFIX)) if store.is_dir() else []
    return out, tuple(n for n in present if n not in names)


def promote(folder: Path, tag: str, files: Sequence[Path], tf: TargetsFile, sign: Sign, release_key: TrustedKey,
            hosts: Optional[rec.EnrolledHosts], allow_unsigned: bool = False,
            now: Optional[dt.datetime] = None, progress=lambda m: None) -> List[Promoted]:
    """Apply seed 000's rule to the release in `folder` for every target the evidence names (GPU evidence and
    serve-check records, told apart by what each file holds)."""
    for note in recover_journals(folder):
        progress(f"recovered: {note}")
    release = read_release(folder, KeyAnchor(trusted=release_key))
    if release.tag != tag:
        raise ConfigError(f"{folder} is release {release.tag}, not {tag}")
    now = now or dt.datetime.now(dt.timezone.utc)
    by_target: Dict[str, List[ev.Signed]] = {}
    served: Dict[str, List[serving.SignedServe]] = {}
    for path in files:
        matrix = servecount.read_signed(Path(path), hosts, allow_unsigned)
        record = matrix.record if matrix is not None else None
        if matrix is None:
            signed = ev.read_signed(Path(path), tag, hosts, allow_unsigned)
            record = signed.record
        if not release.has(record.target):
            raise ev.EvidenceError(f"{path}: the evidence is for target {record.target!r}, which release {tag} does "
                                   f"not have (it has: {', '.join(t.target for t in release.targets)})")
        vt = release.target(record.target)
        if matrix is not None:
            servecount.check_binding(record, vt.manifest, release.index, str(path), now)
            served.setdefault(record.target, []).append(matrix)
            continue
        check_binding(record, vt.manifest, str(tf.get(record.target).capability), release.index, str(path), now)
        by_target.setdefault(record.target, []).append(signed)
    return [_promote_target(release, release.target(t), by_target.get(t, []), tf, sign, allow_unsigned, hosts,
                            served.get(t, []), progress) for t in sorted(set(by_target) | set(served))]


def _manifest_bytes(vt: VerifiedTarget, s: Standing, sequence: int, released: str) -> bytes:
    stmt = copy.deepcopy(dict(vt.manifest.statement))  # what the verified bytes hold, rewritten
    pred = mf.predicate(stmt)
    pred["support_level"] = s.level
    pred["promotion"] = {"released_level": released, "level": s.level, "consecutive_passes": s.consecutive_passes,
                         "required_consecutive_passes": s.required, "note": s.note, "sequence": sequence,
                         "evidence": [c.summary().as_json(vt.target) for c in s.counted]}
    return mf.dumps(stmt)


def _keep(store: Path, signed) -> None:  # ev.Signed or serving.SignedServe
    """The accepted file, content-addressed, with its signature: what the signed record names is what is kept."""
    path = store / f"{signed.sha256}.json"
    write_atomic(path, signed.data)
    if signed.signature is not None:
        write_atomic(formats.signature_path(path), signed.signature)
    if signed.bundle is not None:
        write_atomic(formats.bundle_path(path), signed.bundle)


def _with_serving(old: List[Counted], runs: List[Counted], new: List[serving.SignedServe],
                  rule: servecount.ServingRule, progress) -> Tuple[List[Counted], List[serving.SignedServe]]:
    """Every run, each with the serve-check record of its deployment that decides it (servecount.choose); and
    the handed-in records newly counted (to keep). The cpu target: each new record is a run of its own."""
    known = {c.identity for c in old + runs}
    if rule.alone:
        fresh = [s for i, s in enumerate(new) if s.identity not in known
                 and s.identity not in {x.identity for x in new[:i]}]
        for s in fresh:
            run = servecount.as_run(s.record, rule)
            runs.append(Counted(run, s.sha256, s.host or "unsigned", s.identity, s.sha256,
                                servecount.Combined(run.outcome, run.reason, run.outcome is ev.Outcome.PASS),
                                s.record))
        return old + runs, fresh
    if not rule.counts_serving:
        if new:
            progress(f"{len(new)} serve-check record(s) not counted: this release's rule is {rule.source}")
        return old + runs, []
    out, taken = [], []
    for c in old + runs:
        mine = [s for s in new if servecount.pairs_with(c.record, s.record)]
        pick = servecount.choose([c.served] if c.served else [], [s.record for s in mine], rule)
        chosen = next((s for s in mine if s.record is pick), None)
        if chosen is not None and chosen.sha256 != c.serving_sha256:
            taken.append(chosen)
            c = replace(c, serving_sha256=chosen.sha256, served=chosen.record)
        combined = servecount.combine(c.record.outcome, c.record.reason, [c.served] if c.served else [], rule)
        out.append(replace(c, combined=combined))
    left = servecount.unpaired(new, [c.record for c in out])
    if left:
        progress(f"{len(left)} serve-check record(s) pair with no GPU run handed in or accepted (the GPU evidence "
                 f"of their deployment is missing): {', '.join(str(s.source) for s in left[:3])}")
    return out, taken


def _promote_target(release: VerifiedRelease, vt: VerifiedTarget, new: List[ev.Signed], tf: TargetsFile, sign: Sign,
                    allow_unsigned: bool, hosts: Optional[rec.EnrolledHosts],
                    served: Sequence[serving.SignedServe] = (), progress=lambda m: None) -> Promoted:
    folder, target = release.path, vt.target
    rule = servecount.rule_for(vt.manifest)
    old, ignored = accepted(release, vt, rule)
    known = {c.identity for c in old}
    added, seen = [], set()
    for s in new:
        if s.identity not in known and s.identity not in seen:
            seen.add(s.identity)
            added.append(s)
    runs = [Counted(s.record, s.sha256, s.host or "unsigned", s.identity) for s in added]
    counted, matrices = _with_serving(old, runs, list(served), rule, progress)
    seen |= {s.identity for s in matrices if rule.alone}
    released = vt.entry.support_level
    s = standing(counted, tf.promotion_passes, tf.get(target).support_level, released)
    manifest_path, record_path = folder / vt.entry.manifest_file, folder / rec.promotion_file(target)
    previous = vt.promotion.sequence if vt.promotion else 0
    if not added and not matrices:
        return Promoted(target, s, manifest_path, record_path, 0, previous, ignored, written=False)
    store = _store(folder, target)
    for signed in [*added, *matrices]:
        _keep(store, signed)
    ignored = tuple(n for n in ignored if n not in {f"{a.sha256}.json" for a in [*added, *matrices]})
    manifest = _manifest_bytes(vt, s, previous + 1, released)
    unsigned = (allow_unsigned and any(not c.host for c in [*added, *matrices])) or \
        bool(vt.promotion and vt.promotion.unsigned_evidence_allowed)
    record = rec.PromotionRecord(
        release=release.tag, release_sha256=release.index_sha256, target=target, sequence=previous + 1,
        previous_sha256=vt.promotion_sha256, released_level=released, level=s.level,
        consecutive_passes=s.consecutive_passes, required_consecutive_passes=s.required, note=s.note,
        manifest_sha256=sha256(manifest), evidence=tuple(c.summary() for c in s.counted),
        unsigned_evidence_allowed=unsigned, hosts_sha256=sha256(hosts.to_bytes()) if hosts else None)
    write_signed_files(folder, [(vt.entry.manifest_file, manifest), (rec.promotion_file(target), record.to_bytes())],
                       sign, release.key)
    taken = tuple(c for c in counted if c.identity in seen or c.serving_sha256 in {m.sha256 for m in matrices})
    return Promoted(target, s, manifest_path, record_path, len(added) + len(matrices), previous + 1, ignored,
                    added=taken)


def release_signer(key_file: Path) -> Tuple[Sign, TrustedKey]:
    """Signs with the release key (cosign when installed, else the built-in signer), as a release does:
    `sign(path)` writes PATH.sig and PATH.sigstore.json; and the key's public half."""
    from qualify.signing import keys as cosign_keys
    from qualify.signing.signer import key_signer

    if not key_file.is_file():
        raise ConfigError(f"{key_file}: release key not found", hint="pass --key with the key the release was signed with")
    signer, public = key_signer("auto", key_file)

    def sign(path: Path) -> None:
        signer.sign_file(path, formats.signature_path(path), formats.bundle_path(path))

    return sign, TrustedKey.from_bytes(cosign_keys.public_key_pem(public), f"the public half of {key_file}")


def summary_lines(p: Promoted, allow_unsigned: bool) -> List[str]:
    s = p.standing
    lines = [f"{p.target}: {s.level} ({s.consecutive_passes} of {s.required} consecutive passes; "
             f"{len(s.counted)} records, {p.new} new){'; ' + s.note if s.note else ''}"]
    for c in p.added[:10]:  # what each new run was: a pass, a product failure, or infrastructure (seed 000)
        lines.append(f"  new: {c.record.time} {c.host} on {c.record.gpu.name}: {c.record.outcome.value}"
                     + (f" ({c.record.reason})" if c.record.reason else ""))
    if len(p.added) > 10:
        lines.append(f"  new: {len(p.added) - 10} more")
    if p.written:
        lines.append(f"  wrote {p.manifest} and {p.record} (promotion {p.sequence}, signed)")
    else:
        lines.append(f"  nothing new: {p.manifest} and {p.record} unchanged (promotion {p.sequence})")
    if p.ignored:
        lines.append(f"  ignored {len(p.ignored)} file(s) in {EVIDENCE_DIR}/{p.target}/ that the signed promotion "
                     f"record does not name: {', '.join(p.ignored[:3])}")
    if allow_unsigned:
        lines.append("  --allow-unsigned-evidence: unsigned evidence counted; the promotion record says so")
    return lines


def check_key(key: TrustedKey, folder: Path) -> None:
    """Refuse a --key whose public half is not the release's key before anything is read or written."""
    from qualify.core.readlimit import KEY_LIMIT

    try:
        pem = read_small(folder / rec.PUBLIC_KEY_FILE, KEY_LIMIT, "release key", ConfigError)
        KeyAnchor(trusted=key).accept(pem, str(folder / rec.PUBLIC_KEY_FILE))
    except QualifyError as exc:
        raise ConfigError(f"--key is not this release's key: {exc.message}",
                          hint="pass --key with the private key the release was signed with") from None
