"""The benchmark's clean engine (`nox -s bench-build`, the pull row): a second dockerd that leaves the
host's own engine as it found it. With `--bridge none` dockerd deleted the host's docker0 at start, and
every later RUN step of the host's engine failed ("could not find bridge docker0"). Real dockerd, real pull."""

from __future__ import annotations

import subprocess
import uuid
from pathlib import Path

import pytest

from qualify.devtools import bench_build

pytestmark = pytest.mark.engine


def _bridges() -> set:
    out = subprocess.run(["ip", "-o", "link", "show", "type", "bridge"], capture_output=True, text=True,
                         check=True).stdout
    return {line.split(":")[1].strip().split("@")[0] for line in out.splitlines() if ":" in line}


def test_the_clean_engine_pulls_and_leaves_the_hosts_engine_working(docker_engine, loopback_registry,
                                                                     debian_python_image, tmp_path: Path):
    before = _bridges()
    assert "docker0" in before, "the host's engine has no docker0 before the test: restart dockerd"
    tag = f"{loopback_registry.ref('qualify-test/bench-pull')}:{uuid.uuid4().hex[:8]}"
    subprocess.run([docker_engine, "tag", debian_python_image, tag], check=True)
    subprocess.run([docker_engine, "push", "-q", tag], check=True, capture_output=True, timeout=300)
    try:
        with bench_build.scratch_engine() as sock:
            pulled = subprocess.run([docker_engine, "-H", sock, "pull", "-q", tag], capture_output=True,
                                    text=True, timeout=300)
            assert pulled.returncode == 0, pulled.stderr
            assert subprocess.run([docker_engine, "-H", sock, "image", "inspect", tag],
                                  capture_output=True).returncode == 0
    finally:
        subprocess.run([docker_engine, "rmi", tag], capture_output=True)
        loopback_registry.delete_tag(tag)
    assert _bridges() == before, "the clean engine changed the host's bridges"
    # The host's engine still runs a container on its default bridge (a RUN step needs exactly that).
    ran = subprocess.run([docker_engine, "run", "--rm", debian_python_image, "true"], capture_output=True,
                         text=True, timeout=120)
    assert ran.returncode == 0, ran.stderr
