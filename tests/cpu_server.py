"""A real vLLM server, deployed by `./start.sh` on the cpu target, shared by every test of a session.

Not a test module. The `cpu_deployment` fixture (tests/conftest.py, session scope) hands out one
`CpuDeployment`; any test that needs a real OpenAI-compatible vLLM server asks for it:

    def test_something(cpu_deployment):
        body = api.chat(cpu_deployment.url, cpu_deployment.model, [{"role": "user", "content": "..."}])
        done = cpu_deployment.script("scripts/verify.sh", "--full")

What it does, once per session: the cpu flow users read (docs/deploy.md, "The cpu target"), line by line as typed, in
a clean clone of this checkout (`readme_deployment`): set-up and `nox -s build-cpu -- --base hermetic`, the
release key (`qualify sign generate-key`, committed), the release, `qualify tiny-model` (the committed model,
MODEL_PATH) and the settings line; then `./start.sh` with GPU_RUNTIME=auto on this host, which has no
nvidia-smi: start.sh chooses the cpu target by itself. The first start.sh is killed (SIGKILL) while it waits
for /health, and a second one must converge on the same deployment: both outputs are kept (`killed`,
`started`). The teardown runs the README's closing lines (status, verify --full, stop.sh --purge-cache) and
checks that nothing of the compose project is left; a failure there is an error of the session.

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
from typing import Dict, List, Optional

import docpages

REPO = Path(__file__).resolve().parent.parent
PASSWORD = "cpu deployment release key"
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
    fingerprint: str = ""  # the release key's, as `sign generate-key` printed it
    deploy_dir: Optional[Path] = None  # DEPLOY_DIR (default: beside the settings file)

    @property
    def deployment_record(self) -> Path:
        return (self.deploy_dir or self.env_file.parent / "deploy") / self.project / "deployment.json"

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


DOC_PAGE, DOC_SECTION = "docs/deploy.md", "## The cpu target"  # the README's until issue 52


@dataclass(frozen=True)
class ReadmeFlow:
    """The cpu flow block users read (docs/deploy.md), line by line as a newcomer types them (comments dropped)."""

    before: List[str]  # up to ./start.sh: build, key, release, model, settings
    start: str
    after: List[str]  # status, verify, stop

    @property
    def tag(self) -> str:
        release = next(line for line in self.before if " release -- " in line)
        return release.split(" release -- ", 1)[1].split()[0]


def readme_flow() -> ReadmeFlow:
    text = docpages.section(DOC_PAGE, DOC_SECTION)
    assert "```sh\n" in text, f"{DOC_PAGE}, {DOC_SECTION!r}: no sh block"
    block = text.split("```sh\n", 1)[1].split("```", 1)[0]
    lines = [re.split(r"\s{2,}#", line)[0].strip() for line in block.splitlines()]
    lines = [line for line in lines if line and not line.startswith("#")]
    at = lines.index("./start.sh")
    return ReadmeFlow(lines[:at], lines[at], lines[at + 1:])


TAG = readme_flow().tag


def as_typed(line: str) -> str:
    """A README line with its placeholder password filled in (the only thing a user must supply)."""
    return line.replace("COSIGN_PASSWORD=...", f"COSIGN_PASSWORD='{PASSWORD}'")


def run_line(line: str, cwd: Path, env: Dict[str, str], timeout: float = 3600) -> subprocess.CompletedProcess:
    """One README line, run by bash in the clone as typed there."""
    done = subprocess.run(["bash", "-c", as_typed(line)], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, f"{line}: exit {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-5000:]}"
    return done


def readme_deployment(root: Path) -> CpuDeployment:
    """A clean clone of this checkout, and the README's cpu flow run in it up to ./start.sh, line by line.

    The one thing added is isolation on a shared host, written into the clone's .env before the README's own
    settings line appends to it: a free port, a compose project of its own, the deploy folder, the health
    timeout of a loaded CI host. HOME is a folder of the test's, so `~/tiny-model` is too."""
    from conftest import clone_checkout

    clone = clone_checkout(REPO, root / "repo")
    for args in (["config", "user.name", "CPU Deploy"], ["config", "user.email", "cpu@example.invalid"],
                 ["config", "commit.gpgsign", "false"], ["config", "tag.gpgsign", "false"]):
        subprocess.run(["git", *args], cwd=clone, check=True)
    home = root / "home"
    home.mkdir()
    env = _newcomer_env(HOME=str(home))
    d = CpuDeployment(clone, clone / ".env", free_port(), f"bwcpu-{uuid.uuid4().hex[:10]}", home / "tiny-model", env)
    flow = readme_flow()
    d.deploy_dir = root / "deploy"
    isolation = {"COMPOSE_PROJECT": d.project, "API_PORT": d.port, "DEPLOY_DIR": d.deploy_dir,
                 "MIN_FREE_DISK_GIB": 5, "HEALTH_TIMEOUT_S": HEALTH_TIMEOUT_S}
    for line in flow.before:
        if line.startswith("printf") and ">> .env" in line:
            d.env_file.write_text("".join(f"{k}={v}\n" for k, v in isolation.items()))
        began = time.monotonic()
        done = run_line(line, clone, env)
        if "generate-key" in line:
            d.fingerprint = done.stdout.split("RELEASE_KEY_FINGERPRINT=", 1)[1].split()[0]
        if "build-cpu" in line:
            d.timings["build_and_qualify_s"] = round(time.monotonic() - began, 1)
            manifest = json.loads((clone / "build" / "manifests" / "cpu.json").read_text())
            assert manifest["predicate"]["verdict"] == "pass"
    settings = d.env_file.read_text()
    assert f"MODEL_PATH={d.model_dir}" in settings and "EXTRA_SERVE_ARGS=--dtype float32" in settings, settings
    return d


def make_model(dest: Path) -> Path:
    """`python -m qualify tiny-model --out DIR`, with this interpreter."""
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
    """The README's lines after ./start.sh for the README's deployment (status, verify --full, stop.sh
    --purge-cache, as typed), else scripts/stop.sh --purge-cache; each must pass, and nothing of the project
    may be left (else it is removed and the session fails)."""
    if d.env_file == d.clone / ".env":
        runs = [subprocess.run(["bash", "-c", as_typed(line)], cwd=d.clone, env=d.env, capture_output=True,
                               text=True, timeout=900, stdin=subprocess.DEVNULL) for line in readme_flow().after]
        done = next((r for r in runs if r.returncode != 0), runs[-1])
    else:
        done = d.script("scripts/stop.sh", "--purge-cache", timeout=600)
    left = {kind: d.containers(docker, kind) for kind in ("ps", "volume", "network")}
    if any(left.values()):
        for kind, rm in (("ps", ["rm", "-f"]), ("network", ["network", "rm"]), ("volume", ["volume", "rm", "-f"])):
            if left[kind]:
                subprocess.run([docker, *rm, *left[kind]], capture_output=True, timeout=300)
    assert done.returncode == 0, f"{done.args}: exit {done.returncode}\n" + done.stdout[-2000:] + done.stderr[-3000:]
    assert not any(left.values()), f"scripts/stop.sh --purge-cache left {left}"


