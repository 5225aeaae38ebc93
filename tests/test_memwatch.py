"""Issue 51, item 4: GB10's unified memory watched while the server starts, and the server stopped before the
host stalls (vllm-project/vllm#46307, #56824, NVIDIA/dgx-spark-playbooks#97).

This machine is an amd64 host without a GPU or a unified pool. STAND-INS, each labelled where it is made: the
stand-in nvidia-smi reports a GB10; a stand-in /proc/meminfo (hostfiles.py: BLACKWELL_STANDIN_HOST_ROOT) the
test rewrites while start.sh waits; a `sitecustomize` that makes platform.machine() say aarch64 (GB10 is an
arm64 host); the stand-in vLLM server image. start.sh, compose and the container are real."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import REPO
from deploy_host import GB10, SETTINGS, containers_of
from signing_helpers import statement
from test_deploy import SM121, meminfo, server, standin  # noqa: F401 (server: a fixture)
from test_start_sh import standin_image  # noqa: F401 (a fixture)

from qualify.deploy import memory, memwatch
from qualify.deploy.startup import Startup
from qualify.deploy.ui import Stop, Ui


def _standin_meminfo(root: Path, available_gib: float, total_gib: float = 119.6, free_gib: float = 0) -> Path:
    """STAND-IN /proc/meminfo under `root`, written whole (rename) so a reader never sees half a file."""
    (root / "proc").mkdir(parents=True, exist_ok=True)
    tmp = root / "proc" / "meminfo.new"
    tmp.write_text(meminfo(total_gib, available_gib, free_gib or available_gib - 5))
    tmp.replace(root / "proc" / "meminfo")
    return root


# --- the watch itself -----------------------------------------------------------------------------------------


def test_the_watch_reads_once_a_second_and_trips_below_the_reserve(tmp_path, monkeypatch):
    root = _standin_meminfo(tmp_path, 100.0)
    monkeypatch.setenv("BLACKWELL_STANDIN_HOST_ROOT", str(root))
    tripped = []
    started = time.monotonic()
    with memwatch.Watch(8, tripped.append) as watch:
        time.sleep(2.5)
        assert not tripped and watch.lowest.available_gib == pytest.approx(100.0)
        _standin_meminfo(root, 6.5)
        deadline = time.monotonic() + 5
        while not tripped and time.monotonic() < deadline:
            time.sleep(0.1)
    (short,) = tripped
    assert short.reading.available_gib == pytest.approx(6.5) and short.phase == memwatch.LOADING
    assert watch.tripped is short and 2.5 <= short.seconds <= 4.5
    # One reading a second, not a busy loop: 3 or 4 readings over some 3 s, then it stopped at the shortfall.
    assert 3 <= watch.readings <= 5, watch.readings
    assert not watch._thread.is_alive() and time.monotonic() - started < 8


def test_a_watch_stops_when_told_and_never_trips_while_memory_holds(tmp_path, monkeypatch):
    monkeypatch.setenv("BLACKWELL_STANDIN_HOST_ROOT", str(_standin_meminfo(tmp_path, 50.0)))
    with memwatch.Watch(8, lambda short: pytest.fail("tripped")) as watch:
        time.sleep(1.2)
    assert watch.tripped is None and watch.readings in (2, 3) and not watch._thread.is_alive()


def test_the_advice_computes_the_fraction_that_leaves_the_host_its_reserve():
    short = memwatch.Shortfall(memwatch.LOADING, memwatch.Reading(5.0, 119.6), 8, 12.0)
    fraction, context = memwatch.advice(short, 0.5, 119.6, 16, 8192, ".env")
    # The server had 59.8 GiB; the host was 3 GiB short: (59.8 - 3) / 119.6 = 0.4749 -> 0.47.
    assert fraction.startswith("set GPU_MEMORY_UTILIZATION=0.47 in .env (the server had 0.5 of the 119.6 GiB pool; "
                               "the host was 3.0 GiB short of its 8 GiB reserve")
    assert context.startswith("or lower MAX_MODEL_LEN in .env (now 8192)")
    starved = memwatch.Shortfall(memwatch.CANARY, memwatch.Reading(1.0, 24.0), 8, 3.0)
    first, _ = memwatch.advice(starved, 0.6, 24.0, 16, 8192, ".env")
    assert first.startswith("free memory on this host first") and "minimum of 16 GiB" in first


def test_a_shortfall_during_the_canary_stops_the_server_and_exits_5(server, tmp_path, monkeypatch):  # noqa: F811
    """Startup's canary against the in-process stand-in vLLM, whose answer takes 3 s; the pool (a STAND-IN
    meminfo) falls below the reserve meanwhile. The server is stopped from the watch's thread (the engine is
    a stand-in `true`: nothing to kill here) and the canary's outcome is the memory's exit code 5, not 6."""
    url, _ = server
    root = _standin_meminfo(tmp_path, 100.0)
    monkeypatch.setenv("BLACKWELL_STANDIN_HOST_ROOT", str(root))
    real = standin.complete

    def slow(request):
        _standin_meminfo(root, 4.0)
        time.sleep(3)
        return real(request)

    monkeypatch.setattr(standin, "complete", slow)
    s = SimpleNamespace(served_model_name="qwen", max_model_len=4096, env_file=Path(".env"), log_tail_lines=5,
                        health_timeout_s=30, compose_project="t", hint=lambda *a: "scripts/" + " ".join(a))
    plan = SimpleNamespace(fit=memory.MemoryFit(0.5, 119.6, True, "/proc/meminfo"),
                           target=SimpleNamespace(runtime=SM121), engine=SimpleNamespace(cli="true"))
    start = Startup(s, plan, Ui("test"), "stand-in", url)
    with pytest.raises(Stop) as stop:
        with start.watching_memory():
            start.wait_healthy()
            start.canary()
    assert stop.value.code == 5
    assert stop.value.what.startswith("unified memory ran short during the canary and the first long request: "
                                      "MemAvailable fell to 4.0 GiB of 119.6 GiB")
    assert any("GPU_MEMORY_UTILIZATION=0.46" in f for f in stop.value.fixes)  # (59.8 - 4) / 119.6 = 0.4665


def test_discrete_gpus_are_not_watched(tmp_path, monkeypatch):
    monkeypatch.setenv("BLACKWELL_STANDIN_HOST_ROOT", str(_standin_meminfo(tmp_path, 1.0)))
    plan = SimpleNamespace(fit=memory.MemoryFit(0.9, 31.8, False, "nvml"), target=SimpleNamespace(runtime=SM121))
    start = Startup(SimpleNamespace(), plan, Ui("test"), "x", "http://127.0.0.1:9")
    with start.watching_memory():
        assert start.watch is None


# --- ./start.sh on a stand-in GB10 whose pool runs short while the server loads -----------------------------


def _arm64_standin(root: Path) -> Path:
    folder = root / "arm64-standin"
    folder.mkdir()
    (folder / "sitecustomize.py").write_text(
        "# TEST DOUBLE: this amd64 test host stands in for a GB10 (arm64) host: platform.machine() says aarch64.\n"
        "import platform\nplatform.machine = lambda: 'aarch64'\n")
    return folder


def test_start_sh_stops_the_server_when_gb10s_pool_runs_short_while_it_loads(host, docker_engine,
                                                                            standin_image):  # noqa: F811
    """The acceptance test of the issue: preflight passes (110 GiB available), the server container starts and
    loads (its /health answers 503 for minutes), the stand-in meminfo then says 5 GiB available, below the 8 GiB
    reserve: start.sh stops the server within seconds and exits 5, naming the fraction to use and MAX_MODEL_LEN."""
    root = _standin_meminfo(host.root / "standin-host", 110.0, free_gib=100.0)
    digest = standin_image.split("@", 1)[1]
    stmt = statement("sm121", digest, reference=standin_image, level="baseline", capability="12.1")
    stmt["predicate"]["target"].update(platform="linux/arm64", intended_support_level="baseline")  # promoted: no probe
    host.settings(HEALTH_TIMEOUT_S=240, CONTAINER_ENV_STANDIN_STARTUP_S=600)
    host.release(stmt)
    env = {k: v for k, v in os.environ.items() if k not in SETTINGS and not k.startswith("CONTAINER_ENV_")}
    env.update(QUALIFY_PYTHON=sys.executable, STANDIN_GPUS=GB10, BLACKWELL_STANDIN_HOST_ROOT=str(root),
               PYTHONPATH=str(_arm64_standin(host.root)), PATH=f"{host.root / 'bin'}{os.pathsep}{os.environ['PATH']}")
    proc = subprocess.Popen([str(REPO / "start.sh"), "--allow-no-gpu-runtime", "--env-file", str(host.env_file)],
                            env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL)
    seen, lowered = [], {}
    timer = threading.Timer(300, proc.kill)  # a bound on the whole test, whatever happens
    timer.start()
    try:
        for line in proc.stderr:
            seen.append(line)
            if "/health not ready yet" in line and not lowered:
                _standin_meminfo(root, 5.0)  # weights loading: the pool runs short
                lowered["at"] = time.monotonic()
        proc.wait(timeout=60)
    finally:
        timer.cancel()
    err = "".join(seen)
    assert proc.returncode == 5, err[-4000:]
    stopped_after = time.monotonic() - lowered["at"]
    print(f"start.sh exited {stopped_after:.1f} s after the stand-in pool fell below the reserve")
    assert stopped_after < 20
    assert "target: sm121" in err and "THIS DEPLOY READS STAND-IN HOST FILES" in err
    assert "memory: watching MemAvailable (now 110.0 GiB) every 1 s until the canary is done; below 8 GiB" in err
    assert "MemAvailable 5.0 GiB is below the host's reserve of 8 GiB while the server loaded: stopping the server " \
        "now" in err
    assert "ERROR: unified memory ran short while the server loaded: MemAvailable fell to 5.0 GiB of 119.6 GiB" in err
    # The server had 0.5 of 119.6 GiB (sm121's fraction); 3 GiB short: (59.8 - 3) / 119.6 -> 0.47.
    assert f"fix: set GPU_MEMORY_UTILIZATION=0.47 in {host.env_file}" in err
    assert f"fix: or lower MAX_MODEL_LEN in {host.env_file} (now 8192)" in err
    running = subprocess.run([docker_engine, "ps", "-q", "--filter", f"label=com.docker.compose.project={host.project}",
                              "--filter", "status=running"], capture_output=True, text=True, timeout=60).stdout.split()
    assert running == [] and containers_of(docker_engine, host.project), "stopped, kept for its log"
    assert "canary" not in err.split("ERROR:")[0].split("stopping the server now")[1]  # it never got that far
