"""Reproducers from the independent review (issue 15, items 9 and 10): key pairs are whole or absent under
concurrency, and temp files of killed atomic writes do not pile up."""

from __future__ import annotations

import os
import subprocess
import sys

from conftest import REPO

from qualify.core import fsutil
from qualify.signing import keys as cosign_keys

PASSWORD = "correct horse"


def _generate(prefix, force=False):
    argv = [sys.executable, "-m", "qualify", "sign", "generate-key", "--output-key-prefix", str(prefix)]
    return subprocess.Popen(argv + (["--force"] if force else []), cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "COSIGN_PASSWORD": PASSWORD})


def _pair_matches(prefix) -> bool:
    private = cosign_keys.load_private_key((prefix.parent / f"{prefix.name}.key").read_bytes(), PASSWORD.encode())
    public = cosign_keys.load_public_key((prefix.parent / f"{prefix.name}.pub").read_bytes())
    return cosign_keys.fingerprint(private.public_key()) == cosign_keys.fingerprint(public)


def test_two_concurrent_generate_key_runs_leave_one_whole_pair(tmp_path):
    for trial in range(6):
        prefix = tmp_path / f"trial{trial}" / "release"
        prefix.parent.mkdir()
        runs = [_generate(prefix) for _ in range(2)]
        results = [(p.wait(timeout=120), p.stderr.read()) for p in runs]
        codes = sorted(code for code, _ in results)
        assert codes[0] == 0 and codes[1] != 0, results  # exactly one run wrote the pair
        assert any("already exist" in err for code, err in results if code != 0), results
        assert _pair_matches(prefix), f"trial {trial}: .key and .pub are of different pairs"
        assert sorted(p.name for p in prefix.parent.iterdir()) == ["release.key", "release.pub"]


def test_forced_generate_key_replaces_both_files_with_one_pair(tmp_path):
    prefix = tmp_path / "release"
    assert _generate(prefix).wait(timeout=120) == 0
    old = (tmp_path / "release.pub").read_bytes()
    assert _generate(prefix, force=True).wait(timeout=120) == 0
    assert (tmp_path / "release.pub").read_bytes() != old and _pair_matches(prefix)
    assert oct((tmp_path / "release.key").stat().st_mode & 0o777) == "0o600"


def test_a_killed_atomic_write_leaves_a_temp_file_that_the_next_write_removes(tmp_path):
    target = tmp_path / "manifest.json"
    # A writer killed between writing its temp file and the rename (SIGKILL: no clean-up runs).
    code = ("import os, signal, sys; from qualify.core import fsutil; "
            "os.replace = lambda *a: os.kill(os.getpid(), signal.SIGKILL); "
            f"fsutil.write_atomic({str(target)!r}, b'x' * 100000)")
    killed = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, timeout=60)
    assert killed.returncode == -9
    left = [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    assert len(left) == 1 and not target.exists()
    # A live writer's temp file (this process) must survive another writer's clean-up.
    live = tmp_path / f".manifest.json.{os.getpid()}.inflight.tmp"
    live.write_bytes(b"being written")
    fsutil.write_atomic(target, b"whole")
    assert target.read_bytes() == b"whole"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["manifest.json", live.name])
