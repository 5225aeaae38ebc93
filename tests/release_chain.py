"""A release as the README's commands make it, for the schema tests and the independent verifier's (not a test
module): the sm120 smoke image qualified by the real probe, released with `qualify release`, two hosts enrolled
one after the other with `qualify hosts add` (each version committed, as the command says to), GPU evidence
written and signed as ./start.sh writes and signs it, three `qualify promote` runs (a ledger of three records,
two of them kept), and `qualify publish` to a TLS + htpasswd registry on loopback.

The GPU is a labelled stand-in: this host has none, so the evidence records are made by the same code start.sh
uses (release/evidence.py: Evidence, write; the host's built-in signer) with the checks a passing run reports.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional

from evidence_helpers import gpu_checks
from signing_helpers import init_git_repo

import images
from qualify.config import targets
from qualify.core import manifest as mf
from qualify.core.fsutil import canonical_json
from qualify.host.engine import Engine
from qualify.qualification import stage as qualification
from qualify.release import evidence as ev
from qualify.signing import formats, signer
from qualify.trust import records as rec

REPO = Path(__file__).resolve().parent.parent
TAG = "v1.0.0"
PASSWORD = "release chain key"
HOST_PASSWORD = "release chain gpu host"
SCRIPT = REPO / "scripts" / "verify-independent.sh"
GPU = "NVIDIA GeForce RTX 5090 (TEST STAND-IN: this host has no GPU)"


@dataclass
class Chain:
    repo: Path
    env: Dict[str, str]
    digest: str  # the smoke image's
    reference: str
    destination: str = ""  # where it was published ("" when not)
    hosts_keys: Dict[str, Path] = field(default_factory=dict)
    log: List[str] = field(default_factory=list)
    registry: Optional[object] = None  # the tls_registry.TlsRegistry it was published to

    @property
    def manifests(self) -> Path:
        return self.repo / "manifests"

    @property
    def folder(self) -> Path:
        return self.manifests / TAG

    @property
    def pub(self) -> Path:
        return self.repo / "cosign.pub"

    @property
    def hosts_file(self) -> Path:
        return self.manifests / rec.HOSTS_FILE

    def qualify(self, *args: str, ok: bool = True, timeout: float = 600) -> subprocess.CompletedProcess:
        """`python -m qualify ARGS` typed in the release repository."""
        done = subprocess.run([sys.executable, "-m", "qualify", *args], cwd=self.repo, env=self.env, text=True,
                              capture_output=True, stdin=subprocess.DEVNULL, timeout=timeout)
        self.log.append(f"$ qualify {' '.join(args)}\n{done.stdout}{done.stderr}")
        if ok:
            assert done.returncode == 0, f"qualify {args}: {done.stdout[-2000:]}\n{done.stderr[-3000:]}"
        return done

    def git(self, *args: str) -> str:
        return subprocess.run(["git", *args], cwd=self.repo, check=True, capture_output=True, text=True).stdout

    def enroll(self, name: str) -> None:
        """`qualify hosts add NAME --key HOST.pub`, and the commit the command asks for."""
        prefix = self.repo.parent / f"host-{name}"
        subprocess.run([sys.executable, "-m", "qualify", "sign", "generate-key", "--output-key-prefix", str(prefix)],
                       cwd=self.repo, env={**self.env, "COSIGN_PASSWORD": HOST_PASSWORD}, check=True,
                       capture_output=True, timeout=120)
        self.hosts_keys[name] = Path(f"{prefix}.key")
        self.qualify("hosts", "add", name, "--key", f"{prefix}.pub", "--release-key", "cosign.key",
                     "--file", str(self.hosts_file))
        self.git("add", "manifests/hosts.json", "manifests/hosts.json.sig", "manifests/hosts.json.sigstore.json")
        self.git("commit", "-q", "-m", f"enroll {name}")

    def runs(self, host: str, first: int, count: int) -> List[Path]:
        """`count` passing GPU runs of sm120 on the stand-in, as start.sh writes and signs them (one file each)."""
        t0 = rec.parse_time(json.loads((self.folder / rec.INDEX_FILE).read_text())["time"], "release time")
        manifest = mf.Manifest.load(self.folder / "sm120.json")
        sign = signer.key_signer("builtin", self.hosts_keys[host], HOST_PASSWORD.encode())
        out = self.repo.parent / "handed-in"
        out.mkdir(exist_ok=True)
        paths = []
        for n in range(first, first + count):
            checks = gpu_checks(ev.Outcome.PASS)
            outcome = ev.outcome_of(checks, "12.0", "12.0")
            record = ev.Evidence(
                release=TAG, target="sm120", capability="12.0", image_reference=self.reference,
                image_digest=self.digest, probe_sources_digest=manifest.probe_sha256,
                gpu=ev.Gpu(GPU, "12.0", ev.hashed(f"GPU-stand-in-{host}"), "580.65"),
                host_id_sha256=ev.hashed(f"machine-{host}"),
                time=rec.format_time(t0 + dt.timedelta(seconds=n)), outcome=outcome.outcome, reason=outcome.reason,
                checks=checks, figures={"bf16_matmul_tflops": 200.0 + n / 4}, run_id=f"{n:032x}")
            path = ev.write(out / ev.file_name("sm120", record.time, record.host_id_sha256), record)
            signer.write_signature(sign, path, formats.signature_path(path), formats.bundle_path(path))
            paths.append(path)
        return paths

    def promote(self, paths: List[Path]) -> str:
        return self.qualify("promote", TAG, "--key", "cosign.key", "--manifests", "manifests",
                            "--hosts", str(self.hosts_file), "--evidence", *map(str, paths)).stdout

    def copy(self, dest: Path) -> Chain:
        """The whole repository (its git history too: hosts.json's earlier versions), with promoter marks of its own."""
        shutil.copytree(self.repo, dest / "repo", symlinks=True)
        for key in self.hosts_keys.values():
            shutil.copy2(key, dest / key.name)
        env = {**self.env, "QUALIFY_TRUST_DIR": str(dest / "promoter-trust")}
        return dataclasses.replace(self, repo=dest / "repo", env=env, log=[],
                                   hosts_keys={n: dest / k.name for n, k in self.hosts_keys.items()})

    def gpu_evidence(self, host: str, out: Path) -> Path:
        """`qualify gpu-evidence sm120 --image REF --gpus none --sign-key HOST.key`: the probe's GPU checks in a
        container of the released image, on a host without a GPU (the checks are not-run: infrastructure)."""
        env = {**self.env, "COSIGN_PASSWORD": HOST_PASSWORD}
        done = subprocess.run([sys.executable, "-m", "qualify", "gpu-evidence", "sm120", "--image",
                               f"{self.reference}", "--profile", "smoke", "--gpus", "none", "--out", str(out),
                               "--sign-key", str(self.hosts_keys[host])], cwd=self.repo, env=env, text=True,
                              capture_output=True, stdin=subprocess.DEVNULL, timeout=900)
        assert done.returncode == 0 and out.is_file(), done.stdout[-2000:] + done.stderr[-3000:]
        return out

    def verify(self, folder: Optional[Path] = None, *args: str, env: Optional[Dict[str, str]] = None
               ) -> subprocess.CompletedProcess:
        """scripts/verify-independent.sh FOLDER ARGS, with a PATH of the system's tools only (no venv)."""
        path = ":".join(p for p in os.environ.get("PATH", "/usr/bin:/bin").split(":") if ".venv" not in p
                        and ".nox" not in p)
        return subprocess.run(["bash", str(SCRIPT), str(folder or self.folder), *args], capture_output=True,
                              text=True, timeout=600, stdin=subprocess.DEVNULL,
                              env={"PATH": path, "HOME": os.environ.get("HOME", "/root"), **(env or {})})


def make(root: Path, registry=None) -> Chain:
    """The chain, made under `root`; published to `registry` (tls_registry.TlsRegistry) when one is given."""
    record = images.smoke("sm120")
    path = qualification.qualify(targets.load(), record, Engine("docker").check()).path
    stmt = mf.load(path)  # the real probe's manifest of the real image
    repo = init_git_repo(root / "repo")
    env = {**{k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV",)}, "PYTHONPATH": str(REPO),
           "COSIGN_PASSWORD": PASSWORD, "QUALIFY_TRUST_DIR": str(root / "promoter-trust")}
    if registry is not None:
        env.update(registry.env())
    chain = Chain(repo, env, record.digest, record.image_reference, registry=registry)
    chain.qualify("sign", "generate-key")
    with open(repo / ".gitignore", "a") as ignore:
        ignore.write("/cosign.key\n")  # as the toolkit's own .gitignore says
    chain.git("add", "cosign.pub", ".gitignore")
    chain.git("commit", "-q", "-m", "release key")
    rev = chain.git("rev-parse", "HEAD").strip()
    stmt["predicate"]["toolkit"]["source_revision"] = rev  # qualified at this revision, as a release needs
    (repo / "build" / "manifests").mkdir(parents=True)
    (repo / "build" / "manifests" / "sm120.json").write_bytes(canonical_json(stmt))
    chain.qualify("release", TAG, "--key", "cosign.key", "--no-upload")
    chain.enroll("lab-a")
    chain.promote(chain.runs("lab-a", 1, 1))  # promotion 1: experimental
    chain.enroll("lab-b")  # hosts sequence 2
    chain.promote(chain.runs("lab-a", 2, 2) + chain.runs("lab-b", 4, 2))  # promotion 2
    chain.promote(chain.runs("lab-b", 6, 2))  # promotion 3: seven passes, baseline
    if registry is not None:
        chain.destination = f"{registry.address}/chain"
        chain.qualify("publish", TAG, "--to", chain.destination, "--key", "cosign.key", timeout=1800)
    return chain
