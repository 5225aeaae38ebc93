"""Issue 49, High: the enrolled-hosts chain is verified link by link from the version a promoter (or a promotion
record) saw to the one offered. A fork two or more versions ahead (a second admin working from an older
version, re-enrolling a removed host), a gap in the chain, and a `previous_sha256: null` above what was seen
are each refused, naming the cause; every version `qualify hosts` replaces is kept beside the file.

Real parts throughout: releases by the real release steps, hosts files written and signed by `qualify hosts`'s
own code (trust/hosts.py) with real keys, GPU evidence signed as start.sh signs it."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from evidence_helpers import Lab
from signing_helpers import make_key_pair

from qualify.signing import formats, signer
from qualify.trust import folder
from qualify.trust import hosts as chain
from qualify.trust import records as rec
from qualify.trust.highwater import RollbackError
from qualify.trust.verify import TrustedKey


@pytest.fixture()
def lab(tmp_path) -> Lab:
    return Lab(tmp_path)


def _host(pub: Path, name: str) -> rec.EnrolledHost:
    key = TrustedKey.read(pub)
    return rec.EnrolledHost(name, key_pem=key.pem.decode(), fingerprint=key.fingerprint)


def _files(src: Path, dest: Path, names) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    for name in names:
        for suffix in ("", ".sig", ".sigstore.json"):
            if (src / (name + suffix)).exists():
                shutil.copyfile(src / (name + suffix), dest / (name + suffix))


def _fork(lab: Lab, tmp_path: Path, ahead: int, keep_between: bool = True):
    """Host B enrolled (2); the promoter's copy removes it (3); a second admin, from sequence 2 with B still
    enrolled, makes 3b, 4b, ... (`ahead` versions past 2) on another machine; their hosts.json (and, merged
    with it, the versions they kept) lands in the promoter's manifests/. Returns B's private key."""
    b_key, b_pub = make_key_pair(tmp_path, prefix="host-b")
    lab.enroll(("host-b", b_pub))  # sequence 2
    other = tmp_path / "second-admin" / "manifests"
    _files(lab.manifests, other, ["hosts.json", "hosts.1.json"])
    chain.change(lab.hosts_file, lab.sign, lab.key, remove="host-b")  # sequence 3: B withdrawn (seen here)
    for n in range(ahead):
        _, pub = make_key_pair(tmp_path, prefix=f"extra-{n}")
        chain.change(other / "hosts.json", lab.sign, lab.key, add=_host(pub, f"extra-{n}"),
                     state=tmp_path / "second-admins-marks")
    assert folder.read_hosts(other / "hosts.json", lab.key).host("host-b") is not None
    kept = [f"hosts.{s}.json" for s in range(3, 2 + ahead)] if keep_between else []
    _files(other, lab.manifests, ["hosts.json", *kept])  # a merge: their newest file (and their kept versions)
    return b_key


@pytest.mark.parametrize("ahead", [3, 6])
def test_a_fork_two_or_more_versions_ahead_never_re_enrolls_a_removed_host(lab, tmp_path, ahead):
    """The red team's 5b (and 8b): accepted silently before; now its chain, walked link by link, leads through
    another sequence 3 than the one this promoter saw."""
    b_key = _fork(lab, tmp_path, ahead)
    paths = lab.write([lab.record(i) for i in range(1, 8)], key=b_key)
    with pytest.raises(RollbackError, match=r"does not descend from sequence 3 \(sha256 [0-9a-f]{12}\.\.\.\) that this "
                                            r"host saw: its chain leads through another sequence 3.*a fork of the chain"):
        lab.promote(paths)
    assert not (lab.folder / "sm120.promotion.json").exists()


def test_forks_one_and_two_ahead_stay_refused(lab, tmp_path):
    b_key = _fork(lab, tmp_path, 1)  # 3b: the same sequence, other bytes
    with pytest.raises(RollbackError, match="another file at sequence 3 than the one this host saw"):
        lab.promote(lab.write([lab.record(1)], key=b_key))
    lab2 = Lab(tmp_path / "two")
    b_key = _fork(lab2, tmp_path / "two", 2)  # 4b: its predecessor is 3b, not the 3 seen
    with pytest.raises(RollbackError, match="names a predecessor other than the sequence 3 this host saw"):
        lab2.promote(lab2.write([lab2.record(1)], key=b_key))


def test_a_gap_in_the_chain_is_refused_with_what_to_fetch(lab, tmp_path):
    """5b alone (the versions between neither kept beside it nor in git): the chain cannot be walked."""
    b_key = _fork(lab, tmp_path, 3, keep_between=False)
    with pytest.raises(RollbackError, match=r"names sequence 4 \(sha256 [0-9a-f]{12}\.\.\.\), which is not at hand") as e:
        lab.promote(lab.write([lab.record(1)], key=b_key))
    assert "fetch it" in e.value.hint and "--hosts-history DIR" in e.value.hint


def test_hosts_history_supplies_the_versions_between(lab, tmp_path):
    """An honest change two versions ahead, made elsewhere, with the version between in --hosts-history DIR."""
    _, pub = make_key_pair(tmp_path, prefix="c")
    other = tmp_path / "elsewhere" / "manifests"
    _files(lab.manifests, other, ["hosts.json"])
    chain.change(other / "hosts.json", lab.sign, lab.key, add=_host(pub, "c"), state=tmp_path / "m2")  # 2
    chain.change(other / "hosts.json", lab.sign, lab.key, remove="c", state=tmp_path / "m2")  # 3
    _files(other, lab.manifests, ["hosts.json"])
    history = tmp_path / "history"
    _files(other, history, ["hosts.2.json"])
    with pytest.raises(RollbackError, match="which is not at hand"):
        lab.run([lab.record(1)])
    from qualify.release import promote

    (done,) = promote.promote(lab.folder, "v1.0.0", lab.write([lab.record(2)]), lab.sign, lab.key, lab.hosts_file,
                              now=lab.now, hosts_history=history)
    assert done.written


def test_a_new_chain_above_what_was_seen_is_refused(lab, tmp_path):
    """`previous_sha256: null` skipped the check: a version naming no predecessor, signed with the release key."""
    b_key, b_pub = make_key_pair(tmp_path, prefix="host-b")
    lab.enroll(("host-b", b_pub))
    chain.change(lab.hosts_file, lab.sign, lab.key, remove="host-b")  # 3, seen
    kept = lab.hosts.hosts
    for sequence in (4, 6):
        restarted = rec.EnrolledHosts(sequence, (*kept, _host(b_pub, "host-b")), previous_sha256=None)
        lab.hosts_file.write_bytes(restarted.to_bytes())
        signer.write_signature(lab.sign, lab.hosts_file, formats.signature_path(lab.hosts_file),
                               formats.bundle_path(lab.hosts_file))
        with pytest.raises(RollbackError, match=f"sequence {sequence} names no predecessor"):
            lab.promote(lab.write([lab.record(sequence)], key=b_key))


def test_a_fresh_promoter_holds_the_hosts_file_to_the_version_the_promotion_record_saw(lab, tmp_path, monkeypatch):
    """No marks of its own: the current promotion record's hosts version is what the fork must descend from."""
    b_key, b_pub = make_key_pair(tmp_path, prefix="host-b")
    lab.enroll(("host-b", b_pub))
    other = tmp_path / "second-admin" / "manifests"
    _files(lab.manifests, other, ["hosts.json", "hosts.1.json"])
    chain.change(lab.hosts_file, lab.sign, lab.key, remove="host-b")  # 3
    lab.run([lab.record(1)])  # promotion 1, checked against sequence 3
    for n in range(3):
        _, pub = make_key_pair(tmp_path, prefix=f"extra-{n}")
        chain.change(other / "hosts.json", lab.sign, lab.key, add=_host(pub, f"extra-{n}"), state=tmp_path / "m2")
    _files(other, lab.manifests, ["hosts.json", "hosts.3.json", "hosts.4.json"])
    monkeypatch.setenv("QUALIFY_TRUST_DIR", str(tmp_path / "a-fresh-promoter"))
    with pytest.raises(RollbackError, match=r"does not descend from sequence 3 .*which promotion 1 of sm120 saw"):
        lab.promote(lab.write([lab.record(i) for i in range(2, 9)], key=b_key))


def test_every_replaced_version_is_kept_beside_the_file_with_its_signature(lab, tmp_path):
    _, pub = make_key_pair(tmp_path, prefix="c")
    first = lab.hosts_file.read_bytes()
    lab.enroll(("c", pub))
    kept = lab.manifests / "hosts.1.json"
    assert kept.read_bytes() == first and formats.signature_path(kept).is_file()
    versions = folder.hosts_versions(lab.hosts_file)
    assert any(v.data == first for v in versions)
