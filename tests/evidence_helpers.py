"""Helpers for the promotion tests (not a test module): a release made by the real release steps, a GPU host
enrolled with its own key (manifests/hosts.json signed with the release key, as `qualify hosts add` writes
it), and evidence records made and signed as start.sh makes and signs them (release/evidence.py)."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Optional, Sequence

from signing_helpers import DIGEST_A, PASSWORD, make_key_pair, make_release, statement

from qualify.config import targets
from qualify.core import manifest as mf
from qualify.probe.gpu import REQUIRED_GPU_CHECKS
from qualify.release import evidence as ev
from qualify.release import promote
from qualify.signing import keys as cosign_keys
from qualify.signing import signer
from qualify.trust import folder
from qualify.trust import hosts as hosts_chain
from qualify.trust import records as rec
from qualify.trust.verify import CurrentLevel, KeyAnchor, TrustedKey

TF = targets.load()
PROBE = "sha256:" + "c" * 64
TAG = "v1.0.0"


def gpu_check(cid: str, status: str, required: bool = True) -> dict:
    return {"id": cid, "title": cid, "status": status, "required": required, "reason": f"{cid} {status}",
            "evidence": {}}


def gpu_checks(outcome: ev.Outcome) -> tuple:
    """The GPU checks a run with this outcome has (the outcome is recomputed from them)."""
    status = {ev.Outcome.PASS: "pass", ev.Outcome.INFRASTRUCTURE: "not-run"}.get(outcome, "pass")
    checks = [gpu_check(cid, status) for cid in REQUIRED_GPU_CHECKS]
    if outcome is ev.Outcome.PRODUCT_FAILURE:
        checks[2] = gpu_check(REQUIRED_GPU_CHECKS[2], "fail")
    return tuple(checks)


def sign_with(key_file: Path, password: str = PASSWORD):
    """(Signer, TrustedKey) for a key file, with the test password (no terminal, no environment)."""
    s = signer.key_signer("builtin", key_file, password.encode())
    return s, TrustedKey.from_bytes(cosign_keys.public_key_pem(s.public_key()), str(key_file))


class Lab:
    """One release (sm120 at `unverified`, probe PROBE), one enrolled GPU host. Its image is the smoke profile
    (no server), so GPU evidence alone decides, as the rules these tests check are about; a vllm image's
    runs also need the serving matrix (tests/test_serve_promote.py)."""

    def __init__(self, root: Path, level: str = "unverified", stmt: Optional[dict] = None,
                 options: Optional[dict] = None, **more) -> None:
        """`stmt`: the released statement (default: sm120 of DIGEST_A, which no registry serves); `options`
        and `more`: make_release's (release.ReleaseOptions: e.g. targets_file, the targets file whose rule it
        signs)."""
        self.root = root
        keys = root / "keys"
        keys.mkdir(parents=True, exist_ok=True)
        self.release_key, self.release_pub = make_key_pair(keys)
        self.host_key, self.host_pub = make_key_pair(keys, prefix="gpu-host")
        stmt = stmt or statement("sm120", DIGEST_A, level=level, profile="smoke")
        stmt["predicate"].setdefault("toolkit", {})["probe_sha256"] = PROBE
        self.folder = make_release(root / "repo", TAG, [stmt], self.release_key, **{**(options or {}), **more})
        self.manifests = self.folder.parent
        self.sign, self.key = sign_with(self.release_key)
        self.t0 = rec.parse_time(folder.read_release(self.folder).index.time, "release time")
        self.now = self.t0 + dt.timedelta(days=30)
        self.enroll(("lab-5090", self.host_pub))

    @property
    def hosts_file(self) -> Path:
        return self.manifests / rec.HOSTS_FILE

    def enroll(self, *hosts: tuple) -> Path:
        """Each host enrolled as `qualify hosts add NAME --key PUB` enrolls it (the next version of the chain)."""
        for name, pub in hosts:
            key = TrustedKey.read(pub)
            hosts_chain.change(self.hosts_file, self.sign, self.key, replace=True,
                               add=rec.EnrolledHost(name, key_pem=key.pem.decode(), fingerprint=key.fingerprint))
        return self.hosts_file

    @property
    def hosts(self) -> rec.EnrolledHosts:
        return folder.read_hosts(self.hosts_file, self.key)

    def when(self, n: int) -> str:
        return rec.format_time(self.t0 + dt.timedelta(seconds=n))  # after the release, never in the future

    def record(self, n: int, outcome: ev.Outcome = ev.Outcome.PASS, digest: str = DIGEST_A, cap: str = "12.0",
               probe: str = PROBE, release: str = TAG, **kw) -> ev.Evidence:
        computed = ev.outcome_of(gpu_checks(outcome), cap, "12.0")
        fields = dict(release=release, target="sm120", capability="12.0",
                      image_reference=f"127.0.0.1:5555/blackwell/sm120@{digest}", image_digest=digest,
                      probe_sources_digest=probe,
                      gpu=ev.Gpu("NVIDIA GeForce RTX 5090" if cap == "12.0" else "NVIDIA H200", cap,
                                 ev.hashed("GPU-1"), "580.1"),
                      host_id_sha256=ev.hashed("host"), time=self.when(n), outcome=computed.outcome,
                      reason=computed.reason, checks=gpu_checks(outcome), figures={"bf16_matmul_tflops": 200.0 + n},
                      run_id=f"{n:032x}")
        fields.update(kw)
        return ev.Evidence(**fields)

    def write(self, records: Sequence[ev.Evidence], signed: bool = True, key: Optional[Path] = None,
              where: Optional[Path] = None) -> list:
        where = where or self.root / "handed-in"
        where.mkdir(parents=True, exist_ok=True)
        out = []
        host = self._signer(key or self.host_key) if signed else None
        for r in records:
            path = ev.write(where / ev.file_name(r.target, r.time, ev.hashed(f"host-{len(out)}")), r)
            if host is not None:
                ev.sign(path, host)
            out.append(path)
        return out

    def _signer(self, key: Path):
        """The host's built-in signer, its key decrypted once per key (scrypt costs 0.75 s a time)."""
        cache = self.__dict__.setdefault("_signers", {})
        if key not in cache:
            cache[key] = signer.key_signer("builtin", key, PASSWORD.encode())
        return cache[key]

    def promote(self, paths: Sequence[Path], allow_unsigned: bool = False, hosts_file: Optional[Path] = None
                ) -> promote.Promoted:
        (done,) = promote.promote(self.folder, TAG, paths, self.sign, self.key, hosts_file or self.hosts_file,
                                  allow_unsigned, now=self.now)
        return done

    def run(self, records, **kw) -> promote.Promoted:
        return self.promote(self.write(records), **kw)

    def manifest(self) -> mf.Manifest:
        return folder.read_release(self.folder, KeyAnchor(trusted=self.key)).target("sm120").manifest

    def as_release_v2(self) -> None:
        """The release as a toolkit before issue 52 signed it (release/v2), before any promote: promote then
        rewrites its manifest, as it did for such folders."""
        from qualify.core.fsutil import canonical_json
        from qualify.signing import formats

        path = self.folder / rec.INDEX_FILE
        doc = json.loads(path.read_text())
        doc["schema"] = rec.RELEASE_SCHEMA_V2
        path.write_bytes(canonical_json(doc))
        signer.write_signature(self.sign, path, formats.signature_path(path), formats.bundle_path(path))

    def current(self) -> CurrentLevel:
        """sm120's level now, as every reader takes it: the signed promotion record's, else release.json's."""
        return folder.read_release(self.folder, KeyAnchor(trusted=self.key)).target("sm120").current
