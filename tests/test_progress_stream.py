"""The probe's progress reaches the user while the container runs, not all at once at the end."""

from __future__ import annotations

import time

import pytest

from qualify.host.engine import Engine

pytestmark = pytest.mark.engine


def test_container_stderr_lines_stream_live(docker_engine, debian_python_image):
    seen = []
    script = "echo '[probe] first' >&2; sleep 4; echo '[probe] second' >&2; echo result"
    start = time.monotonic()
    proc = Engine("docker").run_container(debian_python_image, ["sh", "-c", script], timeout=120,
                                          on_stderr_line=lambda line: seen.append((time.monotonic(), line)))
    end = time.monotonic()
    assert proc.returncode == 0 and proc.stdout.strip() == "result"
    assert [line for _, line in seen] == ["[probe] first", "[probe] second"]
    assert proc.stderr.splitlines() == ["[probe] first", "[probe] second"]
    first_at = seen[0][0]
    assert end - first_at >= 3.0, f"the first line arrived {end - first_at:.1f} s before the end: not streamed"
    assert first_at - start < end - start


def test_streaming_run_still_times_out(docker_engine, debian_python_image):
    from qualify.core.errors import EngineError

    with pytest.raises(EngineError, match="did not finish within 3 s"):
        Engine("docker").run_container(debian_python_image, ["sleep", "60"], timeout=3, name="qualify-test-stream-timeout",
                                       on_stderr_line=lambda line: None)


def test_a_push_that_prints_nothing_for_a_while_still_says_it_goes_on(capfd):
    """Issue 30, item 14: a 12 GB layer is one line at its start and one at its end, minutes apart."""
    from qualify.host.progress import PushProgress

    progress = PushProgress("127.0.0.1:5555/blackwell/sm120:vllm-hermetic", 12 << 30, every_s=0.2)
    progress.line("abc123: Pushing")
    time.sleep(0.7)
    progress.done()
    err = capfd.readouterr().err
    assert err.count("still pushing: 0/1 layers done (0 already in the registry)") >= 2, err
    assert "done in" in err


def test_push_progress_says_bytes_rate_and_time_left_from_the_engine_api_stream(capfd, monkeypatch):
    """Issue 33: the Engine API's push stream carries bytes per layer; the lines say them."""
    from qualify.host import progress as mod

    clock = [100.0]
    monkeypatch.setattr(mod.time, "monotonic", lambda: clock[0])
    progress = mod.PushProgress("reg/x:y", 0, every_s=10, heartbeat=False)
    progress.event("aaaaaaaaaaaa", "Preparing")
    progress.event("bbbbbbbbbbbb", "Mounted from blackwell/sm120")
    progress.event("aaaaaaaaaaaa", "Pushing", 0, 4_000_000_000)
    clock[0] = 120.0
    progress.event("aaaaaaaaaaaa", "Pushing", 1_000_000_000, 4_000_000_000)  # 1 GB in 20 s: 50 MB/s
    err = capfd.readouterr().err.splitlines()[-1]
    assert "1/2 layers done (1 already in the registry)" in err
    assert "1.00 of 4.00 GB sent; 50 MB/s, 1 min 0 s left; pushing aaaaaaaaaaaa 1.00/4.00 GB" in err, err
    clock[0] = 180.0
    progress.event("aaaaaaaaaaaa", "Pushed")
    progress.done()
    assert "2/2 layers done" in capfd.readouterr().err


def test_a_real_push_reports_the_bytes_it_sends(docker_engine, loopback_registry, debian_python_image, tmp_path, capfd):
    """Through the real engine and registry: a fresh 64 MB layer, pushed; the lines carry its bytes."""
    import os
    import subprocess
    import uuid

    ctx = tmp_path / "ctx"
    ctx.mkdir()
    (ctx / "blob").write_bytes(os.urandom(64 << 20))  # incompressible: the push takes a few seconds
    (ctx / "Dockerfile").write_text(f"FROM {debian_python_image}\nCOPY blob /blob\n")
    ref = f"{loopback_registry.address}/qualify-test/push-bytes:{uuid.uuid4().hex[:8]}"
    subprocess.run([docker_engine, "build", "-q", "-t", ref, str(ctx)], check=True, capture_output=True,
                   env={"DOCKER_BUILDKIT": "1", "PATH": "/usr/bin:/bin"}, timeout=300)
    from qualify.host import skopeo

    engine = Engine("docker")
    digest = ""
    try:
        digest = engine.push(ref)
        err = capfd.readouterr().err
        assert digest.startswith("sha256:")
        assert "GB sent" in err and "MB/s" in err, err
    finally:
        subprocess.run([docker_engine, "image", "rm", ref], capture_output=True)
        if digest:  # what this test pushed, and nothing else
            skopeo.delete(f"docker://{ref.rsplit(':', 1)[0]}@{digest}", (loopback_registry.address,))


def test_skopeo_copy_lines_say_bytes_rate_and_time_left(monkeypatch):
    """Issue 33: a publish (skopeo copy) says how far it is, also while skopeo draws nothing."""
    from qualify.host import skopeo

    clock = [50.0]
    monkeypatch.setattr(skopeo.time, "monotonic", lambda: clock[0])
    said = []
    meter = skopeo._Meter("sm120", said.append, every_s=5)
    meter.done["aaaa"], meter.total["aaaa"] = 100e6, 400e6
    clock[0] = 60.0  # 100 MB in 10 s
    meter.report()
    assert "10 MB/s, 30 s left" in said[-1] and "10 s" in said[-1], said
