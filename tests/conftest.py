"""Shared test helpers.

Tests that need a real container engine use the `docker_engine` fixture: it
skips on a developer machine without one, and FAILS when CI=true, so a CI run
can never pass by skipping the engine tests.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
NVCC = Path("/usr/local/cuda/bin/nvcc")
IN_CI = os.environ.get("CI", "").lower() == "true"


def pytest_configure(config):
    """The interruption tests press Ctrl-C as a terminal does (SIGINT). A suite started from a background job
    (`bash .ci/run &`, nohup) inherits SIGINT ignored, and an ignored signal stays ignored across exec, so
    the CLI under test never saw it (three Ctrl-C tests failed so, their SIGTERM twins passed). Caught here,
    it is the default again in every child."""
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(autouse=True)
def _own_promoter_state(monkeypatch, tmp_path_factory):
    """Each test promotes with high-water marks of its own (QUALIFY_TRUST_DIR, inherited by the CLI it runs):
    on this shared host the real ones (STATE_DIR/trust) belong to whoever promotes here."""

    monkeypatch.setenv("QUALIFY_TRUST_DIR", str(tmp_path_factory.getbasetemp() / "trust" / uuid.uuid4().hex))


# The fixtures that reach a container engine (or a registry it serves): a test that uses one, directly or
# through another fixture, is marked `engine` here, so `-m "not engine and not slow"` is the fast lane that
# needs no engine at all (tests/test_house_rules.py checks it).
ENGINE_FIXTURES = {"docker_engine", "podman_engine", "loopback_registry", "own_registry", "debian_python_image",
                   "cpu_deployment"}


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by marker
def pytest_collection_modifyitems(config, items):
    for item in items:
        if ENGINE_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.engine)


def _require(condition: bool, why: str) -> None:
    if condition:
        return
    if IN_CI:
        pytest.fail(f"CI=true and {why}: scripts/setup-host.sh should have provided it")
    pytest.skip(why)


def docker_binary() -> str:
    # Debian's client matches Debian's engine (20.10) and can use BuildKit.
    return "/usr/bin/docker" if os.path.exists("/usr/bin/docker") else (shutil.which("docker") or "docker")


@pytest.fixture(scope="session")
def docker_engine() -> str:
    """Path of a docker client whose engine answers."""
    client = docker_binary()
    ok = False
    if shutil.which(client) or os.path.exists(client):
        ok = subprocess.run([client, "info"], capture_output=True, timeout=30).returncode == 0
    _require(ok, "no Docker engine answers")
    return client


@pytest.fixture(scope="session")
def podman_engine() -> str:
    ok = shutil.which("podman") is not None and subprocess.run(
        ["podman", "info"], capture_output=True, timeout=60
    ).returncode == 0
    _require(ok, "podman is not installed or does not work")
    return "podman"


@pytest.fixture(scope="session")
def nvcc() -> Path:
    _require(NVCC.exists(), f"{NVCC} not found (CUDA 13 nvcc)")
    return NVCC


@pytest.fixture(scope="session")
def fx(nvcc, tmp_path_factory):
    """The nvcc-built fatbins and libraries of tests/cuda_fixtures.py, built once for the session."""
    from cuda_fixtures import build

    return build(nvcc, tmp_path_factory.mktemp("cuda-fixtures"))


def require(condition: bool, why: str) -> None:
    """For tests: skip locally, fail in CI, when a dependency is missing."""
    _require(condition, why)


@pytest.fixture(scope="session")
def debian_python_image(docker_engine) -> str:
    """A small local image (Debian bookworm + python3's standard library) for tests that
    need a container but not CUDA. Made with debootstrap, since nothing can be pulled;
    tagged by the rootfs recipe's key so a changed package list makes a new image."""
    from qualify.imagebuild.rootfs import debian_rootfs

    tar = debian_rootfs("amd64", "bookworm", "http://deb.debian.org/debian",
                        ["python3-minimal", "libpython3.11-stdlib", "ca-certificates"])
    image = f"qualify-test/debian-python:{tar.stem.rsplit('-', 1)[-1]}"
    have = subprocess.run([docker_engine, "image", "inspect", image], capture_output=True)
    if have.returncode != 0:
        subprocess.run([docker_engine, "import", str(tar), image], check=True, capture_output=True)
    return image


@pytest.fixture(scope="session")
def loopback_registry(docker_engine):
    """Our registry on 127.0.0.1 (a real one: Debian's docker-registry)."""
    from qualify.host.registry import Registry

    return Registry.from_env().ensure()


@pytest.fixture
def own_registry(tmp_path, docker_engine):
    """(registry, state folder, environment) of this test alone (tests/clean_helpers.py)."""
    from clean_helpers import own_registry_for

    yield from own_registry_for(tmp_path)


@pytest.fixture(scope="session")
def signing_key(tmp_path_factory) -> Path:
    """A release key made by `qualify sign generate-key` (tests/deploy_host.py): PREFIX.key and PREFIX.pub."""
    from deploy_host import make_signing_key

    return make_signing_key(tmp_path_factory.mktemp("key"))


@pytest.fixture()
def host(tmp_path, signing_key):
    """One start.sh deploy host (tests/deploy_host.py: Host); its compose project is removed afterwards."""
    from deploy_host import new_host

    yield from new_host(tmp_path, signing_key)


def clone_checkout(source: Path, dest: Path, *args: str, timeout: float = 300) -> Path:
    """`git clone` of a checkout, as a newcomer would. The checkout may belong to another user (a CI runner's
    copy): git 2.39 refuses to clone such a repository ('dubious ownership') unless a global or system file
    marks it safe (`-c` and GIT_CONFIG_* are not enough), so the clone alone gets such a file. A failure says
    what git said."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    config = dest.parent / f".{dest.name}.gitconfig"
    config.write_text("[safe]\n\tdirectory = *\n")
    env = {**os.environ, "GIT_CONFIG_GLOBAL": str(config)}
    try:
        done = subprocess.run(["git", "clone", "-q", *args, str(source), str(dest)], capture_output=True, text=True,
                              timeout=timeout, env=env, stdin=subprocess.DEVNULL)
    finally:
        config.unlink()
    assert done.returncode == 0, f"git clone {source} failed (exit {done.returncode}): {done.stderr.strip()}"
    return dest


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    """`python -m qualify tiny-model --out DIR` once per session (about a minute of training): the model the
    cpu deployment serves and test_tiny_model.py reads. Never written to after: a server may be serving it."""
    import cpu_server

    return cpu_server.make_model(tmp_path_factory.mktemp("tiny") / "model")


@pytest.fixture(scope="session")
def cpu_deployment(docker_engine, loopback_registry, tmp_path_factory):
    """A real vLLM server (the cpu target, the tiny model) made by the cpu flow of docs/deploy.md as written:
    tests/cpu_server.py says how it is made and used. One per session; that flow's closing lines (status,
    verify --full, stop.sh --purge-cache) run at its end."""
    import cpu_server

    root = tmp_path_factory.mktemp("cpu-deployment")
    d = cpu_server.readme_deployment(root)
    try:
        cpu_server.start_killed_then_converge(d)
        yield d
    finally:
        began = time.monotonic()
        try:
            cpu_server.teardown(d, docker_engine)
        finally:
            d.timings["stop_s"] = round(time.monotonic() - began, 1)
            print(f"\ncpu deployment timings: {d.timings}", file=sys.stderr)


@pytest.fixture(scope="session")
def release_chain(docker_engine, loopback_registry, tmp_path_factory):
    """tests/release_chain.py: the smoke image qualified, released, promoted three times under two versions of the
    enrolled hosts and published, each by the README's command; the TLS registry it went to stays up until the
    session ends. Tests that change anything work on `chain.copy(tmp_path)`."""
    import release_chain as chain
    import tls_registry

    _require(os.path.exists(tls_registry.REGISTRY_BINARY) and all(shutil.which(t) for t in ("skopeo", "openssl", "jq")),
             "docker-registry, skopeo, openssl and jq are needed")
    gen = tls_registry.start(tmp_path_factory.mktemp("chain-registry"))
    registry = next(gen)
    try:
        yield chain.make(tmp_path_factory.mktemp("chain"), registry)
    finally:
        gen.close()
