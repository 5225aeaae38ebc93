"""Promotion by GPU evidence (the Blackwell support RFC's rule), through `qualify/release/promote.py` and the CLI.

Releases are made by the real release steps; evidence records are made and signed as start.sh makes and
signs them, by a GPU host enrolled with its own key; what promote writes is read back through the one
release reader. Issue 27's findings each have a test here (marked "finding N").
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO
from evidence_helpers import PROBE, TAG, TF, Lab, gpu_check
from signing_helpers import DIGEST_A, DIGEST_B, PASSWORD, make_key_pair

from qualify.core import manifest as mf
from qualify.core.errors import ConfigError, VerificationError
from qualify.core.fsutil import canonical_json
from qualify.release import evidence as ev
from qualify.release import promote, standing, verify
from qualify.scaleout import merge
from qualify.signing import formats, signer
from qualify.trust import folder, journal
from qualify.trust import records as rec
from qualify.trust.verify import CurrentLevel, TrustedKey, sha256

N = TF.promotion_passes


@pytest.fixture()
def lab(tmp_path) -> Lab:
    return Lab(tmp_path)


def qualify_cli(*args: str, **env: str) -> subprocess.CompletedProcess:
    full = {**os.environ, "PYTHONPATH": str(REPO), "COSIGN_PASSWORD": PASSWORD, **env}
    return subprocess.run([sys.executable, "-m", "qualify", *args], capture_output=True, text=True, env=full,
                          timeout=120, stdin=subprocess.DEVNULL)


def test_the_promotion_count_lives_in_the_targets_file():
    assert N == 7


def test_six_passes_stay_experimental_the_seventh_promotes(lab):
    released = sha256((lab.folder / "sm120.json").read_bytes())
    six = lab.run([lab.record(i) for i in range(1, 7)])
    assert (six.standing.level, six.standing.consecutive_passes, six.sequence) == ("experimental", 6, 1)
    assert lab.current() == CurrentLevel("experimental", 1)
    seventh = lab.run([lab.record(7)])  # the first six are the ones the signed promotion record accepted
    assert (seventh.standing.level, seventh.standing.consecutive_passes, seventh.new, seventh.sequence) == \
        ("baseline", 7, 1, 2)
    assert lab.current() == CurrentLevel("baseline", 2)
    vt = folder.read_release(lab.folder).target("sm120")
    assert vt.promotion.released_level == "unverified" and len(vt.promotion.evidence) == 7
    # issue 52: the level lives in the signed promotion record only; the manifest is the released bytes
    assert sha256((lab.folder / "sm120.json").read_bytes()) == released == vt.entry.manifest_sha256 == \
        vt.promotion.manifest_sha256
    assert vt.manifest.support_level == "unverified" and "promotion" not in vt.manifest.predicate
    assert "sm120.json unchanged, as released" in "\n".join(promote.summary_lines(seventh, False))


def test_a_promoted_manifest_rewritten_after_all_is_refused(lab, tmp_path):
    """From release/v3 there is one hash rule: the manifest is the bytes release.json names. A manifest rewritten
    and re-signed with the release key, as a release/v2 promote would have written it, does not verify."""
    lab.run([lab.record(i) for i in range(1, 8)])
    stmt = json.loads((lab.folder / "sm120.json").read_text())
    stmt["predicate"]["support_level"] = "baseline"
    path = lab.folder / "sm120.json"
    path.write_bytes(mf.dumps(stmt))
    signed = lab.sign.sign_blob(path.read_bytes())
    formats.signature_path(path).write_bytes(signed.sig_file)
    formats.bundle_path(path).write_bytes(signed.bundle)
    with pytest.raises(VerificationError, match="not the manifest release.json names .* or one rewritten after release"):
        folder.read_release(lab.folder)


def test_a_release_v2_folder_is_promoted_as_before_its_manifest_rewritten_and_it_verifies(lab):
    """Issue 52: a folder released before (release/v2) keeps its rule, so verifiers of that time still read it:
    promote rewrites its manifest with the level, the current promotion record names the new bytes."""
    lab.as_release_v2()
    released = sha256((lab.folder / "sm120.json").read_bytes())
    done = lab.run([lab.record(i) for i in range(1, 8)])
    vt = folder.read_release(lab.folder).target("sm120")
    assert vt.current == CurrentLevel("baseline", 1) and vt.manifest.support_level == "baseline"
    assert vt.manifest_sha256 == vt.promotion.manifest_sha256 != released == vt.entry.manifest_sha256
    assert vt.manifest.predicate["promotion"]["released_level"] == "unverified"
    assert "a release/v2 folder" in "\n".join(promote.summary_lines(done, False))
    again = lab.run([lab.record(8, ev.Outcome.PRODUCT_FAILURE)])  # and again: the ledger moves on as before
    assert again.sequence == 2 and lab.current() == CurrentLevel("experimental", 2) == \
        CurrentLevel(lab.manifest().support_level, 2)


def test_an_infrastructure_outcome_neither_resets_nor_counts(lab):
    records = [lab.record(i) for i in range(1, 4)] + [lab.record(4, ev.Outcome.INFRASTRUCTURE)] + \
        [lab.record(i) for i in range(5, 8)]
    done = lab.run(records)
    assert (done.standing.level, done.standing.consecutive_passes) == ("experimental", 6)
    assert lab.run([lab.record(8)]).standing.level == "baseline"


def test_a_run_that_saw_no_gpu_is_kept_as_infrastructure(lab):
    """The Blackwell support RFC: infrastructure failures are reported apart from product failures. A run on the target's host
    whose GPU was not visible (gpu-evidence --gpus none, a broken driver) is accepted, neither counts nor resets;
    a run on another GPU is still refused (the parametrised test below)."""
    blind = lab.record(4, ev.Outcome.INFRASTRUCTURE, cap=ev.NO_GPU, gpu=ev.Gpu(ev.NO_GPU, ev.NO_GPU, ev.hashed(""), ""))
    assert blind.outcome is ev.Outcome.INFRASTRUCTURE
    done = lab.run([lab.record(i) for i in range(1, 4)] + [blind] + [lab.record(i) for i in range(5, 8)])
    assert (done.standing.level, done.standing.consecutive_passes) == ("experimental", 6)
    said = "\n".join(promote.summary_lines(done, False))
    assert "on none: infrastructure" in said and said.count(": pass (") == 6, said


def test_a_product_failure_resets_and_demotes(lab):
    assert lab.run([lab.record(i) for i in range(1, 8)]).standing.level == "baseline"
    done = lab.run([lab.record(8, ev.Outcome.PRODUCT_FAILURE)])
    assert (done.standing.level, done.standing.consecutive_passes) == ("experimental", 0)
    assert "lowered baseline to experimental" in done.standing.note
    again = lab.run([lab.record(i) for i in range(9, 15)])
    assert (again.standing.level, again.standing.consecutive_passes) == ("experimental", 6)


@pytest.mark.parametrize("kw,message", [
    ({"digest": DIGEST_B}, f"is for image digest {DIGEST_B}, not the released sm120 image {DIGEST_A}"),
    ({"cap": "9.0"}, "taken on NVIDIA H200 with capability 9.0, not the target's capability 12.0"),
    ({"probe": "sha256:" + "d" * 64}, "comes from a probe whose sources differ"),
    ({"release": "v0.9.0"}, "is for release v0.9.0, not v1.0.0"),  # finding 6: the record's release field
])
def test_evidence_for_another_image_gpu_probe_or_release_is_refused_naming_which(lab, kw, message):
    paths = lab.write([lab.record(1, **kw)])
    with pytest.raises(ev.EvidenceError) as caught:
        lab.promote(paths)
    assert message in str(caught.value) and str(paths[0]) in str(caught.value)
    assert lab.current() == CurrentLevel("unverified")  # nothing half-written
    assert not (lab.folder / "sm120.promotion.json").exists()


def test_replaying_one_file_counts_once(lab):
    (one,) = lab.write([lab.record(1)])
    done = lab.promote([one] * 7)
    assert (done.standing.consecutive_passes, done.new) == (1, 1)
    again = lab.promote([one])
    assert (again.standing.consecutive_passes, again.new, again.written, again.sequence) == (1, 0, False, 1)


def test_a_changed_record_is_not_evidence(lab):
    (path,) = lab.write([lab.record(1)], signed=False)
    path.write_text(path.read_text().replace('"outcome": "pass"', '"outcome": "passed"', 1))
    with pytest.raises(ev.EvidenceError, match="outcome"):
        ev.load(path)


# --- finding 1: promote starts from verified state ------------------------------------------


def test_a_tampered_manifest_is_refused_never_laundered(lab):
    """The release's sm120.json edited to name another image at baseline: promote refuses, signs nothing."""
    path = lab.folder / "sm120.json"
    stmt = json.loads(path.read_text())
    stmt["subject"][0]["digest"]["sha256"] = DIGEST_B.split(":")[1]
    stmt["predicate"]["image"] = {"reference": f"127.0.0.1:5000/evil/sm120@{DIGEST_B}", "digest": DIGEST_B}
    stmt["predicate"]["support_level"] = "baseline"
    mf.write(path, stmt)
    sig_before = formats.signature_path(path).read_bytes()
    with pytest.raises(VerificationError, match="signature check failed"):
        lab.run([lab.record(1, ev.Outcome.INFRASTRUCTURE)])
    assert formats.signature_path(path).read_bytes() == sig_before and not (lab.folder / "sm120.promotion.json").exists()


def test_a_key_that_is_not_the_releases_is_refused_before_anything_is_written(lab, tmp_path):
    """finding 6: `promote --key` of another key used to overwrite a valid .sig."""
    other_key, _ = make_key_pair(tmp_path, prefix="other")
    paths = lab.write([lab.record(1)])
    sig = formats.signature_path(lab.folder / "sm120.json").read_bytes()
    done = qualify_cli("promote", TAG, "--manifests", str(lab.manifests), "--key", str(other_key),
                       "--evidence", *map(str, paths))
    assert done.returncode == ConfigError.exit_code and "--key is not this release's key" in done.stderr
    assert formats.signature_path(lab.folder / "sm120.json").read_bytes() == sig
    assert "Traceback" not in done.stderr


def test_cli_promotes_signs_with_the_release_key_and_the_release_still_verifies(lab):
    """finding 6: promote writes `.sigstore.json` (as release does), never a stale bundle beside a new .sig."""
    paths = lab.write([lab.record(i) for i in range(1, 8)])
    done = qualify_cli("promote", TAG, "--manifests", str(lab.manifests), "--key", str(lab.release_key),
                       "--evidence", *map(str, paths))
    assert done.returncode == 0, done.stderr
    assert "sm120: baseline (7 of 7 consecutive passes; 7 records, 7 new)" in done.stdout
    assert not list(lab.folder.glob("*.bundle"))
    result = verify.verify(verify.VerifyOptions(manifest=lab.folder / "sm120.json", key=lab.release_pub))
    assert result.support_level == "baseline" and result.promotion_sequence == 1 and result.release == TAG
    bundle = json.loads(formats.bundle_path(lab.folder / "sm120.json").read_text())
    assert bundle["messageSignature"]["messageDigest"]["digest"]  # checked by the reader against the bytes


# --- finding 2: evidence is a signed claim by an enrolled host -----------------------------------------


def test_unsigned_evidence_is_refused_unless_allowed_loudly_and_on_the_record(lab):
    paths = lab.write([lab.record(i) for i in range(1, 8)], signed=False)
    with pytest.raises(ev.EvidenceError, match="not evidence from an enrolled host: it has no signature"):
        lab.promote(paths)
    done = lab.promote(paths, allow_unsigned=True)
    assert done.standing.level == "baseline"
    record = rec.PromotionRecord.parse((lab.folder / "sm120.promotion.json").read_bytes(), "promotion")
    assert record.unsigned_evidence_allowed and {e.host for e in record.evidence} == {"unsigned"}


def test_evidence_signed_by_a_host_nobody_enrolled_is_refused(lab, tmp_path):
    stranger, _ = make_key_pair(tmp_path, prefix="stranger")
    paths = lab.write([lab.record(1)], key=stranger)
    with pytest.raises(ev.EvidenceError, match="not from an enrolled host"):
        lab.promote(paths)


def test_whoever_writes_the_folder_cannot_enroll_themselves(lab, tmp_path):
    """A hosts file not signed with the release key is refused (the attacker's own key signs it)."""
    attacker_key, attacker_pub = make_key_pair(tmp_path, prefix="attacker")
    hosts = rec.EnrolledHosts(9, (rec.EnrolledHost("evil", key_pem=attacker_pub.read_text(), fingerprint="x"),))
    path = lab.manifests / rec.HOSTS_FILE
    path.write_bytes(hosts.to_bytes())
    from evidence_helpers import sign_with
    sign, _ = sign_with(attacker_key)
    signer.write_signature(sign, path)
    with pytest.raises(VerificationError, match="signature check failed"):
        folder.read_hosts(path, lab.key)
    paths = lab.write([lab.record(1)], key=attacker_key)
    done = qualify_cli("promote", TAG, "--manifests", str(lab.manifests), "--key", str(lab.release_key),
                       "--evidence", *map(str, paths))
    assert done.returncode == ConfigError.exit_code and "enrolled hosts cannot be used" in done.stderr


@pytest.mark.parametrize("checks", [
    tuple(gpu_check(c, "fail") for c in ("gpu.memory", "gpu.triton-scratch", "gpu.bf16-matmul", "gpu.torch-compile")),
    (),  # checks=[] used to count
])
def test_a_declared_pass_its_checks_do_not_give_is_refused(lab, checks):
    record = lab.record(1)
    record = ev.Evidence(**{**record.__dict__, "checks": checks})  # still declares "pass"
    paths = lab.write([record])
    with pytest.raises(ev.EvidenceError, match="declares outcome 'pass', but its checks give"):
        lab.promote(paths)


def test_records_dropped_into_the_evidence_folder_do_not_count(lab):
    lab.run([lab.record(1)])
    store = lab.folder / "evidence" / "sm120"
    for i in range(2, 9):  # seven passes copied in by hand, never through promote
        (dropped,) = lab.write([lab.record(i)], where=lab.root / f"drop{i}")
        shutil.copy(dropped, store / f"{ev.hashed(str(i)).split(':')[1]}.json")
    done = lab.run([lab.record(9)])
    assert (done.standing.consecutive_passes, done.standing.level) == (2, "experimental")
    assert len(done.ignored) == 7 and "ignored 7 file(s)" in "\n".join(promote.summary_lines(done, False))


# --- finding 3: time is parsed, not compared as text ------------------------------------------


@pytest.mark.parametrize("stamp,message", [
    ("1970-01-01T00:00:00Z", "before release v1.0.0's source"),
    ("0", "is not an RFC 3339 time"),
    (" 2026-12-31T00:00:00Z", "is not an RFC 3339 time"),
    ("2999-01-01T00:00:00Z", "in the future"),
])
def test_a_failure_cannot_hide_behind_its_timestamp(lab, stamp, message):
    passes = lab.write([lab.record(i) for i in range(1, 8)])
    failure = lab.record(8, ev.Outcome.PRODUCT_FAILURE)
    (path,) = lab.write([failure])
    doc = json.loads(path.read_text())
    doc["time"] = stamp
    path.write_text(json.dumps(doc))
    ev.sign(path, ev.host_signer(lab.host_key, PASSWORD.encode()))
    with pytest.raises(ev.EvidenceError, match=message):
        lab.promote(passes + [path])


def test_a_probe_statement_without_created_is_refused(lab, tmp_path):
    stmt = probe_statement(lab, 1)
    del stmt["predicate"]["created"]
    path = mf.write(tmp_path / "no-time.json", stmt)
    ev.sign(path, ev.host_signer(lab.host_key, PASSWORD.encode()))
    with pytest.raises(ev.EvidenceError, match="predicate.created.*is not an RFC 3339 time"):
        lab.promote([path])


# --- finding 4: an allow-list, not a deny-list ----------------------------------------------------


@pytest.mark.parametrize("status", ["error", "FAIL", "crashed"])
def test_unknown_statuses_of_required_gpu_checks_are_never_passes(lab, status):
    record = lab.record(1)
    checks = list(record.checks)
    checks[1] = {**checks[1], "status": status}
    paths = lab.write([ev.Evidence(**{**record.__dict__, "checks": tuple(checks)})])
    with pytest.raises(ev.EvidenceError, match="checks/1/status"):
        lab.promote(paths)
    # The outcome rule itself, on checks no schema saw: infrastructure, never a pass.
    assert ev.outcome_of(checks, "12.0", "12.0").outcome is ev.Outcome.INFRASTRUCTURE


def test_a_failing_required_check_marked_not_required_is_still_a_product_failure(lab):
    checks = [gpu_check(c, "pass") for c in ("gpu.memory", "gpu.triton-scratch", "gpu.torch-compile")]
    checks.append(gpu_check("gpu.bf16-matmul", "fail", required=False))
    assert ev.outcome_of(checks, "12.0", "12.0").outcome is ev.Outcome.PRODUCT_FAILURE
    weird = [dict(c, required=0) for c in checks]
    record = lab.record(1, ev.Outcome.PRODUCT_FAILURE)
    paths = lab.write([ev.Evidence(**{**record.__dict__, "checks": tuple(weird)})])
    with pytest.raises(ev.EvidenceError, match="is not of type 'boolean'"):
        lab.promote(paths)


def test_promote_validates_probe_statements_against_the_schema(lab, tmp_path):
    stmt = probe_statement(lab, 1)
    stmt["predicate"]["verdict"] = "great"
    path = mf.write(tmp_path / "broken.json", stmt)
    ev.sign(path, ev.host_signer(lab.host_key, PASSWORD.encode()))
    with pytest.raises(ev.EvidenceError, match="manifest does not match"):
        lab.promote([path])


# --- finding 5: identity is the run's, not the bytes' -------------------------------------------------


@pytest.mark.parametrize("respell", [
    lambda d: {**d, "figures": {"bf16_matmul_tflops": int(d["figures"]["bf16_matmul_tflops"])}},
    lambda d: {**d, "time": d["time"].replace("Z", "+00:00")},
    lambda d: {**d, "time": d["time"].replace("Z", ".0Z")},
    lambda d: {**d, "time": d["time"].replace("Z", "z")},
])
def test_the_same_run_counts_once_however_it_is_serialised(lab, respell):
    (path,) = lab.write([lab.record(1)])
    other = lab.root / "respelled" / path.name
    other.parent.mkdir()
    other.write_text(json.dumps(respell(json.loads(path.read_text()))))
    ev.sign(other, ev.host_signer(lab.host_key, PASSWORD.encode()))
    done = lab.promote([path, other])
    assert (done.new, done.standing.consecutive_passes) == (1, 1)


def test_merge_turns_one_run_in_many_spellings_into_one_file(lab, tmp_path):
    stmt = probe_statement(lab, 1)
    spellings = []
    for i, created in enumerate([stmt["predicate"]["created"], stmt["predicate"]["created"].replace("Z", "+00:00"),
                                 stmt["predicate"]["created"].replace("Z", ".0Z")]):
        doc = json.loads(json.dumps(stmt))
        doc["predicate"]["created"] = created
        path = tmp_path / f"spelling{i}.json"
        path.write_text(json.dumps(doc, indent=i))
        spellings.append(path)
    merged = merge.merge(spellings)
    assert len(merged.evidence) == 1 and len(merged.duplicates) == 2


def test_merge_reads_every_block_of_a_log_and_refuses_blocks_that_disagree(tmp_path, lab):
    from qualify.scaleout.k8s import BEGIN, END

    one, two = probe_statement(lab, 1), probe_statement(lab, 2, status="fail")
    log = tmp_path / "pod.log"
    log.write_text("\n".join(["start", BEGIN, json.dumps(one), END, "retry", BEGIN, json.dumps(two), END, ""]))
    assert len(merge.merge([log]).evidence) == 2  # the second, failing block is not dropped
    two["subject"][0]["digest"]["sha256"] = DIGEST_B.split(":")[1]
    two["predicate"].pop("image", None)
    log.write_text("\n".join([BEGIN, json.dumps(one), END, BEGIN, json.dumps(two), END, ""]))
    with pytest.raises(merge.MergeError, match="its evidence blocks disagree"):
        merge.merge([log])


# --- probe manifests as evidence (qualify gpu-evidence, a Kubernetes Job, qualify merge) ----------------------


REAL = REPO / "manifests" / "evidence" / "h200" / "probe-sm120.json"  # the probe's own output on a real GPU


def probe_statement(lab: Lab, n: int, status: str = "pass", cap: str = "12.0", probe: str = PROBE) -> dict:
    """What `qualify gpu-evidence` writes: the probe's real manifest (the committed H200 run), as if its GPU
    checks had run in a container of the released image on an RTX 5090."""
    real = json.loads(REAL.read_text())
    pred = real["predicate"]
    for c in pred["checks"]:
        if c["id"] in ("gpu.memory", "gpu.triton-scratch", "gpu.bf16-matmul", "gpu.torch-compile"):
            c.update(status="pass", required=True)
        if c["id"] == "gpu.bf16-matmul":
            c["status"] = status
    pred["verdict"] = mf.verdict(pred["checks"]).value
    pred["created"] = lab.when(n)
    pred["run_id"] = f"{n:032x}"
    pred["toolkit"] = {**pred["toolkit"], "probe_sha256": probe}
    pred["gpu"] = {"visible": True, "devices": [{"name": "NVIDIA GeForce RTX 5090", "compute_cap": cap,
                                                 "uuid": f"GPU-{n}", "driver_version": "580.1",
                                                 "memory.total": "32607"}]}
    pred["host"] = {**pred["host"], "hostname": f"gpu-runner-{n}"}
    return mf.statement("127.0.0.1:5555/blackwell/sm120", DIGEST_A, pred)


def _signed_statement(lab: Lab, tmp_path: Path, name: str, stmt: dict) -> Path:
    path = mf.write(tmp_path / name, stmt)
    ev.sign(path, ev.host_signer(lab.host_key, PASSWORD.encode()))
    return path


def test_probe_manifests_count_by_the_same_rule(lab, tmp_path):
    paths = [_signed_statement(lab, tmp_path, f"s{i}.json", probe_statement(lab, i)) for i in range(1, 8)]
    done = lab.promote(paths)
    assert (done.standing.level, done.standing.consecutive_passes) == ("baseline", 7)
    # The same manifests again count once; a failing GPU check is a product failure and demotes.
    failing = _signed_statement(lab, tmp_path, "f.json", probe_statement(lab, 8, "fail"))
    again = lab.promote(paths + [failing])
    assert again.new == 1 and again.standing.level != "baseline"


def test_a_probe_manifest_must_name_its_probe_and_run_on_the_targets_gpu(lab, tmp_path):
    unnamed = probe_statement(lab, 1)
    del unnamed["predicate"]["toolkit"]["probe_sha256"]
    with pytest.raises(ev.EvidenceError, match="does not name its probe's sources digest"):
        lab.promote([_signed_statement(lab, tmp_path, "u.json", unnamed)])
    other = _signed_statement(lab, tmp_path, "o.json", probe_statement(lab, 1, probe="sha256:" + "d" * 64))
    with pytest.raises(ev.EvidenceError, match="probe whose sources differ"):
        lab.promote([other])
    hopper = _signed_statement(lab, tmp_path, "h.json", probe_statement(lab, 1, cap="9.0"))
    with pytest.raises(ev.EvidenceError, match="capability 9.0, not the target's capability 12.0"):
        lab.promote([hopper])


def test_the_probe_records_its_own_sources_digest_and_a_run_id():
    from qualify.probe import identity
    from qualify.qualification import container

    assert identity.sources_digest() == container.probe_sources_digest()
    schema = json.loads((REPO / "manifests" / "manifest.schema.json").read_text())
    assert "run_id" in schema["$defs"]["predicate"]["properties"]


def test_show_and_diff_give_levels_with_their_evidence_and_per_sku_figures(lab):
    from qualify.release import report

    lab.run([lab.record(i) for i in range(1, 8)])
    path = lab.folder / "sm120.json"
    stmt = json.loads(path.read_text())
    current = standing.standing_of(path, mf.Manifest.from_statement(stmt, str(path)))
    shown = report.show(stmt, 200, current)  # the level and evidence: the signed promotion record's
    assert "support level baseline" in shown
    assert "level      baseline by evidence: 7 of 7 consecutive passes (released as unverified)" in shown
    assert shown.count("  evidence 20") == 7 and "bf16_matmul_tflops 207" in shown
    assert "support level unverified" in report.show(stmt, 200)  # the manifest alone: the released level
    from qualify.release import compare

    assert compare.Column.read(path).support_level == "baseline"  # compare reads the verified current level too
    copy = lab.root / "elsewhere" / "sm120.json"  # outside a release folder nothing vouches for a promotion
    copy.parent.mkdir()
    shutil.copyfile(path, copy)
    assert compare.Column.read(copy).support_level == "unverified"
    done = qualify_cli("verify", str(path), "--key", str(lab.folder / "cosign.pub"), "--json")
    assert done.returncode == 0 and json.loads(done.stdout)["support_level"] == "baseline", done.stderr
    old = report.as_current(stmt, current)
    # The next release's evidence on the same SKU is slower: diff names the figure and the change.
    new = json.loads(json.dumps(old))
    for e in new["predicate"]["promotion"]["evidence"]:
        e["figures"]["bf16_matmul_tflops"] = e["figures"]["bf16_matmul_tflops"] * 0.8
    lines = report.diff(old, new)
    assert any(line.startswith("figure bf16_matmul_tflops on NVIDIA GeForce RTX 5090: 204 -> 163.2 (-20.0%)")
               for line in lines), lines


# --- interruptions ------------------------------------------------------------------------------------


@pytest.mark.parametrize("step", ["signed-write:staged", "signed-write:renamed-one"])
def test_a_promote_killed_midway_never_leaves_a_trusted_half_and_the_next_one_finishes(lab, step):
    paths = lab.write([lab.record(i) for i in range(1, 8)])
    argv = ("promote", TAG, "--manifests", str(lab.manifests), "--key", str(lab.release_key),
            "--evidence", *map(str, paths))
    killed = qualify_cli(*argv, QUALIFY_KILL_AT=step)
    assert killed.returncode == -9, killed.stderr
    try:
        # the old state, whole (renamed-one too: the first thing renamed is a signature file beside no record) ...
        assert folder.read_release(lab.folder).target("sm120").current == CurrentLevel("unverified")
    except VerificationError as exc:  # ... or a refusal, never a half-written state taken as true
        assert step == "signed-write:renamed-one" and "signature check failed" in exc.message
    done = qualify_cli(*argv)
    assert done.returncode == 0, done.stderr
    assert "sm120: baseline" in done.stdout
    assert folder.read_release(lab.folder).target("sm120").current == CurrentLevel("baseline", 1)
    assert not list(lab.folder.glob(journal.JOURNAL_PREFIX + "*"))


# --- issue 37: the promotion ledger only moves forward -----------------------------------------------


def _copy(names, src: Path, dest: Path) -> None:
    for name in names:
        for suffix in ("", ".sig", ".sigstore.json"):
            if (src / (name + suffix)).exists():
                shutil.copyfile(src / (name + suffix), dest / (name + suffix))


CURRENT = ("sm120.json", "sm120.promotion.json")


def test_every_promotion_record_is_kept_and_each_names_the_one_before(lab):
    lab.run([lab.record(1)])
    lab.run([lab.record(2)])
    lab.run([lab.record(3, ev.Outcome.PRODUCT_FAILURE)])
    assert sorted(p.name for p in lab.folder.glob("sm120.promotion*.json") if ".json." not in p.name) == \
        ["sm120.promotion.1.json", "sm120.promotion.2.json", "sm120.promotion.json"]
    vt = folder.read_release(lab.folder).target("sm120")
    assert [s for s, _ in vt.chain] == [1, 2, 3]
    kept = (lab.folder / "sm120.promotion.2.json").read_bytes()
    assert vt.promotion.previous_sha256 == sha256(kept)
    assert rec.PromotionRecord.parse(kept, "2").previous_sha256 == sha256(
        (lab.folder / "sm120.promotion.1.json").read_bytes())


def test_a_restored_promotion_never_undoes_a_demotion_and_routine_promotes_cannot_make_it_stick(lab, tmp_path):
    """High 2: after a demotion, the previous promotion's signed files restored. The ledger beside them says the
    current record is older than one it replaced; with that kept record removed too, the folder is exactly as
    it was after promotion 1, which this promoter saw superseded: every later promote is refused."""
    from qualify.trust.highwater import RollbackError

    assert lab.run([lab.record(i) for i in range(1, 8)]).standing.level == "baseline"
    saved = tmp_path / "after-promotion-1"
    shutil.copytree(lab.folder, saved)
    lab.run([lab.record(8, ev.Outcome.PRODUCT_FAILURE)])
    _copy(CURRENT, saved, lab.folder)
    with pytest.raises(VerificationError, match="the current record was restored from an older state"):
        folder.read_release(lab.folder)
    for p in lab.folder.glob("sm120.promotion.1.json*"):
        p.unlink()
    assert folder.read_release(lab.folder).target("sm120").current == CurrentLevel("baseline", 1)
    for n in (9, 10):
        with pytest.raises(RollbackError, match="promotion 1, but promotion 2 was seen before: older "
                                                "promotion files were restored"):
            lab.run([lab.record(n)])
    assert not (lab.folder / "sm120.promotion.1.json").exists()  # nothing was written on top of the old state


def test_a_complete_journal_that_does_not_verify_is_reported_and_left(lab, tmp_path):
    """High 2: the old files planted as a COMPLETE journal are no longer renamed into place unread."""
    lab.run([lab.record(i) for i in range(1, 8)])
    saved = tmp_path / "after-promotion-1"
    shutil.copytree(lab.folder, saved)
    lab.run([lab.record(8, ev.Outcome.PRODUCT_FAILURE)])
    planted = lab.folder / (journal.JOURNAL_PREFIX + "planted")
    planted.mkdir()
    _copy(CURRENT, saved, planted)
    (planted / journal.COMPLETE).write_bytes(b"")
    said = []
    (done,) = promote.promote(lab.folder, TAG, lab.write([lab.record(9)]), lab.sign, lab.key, lab.hosts_file,
                              now=lab.now, progress=said.append)
    assert any(n.startswith("LEFT") and "planted" in n and "restored from an older state" in n for n in said), said
    assert planted.is_dir() and (done.sequence, done.standing.level) == (3, "experimental")
    assert "product-failure" in {e.outcome for e in folder.read_release(lab.folder).target("sm120").promotion.evidence}


def test_an_older_hosts_file_never_re_enrolls_a_removed_host(lab, tmp_path):
    """High 3: enrolled (2), removed (3), the sequence-2 file restored: refused, before any promotion exists."""
    from qualify.trust import hosts
    from qualify.trust.highwater import RollbackError

    rogue_key, rogue_pub = make_key_pair(tmp_path, prefix="rogue")
    lab.enroll(("rogue", rogue_pub))
    saved = tmp_path / "hosts-2"
    saved.mkdir()
    _copy(["hosts.json"], lab.manifests, saved)
    hosts.change(lab.hosts_file, lab.sign, lab.key, remove="rogue")
    _copy(["hosts.json"], saved, lab.manifests)
    paths = lab.write([lab.record(i) for i in range(1, 8)], key=rogue_key)
    with pytest.raises(RollbackError, match="it is sequence 2, but this host has seen sequence 3 of the enrolled hosts"):
        lab.promote(paths)
    assert not (lab.folder / "sm120.promotion.json").exists()


def test_the_promotion_record_binds_its_hosts_file_and_a_fresh_promoter_refuses_an_older_one(lab, tmp_path,
                                                                                                monkeypatch):
    from qualify.trust.highwater import RollbackError

    saved = tmp_path / "hosts-1"
    saved.mkdir()
    _copy(["hosts.json"], lab.manifests, saved)
    _, second = make_key_pair(tmp_path, prefix="second")
    lab.enroll(("second", second))
    lab.run([lab.record(1)])
    record = rec.PromotionRecord.parse((lab.folder / "sm120.promotion.json").read_bytes(), "record")
    assert (record.hosts_sequence, record.hosts_sha256) == (2, sha256(lab.hosts_file.read_bytes()))
    _copy(["hosts.json"], saved, lab.manifests)
    monkeypatch.setenv("QUALIFY_TRUST_DIR", str(tmp_path / "another-promoter"))  # no marks: the record decides
    with pytest.raises(RollbackError, match="promotion 1 of sm120 was checked against sequence 2"):
        lab.run([lab.record(2)])


def test_a_refused_promote_still_records_the_hosts_sequence_it_read(lab, tmp_path, monkeypatch):
    """The promoter's mark is raised by every promote that reads the file, refused or not."""
    from qualify.trust.highwater import RollbackError

    saved = tmp_path / "hosts-1"
    saved.mkdir()
    _copy(["hosts.json"], lab.manifests, saved)
    here = os.environ["QUALIFY_TRUST_DIR"]
    monkeypatch.setenv("QUALIFY_TRUST_DIR", str(tmp_path / "the-release-engineers-laptop"))
    _, second = make_key_pair(tmp_path, prefix="second")
    lab.enroll(("second", second))  # sequence 2, seen on another machine only
    monkeypatch.setenv("QUALIFY_TRUST_DIR", here)
    with pytest.raises(ev.EvidenceError, match="is for image digest"):
        lab.run([lab.record(1, digest=DIGEST_B)])  # refused, after it read sequence 2
    _copy(["hosts.json"], saved, lab.manifests)
    with pytest.raises(RollbackError, match="it is sequence 1, but this host has seen sequence 2"):
        lab.run([lab.record(1)])


def test_hosts_add_never_restarts_a_lost_chain_at_one_unless_told_and_says_so(lab, tmp_path, monkeypatch):
    from qualify.trust import hosts

    _, pub = make_key_pair(tmp_path, prefix="new")
    key = TrustedKey.read(pub)
    host = rec.EnrolledHost("new-host", key_pem=key.pem.decode(), fingerprint=key.fingerprint)
    for p in lab.manifests.glob("hosts.json*"):
        p.unlink()
    with pytest.raises(ConfigError, match="is missing, but this host saw sequence 1 of it"):
        hosts.change(lab.hosts_file, lab.sign, lab.key, add=host)
    done = hosts.change(lab.hosts_file, lab.sign, lab.key, add=host, new_chain=True)
    assert (done.hosts.sequence, done.hosts.previous_sha256) == (2, None)
    assert any("starts a NEW chain at sequence 2" in n for n in done.notes)
    # On a promoter that never saw the chain, git's history is what says the file existed.
    subprocess.run(["git", "add", "-f", "manifests/hosts.json"], cwd=lab.root / "repo", check=True)
    subprocess.run(["git", "commit", "-qm", "hosts"], cwd=lab.root / "repo", check=True)
    for p in lab.manifests.glob("hosts.json*"):
        p.unlink()
    monkeypatch.setenv("QUALIFY_TRUST_DIR", str(tmp_path / "fresh"))
    with pytest.raises(ConfigError, match="is missing, but git's history has it"):
        hosts.change(lab.hosts_file, lab.sign, lab.key, add=host)


def test_hosts_add_never_replaces_a_hosts_key_silently(lab, tmp_path):
    from qualify.trust import hosts

    _, pub = make_key_pair(tmp_path, prefix="other")
    key = TrustedKey.read(pub)
    other = rec.EnrolledHost("lab-5090", key_pem=key.pem.decode(), fingerprint=key.fingerprint)
    with pytest.raises(ConfigError, match="lab-5090 is already enrolled .* with another key"):
        hosts.change(lab.hosts_file, lab.sign, lab.key, add=other)
    done = hosts.change(lab.hosts_file, lab.sign, lab.key, add=other, replace=True)
    assert done.written and any("its key is REPLACED" in n for n in done.notes)


def test_one_run_counts_once_after_its_host_is_renamed(lab):
    """Medium: the identity is the run's (its hashed host id), never the enrolled name."""
    from qualify.trust import hosts

    paths = lab.write([lab.record(1)])
    assert lab.promote(paths).new == 1
    hosts.change(lab.hosts_file, lab.sign, lab.key, remove="lab-5090")
    lab.enroll(("lab-5090-renamed", lab.host_pub))
    again = lab.promote(paths)
    assert (again.new, again.written, again.standing.consecutive_passes) == (0, False, 1)


def test_promote_takes_its_rule_from_the_signed_release_never_a_targets_file(lab, tmp_path):
    """High 4: a targets file saying sm120 is capability 9.0 and one pass suffices changes nothing."""
    index = folder.read_release(lab.folder).index
    assert (index.policy.version, index.policy.consecutive_passes, index.policy.intended("sm120")) == \
        (1, N, "baseline")
    copy = tmp_path / "targets.toml"
    copy.write_text((REPO / "images" / "targets.toml").read_text().replace("consecutive_passes = 7",
                                                                           "consecutive_passes = 1"))
    h200 = lab.record(1, cap="9.0", capability="9.0")  # as a 9.0 target's run: it passes on its own terms
    (h200,) = lab.write([ev.Evidence(**{**h200.__dict__, "outcome": ev.Outcome.PASS})])
    done = qualify_cli("promote", TAG, "--manifests", str(lab.manifests), "--key", str(lab.release_key),
                       "--file", str(copy), "--evidence", str(h200))
    assert done.returncode == ConfigError.exit_code and "never from a targets file" in done.stderr, done.stderr
    with pytest.raises(ev.EvidenceError, match="not capability 12.0, which release v1.0.0 signs for sm120"):
        lab.promote([h200])
    one = lab.run([lab.record(2)])
    assert one.standing.level == "experimental" and "7 consecutive passes on capability 12.0" in one.rule.describe()


def test_a_policy_this_toolkit_cannot_apply_is_refused_never_ignored(lab, monkeypatch):
    from qualify.trust import policy

    data = json.loads((lab.folder / "release.json").read_text())
    checks = data["policy"]["level_checks"]
    data["policy"]["level_checks"] = [{"level": "baseline", "checks": ["serve.canary"]}]  # a check nobody judges
    with pytest.raises(VerificationError, match="names check.s. serve.canary, which this toolkit does not judge"):
        rec.ReleaseIndex.parse(canonical_json(data), "release.json")
    data["policy"]["level_checks"] = checks
    data["policy"]["allreduce_floors"] = [{"topology": "nvlink", "gpus": 2, "min_bus_gbps": 350}]
    floors = rec.ReleaseIndex.parse(canonical_json(data), "release.json").policy.allreduce_floors
    assert [(f.topology, f.gpus, f.min_bus_gbps) for f in floors] == [("nvlink", 2, 350.0)]  # applied (issue 44)
    # A toolkit that did not apply floors would refuse them, never read the release as if they were not there.
    monkeypatch.setattr(policy, "ENFORCED", frozenset({"level_checks"}))
    with pytest.raises(VerificationError, match="sets allreduce_floors, which this toolkit does not apply"):
        rec.ReleaseIndex.parse(canonical_json(data), "release.json")
    monkeypatch.undo()
    del data["policy"]["allreduce_floors"]
    data["policy"]["version"] = 2
    with pytest.raises(VerificationError, match="policy version 2 is newer than this toolkit knows"):
        rec.ReleaseIndex.parse(canonical_json(data), "release.json")


def test_a_release_signed_before_the_policy_keeps_its_implied_rule(lab):
    index = json.loads((lab.folder / "release.json").read_text())
    del index["policy"]  # as releases were signed before issue 37
    path = lab.folder / "release.json"
    path.write_bytes(json.dumps(index, indent=2, sort_keys=True).encode() + b"\n")
    signer.write_signature(lab.sign, path)
    rule = folder.read_release(lab.folder).rule("sm120")
    assert (rule.signed, rule.consecutive_passes, rule.capability, rule.intended_level) == (False, 7, "12.0",
                                                                                           "experimental")
    assert "the implied rule" in rule.describe()  # the manifest records no intended level: never baseline on a guess


def test_two_promotes_at_once_never_lose_a_product_failure(lab):
    """High 5: one lock per release folder; the record a promote replaces is re-checked inside it."""
    lab.run([lab.record(1)])
    n = 2
    for _ in range(3):
        (failure,) = lab.write([lab.record(n, ev.Outcome.PRODUCT_FAILURE)], where=lab.root / f"f{n}")
        (passed,) = lab.write([lab.record(n + 1)], where=lab.root / f"p{n}")
        env = {**os.environ, "PYTHONPATH": str(REPO), "COSIGN_PASSWORD": PASSWORD}
        procs = [subprocess.Popen([sys.executable, "-m", "qualify", "promote", TAG, "--manifests", str(lab.manifests),
                                   "--key", str(lab.release_key), "--evidence", str(path)], env=env,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for path in (failure, passed)]
        outs = [p.communicate(timeout=120) for p in procs]
        assert all(p.returncode == 0 for p in procs), outs
        n += 2
    vt = folder.read_release(lab.folder).target("sm120")
    outcomes = [e.outcome for e in vt.promotion.evidence]
    assert vt.promotion_sequence == 7 and outcomes.count("product-failure") == 3 and len(outcomes) == 7
    assert [s for s, _ in vt.chain] == list(range(1, 8))


def test_a_write_whose_predecessor_changed_inside_the_lock_is_refused(lab):
    with pytest.raises(VerificationError, match="changed while this write was prepared"):
        journal.write_signed_files(lab.folder, [("sm120.promotion.json", b"{}")], lab.sign, lab.key,
                                   replaces={"sm120.promotion.json": "0" * 64})
    assert not (lab.folder / "sm120.promotion.json").exists() and not list(lab.folder.glob(".signed-write-*"))


def test_a_product_failure_always_lowers_the_level(lab):
    """High 6: a target released at baseline (an older toolkit's) is demoted by product failures; one released
    at experimental falls to unverified."""
    from qualify.probe.gpu import REQUIRED_GPU_CHECKS
    from qualify.trust.policy import TargetRule

    rule = TargetRule("sm120", "12.0", "linux/amd64", "baseline", 7, REQUIRED_GPU_CHECKS, True, 1)
    failures = [promote.Counted(lab.record(i, ev.Outcome.PRODUCT_FAILURE), "a" * 64, "h", str(i),
                                ev.Outcome.PRODUCT_FAILURE) for i in range(1, 4)]
    assert promote.standing(failures, rule, "baseline").level == "unverified"
    assert promote.standing(failures[:1], rule, "baseline").level == "experimental"
    assert promote.standing(failures[:1], rule, "experimental").level == "unverified"


def test_a_release_cannot_ship_at_baseline_and_one_run_claims_at_most_experimental(tmp_path):
    from signing_helpers import statement

    from qualify.core.errors import ReleaseError
    from qualify.release import assess, checks, model

    assert mf.support_level("pass", "baseline", True).value == "experimental"
    data = mf.dumps(statement("sm120", DIGEST_A, level="baseline"))
    withheld = assess.assess(model.Candidate.of(tmp_path / "sm120.json", data), "unverified", lambda r: DIGEST_A)
    assert isinstance(withheld, model.Withheld) and "without the promotion rule" in withheld.reason
    opts = model.ReleaseOptions("v1.0.0", tmp_path, tmp_path, tmp_path / "manifests", min_level="baseline")
    with pytest.raises(ReleaseError, match="a release ships targets at experimental at most"):
        checks.check_tag(opts)


def test_a_promote_killed_after_keeping_evidence_never_blocks_the_next(lab):
    paths = lab.write([lab.record(i) for i in range(1, 8)])
    argv = ("promote", TAG, "--manifests", str(lab.manifests), "--key", str(lab.release_key),
            "--evidence", *map(str, paths))
    assert qualify_cli(*argv, QUALIFY_KILL_AT="promote:kept").returncode == -9
    assert len([p for p in (lab.folder / "evidence" / "sm120").glob("*.json") if ".json." not in p.name]) == 7
    assert not (lab.folder / "sm120.promotion.json").exists()
    other = lab.run([lab.record(8)])  # the kept files are listed, never counted, and block nothing
    assert (other.standing.consecutive_passes, len(other.ignored)) == (1, 7)
    done = qualify_cli(*argv)  # handed in again, they are taken in
    assert done.returncode == 0 and "sm120: baseline (8 of 7" in done.stdout, done.stdout + done.stderr


def test_a_symlinked_evidence_folder_is_refused_never_followed(lab, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (lab.folder / "evidence").symlink_to(elsewhere)
    with pytest.raises(ConfigError, match="is a symbolic link or not a folder"):
        lab.run([lab.record(1)])
    assert not list(elsewhere.rglob("*"))


def test_a_check_listed_twice_is_refused_and_never_counts_its_last_entry(lab):
    record = lab.record(1)
    checks = list(record.checks) + [gpu_check("gpu.bf16-matmul", "pass")]
    checks[2] = gpu_check("gpu.bf16-matmul", "fail")
    assert ev.outcome_of(checks, "12.0", "12.0").outcome is ev.Outcome.PRODUCT_FAILURE
    (path,) = lab.write([ev.Evidence(**{**record.__dict__, "checks": tuple(checks),
                                       "outcome": ev.Outcome.PRODUCT_FAILURE})])
    with pytest.raises(ev.EvidenceError, match="check 'gpu.bf16-matmul' is listed 2 times"):
        lab.promote([path])


def test_a_valid_signature_beside_another_files_bundle_names_the_bundle(lab):
    """Medium: the refusal names the real cause, not 'not from an enrolled host'."""
    a, b = lab.write([lab.record(1), lab.record(2)])
    shutil.copyfile(formats.bundle_path(b), formats.bundle_path(a))
    with pytest.raises(ev.EvidenceError, match="its .sig verifies with enrolled host lab-5090's key, but its bundle "
                                               "does not hold: .*the bundle of other bytes"):
        lab.promote([a])


def test_merge_keeps_the_signed_copy_and_refuses_an_edited_one(lab, tmp_path):
    """Medium: an unsigned copy of a signed product failure, edited to pass, no longer displaces it."""
    work = tmp_path / "merge"
    (work / "copies").mkdir(parents=True)
    failing = _signed_statement(lab, work, "signed.json", probe_statement(lab, 1, status="fail"))
    edited = mf.write(work / "copies" / "a-edited.json", probe_statement(lab, 1, status="pass"))
    with pytest.raises(merge.MergeError, match="the same run .* with different results"):
        merge.merge([edited, failing])
    shutil.copyfile(failing, edited)  # an unsigned copy of the very same bytes, found first
    merged = merge.merge([work / "copies", failing])
    assert len(merged.evidence) == 1 and merged.evidence[0].signed
    assert len(merge.merge([work]).evidence) == 1  # the .sigstore.json beside signed.json is no manifest


def test_promote_escapes_control_characters_in_what_it_prints(lab):
    record = lab.record(1, gpu=ev.Gpu("RTX\x1b[2J 5090", "12.0", ev.hashed("GPU-1"), "580.1"))
    done = lab.run([record])
    lines = "\n".join(promote.summary_lines(done, False))
    assert "\x1b" not in lines and "RTX\\x1b[2J 5090" in lines
