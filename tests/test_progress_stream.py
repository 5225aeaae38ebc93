"""The probe's progress reaches the user while the container runs, not all at once at the end."""

from __future__ import annotations

import time

import pytest

from qualify.build.engine import Engine

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
