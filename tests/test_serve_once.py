"""Issue 49, Medium: one serve-check record completes one GPU run, once. Two GPU runs sharing run id, time and
host id but differing in GPU or configuration (1 GPU and tp2) were each paired with the same matrix run: a
streak of two, or both rows, from one serving test. A record is now bound to its run's GPU (hashed UUID) and
tensor-parallel size (start.sh's deployment record), paired by that identity, and never counted twice; it
completes only a run of the host that signed it. Promote, the Python verifier and scripts/verify-independent.sh
agree on each (real signing keys, the real recipe)."""

from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path

import pytest
from evidence_helpers import gpu_check
from signing_helpers import PASSWORD, make_key_pair
from test_serve_promote import hand_in, promote, promotion, served, vllm_lab

from qualify.core.errors import VerificationError
from qualify.core.fsutil import canonical_json
from qualify.probe.gpu import ALLREDUCE_CHECK, REQUIRED_GPU_CHECKS
from qualify.release import evidence as ev
from qualify.release import serving
from qualify.release import verify as pyverify
from qualify.signing import signer
from qualify.trust.gpuconfig import Configuration

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "scripts" / "verify-independent.sh"


def link(r: ev.Evidence, bound: bool = True) -> serving.GpuLink:
    if not bound:  # a record written before the GPU and size were recorded
        return serving.GpuLink(r.run_id, r.time, r.host_id_sha256, r.outcome.value)
    return serving.GpuLink(r.run_id, r.time, r.host_id_sha256, r.outcome.value, "", r.gpu.uuid_sha256,
                           r.configuration.tensor_parallel_size)


def tp2(lab, n: int) -> ev.Evidence:
    """The tp2 run of the same deployment as lab.record(n): same run id, time and host id, its GPUs others."""
    checks = tuple(gpu_check(c, "pass") for c in (*REQUIRED_GPU_CHECKS, ALLREDUCE_CHECK))
    one = lab.record(n)
    return lab.record(n, configuration=Configuration(2, 2, "nvlink"), checks=checks,
                      gpu=ev.Gpu(one.gpu.name, one.gpu.capability, ev.hashed("GPU-2"), one.gpu.driver))


def shell(folder: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), str(folder)], capture_output=True, text=True, timeout=600)


def python(folder: Path, target: str = "sm120") -> None:
    pyverify.verify(pyverify.VerifyOptions(manifest=folder / f"{target}.json", key=folder / "cosign.pub"))


@pytest.mark.parametrize("bound", [True, False])
def test_one_record_completes_one_of_two_runs_of_one_deployment(tmp_path, bound):
    """1 GPU and tp2 sharing run id, time and host: the record completes the 1-GPU run only (a record written
    before the GPU and size were recorded completes a 1-GPU run only)."""
    lab = vllm_lab(tmp_path)
    one, two = lab.record(10), tp2(lab, 10)
    done, _ = promote(lab, [*lab.write([one, two]), *hand_in(lab, [served(lab, 12, target="sm120",
                                                                          gpu_evidence=link(one, bound))])])
    counted = promotion(lab, "sm120").promotion.evidence
    with_record = [e for e in counted if e.serving_sha256]
    assert len(counted) == 2 and len(with_record) == 1 and with_record[0].configuration == "1 GPU"
    assert shell(lab.folder).returncode == 0
    python(lab.folder)


def test_a_record_bound_to_the_tp2_run_completes_it_and_not_the_1_gpu_run(tmp_path):
    lab = vllm_lab(tmp_path)
    one, two = lab.record(10), tp2(lab, 10)
    promote(lab, [*lab.write([one, two]), *hand_in(lab, [served(lab, 12, target="sm120", gpu_evidence=link(two))])])
    (with_record,) = [e for e in promotion(lab, "sm120").promotion.evidence if e.serving_sha256]
    assert with_record.configuration == "2 GPUs tp2 nvlink"


def test_one_record_is_never_a_streak_of_two(tmp_path):
    """Two 1-GPU runs of one deployment on two GPUs (same run id, time, host): an old-style record pairs with
    both; it completes the first only."""
    lab = vllm_lab(tmp_path)
    a = lab.record(10)
    b = lab.record(10, gpu=ev.Gpu(a.gpu.name, a.gpu.capability, ev.hashed("GPU-2"), a.gpu.driver))
    done, _ = promote(lab, [*lab.write([a, b]), *hand_in(lab, [served(lab, 12, target="sm120",
                                                                      gpu_evidence=link(a, bound=False))])])
    assert done.standing.consecutive_passes == 1
    assert sum(1 for e in promotion(lab, "sm120").promotion.evidence if e.serving_sha256) == 1


def _resign_promotion(lab, change) -> None:
    """The current promotion record changed and re-signed with the release key (the red team's move)."""
    path = lab.folder / "sm120.promotion.json"
    doc = json.loads(path.read_bytes())
    change(doc)
    path.write_bytes(canonical_json(doc))
    signer.write_signature(lab.sign, path, path.with_name(path.name + ".sig"),
                           path.with_name(path.name + ".sigstore.json"))


def test_a_ledger_counting_one_record_for_two_runs_is_refused_by_both_verifiers(tmp_path):
    lab = vllm_lab(tmp_path)
    one, two = lab.record(10), tp2(lab, 10)
    promote(lab, [*lab.write([one, two]), *hand_in(lab, [served(lab, 12, target="sm120", gpu_evidence=link(one))])])
    sha = next(e.serving_sha256 for e in promotion(lab, "sm120").promotion.evidence if e.serving_sha256)

    def both(doc):
        for e in doc["evidence"]:
            e["serving_sha256"] = sha

    _resign_promotion(lab, both)
    done = shell(lab.folder)
    assert done.returncode == 1 and f"serve-check record {sha} completes 2 GPU runs" in done.stderr, done.stderr
    with pytest.raises(VerificationError, match="completes two GPU runs"):
        python(lab.folder)


def test_a_record_signed_by_another_enrolled_host_never_completes_a_gpu_run(tmp_path):
    """A cpu-only host, enrolled, signs a matrix record for the GPU host's run: not paired (promote); and a
    ledger that counts it anyway is refused by both verifiers."""
    lab = vllm_lab(tmp_path)
    other_key, other_pub = make_key_pair(tmp_path, prefix="cpu-only")
    lab.enroll(("cpu-only", other_pub))
    one = lab.record(10)
    rec_ = served(lab, 12, target="sm120", gpu_evidence=link(one))
    where = tmp_path / "cpu-only-host"
    where.mkdir()
    path = serving.write(where / "sm120.serve-check.json", rec_)
    ev.sign(path, ev.host_signer(other_key, PASSWORD.encode()))
    done, notes = promote(lab, [*lab.write([one]), path])
    assert not any(e.serving_sha256 for e in promotion(lab, "sm120").promotion.evidence)
    assert any("signed by cpu-only, not by lab-5090, the host of the GPU run it names: not counted" in n
               for n in notes), notes
    # the same record, counted by a promote that took it (its file kept, the ledger re-signed)
    store = lab.folder / "evidence" / "sm120"
    sha = hashlib.sha256(path.read_bytes()).hexdigest()
    for suffix in ("", ".sig", ".sigstore.json"):
        if Path(str(path) + suffix).exists():
            (store / f"{sha}.json{suffix}").write_bytes(Path(str(path) + suffix).read_bytes())

    def count_it(doc):
        doc["evidence"][0]["serving_sha256"] = sha
        doc["evidence"][0]["outcome"] = "pass"

    _resign_promotion(lab, count_it)
    said = shell(lab.folder)
    assert said.returncode == 1 and "not signed by lab-5090, the host of the GPU run it completes" in said.stderr, \
        said.stderr[-800:] + said.stdout[-1500:]
    with pytest.raises(VerificationError, match="not signed by lab-5090, the host the promotion record names for "
                                                "the GPU run it completes"):
        python(lab.folder)


def test_a_record_judged_by_another_matrix_than_the_releases_probe_carries_is_refused(tmp_path):
    """Low: check_binding now holds the record's matrix version and sha256 to the matrix file among the probe
    sources the release pins (where this checkout's probe is the release's own)."""
    from evidence_helpers import PROBE

    from qualify.probe import servematrix
    from qualify.release import servecount

    lab = vllm_lab(tmp_path)
    matrix = servematrix.load()
    same = served(lab, 12, target="sm120", matrix_version=matrix.version, matrix_sha256=matrix.sha256)
    servecount.matrix_binding(same, lab.manifest(), "same", local_probe=lambda: PROBE)
    for kw in ({"matrix_version": matrix.version + 1}, {"matrix_sha256": "e" * 64}):
        other = served(lab, 12, target="sm120", **{"matrix_version": matrix.version, "matrix_sha256": matrix.sha256,
                                                   **kw})
        with pytest.raises(serving.ServeRecordError, match="it was judged by another matrix"):
            servecount.matrix_binding(other, lab.manifest(), "other", local_probe=lambda: PROBE)
    # from a checkout whose probe is not the release's, the matrix cannot be told here
    servecount.matrix_binding(served(lab, 12, target="sm120", matrix_version=9), lab.manifest(), "elsewhere",
                              local_probe=lambda: "sha256:" + "0" * 64)
