"""The deploy host the start.sh tests run against (not a test module): a settings file, a release made by
the real release steps, the stand-in nvidia-smi (a TEST DOUBLE: this host has no GPU) and a uniquely named
compose project. The `host` and `signing_key` fixtures (tests/conftest.py) hand these out."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from signing_helpers import DIGEST_A, make_release, statement

from qualify.signing import keys as cosign_keys

REPO = Path(__file__).resolve().parent.parent

RTX5090 = "12.0|NVIDIA GeForce RTX 5090|32607 MiB|GPU-5090-0000"
H200 = "9.0|NVIDIA H200|143771 MiB|GPU-h200-0000"
GB10 = "12.1|NVIDIA GB10|[N/A]|GPU-gb10-0000"
PASSWORD = "start.sh test key"
SCRIPTS = ["start.sh", "scripts/lib.sh", "scripts/status.sh", "scripts/stop.sh", "scripts/verify.sh"]
SETTINGS = [line.split("=", 1)[0] for line in (REPO / ".env.example").read_text().splitlines()
            if line[:1].isalpha() and "=" in line]
LABEL = "com.docker.compose.project"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def qualify(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "COSIGN_PASSWORD": PASSWORD}
    done = subprocess.run([sys.executable, "-m", "qualify", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stdout + done.stderr
    return done


def make_signing_key(folder: Path) -> Path:
    """The key prefix: PREFIX.key and PREFIX.pub, made by `qualify sign generate-key`."""
    prefix = folder / "cosign"
    qualify("sign", "generate-key", "--output-key-prefix", str(prefix))
    return prefix


@dataclass
class Host:
    """One test's deployment: its settings file, release folder, stand-in GPU and compose project."""

    root: Path
    key: Path
    project: str
    port: int

    @property
    def env_file(self) -> Path:
        return self.root / "settings.env"

    @property
    def repo(self) -> Path:
        return self.root / "repo"

    @property
    def manifests(self) -> Path:
        return self.repo / "manifests"

    @property
    def compose_file(self) -> Path:
        return self.root / "deploy" / self.project / "compose.json"

    def settings(self, **overrides: object) -> Path:
        values = {"MANIFESTS_DIR": self.manifests, "DEPLOY_DIR": self.root / "deploy",
                  "COMPOSE_PROJECT": self.project, "API_PORT": self.port, "GPU_RUNTIME": "none",
                  "MIN_FREE_DISK_GIB": 1, **overrides}
        self.env_file.write_text("".join(f"{k}={v}\n" for k, v in values.items()))
        return self.env_file

    def release(self, stmt: dict, tag: str = "v1.0.0", **options) -> Path:
        """Release `stmt` as `nox -s release -- TAG` does; the path of manifests/<tag>/<target>.json."""
        folder = make_release(self.repo, tag, [stmt], Path(f"{self.key}.key"), PASSWORD, **options)
        return folder / f"{stmt['predicate']['target']['name']}.json"

    def run(self, script: str, *args: str, gpus: Optional[str] = RTX5090, path: Optional[str] = None,
            timeout: float = 60, **extra_env: str) -> subprocess.CompletedProcess:
        env = {k: v for k, v in os.environ.items() if k not in SETTINGS and not k.startswith("CONTAINER_ENV_")}
        env.update(extra_env)
        env["QUALIFY_PYTHON"] = sys.executable
        env["PATH"] = path if path is not None else f"{self.root / 'bin'}{os.pathsep}{os.environ['PATH']}"
        if gpus is not None:
            env["STANDIN_GPUS"] = gpus
        return subprocess.run([str(REPO / script), *args, "--env-file", str(self.env_file)], env=env,
                              capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)


def remove_project(docker: str, project: str) -> None:
    """Remove what a compose project left: only ours, found by its unique label."""
    # Containers first: a network or volume in use cannot be removed.
    for ls, rm in ((["ps", "-aq"], ["rm", "-f"]), (["network", "ls", "-q"], ["network", "rm"]),
                   (["volume", "ls", "-q"], ["volume", "rm", "-f"])):
        ids = subprocess.run([docker, *ls, "--filter", f"label={LABEL}={project}"], capture_output=True,
                             text=True, timeout=60).stdout.split()
        if ids:
            subprocess.run([docker, *rm, *ids], capture_output=True, timeout=120)


def containers_of(docker: str, project: str) -> list:
    return subprocess.run([docker, "ps", "-aq", "--filter", f"label={LABEL}={project}"], capture_output=True,
                          text=True, timeout=60).stdout.split()


def new_host(tmp_path: Path, signing_key: Path):
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "nvidia-smi").symlink_to(REPO / "tests" / "standin" / "nvidia-smi")
    h = Host(tmp_path, signing_key, f"bwtest-{uuid.uuid4().hex[:10]}", free_port())
    yield h
    docker = "/usr/bin/docker" if os.path.exists("/usr/bin/docker") else shutil.which("docker")
    if docker:
        remove_project(docker, h.project)


def released(h: Host, **kw) -> Path:
    """A release of sm120 at baseline, as release and promote make it (make_release: seven signed passes)."""
    kw.setdefault("level", "baseline")
    h.settings(**kw.pop("settings", {}))
    options = kw.pop("options", {})
    return h.release(statement("sm120", DIGEST_A, **kw), **options)



def key_fingerprint(pub: Path) -> str:
    return cosign_keys.fingerprint(cosign_keys.load_public_key(pub.read_bytes()))
