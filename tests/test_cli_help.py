"""--help shows defaults; a mistyped nox session gets "did you mean"."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def qualify(*args):
    return subprocess.run([sys.executable, "-m", "qualify", *args], capture_output=True, text=True, cwd=REPO,
                          timeout=60)


def test_build_help_shows_the_defaults():
    out = qualify("build", "--help")
    assert out.returncode == 0
    text = " ".join(out.stdout.split())
    for default in ("(default: pinned)", "(default: vllm)", "about 12 GB", "(default: docker)"):
        assert default in text, default


def test_release_help_shows_the_defaults_and_what_force_does():
    text = " ".join(qualify("release", "--help").stdout.split())
    for words in ("(default: unverified)", "(default: cosign.key)", "(default: origin)",
                  "files no release wrote are never touched", "--allow-partial", "--dry-run"):
        assert words in text, words


def test_a_mistyped_nox_session_gets_did_you_mean():
    nox = shutil.which("nox")
    argv = [nox] if nox else [sys.executable, "-m", "nox"]
    out = subprocess.run([*argv, "-s", "biuld-sm120"], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert out.returncode != 0
    assert "no session named 'biuld-sm120'; did you mean 'build-sm120'?" in out.stderr
    ok = subprocess.run([*argv, "-l"], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert ok.returncode == 0 and "did you mean" not in ok.stderr
