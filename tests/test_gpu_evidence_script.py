"""scripts/gpu-evidence.sh on a host whose Python has none of the toolkit's host dependencies (issue 48).

On the lent H200 the script ran with the host's python3 (torch, Triton; manifests/evidence/ keeps its log).
Here, a STAND-IN for that host: a venv made from the base interpreter with nothing installed (no torch, no
python_on_whales, no cryptography), in a clean clone that has no .venv to fall back to, so a step that needed
the toolkit would fail instead of quietly re-running in the toolkit's venv. The probe runs for real on this
CPU host, whose GPU checks are then not-run (no GPU); every step after it (show, signing with the host's
cosign key through what `qualify probe-bundle` staged) runs as on the GPU host, and the signature is checked
with the verifier promote uses.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import clone_checkout
from signing_helpers import PASSWORD

from qualify.signing import formats
from qualify.trust.verify import TrustedKey, verify_blob

REPO = Path(__file__).resolve().parent.parent
ENGINE_DEPENDENCIES = ("python_on_whales", "tomlkit", "cryptography", "nacl", "jsonschema", "elftools", "torch")


def _base_python() -> str:
    base = Path(sys.base_prefix) / "bin" / "python3"
    return str(base if base.exists() else "/usr/bin/python3")


@pytest.fixture(scope="module")
def bare(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("gpu-evidence")
    venv = root / "bare"
    subprocess.run([_base_python(), "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python3"
    has = subprocess.run([str(python), "-c", "import importlib.util as u, sys; "
                          f"print([n for n in {ENGINE_DEPENDENCIES!r} if u.find_spec(n)])"],
                         capture_output=True, text=True, check=True).stdout.strip()
    assert has == "[]", f"the stand-in interpreter is meant to have none of them: {has}"
    version = subprocess.run([str(python), "-c", "import sys; print(f'{sys.version_info[0]}.{sys.version_info[1]}')"],
                             capture_output=True, text=True, check=True).stdout.strip()
    clone = clone_checkout(REPO, root / "repo")
    assert not (clone / ".venv").exists()
    env = {**os.environ, "COSIGN_PASSWORD": PASSWORD}
    made = subprocess.run([sys.executable, "-m", "qualify", "probe-bundle", "--python", version, "--out",
                           str(root / "bundle")], cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert made.returncode == 0, made.stdout + made.stderr
    key = subprocess.run([sys.executable, "-m", "qualify", "sign", "generate-key", "--output-key-prefix",
                          str(root / "host")], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert key.returncode == 0, key.stderr
    return {"root": root, "venv": venv, "clone": clone, "bundle": root / "bundle", "key": root / "host.key",
            "pub": root / "host.pub"}


def _run(bare: dict, out: Path, **extra: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "QUALIFY_PYTHON",
                                                           "QUALIFY_STAGED", "EVIDENCE_SIGNING_KEY")}
    env["PATH"] = os.pathsep.join([str(bare["venv"] / "bin"), "/usr/bin", "/bin"])
    env.update(extra)
    return subprocess.run(["bash", str(bare["clone"] / "scripts" / "gpu-evidence.sh"), str(out)], cwd=bare["clone"],
                          env=env, capture_output=True, text=True, timeout=900, stdin=subprocess.DEVNULL)


def test_every_step_runs_and_signs_with_an_interpreter_that_has_no_engine_dependencies(bare, tmp_path):
    out = tmp_path / "evidence"
    done = _run(bare, out, QUALIFY_STAGED=str(bare["bundle"]), EVIDENCE_SIGNING_KEY=str(bare["key"]),
                COSIGN_PASSWORD=PASSWORD)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    manifest = out / "probe-sm120.json"
    doc = json.loads(manifest.read_text())
    checks = {c["id"]: c["status"] for c in doc["predicate"]["checks"]}
    assert checks["gpu.bf16-matmul"] == "not-run"  # the stand-in host has no GPU: never a pass
    shown = (out / "probe-sm120.txt").read_text()
    assert shown.startswith("target     sm120") and "gpu        none visible" in shown
    assert "needs the toolkit's dependencies" not in done.stderr
    assert f"signed with {bare['key']}" in done.stderr
    key = TrustedKey.from_bytes(bare["pub"].read_bytes(), str(bare["pub"]))
    verify_blob(key, manifest.read_bytes(), (out / "probe-sm120.json.sig").read_bytes(), None, str(manifest))
    assert formats.decode_signature((out / "probe-sm120.json.sig").read_bytes())  # cosign's base64 DER


def test_without_a_python_that_can_sign_it_says_which_one_it_needs(bare, tmp_path):
    out = tmp_path / "evidence"
    done = _run(bare, out, EVIDENCE_SIGNING_KEY=str(bare["key"]), COSIGN_PASSWORD=PASSWORD)
    assert done.returncode == 2, done.stderr[-3000:]
    assert "signing needs cryptography (and PyNaCl for a cosign key)" in done.stderr
    assert "qualify probe-bundle --python" in done.stderr and "stays unsigned" in done.stderr
    assert (out / "probe-sm120.json").is_file() and not (out / "probe-sm120.json.sig").exists()
