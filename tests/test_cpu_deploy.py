"""./start.sh against a REAL vLLM server: the cpu target (vLLM's CPU build) serving the tiny model.

The deployment is tests/cpu_server.py's, shared by the session (fixture `cpu_deployment`): a clean clone,
docs/deploy.md's cpu flow (build, release key, release), `qualify tiny-model`, then ./start.sh with GPU_RUNTIME=auto on this
host, which has no nvidia-smi. Nothing here is a stand-in: the image is the one `nox -s build-cpu` built,
the server is vLLM's, the manifest is the one qualification wrote and the release signed.
"""

from __future__ import annotations

import json
import re
import subprocess
import urllib.request

import pytest

from qualify.deploy import api

pytestmark = [pytest.mark.engine, pytest.mark.slow]


def test_start_sh_chose_the_cpu_target_and_the_gate_passed_it(cpu_deployment):
    out = cpu_deployment.started.stderr
    assert "target: cpu: this host has no nvidia-smi on PATH" in out and "GPU_RUNTIME=auto" in out
    assert "GPU_RUNTIME=none" not in out and "stand-in" not in out  # never the stand-in's path
    assert "CPU: " in out and "vLLM loads its" in out  # preflight's CPU flags
    assert re.search(r"memory: [0-9.]+ GiB available; KV cache 1 GiB \([0-9]+ tokens of this model", out), out
    assert "trust gate: passed: cpu target: no GPU checks apply (verdict pass, support level unverified)" in out
    assert "GPU checks:" not in out  # none ran, none were asked for
    assert "canary: ok: 'What is 19 times 23?' -> '437'" in cpu_deployment.started.stdout + out
    assert "(MODEL_PATH, offline)" in cpu_deployment.started.stdout


def test_a_killed_start_sh_and_a_rerun_converge(cpu_deployment, docker_engine):
    assert "waiting up to" in cpu_deployment.killed  # it was killed while waiting for /health
    out = cpu_deployment.started.stderr
    assert f"port: compose project {cpu_deployment.project} is running already" in out
    assert "healthy after" in out
    assert len(cpu_deployment.containers(docker_engine)) == 1


def test_the_real_server_answers_models_canary_tool_call_and_determinism(cpu_deployment):
    url, model = cpu_deployment.url, cpu_deployment.model
    for check in (api.health(url), api.models(url, model), api.canary(url, model), api.tool_call(url, model),
                  api.determinism(url, model)):
        assert check.ok, check.detail
    assert api.tool_call(url, model).detail == 'tool call get_weather({"city": "Paris"})'


def _metrics(url: str) -> dict:
    with urllib.request.urlopen(f"{url}/metrics", timeout=30) as resp:
        text = resp.read().decode()
    out = {}
    for line in text.splitlines():
        m = re.match(r'^(vllm:[a-z_]+)\{[^}]*\} ([0-9.e+-]+)$', line)
        if m:
            out[m.group(1)] = out.get(m.group(1), 0.0) + float(m.group(2))
    return out


def test_the_throughput_figure_is_plausible_against_the_servers_own_metrics(cpu_deployment):
    """The server's inter-token latency (its own histogram, this request alone) gives its decode rate; ours
    is measured from the stream, which adds HTTP and detokenising: it must be the same order, never above
    the server's own rate by more than timing noise (115,288 tokens/s was 300x above it)."""
    url, model = cpu_deployment.url, cpu_deployment.model
    before = _metrics(url)
    figures = api.throughput(url, model)
    after = _metrics(url)
    count = after["vllm:inter_token_latency_seconds_count"] - before["vllm:inter_token_latency_seconds_count"]
    spent = after["vllm:inter_token_latency_seconds_sum"] - before["vllm:inter_token_latency_seconds_sum"]
    server_rate = count / spent
    assert figures.tokens == 256 and count == 255  # ignore_eos: the whole max_tokens, timed
    # over the stream or (a burst) over the whole request, the figure is the server's own, give or take
    assert server_rate / 4 <= figures.tokens_per_s <= server_rate * 1.25, (figures, server_rate)


def test_verify_status_and_the_recorded_deployment(cpu_deployment):
    smoke = cpu_deployment.script("scripts/verify.sh", "--smoke")
    assert smoke.returncode == 0, smoke.stdout + smoke.stderr
    full = cpu_deployment.script("scripts/verify.sh", "--full")
    assert full.returncode == 0, full.stdout + full.stderr
    for name in ("health: ok", "models: ok", "canary: ok", "determinism: ok", "tool-call: ok", "throughput: ok"):
        assert name in full.stdout, full.stdout
    status = cpu_deployment.script("scripts/status.sh")
    assert status.returncode == 0, status.stdout + status.stderr
    assert "target: cpu (cpu)" in status.stdout and "none: the cpu target serves on the CPU" in status.stdout
    assert f"{cpu_deployment.model_dir} (MODEL_PATH, offline)" in status.stdout
    record = json.loads(cpu_deployment.deployment_record.read_text())
    assert record["model"]["path"] == str(cpu_deployment.model_dir) and record["target"] == "cpu"


def test_the_model_folder_is_mounted_read_only_and_served_offline(cpu_deployment, docker_engine):
    (cid,) = cpu_deployment.containers(docker_engine)
    info = json.loads(subprocess.run([docker_engine, "inspect", cid], capture_output=True, text=True,
                                     timeout=60).stdout)[0]
    mount = next(m for m in info["Mounts"] if m["Source"] == str(cpu_deployment.model_dir))
    assert mount["RW"] is False
    env = dict(e.split("=", 1) for e in info["Config"]["Env"])
    assert env["HF_HUB_OFFLINE"] == "1" and "HF_TOKEN" not in env and env["VLLM_CPU_KVCACHE_SPACE"] == "1"
    assert not any(d for d in (info["HostConfig"].get("DeviceRequests") or []))  # no GPU asked for


def test_vllms_own_command_runs_in_the_image(cpu_deployment, docker_engine):
    """Issue 48: `vllm bench serve` (vLLM's benchmark client, run against a deploy) failed in the cpu image with
    PackageNotFoundError: the distribution is vllm-cpu, and vLLM's CLI looks itself up as `vllm`."""
    manifest = json.loads((cpu_deployment.clone / "build" / "manifests" / "cpu.json").read_text())
    image = manifest["predicate"]["image"]["reference"]
    for argv in (["vllm", "--version"], ["vllm", "bench", "serve", "--help"]):
        done = subprocess.run([docker_engine, "run", "--rm", "--network", "none", image, *argv], capture_output=True,
                              text=True, timeout=600)
        assert done.returncode == 0, f"{argv}: {done.stdout[-2000:]}{done.stderr[-3000:]}"
    assert "0.32.0+cpu" in subprocess.run([docker_engine, "run", "--rm", "--network", "none", image, "vllm", "--version"],
                                      capture_output=True, text=True, timeout=600).stdout
    checks = {c["id"]: c for c in manifest["predicate"]["checks"]}
    assert checks["cpu.vllm-cli"]["status"] == "pass", checks["cpu.vllm-cli"]
