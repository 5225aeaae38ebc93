"""How `qualify promote` counts serving evidence (issue 39): serve-check records beside GPU evidence.

The rule (seeds 000 and 002): a run counts toward the N consecutive passes when its GPU evidence and a
serve-check record of the same deployment both pass, over the serving checks the release's rule requires; the
cpu target, which no GPU evidence can exist for, counts serve-check records alone; a failed matrix is a
product failure (it resets the run and lowers the level); a run whose GPU checks passed but whose serving
evidence is missing or did not run counts toward nothing, and lifts an unverified target to experimental as
GPU evidence alone always did.

Which serving checks a target's runs need is the release's rule (`rule_for`). Releases signed before the
release carried a rule of its own keep the rule they were made under: GPU targets count GPU evidence alone,
and serve-check records handed in for them are kept out, with a note. The cpu target had no way to be promoted
before; its rule is every check of the matrix (servematrix.CHECK_IDS), from records whose probe is the
release's own (the probe digest pins the matrix file, which sits on the image side). Issue 37's signed pass
rule (release.json's policy, `level_checks`) is where a release names the checks itself; `rule_for` is the
one place that reads it.

"The same deployment": start.sh records the GPU evidence it saved in deployment.json, and serve-check copies
that run's identity (probe run id, time, hashed host id) into its record; a record pairs with the GPU run of
that identity and that image digest, and with nothing else.
"""

from __future__ import annotations

import datetime as dt
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, List, Optional, Sequence, Tuple

from qualify.core import manifest as mf
from qualify.core.readlimit import read_small, strict_json
from qualify.probe.servematrix import CHECK_IDS
from qualify.release import evidence as ev
from qualify.release import serving
from qualify.trust import records as rec
from qualify.trust.policy import TargetRule


@dataclass(frozen=True)
class ServingRule:
    required: Tuple[str, ...]  # the serving checks a run needs to count; () = serving evidence does not count
    alone: bool  # the cpu target: a serve-check record is a run of its own
    source: str  # where the rule comes from, for people
    lift_needs_serving: bool = False  # the policy names serving checks for experimental too

    @property
    def counts_serving(self) -> bool:
        return bool(self.required)


def serves(m: mf.Manifest) -> bool:
    """A target whose image serves (vLLM): the cpu target, a vllm profile; a smoke image has no server."""
    return m.is_cpu or m.profile == "vllm"


def rule_for(m: mf.Manifest, rule: Optional[TargetRule] = None) -> ServingRule:
    """The serving rule for a verified target, from the release's signed rule only (`VerifiedRelease.rule`).

    A release whose policy is signed (issue 37) names the serving checks per level (`level_checks`, written by
    `qualify release` from images/targets.toml): a serving target's run needs the checks of baseline and of
    experimental to count toward the N passes, and a run whose GPU checks passed lifts an unverified target to
    experimental only when experimental names none. A smoke image has no server: none. A policy that names
    none (signed before issue 39) keeps that rule: GPU evidence alone, and the cpu target cannot be promoted.
    A release from before the signed policy (`rule.signed` False, or no rule): GPU targets count GPU evidence
    alone; the cpu target, which nothing could promote before, needs every check of the matrix."""
    if rule is not None and rule.signed:
        if not serves(m):
            return ServingRule((), False, "no serving checks (the image does not serve)")
        lift = rule.checks_for("experimental")
        required = tuple(dict.fromkeys([*rule.checks_for("baseline"), *lift]))
        return ServingRule(required, m.is_cpu and bool(required),
                           f"release.json's signed policy: {', '.join(required) or 'no serving checks'}"
                           + (" (the cpu target: serve-check records alone)" if m.is_cpu and required else ""),
                           bool(lift))
    if m.is_cpu:
        return ServingRule(tuple(CHECK_IDS), True, "the cpu target: serve-check records alone, every check of "
                           "the matrix (a release signed before releases carried a serving rule)")
    return ServingRule((), False, "GPU evidence alone (the rule this release was signed under)")


# --- reading a handed-in file ---------------------------------------------------------------------------------


def read_signed(path: Path, hosts, allow_unsigned: bool) -> Optional[serving.SignedServe]:
    """A serve-check record and its signature, each read once; None when the file is not a serve-check record
    (the caller reads it as GPU evidence). Refused unless an enrolled host signed it or unsigned evidence is
    allowed, as GPU evidence is (evidence.handed_in: the one signature path)."""
    data = read_small(path, serving.MAX_BYTES, "evidence file", serving.ServeRecordError)
    try:
        doc = strict_json(data, str(path), serving.ServeRecordError)
    except serving.ServeRecordError:
        return None  # not JSON at all: the GPU evidence reader says so in its words
    if not serving.is_serve_record(doc):
        return None
    return ev.handed_in(path, data, serving.parse(data, str(path)), hosts, allow_unsigned, serving.ServeRecordError,
                        "a serve-check record", "serve-check --sign-key")


def check_binding(record: serving.ServeRecord, m: mf.Manifest, release: rec.ReleaseIndex, where: str,
                  now: dt.datetime) -> None:
    """A record about another release, image, target or probe, or from a time it cannot be from, is refused."""
    if record.image is None:
        raise serving.ServeRecordError(f"{where}: the record names no image (serve-check --url without --image): "
                                       "it cannot be about a released image",
                                       hint="run serve-check against the deployment start.sh made, or pass --image")
    if record.release and record.release != release.tag:
        raise serving.ServeRecordError(f"{where}: the record is for release {record.release}, not {release.tag}")
    if record.subject_digest != m.digest:
        raise serving.ServeRecordError(f"{where}: the record is for image digest {record.subject_digest}, not the "
                                       f"released {m.target} image {m.digest}",
                                       hint="run serve-check against a deploy of this release")
    if record.target != m.target or record.capability != m.capability:
        raise serving.ServeRecordError(f"{where}: the record is for {record.target} ({record.capability}), not "
                                       f"{m.target} ({m.capability})")
    if m.probe_sha256 and record.probe_sources_digest != m.probe_sha256:
        raise serving.ServeRecordError(
            f"{where}: the record was made with a probe (and matrix) whose sources differ: "
            f"{record.probe_sources_digest}, the release's probe is {m.probe_sha256}",
            hint="run serve-check from the release's own checkout (git checkout TAG)")
    matrix_binding(record, m, where)
    when = record.when
    if when > now + ev.CLOCK_SKEW:
        raise serving.ServeRecordError(f"{where}: the record is dated {record.time}, in the future")
    if when < rec.parse_time(release.time, "release time"):
        raise serving.ServeRecordError(f"{where}: the record is dated {record.time}, before release "
                                       f"{release.tag}'s source ({release.time})")


def matrix_binding(record: serving.ServeRecord, m: mf.Manifest, where: str,
                   local_probe: Optional[Callable[[], str]] = None) -> None:
    """The record's matrix (version and sha256) is the one the release's probe carries (issue 49). The matrix
    file sits among the probe sources the manifest's probe_sha256 pins: where this checkout's probe is the
    release's own, its serve-matrix file is that matrix, and a record naming another is refused; from another
    checkout it cannot be told here (the probe check above already holds the record to the release's probe)."""
    from qualify.probe import servematrix
    from qualify.qualification.container import probe_sources_digest

    here = (local_probe or probe_sources_digest)()
    if not m.probe_sha256 or here != m.probe_sha256:
        return
    matrix = servematrix.load()
    if (record.matrix_version, record.matrix_sha256) != (matrix.version, matrix.sha256):
        raise serving.ServeRecordError(
            f"{where}: the record names matrix version {record.matrix_version} (sha256 {record.matrix_sha256[:12]}...), "
            f"but the release's probe ({m.probe_sha256[:19]}...) carries {os.path.basename(matrix.path)}, version "
            f"{matrix.version} (sha256 {matrix.sha256[:12]}...): it was judged by another matrix",
            hint="run serve-check from the release's own checkout (git checkout TAG)")


# --- outcomes ---------------------------------------------------------------------------------------------------


def outcome(record: serving.ServeRecord, rule: ServingRule) -> serving.ServeOutcome:
    return serving.outcome_of(record.checks, rule.required)


def as_run(record: serving.ServeRecord, rule: ServingRule) -> ev.Evidence:
    """A record of the cpu target as the run it is (no GPU: the GPU fields say none)."""
    o = outcome(record, rule)
    return ev.Evidence(release=record.release, target=record.target, capability=record.capability,
                       image_reference=record.image or "", image_digest=record.subject_digest,
                       probe_sources_digest=record.probe_sources_digest,
                       gpu=ev.Gpu(ev.NO_GPU, ev.NO_GPU, ev.hashed(""), ""), host_id_sha256=record.host_id_sha256,
                       time=record.time, outcome=o.outcome, reason=o.reason, checks=record.checks,
                       figures=dict(record.figures), run_id=record.run_id)


def pairs_with(gpu: ev.Evidence, record: serving.ServeRecord) -> bool:
    """The record was made against the deployment whose GPU checks gave `gpu`, and against that GPU run of it:
    its GPU (hashed UUID) and tensor-parallel size, as start.sh recorded them (issue 49: two runs sharing run
    id, time and host, 1 GPU and tp2, are two runs; one serving test completes one). A record written before
    it named them completes a 1-GPU run only."""
    link = record.gpu_evidence
    if link is None or record.subject_digest != gpu.image_digest or link.run_id != gpu.run_id \
            or link.host_id_sha256 != gpu.host_id_sha256 or link.time != ev.normal_time(gpu.time, "time"):
        return False
    return link.gpu_uuid_sha256 == gpu.gpu.uuid_sha256 and link.tensor_parallel_size == \
        gpu.configuration.tensor_parallel_size if link.tensor_parallel_size else not gpu.configuration.multi_gpu


@dataclass(frozen=True)
class Combined:
    outcome: ev.Outcome  # what counts toward the N passes
    reason: str
    lifts: bool  # its GPU checks passed: it lifts an unverified target to experimental


def combine(gpu: ev.Outcome, gpu_reason: str, served: Sequence[serving.ServeRecord], rule: ServingRule) -> Combined:
    """One GPU run with the serve-check records of its deployment (the worst of them decides)."""
    if not rule.counts_serving:
        return Combined(gpu, gpu_reason, gpu is ev.Outcome.PASS)
    results = [outcome(r, rule) for r in served]
    failed = [r for r in results if r.outcome is ev.Outcome.PRODUCT_FAILURE]
    if gpu is ev.Outcome.PRODUCT_FAILURE or failed:
        why = [gpu_reason] if gpu is ev.Outcome.PRODUCT_FAILURE else []
        return Combined(ev.Outcome.PRODUCT_FAILURE, "; ".join(why + [f"matrix: {f.reason}" for f in failed]),
                        False)
    if gpu is not ev.Outcome.PASS:
        return Combined(gpu, gpu_reason, False)
    passed = [r for r in results if r.outcome is ev.Outcome.PASS]
    if passed:
        return Combined(ev.Outcome.PASS, f"{gpu_reason}; matrix: {passed[0].reason}", True)
    # Fail closed: the policy requires serving checks and no verified record of this deployment passed them.
    why = results[0].reason if results else "no verified serve-check record of this deployment"
    return Combined(ev.Outcome.INFRASTRUCTURE, f"{gpu_reason}; but serving: {why}", not rule.lift_needs_serving)


SEVERITY = {ev.Outcome.PRODUCT_FAILURE: 0, ev.Outcome.PASS: 1, ev.Outcome.INFRASTRUCTURE: 2}


def choose(accepted: Sequence[serving.ServeRecord], handed_in: Sequence[serving.ServeRecord],
           rule: ServingRule) -> Optional[serving.ServeRecord]:
    """Of the records of one deployment, the one that decides its run: a failed matrix before a pass before one
    that did not run (a failure is never hidden by a later pass); an accepted one keeps its place on a tie."""
    ranked = sorted([*accepted, *handed_in], key=lambda r: SEVERITY[outcome(r, rule).outcome])
    return ranked[0] if ranked else None


def unpaired(records: Sequence[serving.SignedServe], runs: Sequence[ev.Evidence]) -> List[serving.SignedServe]:
    """Handed-in records that pair with none of the GPU runs (named to the user: they cannot count)."""
    return [s for s in records if not any(pairs_with(g, s.record) for g in runs)]
