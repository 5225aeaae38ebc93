"""Helpers for the clean and interruption tests (not a test module): a registry and state folder of a test's
own, tiny images, sizes measured with du."""

from __future__ import annotations

import io
import os
import signal
import socket
import subprocess
import tarfile
import uuid
from pathlib import Path

from qualify.host import clean
from qualify.host.registry import Registry


def du(path: Path) -> int:
    """Bytes on disk, as du counts them (an independent measure of what clean reports)."""
    if not path.exists():
        return 0
    out = subprocess.run(["du", "-s", "-B1", str(path)], capture_output=True, text=True, check=True).stdout
    return int(out.split()[0])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tiny_image(docker: str, tag: str, size: int = 0) -> str:
    """A one-file image made with `docker import` (unique content, so a unique digest); `size` bytes of
    random data when given (incompressible: what a push sends)."""
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w") as tar:
        body = os.urandom(size) if size else f"{tag} {uuid.uuid4()}\n".encode() * 2000
        info = tarfile.TarInfo("payload.txt")
        info.size = len(body)
        tar.addfile(info, io.BytesIO(body))
    subprocess.run([docker, "import", "-", tag], input=data.getvalue(), check=True, capture_output=True)
    return tag


def registry_dir(registry: Registry, state: Path) -> Path:
    return state / f"registry-{registry.port}"


def stop_registry(registry: Registry, state: Path) -> None:
    for pid in clean._serving(registry_dir(registry, state) / "config.yml"):
        os.kill(pid, signal.SIGTERM)


def own_registry_for(tmp_path: Path):
    """A registry and state folder of a test alone (clean stops and restarts the registry it collects). This
    process gives its lease back: the clean the test runs must find nobody else using the registry."""
    state = tmp_path / "state"
    env = {**os.environ, "QUALIFY_REGISTRY": f"127.0.0.1:{free_port()}", "QUALIFY_STATE_DIR": str(state)}
    registry = Registry(env["QUALIFY_REGISTRY"])
    registry.ensure(state)
    registry.release(state)
    yield registry, state, env
    stop_registry(registry, state)
