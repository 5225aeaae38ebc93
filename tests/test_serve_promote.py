"""`qualify promote` counts serve-check records (issue 39): signed by an enrolled host, bound to the release's
image and probe, recomputed from their checks; the cpu target by them alone, a GPU target's run by its GPU
evidence and the matrix of the same deployment together, where the release's rule says so."""

from __future__ import annotations

import json

import pytest
from evidence_helpers import PROBE, TAG, Lab
from signing_helpers import DIGEST_A, DIGEST_B, PASSWORD, REPO, statement
from test_serve_matrix import record

from qualify.probe import servematrix as sm
from qualify.release import evidence as ev
from qualify.release import servecount, serving
from qualify.trust import folder
from qualify.trust.verify import KeyAnchor

REPO_TARGETS = REPO / "images" / "targets.toml"


def cpu_lab(tmp_path) -> Lab:
    stmt = statement("cpu", DIGEST_A, level="unverified", capability="cpu")
    return Lab(tmp_path, stmt=stmt)


def served(lab: Lab, n: int, statuses=None, target="cpu", digest=DIGEST_A, **kw) -> serving.ServeRecord:
    fields = dict(release=TAG, target=target, capability="cpu" if target == "cpu" else "12.0",
                  image=f"127.0.0.1:5555/blackwell/{target}@{digest}", subject_name=f"127.0.0.1:5555/blackwell/{target}",
                  subject_digest=digest, time=lab.when(n), run_id=f"{n:032x}", probe_sources_digest=PROBE)
    return record(statuses, **{**fields, **kw})


def hand_in(lab: Lab, records, signed=True):
    where = lab.root / "handed-in"
    where.mkdir(parents=True, exist_ok=True)
    out = []
    for r in records:
        path = serving.write(where / serving.file_name(r.target, r.time, ev.hashed(f"h{len(out)}")), r)
        if signed:
            ev.sign(path, ev.host_signer(lab.host_key, PASSWORD.encode()))
        out.append(path)
    return out


def promote(lab: Lab, paths, **kw):
    from qualify.release import promote as pr

    notes = []
    (done,) = pr.promote(lab.folder, TAG, paths, lab.sign, lab.key, lab.hosts_file, now=lab.now,
                         progress=notes.append, **kw)
    return done, notes


def promotion(lab: Lab, target="cpu"):
    return folder.read_release(lab.folder, KeyAnchor(trusted=lab.key)).target(target)


def test_the_cpu_target_is_promoted_by_signed_serve_check_records_alone(tmp_path):
    lab = cpu_lab(tmp_path)
    done, _ = promote(lab, hand_in(lab, [served(lab, 10)]))
    assert done.standing.level == "experimental" and done.standing.consecutive_passes == 1 and done.new == 1
    vt = promotion(lab)
    (counted,) = vt.promotion.evidence
    assert counted.outcome == "pass" and counted.serving_sha256 == counted.sha256 and counted.gpu == "none"
    assert counted.reason == f"{len(sm.CHECK_IDS)} required serving checks passed"
    assert "promotion" not in vt.manifest.predicate  # issue 52: the signed promotion record alone holds it
    assert (lab.folder / "evidence" / "cpu" / f"{counted.sha256}.json.sig").exists()
    again, _ = promote(lab, hand_in(lab, [served(lab, 10)]))  # the same run again: counted once
    assert again.new == 0 and not again.written


def test_a_failed_matrix_is_a_product_failure_and_resets_the_run(tmp_path):
    lab = cpu_lab(tmp_path)
    promote(lab, hand_in(lab, [served(lab, 10), served(lab, 20)]))
    done, _ = promote(lab, hand_in(lab, [served(lab, 30, {"serve.niah": "fail"})]))
    assert done.standing.consecutive_passes == 0
    outcomes = [e.outcome for e in promotion(lab).promotion.evidence]
    assert outcomes == ["pass", "pass", "product-failure"]
    assert "serve.niah: fail" in promotion(lab).promotion.evidence[-1].reason


def test_a_record_that_did_not_run_every_check_counts_for_nothing(tmp_path):
    lab = cpu_lab(tmp_path)
    done, _ = promote(lab, hand_in(lab, [served(lab, 10, {"serve.accuracy": "not-run"})]))
    assert done.standing.level == "unverified" and done.standing.consecutive_passes == 0
    assert promotion(lab).promotion.evidence[0].outcome == "infrastructure"


@pytest.mark.parametrize("kw, words", [
    ({"digest": DIGEST_B}, "not the released cpu image"),
    ({"probe_sources_digest": "sha256:" + "d" * 64}, "a probe (and matrix) whose sources differ"),
    ({"release": "v9.9.9"}, "for release v9.9.9"),
])
def test_a_record_about_another_image_probe_or_release_is_refused(tmp_path, kw, words):
    lab = cpu_lab(tmp_path)
    with pytest.raises(serving.ServeRecordError) as err:
        promote(lab, hand_in(lab, [served(lab, 10, **kw)]))
    assert words in err.value.message


def test_an_unsigned_record_counts_only_with_allow_unsigned_evidence(tmp_path):
    lab = cpu_lab(tmp_path)
    paths = hand_in(lab, [served(lab, 10)], signed=False)
    with pytest.raises(serving.ServeRecordError) as err:
        promote(lab, paths)
    assert "not a serve-check record from an enrolled host" in err.value.message
    done, _ = promote(lab, paths, allow_unsigned=True)
    assert done.new == 1 and promotion(lab).promotion.unsigned_evidence_allowed


def test_a_changed_record_is_refused_by_its_own_checks(tmp_path):
    lab = cpu_lab(tmp_path)
    (path,) = hand_in(lab, [served(lab, 10, {"serve.soak": "fail"})])
    doc = json.loads(path.read_text())
    doc["predicate"]["checks"][3]["status"] = "pass"  # the outcome still says product-failure
    path.write_text(json.dumps(doc))
    with pytest.raises(serving.ServeRecordError) as err:
        promote(lab, [path])
    assert "declares outcome 'product-failure', but its checks give 'pass'" in err.value.message


def vllm_lab(tmp_path, **options) -> Lab:
    """sm120 built with the vllm profile: an image that serves, so the signed policy's serving checks apply."""
    stmt = statement("sm120", DIGEST_A, level="unverified", profile="vllm")
    return Lab(tmp_path, stmt=stmt, **options)


def test_the_release_signs_the_serving_checks_from_the_targets_file(tmp_path):
    """images/targets.toml's [promotion] level_checks, the one source, in release.json's signed policy."""
    from qualify.config import targets

    lab = vllm_lab(tmp_path)
    index = folder.read_release(lab.folder).index
    assert [(x.level, x.checks) for x in index.policy.level_checks] == \
        [(level, tuple(checks)) for level, checks in targets.load().promotion_level_checks.items()]
    assert index.policy.level_checks and set(index.policy.level_checks[0].checks) == set(sm.CHECK_IDS)
    rule = folder.read_release(lab.folder).rule("sm120")
    assert servecount.rule_for(lab.manifest(), rule).required == index.policy.level_checks[0].checks


def test_a_targets_file_naming_a_check_nobody_judges_is_refused(tmp_path):
    from qualify.config import targets
    from qualify.core.errors import ConfigError

    copy = tmp_path / "targets.toml"
    copy.write_text(REPO_TARGETS.read_text().replace('baseline = ["serve.determinism"', 'baseline = ["serve.canary"'))
    with pytest.raises(ConfigError) as err:
        targets.load(copy)
    assert "[promotion] level_checks: 'baseline'" in err.value.message and "serve.determinism" in err.value.hint


def without_serving_rule(tmp_path):
    copy = tmp_path / "targets-before-issue-39.toml"
    text = REPO_TARGETS.read_text()
    kept = [line for line in text.splitlines(keepends=True) if not line.startswith("level_checks")]
    assert len(kept) == len(text.splitlines()) - 1
    copy.write_text("".join(kept))
    return copy


def test_a_gpu_release_signed_before_serving_rules_keeps_its_rule(tmp_path):
    """A policy without level_checks (signed before issue 39): GPU evidence alone, serve-check records kept out."""
    lab = vllm_lab(tmp_path, targets_file=without_serving_rule(tmp_path))
    assert folder.read_release(lab.folder).index.policy.level_checks == ()
    done, notes = promote(lab, [*lab.write([lab.record(10)]), *hand_in(lab, [served(lab, 11, target="sm120")])])
    assert done.standing.consecutive_passes == 1 and done.new == 1
    assert any("serve-check record(s) not counted" in n and "no serving checks" in n for n in notes), notes
    assert promotion(lab, "sm120").promotion.evidence[0].serving_sha256 is None


def test_gpu_evidence_alone_never_counts_toward_baseline_of_a_serving_image(tmp_path):
    """Fail closed: seven passing GPU runs of a vllm image and no serve-check record: experimental, no streak."""
    lab = vllm_lab(tmp_path)
    done, _ = promote(lab, lab.write([lab.record(i) for i in range(1, 8)]))
    assert (done.standing.level, done.standing.consecutive_passes) == ("experimental", 0)
    assert all(e.outcome == "infrastructure" and "no verified serve-check record" in e.reason
               for e in promotion(lab, "sm120").promotion.evidence)


def test_a_record_of_an_unenrolled_host_never_completes_a_gpu_run(tmp_path):
    lab = vllm_lab(tmp_path)
    (gpu,) = [lab.record(10)]
    paired = served(lab, 12, target="sm120", gpu_evidence=link(gpu))
    where = lab.root / "other-host"
    where.mkdir()
    path = serving.write(where / "sm120.serve-check.json", paired)
    from signing_helpers import make_key_pair
    other, _ = make_key_pair(where, prefix="other-host")
    ev.sign(path, ev.host_signer(other, PASSWORD.encode()))
    with pytest.raises(serving.ServeRecordError) as err:
        promote(lab, [*lab.write([gpu]), path])
    assert "not a serve-check record from an enrolled host" in err.value.message


def link(r):
    return serving.GpuLink(r.run_id, r.time, r.host_id_sha256, r.outcome.value)


def test_where_the_signed_policy_requires_the_matrix_a_gpu_run_counts_with_the_record_of_its_deployment(tmp_path):
    """The release's own signed rule (images/targets.toml's level_checks), on an image that serves."""
    lab = vllm_lab(tmp_path)
    gpu = [lab.record(10), lab.record(20)]
    done, notes = promote(lab, lab.write(gpu))  # GPU evidence alone: lifts to experimental, counts no streak
    assert done.standing.level == "experimental" and done.standing.consecutive_passes == 0
    paired = served(lab, 12, target="sm120", gpu_evidence=link(gpu[0]))
    stray = served(lab, 13, target="sm120", gpu_evidence=None)
    done, notes = promote(lab, hand_in(lab, [paired, stray]))
    assert done.standing.consecutive_passes == 1 and done.written  # the first run now counts
    assert any("pair with no GPU run" in n for n in notes)
    first, second = promotion(lab, "sm120").promotion.evidence
    assert first.outcome == "pass" and first.serving_sha256 and "matrix:" in first.reason
    assert second.outcome == "infrastructure" and second.serving_sha256 is None
    failed = served(lab, 21, {"serve.tools": "fail"}, target="sm120", gpu_evidence=link(gpu[1]))
    done, _ = promote(lab, hand_in(lab, [failed]))
    assert promotion(lab, "sm120").promotion.evidence[1].outcome == "product-failure"
    assert done.standing.consecutive_passes == 0
