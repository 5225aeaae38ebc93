"""./start.sh and scripts/{status,stop,verify}.sh, run as a user runs them.

This machine has no NVIDIA GPU and no driver. Tests that need start.sh to see
a GPU put tests/standin/nvidia-smi first on PATH: a TEST DOUBLE for
nvidia-smi that reports the GPU a test describes (STANDIN_GPUS), so the real
preflight runs against hardware this machine lacks.

The deploy tests serve tests/standin/server.py, a TEST DOUBLE for vLLM, from
an image built here FROM the debian_python_image fixture and pushed to the
loopback registry: start.sh verifies its signed manifest, pulls it by digest
and runs it with real compose. The container gets no GPU: GPU_RUNTIME=none,
which start.sh accepts only with --allow-no-gpu-runtime and announces.

Releases are made as a release engineer makes them: `python -m qualify sign
generate-key`, then the real release steps (signing_helpers.make_release) in a
temporary git repository, whose manifests/<tag>/ is then exactly what
`nox -s release` writes (signed release.json, manifests, signatures, bundles).
Every compose project is uniquely named and removed (by its label) afterwards.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import socket
import subprocess
import time
import urllib.request
import uuid
from pathlib import Path

import pytest
from conftest import REPO, require
from deploy_host import (
    GB10,
    H200,
    LABEL,
    PASSWORD,
    RTX5090,
    SCRIPTS,
    SETTINGS,
    Host,
    containers_of,
    key_fingerprint,
    released,
)
from signing_helpers import DIGEST_A, DIGEST_B, runtime_with, statement

from qualify.config import targets
from qualify.core import manifest as mf

# --- the scripts themselves ----------------------------------------------------------


def test_scripts_are_shellcheck_clean():
    require(shutil.which("shellcheck") is not None, "shellcheck is not installed")
    done = subprocess.run(["shellcheck", *SCRIPTS, "tests/standin/nvidia-smi"], cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stdout


def test_help_and_unknown_options(host):
    host.settings()
    assert "--allow-unqualified" in host.run("start.sh", "--help").stdout
    done = host.run("start.sh", "--bogus")
    assert done.returncode == 2 and "unknown option: --bogus" in done.stderr


def test_settings_file_is_read_not_executed(host):
    host.env_file.write_text("GPU_DEVICE=0\nGPU_DEVICES=1\n$(touch pwned)\n")
    done = host.run("start.sh")
    assert done.returncode == 2, done.stderr
    assert "unknown setting GPU_DEVICES" in done.stderr and "settings.env:3: not a KEY=VALUE line" in done.stderr
    assert not (Path.cwd() / "pwned").exists() and not (host.root / "pwned").exists()


# --- preflight ---------------------------------------------------------------------------


def test_without_a_gpu_the_first_run_chooses_the_cpu_target_and_stops_before_pulling(tmp_path):
    """This machine has no NVIDIA GPU: the real PATH, no stand-in. GPU_RUNTIME=auto (the default) then means the
    cpu target, said so, when a verified release signs one (issue 52: the cpu targets are the release's facts);
    this checkout has no release, so the deploy stops before anything is pulled.
    (With GPU_RUNTIME named, "no NVIDIA GPU found" stands: tests/test_cpu_target.py.)"""
    if shutil.which("nvidia-smi"):
        pytest.skip("this host has nvidia-smi; the test is about a host without one")
    env_file = tmp_path / "first-run.env"
    env_file.write_bytes((REPO / ".env.example").read_bytes())  # a file named with --env-file must exist (issue 37)
    started = time.monotonic()
    done = subprocess.run([str(REPO / "start.sh"), "--env-file", str(env_file)], capture_output=True, text=True,
                          timeout=60, stdin=subprocess.DEVNULL, env={k: v for k, v in os.environ.items()
                                                                    if k not in SETTINGS})
    elapsed = time.monotonic() - started
    assert done.returncode in (3, 4), done.stderr
    assert elapsed < 30
    assert ("target: cpu: this host has no nvidia-smi on PATH (no NVIDIA driver) and GPU_RUNTIME=auto" in done.stderr
            or "trust gate: no verified release under" in done.stderr), done.stderr
    assert "fix:" in done.stderr
    assert "pulling" not in done.stderr and "starting compose" not in done.stderr  # stopped before anything started


def test_a_driver_that_does_not_answer(host):
    host.settings()
    fail = "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."
    done = host.run("start.sh", STANDIN_NVIDIA_SMI_FAIL=fail)
    assert done.returncode == 3
    assert f"cannot reach the NVIDIA driver: {fail}" in done.stderr and "modprobe nvidia" in done.stderr


def test_gpu_device_that_is_not_there(host):
    host.settings(GPU_DEVICE="GPU-missing")
    done = host.run("start.sh")
    assert done.returncode == 3
    assert "GPU_DEVICE=GPU-missing does not name a GPU" in done.stderr and "GPU 0: NVIDIA GeForce RTX 5090" in done.stderr


def test_hopper_is_rejected_with_the_supported_targets(host):
    """The supported targets are those the newest verified release signs (issue 52), not the targets file's."""
    released(host)
    done = host.run("start.sh", gpus=H200)
    assert done.returncode == 3, done.stderr
    assert "unsupported GPU: NVIDIA H200 (compute capability 9.0)" in done.stderr
    assert "supported: sm120 (12.0, linux/amd64)" in done.stderr
    assert "DEPLOY_TARGET=cpu" in done.stderr  # the cpu target the release signs


@pytest.mark.skipif(platform.machine() != "x86_64", reason="the mismatch is GB10 (arm64) on an amd64 host")
def test_gb10_on_an_amd64_host_is_a_platform_mismatch(host):
    host.settings()
    host.release(statement("sm121", DIGEST_A))
    done = host.run("start.sh", gpus=GB10)
    assert done.returncode == 3, done.stderr
    assert "platform mismatch: NVIDIA GB10 (compute capability 12.1) on this x86_64 host" in done.stderr
    assert "sm121 (linux/arm64)" in done.stderr


def test_the_second_gpu_is_chosen_by_uuid(host, docker_engine):
    released(host, settings={"GPU_DEVICE": "GPU-5090-0000"})
    done = host.run("start.sh", "--dry-run", "--allow-no-gpu-runtime", gpus=f"{H200};{RTX5090}")
    assert done.returncode == 0, done.stderr
    assert "GPU GPU-5090-0000: NVIDIA GeForce RTX 5090" in done.stderr and "target: sm120" in done.stderr


def test_sm120_dry_run_prints_the_compose_file_and_starts_nothing(host, docker_engine):
    pinned = key_fingerprint(Path(f"{host.key}.pub"))
    path = released(host, settings={"RELEASE_KEY_FINGERPRINT": f"'{pinned}'", "SERVED_MODEL_NAME": '"qwen small"  # x',
                                    "TOOL_CALL_PARSER": "  # none", "EXTRA_SERVE_ARGS": "--enforce-eager --seed 7"})
    done = host.run("start.sh", "--dry-run", "--allow-no-gpu-runtime")
    assert done.returncode == 0, done.stderr
    assert f"release key: {pinned} (pinned)" in done.stderr
    svc = json.loads(done.stdout)["services"]["vllm"]
    reference = json.loads(path.read_text())["predicate"]["image"]["reference"]
    assert svc["image"] == reference and reference.endswith(f"@{DIGEST_A}")
    assert svc["ports"] == [f"127.0.0.1:{host.port}:8000"]
    assert svc["labels"]["dev.blackwell-qualify.target"] == "sm120"
    command = svc["command"]
    assert command[command.index("--served-model-name") + 1] == "qwen small"
    assert "--tool-call-parser" not in command and command[-3:] == ["--enforce-eager", "--seed", "7"]
    assert "GPU_RUNTIME=none: THE CONTAINER GETS NO GPU" in done.stderr
    assert "trust gate: passed: support level baseline, verdict pass" in done.stderr
    assert not host.compose_file.exists() and containers_of(docker_engine, host.project) == []


def _pulls(docker: str, image_digest: str) -> bool:
    """Whether the engine holds the image (a refusal before the pull leaves it absent)."""
    return subprocess.run([docker, "image", "inspect", f"127.0.0.1:5000/qualify/sm120@{image_digest}"],
                          capture_output=True).returncode == 0


@pytest.mark.parametrize("driver", ["570.133.07", "575.57.08"])
def test_a_driver_too_old_for_cuda_13_is_refused_before_the_trust_gate_and_any_pull(host, docker_engine, driver):
    """Issue 32 item 1 (vllm#18813 'unsatisfied condition: cuda>=13.0'): the stand-in nvidia-smi (a TEST
    DOUBLE) reports an R570/R575 driver; preflight compares it with images/targets.toml's floor for the
    target's CUDA and stops, naming the driver found, the one needed and the fix. Nothing is read or pulled."""
    floor = targets.load().get("sm120").driver_floor
    released(host)
    done = host.run("start.sh", "--dry-run", "--allow-no-gpu-runtime",
                    gpus=RTX5090 + f"|{driver}")
    assert done.returncode == 3, done.stderr
    assert f"the host's NVIDIA driver is {driver}; the image's CUDA 13.0 needs {floor} or newer" in done.stderr
    assert "nothing was pulled" in done.stderr and "R580-branch driver or newer" in done.stderr
    assert "trust gate" not in done.stderr and not _pulls(docker_engine, DIGEST_A)


def test_an_r580_driver_runs_cuda_13_and_is_checked_again_against_the_verified_manifest(host, docker_engine):
    floor = targets.load().get("sm120").driver_floor
    released(host)
    done = host.run("start.sh", "--dry-run", "--allow-no-gpu-runtime", gpus=RTX5090 + f"|{floor}")
    assert done.returncode == 0, done.stderr
    assert f"driver: {floor} runs CUDA 13.0 (sm120 images, per release v1.0.0's signed policy; needs {floor} or " \
        "newer)" in done.stderr
    assert f"driver: {floor} runs CUDA 13.0 (the image, per its verified manifest; needs {floor} or newer)" in done.stderr


def test_the_verified_manifests_cuda_decides_after_the_gate(host, docker_engine):
    """The targets file says CUDA 13.0, the signed manifest says the image carries 13.9: the table has no
    floor for it, so the deploy refuses rather than guess (never against an unverified read)."""
    released(host, runtime=runtime_with(cuda="13.9"))
    done = host.run("start.sh", "--dry-run", "--allow-no-gpu-runtime")
    assert done.returncode == 3, done.stderr
    assert "the image carries CUDA 13.9 (its verified manifest says so)" in done.stderr
    assert "names no driver floor for it (known: 13.0)" in done.stderr and not host.compose_file.exists()


@pytest.mark.parametrize("host_driver,compat,error", [("590.44.01", "580.65.06", "error 803"),
                                                      ("580.65.06", "590.44.01", "error 804")])
def test_a_forward_compat_libcuda_that_does_not_match_the_host_driver_is_refused(host, docker_engine, host_driver,
                                                                                  compat, error):
    """Issue 32 item 2 (gpustack#4678, vllm#33447): the image's loader finds CUDA's compat/ libcuda; on a
    newer host driver that is error 803, and an RTX 5090 cannot use forward compatibility (804)."""
    released(host, runtime=runtime_with(compat=compat))
    done = host.run("start.sh", "--dry-run", "--allow-no-gpu-runtime", gpus=RTX5090 + f"|{host_driver}")
    assert done.returncode == 3, done.stderr
    assert f"forward-compatibility libcuda {compat}" in done.stderr and error in done.stderr
    assert host_driver in done.stderr and "remove CUDA's compat/ directory from the image's loader path" in done.stderr
    assert not host.compose_file.exists() and not _pulls(docker_engine, DIGEST_A)


def test_a_compat_libcuda_of_the_host_drivers_own_version_is_accepted(host, docker_engine):
    released(host, runtime=runtime_with(compat="580.95.05"))
    done = host.run("start.sh", "--dry-run", "--allow-no-gpu-runtime", gpus=RTX5090 + "|580.95.05")
    assert done.returncode == 0, done.stderr
    assert "forward-compatibility libcuda 580.95.05 matches this host" in done.stderr


def test_a_manifest_from_before_the_runtime_section_is_checked_against_the_targets_file(host, docker_engine):
    released(host, runtime={})
    done = host.run("start.sh", "--dry-run", "--allow-no-gpu-runtime")
    assert done.returncode == 0, done.stderr
    assert "the manifest does not record the image's CUDA (qualified by an older toolkit)" in done.stderr


def test_gpu_runtime_none_is_refused_without_its_flag(host, docker_engine):
    released(host)
    done = host.run("start.sh", "--dry-run")
    assert done.returncode == 3
    assert "GPU_RUNTIME=none would start the server WITHOUT a GPU; refused" in done.stderr


def test_no_gpu_runtime_says_how_to_install_one(host, docker_engine):
    released(host, settings={"GPU_RUNTIME": "auto"})
    done = host.run("start.sh", "--dry-run")
    if "GPU runtime: " in done.stderr:
        pytest.skip("this host has a GPU container runtime")
    assert done.returncode == 3
    assert "cannot give the container a GPU" in done.stderr and "nvidia-ctk" in done.stderr


def test_a_port_in_use_is_rejected(host, docker_engine):
    released(host)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", host.port))
        sock.listen()
        done = host.run("start.sh", "--dry-run", "--allow-no-gpu-runtime")
    assert done.returncode == 3
    assert f"port {host.port} on 127.0.0.1 is already in use" in done.stderr
    assert f"API port 127.0.0.1:{host.port} is not free" in done.stderr


def test_too_little_disk_names_the_commands_that_free_it(host, docker_engine):
    released(host)
    host.settings(MIN_FREE_DISK_GIB=10**6)  # more than any disk here has
    done = host.run("start.sh", "--dry-run", "--allow-no-gpu-runtime")
    assert done.returncode == 3
    assert "GiB free under" in done.stderr and "need 1000000 GiB" in done.stderr
    assert "nox -s clean -- --dry-run" in done.stderr and "nox -s clean" in done.stderr


# --- trust gate ----------------------------------------------------------------------------------


def test_a_tampered_manifest_is_refused_even_with_allow_unqualified(host, docker_engine):
    path = released(host)
    stmt = json.loads(path.read_text())
    stmt["subject"][0]["digest"]["sha256"] = DIGEST_B.split(":")[1]  # the attacker's image
    stmt["predicate"]["image"] = {"reference": f"127.0.0.1:5000/evil/sm120@{DIGEST_B}", "digest": DIGEST_B}
    mf.write(path, stmt)
    done = host.run("start.sh", "--dry-run", "--allow-no-gpu-runtime", "--allow-unqualified")
    assert done.returncode == 4, done.stderr
    assert "signature check failed" in done.stderr and "cannot be overridden" in done.stderr
    assert done.stdout == "" and not host.compose_file.exists()


def test_a_swapped_release_key_is_refused_when_the_key_is_pinned(host, docker_engine):
    released(host, settings={"RELEASE_KEY_FINGERPRINT": "sha256:" + "0" * 64})
    done = host.run("start.sh", "--dry-run", "--allow-no-gpu-runtime", "--allow-unqualified")
    assert done.returncode == 4
    assert "not the pinned RELEASE_KEY_FINGERPRINT" in done.stderr and done.stdout == ""


def test_an_image_override_with_another_digest_is_refused(host, docker_engine):
    released(host, settings={"IMAGE": f"127.0.0.1:5000/qualify/sm120@{DIGEST_B}"})
    done = host.run("start.sh", "--dry-run", "--allow-no-gpu-runtime", "--allow-unqualified")
    assert done.returncode == 4
    assert "is not the image the manifest qualified" in done.stderr


def test_an_unsupported_level_is_refused_unless_allow_unqualified(host, docker_engine):
    """A failing check never reaches a release (the release withholds it; test_gate_decision covers the gate's
    own refusal); a level below what can serve does, with --min-level unsupported."""
    released(host, level="unsupported", options={"min_level": "unsupported"})
    done = host.run("start.sh", "--dry-run", "--allow-no-gpu-runtime")
    assert done.returncode == 4
    assert "trust gate: REFUSED: the manifest's support level is unsupported" in done.stderr
    done = host.run("start.sh", "--dry-run", "--allow-no-gpu-runtime", "--allow-unqualified")
    assert done.returncode == 0, done.stderr
    assert "--allow-unqualified: DEPLOYING AN IMAGE THE TRUST GATE REFUSED" in done.stderr
    assert json.loads(done.stdout)["services"]["vllm"]["labels"]["dev.blackwell-qualify.gate"].startswith("UNQUALIFIED")


def test_a_statically_qualified_image_needs_the_gpu_checks_here(host, docker_engine):
    released(host, statuses={"fatbin-arch": "pass", "gpu-smoke": "not-run"}, level="unverified")
    done = host.run("start.sh", "--dry-run", "--allow-no-gpu-runtime")
    assert done.returncode == 4
    assert "qualified only statically" in done.stderr
    # Issue 30, item 4: the words say the manifest passes and only a GPU run here can raise its level.
    assert SAYS_UNVERIFIED in done.stderr and "the container gets no GPU, so they cannot run here" in done.stderr
    assert "deploy a release whose manifest passes" not in done.stderr and "GPU_RUNTIME=auto" in done.stderr


SAYS_UNVERIFIED = ("trust gate: REFUSED: the GPU checks did not run on this host: the manifest passes, but its level "
                   "is unverified, and only GPU checks passing on the target's own GPU can raise it")


def test_a_smoke_profile_release_is_refused_it_cannot_serve(host, docker_engine):
    """Issue 30, item 4: start.sh accepted a smoke release and failed only when the container crash-looped."""
    released(host, profile="smoke")
    done = host.run("start.sh", "--dry-run", "--allow-no-gpu-runtime")
    assert done.returncode == 4
    assert "the image is the smoke profile, which holds no vLLM server" in done.stderr


def test_no_release_for_the_target(host, docker_engine):
    """Issue 52: with no verified release nothing says what this GPU's target is, its driver floor or memory
    (never the checkout's targets file), so --allow-unqualified with IMAGE cannot deploy either."""
    host.settings()
    done = host.run("start.sh", "--dry-run", "--allow-no-gpu-runtime")
    assert done.returncode == 4 and "trust gate: no verified release under" in done.stderr, done.stderr
    host.settings(IMAGE=f"127.0.0.1:5000/own/sm120@{DIGEST_B}")
    done = host.run("start.sh", "--dry-run", "--allow-no-gpu-runtime", "--allow-unqualified")
    assert done.returncode == 4, done.stderr
    assert "--allow-unqualified does not stand in for them" in done.stderr and "target: sm120" not in done.stderr
    # a release of another target only: this GPU's is not among the targets it signs
    host.settings()
    host.release(statement("sm121", DIGEST_A))
    done = host.run("start.sh", "--dry-run", "--allow-no-gpu-runtime")
    assert done.returncode == 3 and "supported: sm121 (12.1, linux/arm64) (as release v1.0.0 signs them)" in \
        done.stderr, done.stderr


# --- deploy, end to end with real compose and the stand-in server -----------------------------------


@pytest.fixture(scope="module")
def standin_image(docker_engine, debian_python_image, loopback_registry):
    """The stand-in vLLM (a test double) pushed to the loopback registry; yields its digest reference."""
    require(shutil.which("docker-compose") is not None or subprocess.run(
        [docker_engine, "compose", "version"], capture_output=True).returncode == 0, "no docker compose")
    repo = f"qualify-test/standin-{uuid.uuid4().hex[:10]}"
    tag = f"{loopback_registry.ref(repo)}:test"
    subprocess.run([docker_engine, "build", "-q", "--build-arg", f"BASE={debian_python_image}", "-t", tag,
                    str(REPO / "tests" / "standin")], check=True, capture_output=True, timeout=600)
    subprocess.run([docker_engine, "push", tag], check=True, capture_output=True, timeout=300)
    digest = loopback_registry.manifest_digest(repo, "test")
    ref = f"{loopback_registry.ref(repo)}@{digest}"
    yield ref
    subprocess.run([docker_engine, "rmi", tag, ref], capture_output=True, timeout=120)
    req = urllib.request.Request(f"{loopback_registry.url}/v2/{repo}/manifests/{digest}", method="DELETE")
    try:
        urllib.request.urlopen(req, timeout=10).close()
    except OSError:
        pass  # the registry keeps it; it is uniquely named


def standin_release(h: Host, image: str, **settings: object) -> None:
    digest = image.split("@", 1)[1]
    h.settings(**{"HEALTH_TIMEOUT_S": 90, **settings})
    h.release(statement("sm120", digest, reference=image, level="baseline"))


def volumes_of(docker: str, project: str) -> list:
    return subprocess.run([docker, "volume", "ls", "-q", "--filter", f"label={LABEL}={project}"],
                          capture_output=True, text=True, timeout=60).stdout.split()


def test_deploy_end_to_end(host, docker_engine, standin_image):
    token = "hf_test_token_kept_out_of_files"
    standin_release(host, standin_image, CONTAINER_ENV_STANDIN_STARTUP_S=3, HF_TOKEN=token)
    done = host.run("start.sh", "--allow-no-gpu-runtime", timeout=240)
    assert done.returncode == 0, done.stderr[-4000:]
    assert token not in host.compose_file.read_text()
    env = subprocess.run([docker_engine, "inspect", "--format", "{{json .Config.Env}}", *containers_of(
        docker_engine, host.project)], capture_output=True, text=True, timeout=60).stdout
    assert f"HF_TOKEN={token}" in env and "CUDA_DEVICE_ORDER=PCI_BUS_ID" in env
    assert f"pulling {standin_image}" in done.stderr
    assert "/health not ready yet" in done.stderr and "healthy after" in done.stderr
    assert "canary: ok: 'What is 19 times 23?' -> '19 times 23 is 437.'" in done.stderr
    assert f"API:      http://127.0.0.1:{host.port}/v1" in done.stdout
    served = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{host.port}/v1/models", timeout=10).read())
    argv = served["data"][0]["standin_argv"]
    assert argv[argv.index("--revision") + 1] == "7ae557604adf67be50417f59c2c2f167def9a775"

    smoke = host.run("scripts/verify.sh", "--smoke")
    assert smoke.returncode == 0 and "smoke: 3 of 3 checks passed" in smoke.stderr, smoke.stdout + smoke.stderr
    full = host.run("scripts/verify.sh", "--full", timeout=120)
    assert full.returncode == 0, full.stdout + full.stderr
    assert "determinism: ok" in full.stdout and 'tool-call: ok: tool call get_weather({"city": "Paris"})' in full.stdout
    # Issue 48: with the tool-call parser taken away, --full cannot make the tool call the release's signed
    # policy requires for sm120's intended level (baseline names serve.tools): exit 13, never a pass.
    settings = host.env_file.read_text()
    host.env_file.write_text(settings + "TOOL_CALL_PARSER=\n")
    untooled = host.run("scripts/verify.sh", "--full", timeout=120)
    assert untooled.returncode == 13, untooled.stdout + untooled.stderr
    assert "tool-call: skipped (TOOL_CALL_PARSER is empty)" in untooled.stderr
    assert "serve.tools did not run, and release v1.0.0's signed policy for sm120" in untooled.stderr
    host.env_file.write_text(settings)
    status = host.run("scripts/status.sh")
    assert status.returncode == 0, status.stderr
    assert " Up " in status.stdout and "health: ok: /health: HTTP 200" in status.stdout
    assert f"{host.project}_hf-cache" in status.stdout and "GPU-5090-0000" in status.stdout

    stop = host.run("scripts/stop.sh", timeout=120)
    assert stop.returncode == 0, stop.stderr
    assert containers_of(docker_engine, host.project) == []
    assert len(volumes_of(docker_engine, host.project)) == 3  # caches kept
    purge = host.run("scripts/stop.sh", "--purge-cache", timeout=120)
    assert purge.returncode == 0, purge.stderr
    assert volumes_of(docker_engine, host.project) == []
    assert host.run("scripts/verify.sh").returncode == 6  # nothing answers any more


def test_health_timeout_prints_the_log_tail(host, docker_engine, standin_image):
    standin_release(host, standin_image, HEALTH_TIMEOUT_S=6, CONTAINER_ENV_STANDIN_NEVER_HEALTHY=1)
    started = time.monotonic()
    done = host.run("start.sh", "--allow-no-gpu-runtime", timeout=120)
    assert done.returncode == 5, done.stderr[-4000:]
    assert "the server did not become healthy within 6 s" in done.stderr
    assert "last 60 log lines of vllm:" in done.stderr
    assert "| standin: STANDIN_NEVER_HEALTHY=1: /health will answer 503 forever" in done.stderr
    assert f"scripts/stop.sh --env-file {host.env_file}" in done.stderr
    assert time.monotonic() - started < 90
    status = host.run("scripts/status.sh")
    assert status.returncode == 1 and "health: FAILED" in status.stdout


VLLM_REFUSES = ("ValueError: Free memory on device (19.5/95.6 GiB) on startup is less than desired GPU memory "
                "utilization (0.9, 86.0 GiB). Decrease GPU memory utilization or reduce GPU memory used by other "
                "processes.")


def test_a_server_vllm_refused_to_start_is_said_so_with_vllms_reason(host, docker_engine, standin_image):
    """Issue 48: start.sh said 'stopped (running, 3 restarts)' for a server vLLM refused to start. The stand-in
    (a TEST DOUBLE for vLLM) refuses as vLLM does, with vLLM's log shape; compose restarts it; start.sh says it
    failed to start, how often it was restarted, and vLLM's reason: the cause and what it became."""
    standin_release(host, standin_image, CONTAINER_ENV_STANDIN_FAIL_AT_START=VLLM_REFUSES)
    done = host.run("start.sh", "--allow-no-gpu-runtime", timeout=180)
    assert done.returncode == 5, done.stderr[-4000:]
    error = next(line for line in done.stderr.splitlines() if "ERROR:" in line)
    assert "the server failed to start: vLLM exited with code 1 and compose restarted it" in error, error
    assert f"before /health answered; vLLM's reason: {VLLM_REFUSES} / RuntimeError: Engine core initialization " \
        "failed. See root cause above. Failed core proc(s): {}" in error, error
    assert "stopped (running" not in done.stderr and "last 60 log lines of vllm:" in done.stderr
    assert f"scripts/stop.sh --env-file {host.env_file} removes the container" in done.stderr


def _standin_host_root(host, loadavg: str) -> Path:
    """A STAND-IN /proc (hostfiles.py: BLACKWELL_STANDIN_HOST_ROOT) holding only the load average a test needs."""
    root = host.root / "standin-host"
    (root / "proc").mkdir(parents=True)
    (root / "proc" / "loadavg").write_text(loadavg + "\n")
    return root


def test_the_throughput_line_says_when_the_host_was_busy(host, docker_engine, standin_image):
    """Issue 48: 195 tokens/s on a host whose cores were busy, with no caveat. A STAND-IN /proc/loadavg says the
    load is twice the cores before the server starts and after the figure is measured."""
    cores = os.cpu_count() or 1
    load = f"{2 * cores:.2f}"
    root = _standin_host_root(host, f"{load} {load} {load} 3/600 4242")
    standin_release(host, standin_image, CONTAINER_ENV_STANDIN_STARTUP_S=1)
    done = host.run("start.sh", "--allow-no-gpu-runtime", timeout=240, BLACKWELL_STANDIN_HOST_ROOT=str(root))
    assert done.returncode == 0, done.stderr[-4000:]
    assert "THIS DEPLOY READS STAND-IN HOST FILES" in done.stderr  # said, loudly
    (line,) = [x for x in done.stderr.splitlines() if "canary figures:" in x]
    assert line.endswith(f"; host busy: load {2 * cores:.1f} on {cores} core{'s' * (cores != 1)} "
                         f"({2 * cores:.1f} before the server started: other work keeps every core busy); the "
                         "figure is low"), line


# --- the on-host GPU gate, for real: a real smoke image, the real probe in it ---------------


def test_the_gpu_gate_runs_the_real_probe_in_the_image_and_refuses_without_a_gpu(host, docker_engine,
                                                                                loopback_registry):
    """The path a Blackwell host takes, on this GPU-less host: a statically qualified release of the
    real sm120 smoke image, pulled by digest; the probe's GPU checks run inside it (GPU_RUNTIME=none,
    so the container has no GPU); the evidence lands beside the manifest and the gate refuses, naming
    why. The stand-in nvidia-smi (a labelled test double) gives preflight its GPU."""
    import images
    from qualify.qualification import container
    from qualify.release import evidence

    built = images.smoke("sm120")
    reference = built.image_reference
    digest = reference.split("@", 1)[1]
    host.settings(HEALTH_TIMEOUT_S=30)
    # The smoke image stands in for a vLLM one (profile vllm in its statement): the gate's GPU path is the same.
    manifest = host.release(statement("sm120", digest, reference=reference, level="unverified",
                                      statuses={"fatbin-arch": "pass", "gpu-smoke": "not-run"}))
    started = time.monotonic()
    done = host.run("start.sh", "--allow-no-gpu-runtime", timeout=600)
    seconds = time.monotonic() - started
    print(f"real GPU gate through start.sh: {seconds:.1f} s")
    assert done.returncode == 4, done.stderr[-4000:]
    assert f"pulling {reference}" in done.stderr
    assert "GPU checks: running the probe inside the image, WITHOUT a GPU (GPU_RUNTIME=none" in done.stderr
    saved = sorted(manifest.parent.glob("sm120.gpu-evidence.*.json"))
    assert len(saved) == 1, done.stderr[-3000:]
    record = evidence.load(saved[0])
    assert f"GPU evidence saved: {saved[0]} (infrastructure)" in done.stderr
    assert record.outcome is evidence.Outcome.INFRASTRUCTURE
    assert (record.image_digest, record.release, record.target) == (digest, "v1.0.0", "sm120")
    assert record.probe_sources_digest == container.probe_sources_digest()
    assert record.gpu.name == "NVIDIA GeForce RTX 5090" and record.gpu.capability == "12.0"
    assert record.gpu.uuid_sha256 == evidence.hashed("GPU-5090-0000")
    required = [c for c in record.checks if c.get("required")]
    assert required and all((c["status"], c["reason"]) == ("not-run", "no GPU visible") for c in required)
    assert "gpu.bf16-matmul: not-run: no GPU visible" in record.reason
    assert SAYS_UNVERIFIED in done.stderr  # the same words as the dry run's refusal
    assert "gpu.bf16-matmul: not-run: no GPU visible" in done.stderr
    assert not host.compose_file.exists() and containers_of(docker_engine, host.project) == []


# --- published releases (nox -s publish) -----------------------------------------------------------


def _publication(h: Host, reference: str, tamper: bool = False) -> Path:
    """published.json beside the manifests, as `nox -s publish` writes it: the signed publication record
    bound to the release's release.json (the records and writer publish itself uses)."""
    from qualify.trust import folder, journal, records

    release_dir = h.manifests / "v1.0.0"
    release = folder.read_release(release_dir)
    digest = reference.split("@", 1)[1]
    image = records.PublishedImage("sm120", reference, reference.split("@")[0] + ":v1.0.0", digest,
                                   release.target("sm120").manifest.reference, reference.split("@")[0] + ":att",
                                   (mf.PREDICATE_TYPE,), "not pushed")
    record = records.Publication("v1.0.0", release.index_sha256, "registry.example:5000/acme",
                                 release.key.fingerprint, (image,))
    from qualify.signing import signer

    s = signer.key_signer("builtin", Path(f"{h.key}.key"), PASSWORD.encode())
    journal.write_signed_files(release_dir, [(records.PUBLICATION_FILE, record.to_bytes())],
                              s, release.key)
    path = release_dir / records.PUBLICATION_FILE
    if tamper:
        path.write_text(path.read_text().replace("registry.example", "registry.evil"))
    return path


def test_a_published_release_deploys_the_published_reference(host, docker_engine):
    released(host)
    published = f"registry.example:5000/acme/sm120@{DIGEST_A}"
    _publication(host, published)
    done = host.run("start.sh", "--dry-run", "--allow-no-gpu-runtime")
    assert done.returncode == 0, done.stderr
    assert f"published: {published} (from published.json, signed with the release key)" in done.stderr
    assert json.loads(done.stdout)["services"]["vllm"]["image"] == published


@pytest.mark.parametrize("case", ["tampered", "another digest"])
def test_a_publication_that_does_not_verify_or_names_another_image_is_refused(host, docker_engine, case):
    released(host)
    digest = DIGEST_B if case == "another digest" else DIGEST_A
    _publication(host, f"registry.example:5000/acme/sm120@{digest}", tamper=case == "tampered")
    done = host.run("start.sh", "--dry-run", "--allow-no-gpu-runtime", "--allow-unqualified")
    assert done.returncode == 4, done.stderr
    said = "does not match its signature" if case == "tampered" else f"not the released image {DIGEST_A}"
    assert said in done.stderr and not host.compose_file.exists()


def test_without_a_release_folder_the_registry_attestation_alone_is_refused(host, docker_engine, tmp_path):
    """A deploy host with no release folder, only IMAGE (by digest) and the release's public key: the
    attestation `nox -s publish` put beside the image signs no deploy facts (issue 52: the GPU's target, its
    driver floor and memory come only from a verified release's policy), so it is refused, with the way on."""
    empty = tmp_path / "no-manifests"
    empty.mkdir()
    host.settings(MANIFESTS_DIR=empty, IMAGE=f"127.0.0.1:5000/qualify/sm120@{DIGEST_A}",
                  RELEASE_PUBLIC_KEY=f"{host.key}.pub")
    done = host.run("start.sh", "--dry-run", "--allow-no-gpu-runtime", "--allow-unqualified")
    assert done.returncode == 4, done.stderr
    assert "the registry's attestation alone (IMAGE and RELEASE_PUBLIC_KEY) signs no deploy facts" in done.stderr
    assert "RELEASE_TAG fetches it from the GitHub release" in done.stderr


def test_a_release_tag_the_checkout_lacks_is_fetched_from_its_github_release_and_verified(host, docker_engine,
                                                                                          tmp_path):
    """A deploy host that cloned the source, not the release: RELEASE_TAG names a release whose folder is not
    here. The STAND-IN `gh` (tests/standin/gh; GitHub is not reachable from these machines) serves the release's
    assets as `nox -s release` uploads them; start.sh downloads them into manifests/<tag>/ and verifies them."""
    released(host)
    assets = tmp_path / "github-assets"
    shutil.move(str(host.manifests / "v1.0.0"), str(assets / "v1.0.0"))
    shutil.rmtree(assets / "v1.0.0" / "evidence")  # release assets are flat files; evidence/ is promote's, not one
    (host.root / "bin" / "gh").symlink_to(REPO / "tests" / "standin" / "gh")
    host.settings(RELEASE_TAG="v1.0.0")
    done = host.run("start.sh", "--dry-run", "--allow-no-gpu-runtime", STANDIN_GH_ASSETS=str(assets))
    assert done.returncode == 0, done.stderr
    assert "release v1.0.0: fetched its files from the GitHub release" in done.stderr
    assert (host.manifests / "v1.0.0" / "sm120.json.sig").is_file()
    assert "trust gate: passed" in done.stderr
    # A tampered asset is fetched too, and refused by the signature check: the download vouches for nothing.
    shutil.rmtree(host.manifests / "v1.0.0")
    stmt = json.loads((assets / "v1.0.0" / "sm120.json").read_text())
    stmt["predicate"]["support_level"] = "optimized"
    (assets / "v1.0.0" / "sm120.json").write_text(json.dumps(stmt))
    refused = host.run("start.sh", "--dry-run", "--allow-no-gpu-runtime", STANDIN_GH_ASSETS=str(assets))
    assert refused.returncode == 4 and "signature" in refused.stderr
