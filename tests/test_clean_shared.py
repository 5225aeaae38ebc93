"""Issue 41: `clean` on a host that several checkouts share takes only what this checkout made, never leaves
the registry stopped (killed or interrupted during its garbage collection, the next clean finishes it), and
never stops a registry another command is using; a full registry storage is the host refusing, named.
Real engine, real registries (Debian's docker-registry) of each test's own, real clones, real tmpfs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from clean_helpers import du, free_port, registry_dir, stop_registry, tiny_image
from conftest import REPO, clone_checkout, require

from qualify.core.errors import HostError
from qualify.host import clean, ledger
from qualify.host.engine import Engine
from qualify.host.registry import Registry

pytestmark = pytest.mark.engine

# A build context staged as a build stages it (imagebuild/image.py:build_context), in the checkout it runs in.
STAGE_CONTEXT = """
import sys
from pathlib import Path
from qualify.config.targets import DEFAULT_BUILD
from qualify.imagebuild import image
with image.build_context("sm120-smoke-hermetic", Path(sys.argv[1]), Path(sys.argv[2]), DEFAULT_BUILD) as ctx:
    print(ctx)
"""
# A command using the registry (a build pushing, say) for as long as its standard input stays open.
USE_REGISTRY = """
import sys
from qualify.host.registry import Registry
Registry.from_env().ensure()
print("using the registry", flush=True)
sys.stdin.read()
"""


def _python(checkout: Path, env: dict, *args: str, **kw):
    return subprocess.run([sys.executable, *args], cwd=checkout, env={**env, "PYTHONPATH": str(checkout)},
                          capture_output=True, text=True, timeout=600, **kw)


def _clean(env: dict, *args: str, checkout: Path = REPO, **extra) -> subprocess.CompletedProcess:
    return _python(checkout, {**env, **extra}, "-m", "qualify", "clean", "--json", "--releases",
                   str(Path(env["QUALIFY_STATE_DIR"]).parent / "no-releases"), *args)


def _pushed_by_this_checkout(docker: str, registry: Registry, state: Path, size: int = 2 << 20) -> tuple:
    """An image in the toolkit's namespace, pushed and recorded in this checkout's ledger as a build does."""
    engine = Engine("docker")
    tag = tiny_image(docker, f"{registry.address}/blackwell/sm120:smoke-hermetic-{uuid.uuid4().hex[:6]}", size)
    digest = engine.push(tag)
    ledger.record(engine.image_id(tag), f"{tag.rsplit(':', 1)[0]}@{digest}", state_dir=state)
    return tag, digest


def _tiny_lock(tmp_path: Path) -> tuple:
    lock = tmp_path / "smoke-linux-amd64-py3.11.txt"  # the stem a real lock's context is named by
    lock.write_text("x==1 --hash=sha256:" + "0" * 64 + "\n")
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    return lock, wheels


def test_clean_in_checkout_b_leaves_checkout_as_context_wheelhouse_and_registry(tmp_path, docker_engine,
                                                                                 own_registry):
    """Two checkouts on one engine and one state folder. A's build context and the shared wheelhouse stay; B's
    context goes; while a command of A uses the registry, B's clean deletes its manifests but does not stop the
    registry (same process before and after), and its next clean, with A done, collects the garbage."""
    registry, state, env = own_registry
    a = clone_checkout(REPO, tmp_path / "checkout-a")
    lock, wheels = _tiny_lock(tmp_path)
    contexts = {}
    for name, checkout in (("a", a), ("b", REPO)):
        staged = _python(checkout, env, "-c", STAGE_CONTEXT, str(lock), str(wheels))
        assert staged.returncode == 0, staged.stderr
        contexts[name] = Path(staged.stdout.strip())
    assert contexts["a"] != contexts["b"] and contexts["a"].is_dir() and contexts["b"].is_dir()
    wheelhouse = state / "wheelhouse" / "smoke-linux-amd64-linux-amd64-000000000000"
    wheelhouse.mkdir(parents=True)
    (wheelhouse / "x-1-py3-none-any.whl").write_bytes(os.urandom(1 << 20))
    tag, digest = _pushed_by_this_checkout(docker_engine, registry, state)
    config = registry_dir(registry, state) / "config.yml"
    serving = clean._serving(config)
    user = subprocess.Popen([sys.executable, "-c", USE_REGISTRY], cwd=a, env={**env, "PYTHONPATH": str(a)},
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert user.stdout.readline().strip() == "using the registry"
        done = _clean(env)
        assert done.returncode == 0, done.stderr
        report = json.loads(done.stdout)
        assert report["images"] == [tag]
        assert report["registry_manifests"] == [f"{registry.address}/blackwell/sm120@{digest}"]
        assert any("is in use by another command" in n and "not stopped" in n for n in report["notes"]), report
        assert clean._serving(config) == serving and registry.answers(), "clean stopped a registry in use"
        assert registry.gc_pending(state).is_file()
        assert not contexts["b"].exists() and contexts["a"].is_dir() and (wheelhouse / "x-1-py3-none-any.whl").is_file()
        assert any(str(contexts["a"]) in k and "not this checkout's" in k for k in report["kept_state"])
        assert any(str(wheelhouse.parent) in k and "shared by every checkout" in k for k in report["kept_state"])
    finally:
        user.stdin.close()
        user.wait(timeout=60)
    before = du(registry_dir(registry, state))
    again = _clean(env)
    assert again.returncode == 0, again.stderr
    report = json.loads(again.stdout)
    assert any("did not finish" in n for n in report["notes"]), report
    assert report["freed_registry_bytes"] >= 1 << 20 and before - du(registry_dir(registry, state)) >= 1 << 20
    assert not registry.gc_pending(state).exists() and registry.answers()
    assert contexts["a"].is_dir() and wheelhouse.is_dir()  # still not B's to take
    # A's own clean takes A's context.
    theirs = _clean(env, checkout=a)
    assert theirs.returncode == 0, theirs.stderr
    assert not contexts["a"].exists() and wheelhouse.is_dir() and registry.answers()


def test_clean_killed_during_garbage_collection_is_finished_by_the_next_clean(docker_engine, own_registry):
    """Issue 41, item 7: killed while the registry was stopped for its collector, clean left it stopped and
    the next clean said 'registry 0.00 GB'. Now the next clean notices, collects and starts it again."""
    registry, state, env = own_registry
    _pushed_by_this_checkout(docker_engine, registry, state)
    killed = _clean(env, QUALIFY_KILL_AT="clean:collecting")
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert not registry.answers() and registry.gc_pending(state).is_file()  # what the kill left
    before = du(registry_dir(registry, state))
    again = _clean(env)
    assert again.returncode == 0, again.stderr
    report = json.loads(again.stdout)
    assert any("did not finish" in n and "left stopped" in n for n in report["notes"]), report
    assert registry.answers() and not registry.gc_pending(state).exists()
    freed = before - du(registry_dir(registry, state))
    assert freed >= 1 << 20 and abs(report["freed_registry_bytes"] - freed) <= 64 << 10


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_clean_interrupted_during_garbage_collection_starts_the_registry_again(docker_engine, own_registry, sig):
    """A signal at the printed step (the registry is being stopped for its collector): clean exits 130 with
    the registry answering; the collection it did not finish is finished by the next clean."""
    registry, state, env = own_registry
    _pushed_by_this_checkout(docker_engine, registry, state)
    proc = subprocess.Popen([sys.executable, "-m", "qualify", "clean", "--releases", str(state.parent / "none")],
                            cwd=REPO, env={**env, "PYTHONPATH": str(REPO)}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    seen = []
    for line in proc.stderr:
        seen.append(line)
        if "for its garbage collection" in line:
            proc.send_signal(sig)
            break
    out, err = proc.communicate(timeout=120)
    err = "".join(seen) + err
    assert proc.returncode == 130, err
    assert "interrupted" in err and registry.answers(), err
    again = _clean(env)
    assert again.returncode == 0, again.stderr
    assert registry.answers() and not registry.gc_pending(state).exists()


def test_a_push_into_a_full_registry_storage_names_the_storage_and_is_the_host_refusing(tmp_path, docker_engine):
    """Issue 41: disk full in the registry's storage surfaced as exit 3 'HTTP status: 500'. A real registry
    whose storage is a 1 MiB tmpfs, and a push of 3 MiB: exit 12, naming the storage path."""
    state = tmp_path / "state"
    registry = Registry(f"127.0.0.1:{free_port()}")
    data = registry_dir(registry, state) / "data"
    data.mkdir(parents=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(data)], capture_output=True)
    require(mounted.returncode == 0, f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    tag = f"{registry.address}/blackwell/sm120:full-{uuid.uuid4().hex[:6]}"
    try:
        registry.ensure(state)
        tiny_image(docker_engine, tag, 3 << 20)
        with pytest.raises(HostError) as refused:
            with registry.storage_checked(tag, state):
                Engine("docker").push(tag)
        assert refused.value.exit_code == 12
        assert f"the loopback registry's storage {data} is full" in refused.value.message
        assert f"df -h {data}" in refused.value.hint and "run the same command again" in refused.value.hint
    finally:
        registry.release(state)
        stop_registry(registry, state)
        subprocess.run(["umount", "--lazy", str(data)], capture_output=True)
        subprocess.run([docker_engine, "rmi", tag], capture_output=True)
