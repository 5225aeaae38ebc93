"""Issue 30, item 1: every `python -m qualify <command>` the README and the guides under docs/ show (issue 52 moved
most of the README there: tests/docpages.py) works as written, in a clean clone,
with the interpreter a newcomer has (the base Python, without the toolkit's dependencies), once the README's
set-up has made the toolkit's `.venv`; and before it, the same command says what to run, never a traceback."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import docpages
import pytest
from conftest import clone_checkout

REPO = Path(__file__).resolve().parent.parent
COMMAND = re.compile(r"(?:^|[\s`(])python3? -m qualify ([a-z][a-z-]*)")


def readme_commands() -> list:
    found = sorted(set(COMMAND.findall(docpages.user_text())))
    assert len(found) >= 10, found  # the guides show many; a parse that finds few is broken
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


# --- the README's globs, run by a shell as written (issue 41) ------------------------------------------


def readme_line(needle: str) -> str:
    """The command line holding `needle` that users read (README first, then the guides), without its trailing
    comment."""
    lines = [ln for ln in docpages.user_lines(needle) if "-m qualify" in ln]
    assert lines, f"neither the README nor a guide shows a command with {needle!r} any more"
    return lines[0].split("   #", 1)[0].strip()


def shell(command: str, cwd: Path, **env: str) -> subprocess.CompletedProcess:
    """`command` through bash in `cwd` (the shell expands the globs), `python` being the toolkit's."""
    bin_dir = cwd / ".bin"
    bin_dir.mkdir(exist_ok=True)
    if not (bin_dir / "python").exists():
        # A script, not a symlink: a venv's python is found to be one by the path it runs under (pyvenv.cfg
        # beside it); a symlink elsewhere runs the base interpreter, without the toolkit's dependencies, and
        # only a checkout's .venv to hand over to hid that (issue 48: the suite from an activated venv).
        (bin_dir / "python").write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
        (bin_dir / "python").chmod(0o755)
    full = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "PYTHONPATH": str(REPO), **env}
    return subprocess.run(["bash", "-c", command], cwd=cwd, env=full, capture_output=True, text=True, timeout=300,
                          stdin=subprocess.DEVNULL)


def test_the_readme_promote_glob_skips_the_bundles_beside_the_evidence(tmp_path):
    """`--evidence sm120.gpu-evidence.*.json` also matches each record's `.json.sigstore.json` (exit 2 before).
    Evidence written and signed as start.sh writes and signs it (release/evidence.py), in the folder the
    command runs in; the release is elsewhere in this test, so `--manifests` names it."""
    from evidence_helpers import TAG, Lab
    from signing_helpers import PASSWORD

    lab = Lab(tmp_path / "lab")
    here = tmp_path / "handed-in"
    records = lab.write([lab.record(i) for i in range(1, 8)], where=here)
    shutil.copy(lab.release_key, here / "cosign.key")
    command = readme_line("--evidence sm120.gpu-evidence.*.json").replace("COSIGN_PASSWORD=... ", "")
    assert command.startswith(f"python -m qualify promote {TAG} --key cosign.key --evidence "), command
    done = shell(f"{command} --manifests {lab.manifests}", here, COSIGN_PASSWORD=PASSWORD)
    assert done.returncode == 0, done.stderr
    assert f"skipped {len(records)} signature or bundle file(s)" in done.stderr and ".json.sigstore.json" in done.stderr
    # a smoke image serves nothing: the line's serve-check pattern matches no file and bash passes it on as
    # written (exit 2 before: "evidence file not found: sm120.serve-check.*.json")
    assert "1 pattern(s) matched no file" in done.stderr and "sm120.serve-check.*.json" in done.stderr
    assert "sm120: baseline (7 of 7 consecutive passes; 7 records, 7 new)" in done.stdout


def test_the_readme_promote_line_counts_the_serve_check_records_with_their_gpu_runs(tmp_path):
    """A vLLM image's runs: GPU evidence and the serve-check record of the same deployment, both globs matching,
    each record's bundle skipped; the run counts only because its serve-check record came with it."""
    from signing_helpers import PASSWORD
    from test_serve_promote import hand_in, link, served, vllm_lab

    lab = vllm_lab(tmp_path / "lab")
    here = lab.root / "handed-in"  # where hand_in writes the serve-check records
    gpu = [lab.record(i) for i in (10, 20)]
    lab.write(gpu, where=here)
    hand_in(lab, [served(lab, 12, target="sm120", gpu_evidence=link(gpu[0]))])
    shutil.copy(lab.release_key, here / "cosign.key")
    command = readme_line("--evidence sm120.gpu-evidence.*.json").replace("COSIGN_PASSWORD=... ", "")
    done = shell(f"{command} --manifests {lab.manifests}", here, COSIGN_PASSWORD=PASSWORD)
    assert done.returncode == 0, done.stderr
    assert "matched no file" not in done.stderr and "skipped 3 signature or bundle file(s)" in done.stderr
    line = "sm120: experimental (1 of 7 consecutive passes; 2 records, 3 new, 1 of them serve-check records)"
    assert line in done.stdout, done.stdout


@pytest.mark.parametrize("given, words", [
    (["sm120.gpu-evidence.*.json"], "--evidence: no evidence file given (every pattern matched nothing)"),
    (["sm120.gpu-evidence.missing.json"], "not found"),
])
def test_promote_refuses_when_nothing_is_left_or_a_named_file_is_missing(tmp_path, given, words):
    """A pattern that matched nothing is skipped with a note; a file named outright and missing stays an error."""
    from evidence_helpers import TAG, Lab
    from signing_helpers import PASSWORD

    lab = Lab(tmp_path / "lab")
    here = tmp_path / "empty"
    here.mkdir()
    shutil.copy(lab.release_key, here / "cosign.key")
    done = shell(f"python -m qualify promote {TAG} --key cosign.key --manifests {lab.manifests} --evidence "
                 + " ".join(given), here, COSIGN_PASSWORD=PASSWORD)
    assert done.returncode == 2 and words in done.stderr, done.stderr


def test_the_readme_compare_glob_skips_bundles_and_still_needs_two_manifests(tmp_path):
    """`compare ... build/external/sm120-*.json` also matches the `.json.sigstore.json` that `sign` writes
    beside each manifest (exit 9 before). Manifests made by the tests' manifest helper, signed by the real
    `qualify sign`; the command runs as the README writes it."""
    from signing_helpers import DIGEST_A, DIGEST_B, DIGEST_C, PASSWORD, make_key_pair, write_manifest

    key, _ = make_key_pair(tmp_path)
    write_manifest(tmp_path / "build" / "qualified" / "sm120-smoke-hermetic.json", "sm120", DIGEST_A)
    for digest in (DIGEST_B, DIGEST_C):
        path = write_manifest(tmp_path / "build" / "external" / f"sm120-{digest[7:19]}.json", "sm120", digest)
        signed = shell(f"python -m qualify sign {path} --key {key}", tmp_path, COSIGN_PASSWORD=PASSWORD)
        assert signed.returncode == 0, signed.stderr
    command = readme_line("compare build/qualified/sm120-smoke-hermetic.json build/external/sm120-*.json --markdown")
    done = shell(command, tmp_path)
    assert done.returncode == 0, done.stderr  # these three agree on their verdicts
    assert "compare: skipped 2 signature or bundle file(s)" in done.stderr and done.stdout.count("`sm120@") == 3
    for left in (tmp_path / "build" / "external").glob(f"sm120-{DIGEST_C[7:19]}.json*"):
        left.unlink()
    # One manifest and its bundle: after the skip, one manifest is not a comparison.
    fewer = shell(command.replace("build/qualified/sm120-smoke-hermetic.json ", ""), tmp_path)
    assert fewer.returncode == 2 and "skipped 1 signature" in fewer.stderr, fewer.stderr
    assert "compare needs at least two manifests" in fewer.stderr


def test_a_host_key_made_as_the_readme_says_gets_no_release_key_advice(tmp_path):
    """`sign generate-key --output-key-prefix host` printed 'commit the public key' and RELEASE_KEY_FINGERPRINT."""
    command = re.search(r"python -m qualify sign generate-key --output-key-prefix host", README_TEXT).group(0)
    host = shell(command, tmp_path, COSIGN_PASSWORD="x")
    assert host.returncode == 0, host.stderr
    assert "RELEASE_KEY_FINGERPRINT" not in host.stdout and "git add" not in host.stdout
    assert f"EVIDENCE_SIGNING_KEY={tmp_path / 'host.key'}" in host.stdout and "hosts add NAME --key host.pub" in host.stdout
    release = shell("python -m qualify sign generate-key", tmp_path, COSIGN_PASSWORD="x")
    assert release.returncode == 0 and "RELEASE_KEY_FINGERPRINT=" in release.stdout, release.stderr


README_TEXT = docpages.user_text()  # the README and the guides
