"""A real vLLM server, deployed by `./start.sh` on the cpu target, shared by every test of a session.

Not a test module. The `cpu_deployment` fixture (tests/conftest.py, session scope) hands out one
`CpuDeployment`; any test that needs a real OpenAI-compatible vLLM server asks for it:

    def test_something(cpu_deployment):
        body = api.chat(cpu_deployment.url, cpu_deployment.model, [{"role": "user", "content": "..."}])
        done = cpu_deployment.script("scripts/verify.sh", "--full")

What it does, once per session, as a user would (the README's commands, in a clean clone of this checkout):
the release key (`qualify sign generate-key`, committed), `nox -s build-cpu -- --base hermetic` (builds,
pushes to the loopback registry and qualifies), `nox -s release -- TAG --no-upload`, `qualify tiny-model`
(the model the server serves, MODEL_PATH), then `./start.sh` with GPU_RUNTIME=auto on this host, which has
no nvidia-smi: start.sh chooses the cpu target by itself. The first start.sh is killed (SIGKILL) while it
waits for /health, and a second one must converge on the same deployment: both outputs are kept
(`killed`, `started`). The teardown runs `scripts/stop.sh --purge-cache` and checks that nothing of the
compose project is left; a failure there is an error of the session.

The server runs the tiny model in float32 (EXTRA_SERVE_ARGS=--dtype float32): test_cpu_matrix.py compares it
with a BF16 reference. Settings a later test needs changed (another parser, a longer context) belong in a deployment of its own:
`deploy(root, **settings)` makes one the same way, reusing the built image and the release (cached).
The server's figures for this host (build, /health) are in `timings`.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Optional

REPO = Path(__file__).resolve().parent.parent
PASSWORD = "cpu deployment release key"
TAG = "v0.1.0"
SERVED = "tiny"
LABEL = "com.docker.compose.project"
HEALTH_TIMEOUT_S = 900


def _python3() -> str:
    base = Path(sys.base_prefix) / "bin" / "python3"
    return str(base if base.exists() else "/usr/bin/python3")


def _newcomer_env(**extra: str) -> Dict[str, str]:
    """The environment of a user's shell: no test venv, no nvidia-smi stand-in, none of start.sh's settings."""
    settings = [line.split("=", 1)[0] for line in (REPO / ".env.example").read_text().splitlines()
                if line[:1].isalpha() and "=" in line]
    env = {k: v for k, v in os.environ.items()
           if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME", *settings) and not k.startswith("CONTAINER_ENV_")}
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep)
                                  if ".nox" not in p and ".venv" not in p and "standin" not in p)
    env.update(extra)
    return env


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class CpuDeployment:
    """One deployment start.sh made: its clone, settings file, API and what start.sh printed."""

    clone: Path
    env_file: Path
    port: int
    project: str
    model_dir: Path
    env: Dict[str, str]
    started: Optional[subprocess.CompletedProcess] = None  # the start.sh run that converged
    killed: str = ""  # what the start.sh killed while waiting for /health had printed
    timings: Dict[str, float] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def model(self) -> str:
        return SERVED

    def script(self, script: str, *args: str, timeout: float = 900) -> subprocess.CompletedProcess:
        """`./start.sh` or `scripts/<x>.sh` of the clone, with this deployment's settings file."""
        return subprocess.run([str(self.clone / script), *args, "--env-file", str(self.env_file)], cwd=self.clone,
                              env=self.env, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)

    def containers(self, docker: str, kind: str = "ps") -> list:
        argv = {"ps": ["ps", "-aq"], "volume": ["volume", "ls", "-q"], "network": ["network", "ls", "-q"]}[kind]
        return subprocess.run([docker, *argv, "--filter", f"label={LABEL}={self.project}"], capture_output=True,
                              text=True, timeout=60).stdout.split()


def _run(argv, cwd: Path, env: Dict[str, str], timeout: float = 1800) -> subprocess.CompletedProcess:
    argv = [_python3() if a == "python" else a for a in argv]
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)
    assert done.returncode == 0, f"{argv}: exit {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-5000:]}"
    return done


def release_clone(root: Path) -> tuple:
    """A clean clone of this checkout with the cpu target built, qualified and released: (clone, env, fingerprint,
    timings). The commands are the README's."""
    from conftest import clone_checkout

    clone = clone_checkout(REPO, root / "repo")
    for args in (["config", "user.name", "CPU Deploy"], ["config", "user.email", "cpu@example.invalid"],
                 ["config", "commit.gpgsign", "false"], ["config", "tag.gpgsign", "false"]):
        subprocess.run(["git", *args], cwd=clone, check=True)
    env = _newcomer_env(COSIGN_PASSWORD=PASSWORD)
    timings: Dict[str, float] = {}
    _run(["python", "-c", "from qualify import toolenv; toolenv.ensure()"], clone, env)
    made = _run(["python", "-m", "qualify", "sign", "generate-key"], clone, env)
    fingerprint = made.stdout.split("RELEASE_KEY_FINGERPRINT=", 1)[1].split()[0]
    _run(["git", "add", "cosign.pub"], clone, env)
    _run(["git", "commit", "-q", "-m", "release key"], clone, env)
    began = time.monotonic()
    _run(["python", "-m", "nox", "-s", "build-cpu", "--", "--base", "hermetic"], clone, env, timeout=3600)
    timings["build_and_qualify_s"] = round(time.monotonic() - began, 1)
    assert json.loads((clone / "build" / "manifests" / "cpu.json").read_text())["predicate"]["verdict"] == "pass"
    _run(["python", "-m", "nox", "-s", "release", "--", TAG, "--no-upload"], clone, env)
    return clone, env, fingerprint, timings


def make_model(dest: Path) -> Path:
    """`python -m qualify tiny-model --out DIR`, with this interpreter (the test extra holds torch)."""
    done = subprocess.run([sys.executable, "-m", "qualify", "tiny-model", "--out", str(dest)], cwd=REPO,
                          capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert f"serve it: MODEL_PATH={dest}" in done.stdout
    return dest


def settings_file(path: Path, d: CpuDeployment, fingerprint: str, **overrides: object) -> Path:
    values = {"MODEL_PATH": d.model_dir, "SERVED_MODEL_NAME": SERVED, "TOOL_CALL_PARSER": "hermes",
              "RELEASE_KEY_FINGERPRINT": fingerprint, "COMPOSE_PROJECT": d.project, "API_PORT": d.port,
              "DEPLOY_DIR": path.parent / "deploy", "MIN_FREE_DISK_GIB": 5, "HEALTH_TIMEOUT_S": HEALTH_TIMEOUT_S,
              # float32, not vLLM's CPU default (bfloat16): serve.accuracy compares it with a BF16 reference
              "EXTRA_SERVE_ARGS": "--dtype float32",
              **overrides}
    path.write_text("".join(f"{k}={v}\n" for k, v in values.items()))
    return path


def start_killed_then_converge(d: CpuDeployment) -> None:
    """start.sh, SIGKILLed while it waits for /health; then start.sh again, which must finish the deployment."""
    argv = [str(d.clone / "start.sh"), "--env-file", str(d.env_file)]
    began = time.monotonic()
    proc = subprocess.Popen(argv, cwd=d.clone, env=d.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            stdin=subprocess.DEVNULL)
    lines = []
    try:
        for line in proc.stdout:
            lines.append(line)
            if "waiting up to" in line and "/health" in line:
                break
        else:
            raise AssertionError("start.sh ended before it waited for /health:\n" + "".join(lines)[-5000:])
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
        proc.stdout.close()
    d.killed = "".join(lines)
    again = time.monotonic()
    d.started = d.script("start.sh", timeout=HEALTH_TIMEOUT_S + 600)
    d.timings["start_s"] = round(time.monotonic() - began, 1)
    d.timings["second_start_s"] = round(time.monotonic() - again, 1)
    assert d.started.returncode == 0, d.started.stdout[-3000:] + d.started.stderr[-6000:]
    healthy = re.search(r"healthy after ([0-9]+) s", d.started.stderr)
    if healthy:
        d.timings["health_wait_s"] = float(healthy.group(1))


def deploy(root: Path, clone: Path, env: Dict[str, str], fingerprint: str, model_dir: Path,
           **overrides: object) -> CpuDeployment:
    d = CpuDeployment(clone, root / "deploy.env", free_port(), f"bwcpu-{uuid.uuid4().hex[:10]}", model_dir, env)
    settings_file(d.env_file, d, fingerprint, **overrides)
    start_killed_then_converge(d)
    return d


def teardown(d: CpuDeployment, docker: str) -> None:
    """scripts/stop.sh --purge-cache; nothing of the project may be left (else remove it and fail)."""
    done = d.script("scripts/stop.sh", "--purge-cache", timeout=600)
    left = {kind: d.containers(docker, kind) for kind in ("ps", "volume", "network")}
    if any(left.values()):
        for kind, rm in (("ps", ["rm", "-f"]), ("network", ["network", "rm"]), ("volume", ["volume", "rm", "-f"])):
            if left[kind]:
                subprocess.run([docker, *rm, *left[kind]], capture_output=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert not any(left.values()), f"scripts/stop.sh --purge-cache left {left}"


