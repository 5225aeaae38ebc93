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
    assert err.count("still pushing: 0/1 layers done (0 already in the registry), 1 pushing") >= 2, err
    assert "done in" in err
