"""Issue 48: a killed `qualify hosts add` or `hosts remove` converges on the same command, at every kill point
(kill -9 through QUALIFY_KILL_AT, and Ctrl-C), saying what it recovered; promote works after the re-run.

The journal's finish renames signatures first, then hosts.json (journal._order): `signed-write:renamed-one#N`
is the state after the N-th of its three renames, `signed-write:staged` the state before it is marked
COMPLETE. Before the fix every re-run exited 9, "hosts.json does not match its signature", because the check
read the new hosts.json against a signature the first rename had already moved out of the journal."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from conftest import REPO
from evidence_helpers import TAG, Lab, sign_with
from signing_helpers import PASSWORD, make_key_pair

from qualify.signing import formats
from qualify.trust import folder, journal

POINTS = ["signed-write:staged", "signed-write:renamed-one#1", "signed-write:renamed-one#2",
          "signed-write:renamed-one#3"]


def cli(*args: str, **env: str) -> subprocess.CompletedProcess:
    full = {**os.environ, "PYTHONPATH": str(REPO), "COSIGN_PASSWORD": PASSWORD, **env}
    return subprocess.run([sys.executable, "-m", "qualify", *args], capture_output=True, text=True, env=full,
                          timeout=120, stdin=subprocess.DEVNULL)


@pytest.fixture
def lab(tmp_path) -> Lab:
    return Lab(tmp_path)  # one release, lab-5090 enrolled (sequence 1)


def _argv(lab: Lab, action: str, pub) -> tuple:
    who = ("add", "lab-b", "--key", str(pub)) if action == "add" else ("remove", "lab-b")
    return ("hosts", *who, "--release-key", str(lab.release_key), "--file", str(lab.hosts_file))


@pytest.mark.parametrize("signal_name", ["KILL", "INT"])
@pytest.mark.parametrize("point", POINTS)
@pytest.mark.parametrize("action", ["add", "remove"])
def test_a_killed_hosts_change_converges_on_the_same_command_and_promote_works_after(lab, tmp_path, action, point,
                                                                                     signal_name):
    (tmp_path / "b").mkdir()
    _, pub = make_key_pair(tmp_path / "b", prefix="lab-b")
    if action == "remove":
        assert cli(*_argv(lab, "add", pub)).returncode == 0  # sequence 2: lab-b enrolled, then removed
    before = lab.hosts.sequence
    env = {"QUALIFY_KILL_AT": point} | ({"QUALIFY_KILL_WITH": "INT"} if signal_name == "INT" else {})
    killed = cli(*_argv(lab, action, pub), **env)
    assert killed.returncode != 0, killed.stdout  # -9, or Ctrl-C's exit
    if signal_name == "KILL":
        assert killed.returncode == -9, killed.stderr
    again = cli(*_argv(lab, action, pub))
    assert again.returncode == 0, again.stderr + again.stdout
    said = again.stdout
    if point == "signed-write:staged":  # never marked complete: it did not take effect and is removed
        assert signal_name == "INT" or "removed an interrupted write that had not completed" in said, said
        assert f"sequence {before + 1}" in said  # and the change is made now
    else:
        assert journal.FINISHED in said, said
        assert "nothing changed" in said  # the finished write was this very change
    hosts = lab.hosts
    assert hosts.sequence == before + 1
    assert ("lab-b" in [h.name for h in hosts.hosts]) == (action == "add")
    assert not list(lab.manifests.glob(journal.JOURNAL_PREFIX + "*"))
    # A third run changes nothing and says so; promote reads the chain and counts lab-5090's runs.
    third = cli(*_argv(lab, action, pub))
    if action == "add":
        assert third.returncode == 0 and "already enrolled" in third.stdout, third.stderr
    else:
        assert third.returncode != 0 and "lab-b is not enrolled" in third.stderr, third.stderr
    paths = lab.write([lab.record(i) for i in range(1, 8)])
    promoted = cli("promote", TAG, "--manifests", str(lab.manifests), "--key", str(lab.release_key),
                   "--evidence", *map(str, paths))
    assert promoted.returncode == 0, promoted.stderr
    assert folder.read_release(lab.folder).target("sm120").current.level == "baseline"


def test_a_planted_complete_journal_that_does_not_verify_is_left_and_said(lab, tmp_path):
    """The recovery finishes only what verifies: a journal whose hosts.json another key signed is left."""
    from qualify.trust import hosts as chain
    from qualify.trust import records as rec
    from qualify.trust.verify import TrustedKey

    (tmp_path / "evil").mkdir()
    other_key, _ = make_key_pair(tmp_path / "evil", prefix="evil")
    forged = rec.EnrolledHosts(lab.hosts.sequence + 1, (), previous_sha256=None)
    planted = lab.manifests / (journal.JOURNAL_PREFIX + "planted")
    planted.mkdir()
    sign, _ = sign_with(other_key)
    done = sign.sign_blob(forged.to_bytes())
    (planted / rec.HOSTS_FILE).write_bytes(forged.to_bytes())
    (planted / (rec.HOSTS_FILE + formats.SIGNATURE_SUFFIX)).write_bytes(done.sig_file)
    (planted / (rec.HOSTS_FILE + formats.BUNDLE_SUFFIX)).write_bytes(done.bundle)
    (planted / journal.COMPLETE).write_bytes(b"")
    notes = chain.recover(lab.hosts_file, TrustedKey.read(lab.release_pub))
    assert len(notes) == 1 and notes[0].startswith(f"LEFT {planted}"), notes
    assert lab.hosts.sequence == 1 and planted.is_dir()
