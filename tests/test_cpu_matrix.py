"""The serving correctness matrix against the REAL vLLM server of the cpu target (issue 39's acceptance).

The deployment is tests/cpu_server.py's (fixture `cpu_deployment`): ./start.sh serving the tiny model in
float32 (EXTRA_SERVE_ARGS=--dtype float32) from a clean clone with a signed release. Here, as a user would in
that clone: a host key, `python -m qualify serve-check` (the BF16 reference computed on this host with
transformers from MODEL_PATH), the host enrolled, `qualify promote` counting the signed record, `./start.sh
--dry-run` saying the release's matrix standing; `scripts/verify.sh --matrix` with a reference file that
`--record-reference` wrote, and with a deliberately different one (a copy of the model with its weights
perturbed), which must fail serve.accuracy.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from cpu_server import PASSWORD, TAG

from qualify.probe import servematrix as sm
from qualify.release import serving
from qualify.trust import folder
from qualify.trust import records as rec
from qualify.trust.verify import TrustedKey, verify_blob

pytestmark = [pytest.mark.engine, pytest.mark.slow]


def qualify_in(d, *args: str, timeout: float = 1200) -> subprocess.CompletedProcess:
    """`python -m qualify ARGS` of the clone, with this interpreter (it has torch and transformers)."""
    env = {**d.env, "PYTHONPATH": str(d.clone), "COSIGN_PASSWORD": PASSWORD}
    return subprocess.run([sys.executable, "-m", "qualify", *args], cwd=d.clone, env=env, capture_output=True,
                          text=True, timeout=timeout, stdin=subprocess.DEVNULL)


@pytest.fixture(scope="module")
def host_key(cpu_deployment) -> Path:
    done = qualify_in(cpu_deployment, "sign", "generate-key", "--output-key-prefix", "ci-host")
    assert done.returncode == 0, done.stdout + done.stderr
    return cpu_deployment.clone / "ci-host.key"


@pytest.fixture(scope="module")
def matrix(cpu_deployment, host_key):
    """The acceptance run: serve-check found by the settings file, signed with the host's key."""
    done = qualify_in(cpu_deployment, "serve-check", "--env-file", str(cpu_deployment.env_file),
                      "--sign-key", str(host_key))
    records = sorted(p for p in (cpu_deployment.clone / "manifests" / TAG).glob("cpu.serve-check.*.json")
                     if not p.name.endswith(".sigstore.json"))
    assert records, done.stdout + done.stderr
    print(f"\nserve-check on the cpu target:\n{done.stdout}", file=sys.stderr)
    return done, records[-1]


def test_every_check_of_the_matrix_runs_and_passes_with_its_numbers_in_the_signed_record(matrix, host_key):
    done, path = matrix
    assert done.returncode == 0, done.stdout + done.stderr[-6000:]
    data = path.read_bytes()
    record = serving.parse(data, str(path))
    checks = {c["id"]: c for c in record.checks}
    assert {i: c["status"] for i, c in checks.items()} == {i: "pass" for i in sm.CHECK_IDS}, done.stdout
    assert record.outcome.value == "pass" and record.target == "cpu" and record.release == TAG
    assert record.image and record.server["found_by"] == "deployment" and record.server["loopback"]
    for figure in ("determinism_max_logprob_delta", "niah_retrieved", "niah_longest_prompt_tokens",
                   "soak_p50_latency_s", "soak_p99_latency_s", "soak_p50_ttft_s", "soak_tokens_per_s",
                   "soak_memory_growth_mib", "accuracy_top1_agreement", "accuracy_mean_kl"):
        assert figure in record.figures, figure
    assert record.figures["niah_longest_prompt_tokens"] > 3500  # half of MAX_MODEL_LEN 8192
    assert "container" in checks["serve.soak"]["evidence"]["memory_source"]
    assert checks["serve.providers"]["evidence"]["server"]["attention"] == ["CPU_ATTN"]
    assert checks["serve.providers"]["evidence"]["server"]["dtype"] == ["float32"]  # the server's float32 deployment
    assert checks["serve.accuracy"]["evidence"]["reference"]["dtype"] == "bfloat16"
    assert checks["serve.accuracy"]["evidence"]["reference"]["source"] == "transformers"
    key = TrustedKey.read(host_key.with_suffix(".pub"))
    verify_blob(key, data, path.with_name(path.name + ".sig").read_bytes(), None, "record")


def test_promote_counts_the_record_and_the_deploy_shows_the_matrix_standing(cpu_deployment, matrix, host_key):
    d, (_, path) = cpu_deployment, matrix
    enrolled = qualify_in(d, "hosts", "add", "ci-host", "--key", str(host_key.with_suffix(".pub")),
                          "--release-key", "cosign.key")
    assert enrolled.returncode == 0, enrolled.stdout + enrolled.stderr
    done = qualify_in(d, "promote", TAG, "--key", "cosign.key", "--evidence", *map(str, sorted(path.parent.glob(
        "cpu.serve-check.*"))))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "cpu: experimental (1 of 7 consecutive passes; 1 records, 1 new)" in done.stdout, done.stdout
    release = folder.read_release(d.clone / "manifests" / TAG)
    (counted,) = release.target("cpu").promotion.evidence
    assert counted.outcome == "pass" and counted.serving_sha256 and counted.host == "ci-host"
    assert release.target("cpu").current.level == "experimental"  # the promotion record's (issue 52)
    dry = d.script("start.sh", "--dry-run")
    assert dry.returncode == 0, dry.stdout + dry.stderr[-4000:]
    assert "serving matrix: 1 run(s) counted by promotion 1 (signed), 1 passing" in dry.stderr, dry.stderr[-4000:]
    assert rec.promotion_file("cpu") in os.listdir(d.clone / "manifests" / TAG)


@pytest.fixture(scope="module")
def bf16_reference(cpu_deployment, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("reference") / "bf16.json"
    done = qualify_in(cpu_deployment, "serve-check", "--env-file", str(cpu_deployment.env_file),
                      "--record-reference", str(out), "--reference-model", str(cpu_deployment.model_dir))
    assert done.returncode == 0, done.stdout + done.stderr
    return out


def test_verify_sh_matrix_with_a_recorded_reference_passes(cpu_deployment, bf16_reference, tmp_path):
    out = tmp_path / "record.json"
    done = cpu_deployment.script("scripts/verify.sh", "--matrix", "--reference", str(bf16_reference), "--out", str(out))
    assert done.returncode == 0, done.stdout + done.stderr[-4000:]
    record = serving.parse(out.read_bytes(), str(out))
    assert record.outcome.value == "pass" and record.check("serve.accuracy")["status"] == "pass"
    assert record.check("serve.accuracy")["evidence"]["reference"]["sha256"] == \
        hashlib.sha256(bf16_reference.read_bytes()).hexdigest()  # the record names the reference it used
    server_ref = tmp_path / "server.json"  # the server's own answers as a reference (a BF16 deployment's use)
    recorded = cpu_deployment.script("scripts/verify.sh", "--matrix", "--record-reference", str(server_ref))
    assert recorded.returncode == 0, recorded.stdout + recorded.stderr[-3000:]
    assert json.loads(server_ref.read_text())["source"] == "server"
    assert json.loads(server_ref.read_text())["dtype"] == "float32"


def test_a_deliberately_different_reference_fails_accuracy(cpu_deployment, tmp_path):
    """The reference of another model: the tiny model's weights with noise of half their spread added."""
    import torch
    from safetensors.torch import load_file, save_file

    other = tmp_path / "other-model"
    shutil.copytree(cpu_deployment.model_dir, other)
    weights = load_file(str(other / "model.safetensors"))
    noise = torch.Generator().manual_seed(39)
    weights = {k: v + 0.5 * v.std() * torch.randn(v.shape, generator=noise) if v.dim() > 1 else v
               for k, v in weights.items()}
    save_file(weights, str(other / "model.safetensors"), metadata={"format": "pt"})
    reference = tmp_path / "other.json"
    made = qualify_in(cpu_deployment, "serve-check", "--env-file", str(cpu_deployment.env_file),
                      "--record-reference", str(reference), "--reference-model", str(other))
    assert made.returncode == 0, made.stdout + made.stderr
    out = tmp_path / "record.json"
    done = cpu_deployment.script("scripts/verify.sh", "--matrix", "--reference", str(reference), "--out", str(out))
    assert done.returncode == 6, done.stdout + done.stderr[-4000:]  # verify.sh's "a check failed"
    record = serving.parse(out.read_bytes(), str(out))
    accuracy = record.check("serve.accuracy")
    assert accuracy["status"] == "fail" and record.outcome.value == "product-failure"
    assert accuracy["evidence"]["repeats"][0]["mean_kl"] > sm.load().accuracy.max_mean_kl
    assert all(c["status"] == "pass" for c in record.checks if c["id"] != "serve.accuracy")
    print(f"\na different reference: {accuracy['reason']}", file=sys.stderr)
