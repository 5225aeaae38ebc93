"""Issue 41, the deploy's messages: Ctrl-C while ./start.sh waits for /health, the port right after
scripts/stop.sh (TIME-WAIT), a full DEPLOY_DIR. Real start.sh, real compose, the stand-in server (a TEST
DOUBLE for vLLM: this host has no GPU), real sockets, a real full tmpfs."""

from __future__ import annotations

import errno
import os
import signal
import socket
import subprocess
import sys
import time

import pytest
from conftest import REPO, require
from deploy_host import RTX5090, SETTINGS, containers_of, released
from test_start_sh import standin_image, standin_release  # noqa: F401 (standin_image: a fixture)

from qualify.deploy import netcheck

pytestmark = pytest.mark.engine


def _start(host, *args: str) -> subprocess.Popen:
    """./start.sh as host.run starts it, in a session of its own (the terminal's process group Ctrl-C goes to)."""
    env = {k: v for k, v in os.environ.items() if k not in SETTINGS and not k.startswith("CONTAINER_ENV_")}
    env.update(QUALIFY_PYTHON=sys.executable, STANDIN_GPUS=RTX5090,
               PATH=f"{host.root / 'bin'}{os.pathsep}{os.environ['PATH']}")
    return subprocess.Popen([str(REPO / "start.sh"), *args, "--env-file", str(host.env_file)], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                            start_new_session=True)


def test_ctrl_c_while_waiting_for_health_says_the_container_runs_and_how_to_stop_or_resume(host, docker_engine,
                                                                                         standin_image):  # noqa: F811
    standin_release(host, standin_image, HEALTH_TIMEOUT_S=300, CONTAINER_ENV_STANDIN_NEVER_HEALTHY=1)
    proc = _start(host, "--allow-no-gpu-runtime")
    seen = []
    for line in proc.stderr:
        seen.append(line)
        if "/health not ready yet" in line:
            os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in the terminal does
            break
    _, rest = proc.communicate(timeout=120)
    err = "".join(seen) + rest
    assert proc.returncode == 130, err[-3000:]
    assert "interrupted while waiting for" in err and "is still running and starting" in err
    assert f"scripts/stop.sh --env-file {host.env_file} stops it" in err
    assert f"scripts/status.sh --env-file {host.env_file} says when it is healthy" in err and "./start.sh again" in err
    running = subprocess.run([docker_engine, "ps", "-q", "--filter", f"label=com.docker.compose.project={host.project}",
                              "--filter", "status=running"], capture_output=True, text=True, timeout=60).stdout.split()
    assert running, "the container should still be running after Ctrl-C"
    stop = host.run("scripts/stop.sh", timeout=120)
    assert stop.returncode == 0 and containers_of(docker_engine, host.project) == [], stop.stderr


def _time_wait_on(port: int) -> None:
    """A real server on `port` (as uvicorn binds: SO_REUSEADDR) that served one connection and closed first:
    its side of that connection is in TIME-WAIT for a minute, and the listener is gone."""
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("127.0.0.1", port))
    server.listen()
    client = socket.create_connection(("127.0.0.1", port))
    conn, _ = server.accept()
    conn.close()  # the server closes first: TIME-WAIT is on the server's port
    time.sleep(0.2)
    client.close()
    server.close()


def _time_waits(port: int) -> list:
    out = subprocess.run(["ss", "-Htan", "state", "time-wait", f"sport = :{port}"], capture_output=True, text=True)
    return out.stdout.splitlines()


def test_the_port_check_is_not_fooled_by_time_wait_after_a_stop(host, docker_engine):
    """`./start.sh` right after `scripts/stop.sh` refused 'port ... already in use' for about 60 s while only
    TIME-WAIT sockets were left (the preflight bound without SO_REUSEADDR)."""
    require(subprocess.run(["ss", "-V"], capture_output=True).returncode == 0, "ss (iproute2)")
    released(host)
    _time_wait_on(host.port)
    assert _time_waits(host.port), "no TIME-WAIT socket: the case is not reproduced"
    with socket.socket() as plain, pytest.raises(OSError) as busy:
        plain.bind(("127.0.0.1", host.port))  # what the preflight did: refused while TIME-WAIT lasts
    assert busy.value.errno == errno.EADDRINUSE
    assert netcheck.port_problem("127.0.0.1", host.port) is None
    done = host.run("start.sh", "--dry-run", "--allow-no-gpu-runtime")
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"port: 127.0.0.1:{host.port} is free" in done.stderr
    with socket.socket() as listener:  # a listener still is "in use"
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", host.port))
        listener.listen()
        assert "already in use" in netcheck.port_problem("127.0.0.1", host.port)


def test_a_full_deploy_dir_is_exit_12_naming_the_file_with_a_deploy_hosts_fixes(host, docker_engine,
                                                                               standin_image):  # noqa: F811
    """Disk full in DEPLOY_DIR was exit 12 'No space left on device' with no path and a build host's hint
    (`nox -s clean`); 12 was not among start.sh's exit codes. A real tmpfs, filled."""
    deploy = host.root / "full-deploy"
    deploy.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(deploy)], capture_output=True)
    require(mounted.returncode == 0, f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        with open(deploy / "filler", "wb", buffering=0) as fh:
            try:
                while True:
                    fh.write(b"\0" * 4096)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC
        standin_release(host, standin_image, DEPLOY_DIR=deploy)
        done = host.run("start.sh", "--allow-no-gpu-runtime", timeout=120)
        assert done.returncode == 12, done.stderr[-3000:]
        assert f"ERROR: No space left on device: {deploy / 'accepted-releases.json'}" in done.stderr
        assert f"df -h {deploy}" in done.stderr and "docker system df" in done.stderr
        assert "nox -s clean" not in done.stderr and "Traceback" not in done.stderr
        assert containers_of(docker_engine, host.project) == []  # stopped before anything was pulled or started
        assert "12 the host refused" in host.run("start.sh", "--help").stdout
    finally:
        subprocess.run(["umount", "--lazy", str(deploy)], capture_output=True)
