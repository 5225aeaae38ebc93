"""Promotion by GPU evidence (seed 000's rule), through `qualify/release/promote.py` and the CLI.

Evidence records are made here as start.sh makes them (release/evidence.py); the
manifests are signed with the built-in signer and verified after promotion.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO
from signing_helpers import DIGEST_A, DIGEST_B, PASSWORD, make_key_pair, statement

from qualify.config import targets
from qualify.core import manifest as mf
from qualify.release import evidence as ev
from qualify.release import promote, verify

TF = targets.load()
PROBE = "sha256:" + "c" * 64
N = TF.promotion_passes


def record(n: int, outcome: ev.Outcome = ev.Outcome.PASS, digest: str = DIGEST_A, cap: str = "12.0",
           probe: str = PROBE) -> ev.Evidence:
    return ev.Evidence(release="v1", target="sm120", capability="12.0",
                       image_reference=f"127.0.0.1:5555/blackwell/sm120@{digest}", image_digest=digest,
                       probe_sources_digest=probe,
                       gpu=ev.Gpu("NVIDIA GeForce RTX 5090" if cap == "12.0" else "NVIDIA H200", cap,
                                  ev.hashed("GPU-1"), "580.1"),
                       host_id_sha256=ev.hashed("host"), time=f"2026-12-{n:02d}T00:00:00Z", outcome=outcome,
                       reason=outcome.value, figures={"bf16_matmul_tflops": 200.0 + n})


@pytest.fixture()
def release(tmp_path) -> Path:
    folder = tmp_path / "manifests" / "v1"
    stmt = statement("sm120", DIGEST_A, level="unverified")
    stmt["predicate"].setdefault("toolkit", {})["probe_sha256"] = PROBE
    mf.write(folder / "sm120.json", stmt)
    return folder


def files(tmp_path: Path, records) -> list:
    out = []
    for i, r in enumerate(records):
        out.append(ev.write(tmp_path / f"e{i}-{r.time[:10]}-{r.outcome.value}.json", r))
    return out


def run(release: Path, tmp_path: Path, records) -> promote.Promoted:
    (done,) = promote.promote(release, "v1", files(tmp_path, records), TF)
    return done


def test_the_promotion_count_lives_in_the_targets_file():
    assert N == 7


def test_six_passes_stay_experimental_the_seventh_promotes(release, tmp_path):
    six = run(release, tmp_path, [record(i) for i in range(1, 7)])
    assert (six.standing.level, six.standing.consecutive_passes) == ("experimental", 6)
    assert mf.predicate(mf.load(release / "sm120.json"))["support_level"] == "experimental"
    seventh = run(release, tmp_path, [record(7)])  # re-run: the first six are kept in the release folder
    assert (seventh.standing.level, seventh.standing.consecutive_passes, seventh.new) == ("baseline", 7, 1)
    pred = mf.predicate(mf.load(release / "sm120.json"))
    assert pred["support_level"] == "baseline" and pred["promotion"]["released_level"] == "unverified"
    assert len(pred["promotion"]["evidence"]) == 7 and (release / "sm120.promotion.json").is_file()


def test_an_infrastructure_outcome_neither_resets_nor_counts(release, tmp_path):
    records = [record(i) for i in range(1, 4)] + [record(4, ev.Outcome.INFRASTRUCTURE)] + \
        [record(i) for i in range(5, 8)]
    done = run(release, tmp_path, records)
    assert (done.standing.level, done.standing.consecutive_passes) == ("experimental", 6)
    assert run(release, tmp_path, [record(8)]).standing.level == "baseline"


def test_a_product_failure_resets_and_demotes(release, tmp_path):
    records = [record(i) for i in range(1, 8)]
    assert run(release, tmp_path, records).standing.level == "baseline"
    done = run(release, tmp_path, [record(8, ev.Outcome.PRODUCT_FAILURE)])
    assert (done.standing.level, done.standing.consecutive_passes) == ("experimental", 0)
    assert "demoted by a product failure" in done.standing.note
    again = run(release, tmp_path, [record(i) for i in range(9, 15)])
    assert (again.standing.level, again.standing.consecutive_passes) == ("experimental", 6)


@pytest.mark.parametrize("kw,message", [
    ({"digest": DIGEST_B}, f"is for image digest {DIGEST_B}, not the released sm120 image {DIGEST_A}"),
    ({"cap": "9.0"}, "taken on NVIDIA H200 with capability 9.0, not the target's capability 12.0"),
    ({"probe": "sha256:" + "d" * 64}, "comes from a probe whose sources differ"),
])
def test_evidence_for_another_image_gpu_or_probe_is_refused_naming_which(release, tmp_path, kw, message):
    with pytest.raises(ev.EvidenceError) as caught:
        run(release, tmp_path, [record(1, **kw)])
    assert message in str(caught.value) and str(tmp_path) in str(caught.value)
    assert "promotion" not in mf.predicate(mf.load(release / "sm120.json"))  # nothing half-written


def test_replaying_one_file_counts_once(release, tmp_path):
    (one,) = files(tmp_path, [record(1)])
    done = promote.promote(release, "v1", [one] * 7, TF)[0]
    assert (done.standing.consecutive_passes, done.new) == (1, 1)
    done = promote.promote(release, "v1", [one], TF)[0]
    assert (done.standing.consecutive_passes, done.new) == (1, 0)


def test_a_changed_record_is_not_evidence(tmp_path):
    path = ev.write(tmp_path / "e.json", record(1))
    path.write_text(path.read_text().replace('"pass"', '"passed"', 1))
    with pytest.raises(ev.EvidenceError, match="outcome"):
        ev.load(path)


def test_cli_promotes_and_signs_with_the_release_key(release, tmp_path):
    key, pub = make_key_pair(tmp_path)
    paths = files(tmp_path, [record(i) for i in range(1, 8)])
    env = {**os.environ, "PYTHONPATH": str(REPO), "COSIGN_PASSWORD": PASSWORD}
    done = subprocess.run([sys.executable, "-m", "qualify", "promote", "v1", "--manifests", str(release.parent),
                           "--key", str(key), "--evidence", *map(str, paths)], capture_output=True, text=True,
                          env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "sm120: baseline (7 of 7 consecutive passes; 7 records, 7 new)" in done.stdout
    result = verify.verify(verify.VerifyOptions(manifest=release / "sm120.json", key=pub,
                                                signature=release / "sm120.json.sig"))
    assert result.support_level == "baseline"


# --- probe manifests as evidence (qualify gpu-evidence, a Kubernetes Job, qualify merge) ----------------------


def probe_statement(n: int, status: str = "pass", cap: str = "12.0", probe: str = PROBE) -> dict:
    """What `qualify gpu-evidence` writes: the probe's GPU checks in a container of the released image."""
    stmt = statement("sm120", DIGEST_A, level="unverified",
                     statuses={"gpu.bf16-matmul": status, "gpu.triton-scratch": "pass"})
    pred = stmt["predicate"]
    pred["created"] = f"2026-12-{n:02d}T00:00:00Z"
    pred["toolkit"] = {"version": "0.1.0", "probe_sha256": probe}
    pred["gpu"] = {"visible": True, "devices": [{"name": "NVIDIA GeForce RTX 5090", "compute_cap": cap,
                                                 "uuid": f"GPU-{n}", "driver_version": "580.1"}]}
    pred["host"] = {"hostname": f"gpu-runner-{n}"}
    return stmt


def test_probe_manifests_count_by_the_same_rule(release, tmp_path):
    paths = [mf.write(tmp_path / f"s{i}.json", probe_statement(i)) for i in range(1, 8)]
    done = promote.promote(release, "v1", paths, TF)[0]
    assert (done.standing.level, done.standing.consecutive_passes) == ("baseline", 7)
    # The same manifests again count once; a failing GPU check is a product failure and demotes.
    again = promote.promote(release, "v1", paths + [mf.write(tmp_path / "f.json", probe_statement(8, "fail"))], TF)[0]
    assert again.new == 1 and again.standing.level != "baseline"


def test_a_probe_manifest_must_name_its_probe_and_run_on_the_targets_gpu(release, tmp_path):
    unnamed = probe_statement(1)
    del unnamed["predicate"]["toolkit"]["probe_sha256"]
    with pytest.raises(ev.EvidenceError, match="does not name its probe's sources digest"):
        promote.promote(release, "v1", [mf.write(tmp_path / "u.json", unnamed)], TF)
    other = mf.write(tmp_path / "o.json", probe_statement(1, probe="sha256:" + "d" * 64))
    with pytest.raises(ev.EvidenceError, match="probe whose sources differ"):
        promote.promote(release, "v1", [other], TF)
    hopper = mf.write(tmp_path / "h.json", probe_statement(1, cap="9.0"))
    with pytest.raises(ev.EvidenceError, match="capability 9.0, not the target's capability 12.0"):
        promote.promote(release, "v1", [hopper], TF)


def test_the_probe_records_its_own_sources_digest():
    from qualify.probe import identity
    from qualify.qualification import container

    assert identity.sources_digest() == container.probe_sources_digest()


def test_show_and_diff_give_levels_with_their_evidence_and_per_sku_figures(release, tmp_path):
    from qualify.release import report

    before = run(release, tmp_path, [record(i) for i in range(1, 8)])
    old = mf.load(before.manifest)
    shown = report.show(old, width=200)
    assert "level      baseline by evidence: 7 of 7 consecutive passes (released as unverified)" in shown
    assert shown.count("  evidence 2026-12-") == 7 and "bf16_matmul_tflops 207" in shown
    # The next release's evidence on the same SKU is slower: diff names the figure and the change.
    new = json.loads(json.dumps(old))
    for e in new["predicate"]["promotion"]["evidence"]:
        e["figures"]["bf16_matmul_tflops"] = e["figures"]["bf16_matmul_tflops"] * 0.8
    lines = report.diff(old, new)
    assert any(line.startswith("figure bf16_matmul_tflops on NVIDIA GeForce RTX 5090: 204 -> 163.2 (-20.0%)")
               for line in lines), lines
