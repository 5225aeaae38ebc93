"""Issue 30, item 1: every `python -m qualify <command>` the README shows works as written, in a clean clone,
with the interpreter a newcomer has (the base Python, without the toolkit's dependencies), once the README's
set-up has made the toolkit's `.venv`; and before it, the same command says what to run, never a traceback."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import clone_checkout

REPO = Path(__file__).resolve().parent.parent
COMMAND = re.compile(r"(?:^|[\s`(])python3? -m qualify ([a-z][a-z-]*)")


def readme_commands() -> list:
    found = sorted(set(COMMAND.findall((REPO / "README.md").read_text())))
    assert len(found) >= 10, found  # the README shows many; a parse that finds few is broken
    return found


def newcomer_python() -> str:
    """The interpreter behind this test's venv: what `python3` is on a machine before any venv."""
    base = Path(sys.base_prefix) / "bin" / "python3"
    return str(base if base.exists() else "/usr/bin/python3")


def newcomer_env() -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")}
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep)
                                  if ".nox" not in p and ".venv" not in p)
    return env


@pytest.fixture(scope="module")
def clone(tmp_path_factory) -> Path:
    where = tmp_path_factory.mktemp("clean-clone") / "repo"
    return clone_checkout(REPO, where)


def run(clone: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([newcomer_python(), "-m", "qualify", *args], cwd=clone, env=newcomer_env(),
                          capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)


def test_before_the_set_up_a_command_says_what_to_run_never_a_traceback(clone):
    probe = subprocess.run([newcomer_python(), "-c", "import nacl"], capture_output=True, env=newcomer_env())
    if probe.returncode == 0:
        pytest.skip("this machine's base Python has the toolkit's dependencies: nothing to show")
    done = run(clone, "sign", "--help")
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert "run `bash scripts/setup-host.sh` once" in done.stderr and "needs the toolkit's dependencies" in done.stderr


def test_after_the_set_up_every_readme_command_answers_help(clone):
    """The set-up's own step for the toolkit (scripts/setup-host.sh: toolenv.ensure) makes the clone's .venv;
    then each command the README shows answers --help from the newcomer's python3."""
    made = subprocess.run([newcomer_python(), "-c", "from qualify import toolenv; print(toolenv.ensure())"],
                          cwd=clone, env=newcomer_env(), capture_output=True, text=True, timeout=900)
    assert made.returncode == 0, made.stderr[-3000:]
    assert made.stdout.strip() == str(clone / ".venv" / "bin" / "python")
    failed = {}
    for command in readme_commands():
        done = run(clone, command, "--help")
        if done.returncode != 0 or "Traceback" in done.stderr or "usage:" not in done.stdout:
            failed[command] = (done.returncode, done.stderr[-500:])
    assert not failed, failed
