"""Shared builders for tests that need the real smoke images (built once per session).

Built for real on the hermetic base with the host's Docker engine; CI builds
them from a clean state (debootstrap, CUDA wheels, loopback registry).
"""

from __future__ import annotations

import dataclasses
import subprocess

from qualify.config import targets
from qualify.host.engine import Engine
from qualify.host.registry import Registry
from qualify.imagebuild import image

_CACHE = {}


def smoke(target: str) -> image.BuildRecord:
    """The smoke image of `target` on the hermetic base (built on first use)."""
    if target not in _CACHE:
        tf = targets.load()
        # The suite's many builds share their cache (a warm CI run takes minutes, not a quarter hour);
        # the clean-up a user's build does by default has its own test.
        opts = image.BuildOptions(target=target, base="hermetic", profile="smoke", engine="docker", keep_cache=True)
        _CACHE[target] = image.build(tf, opts, Engine("docker"), Registry.from_env())
    return _CACHE[target]


def variant(target: str, name: str, **changes) -> image.BuildRecord:
    """A deliberately changed build of `target` under another name (e.g. another arch list)."""
    key = (target, name)
    if key not in _CACHE:
        tf = targets.load()
        t = dataclasses.replace(tf.get(target), name=name, **changes)
        tf2 = dataclasses.replace(tf, targets={**tf.targets, name: t})
        opts = image.BuildOptions(target=name, base="hermetic", profile="smoke", engine="docker", keep_cache=True)
        _CACHE[key] = image.build(tf2, opts, Engine("docker"), Registry.from_env())
    return _CACHE[key]


def derived(docker: str, base_ref: str, tag: str, dockerfile_body: str, files: dict, tmp_dir, platform: str) -> str:
    """`FROM base_ref` + a few instructions: a broken image for the failure tests."""
    ctx = tmp_dir / tag.replace("/", "_").replace(":", "_")
    ctx.mkdir(parents=True, exist_ok=True)
    for rel, data in files.items():
        (ctx / rel).write_bytes(data)
        (ctx / rel).chmod(0o755)
    (ctx / "Dockerfile").write_text(f"FROM {base_ref}\n{dockerfile_body}\n")
    subprocess.run([docker, "build", "-q", "--platform", platform, "-t", tag, str(ctx)], check=True,
                   capture_output=True, env={"DOCKER_BUILDKIT": "1", "PATH": "/usr/bin:/bin"}, timeout=900)
    return tag


def run(docker: str, image: str, script: str, platform: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([docker, "run", "--rm", "--network", "none", "--platform", platform, image, "bash", "-c",
                           script], capture_output=True, text=True, timeout=timeout)
