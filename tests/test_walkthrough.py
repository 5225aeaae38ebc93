"""Issue 30: the README's flow, run as a new release engineer runs it, from a clean clone.

Build and qualify (the smoke images, hermetic base), make the release key and commit it, release, clone the
tag, verify, publish to a TLS + htpasswd registry on loopback, verify from the registry, `./start.sh --dry-run`
with the labelled stand-in nvidia-smi (a TEST DOUBLE: this host has no GPU), GPU evidence signed by an
enrolled host, promote. Every command is the README's or its guides' (docs/), typed in the clone's root with the
newcomer's python3 (which moves into the clone's .venv, made by the set-up's toolkit step), nox where they say nox.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import tls_registry
from conftest import clone_checkout, require

REPO = Path(__file__).resolve().parent.parent
pytestmark = [pytest.mark.engine, pytest.mark.slow]
PASSWORD = "walkthrough release key"


def newcomer_env(**extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")}
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if ".nox" not in p and ".venv" not in p)
    env.update(extra)
    return env


def python3() -> str:
    base = Path(sys.base_prefix) / "bin" / "python3"
    return str(base if base.exists() else "/usr/bin/python3")


class Shell:
    """Commands typed in one folder, as the README writes them."""

    def __init__(self, root: Path, env: dict) -> None:
        self.root, self.env = root, env

    def __call__(self, *argv: str, ok: bool = True, timeout: float = 900, **env: str) -> subprocess.CompletedProcess:
        argv = [python3() if a == "python" else a for a in argv]
        done = subprocess.run(argv, cwd=self.root, env={**self.env, **env}, capture_output=True, text=True,
                              timeout=timeout, stdin=subprocess.DEVNULL)
        if ok:
            assert done.returncode == 0, f"{argv}: {done.stdout[-2000:]}\n{done.stderr[-4000:]}"
        assert "Traceback" not in done.stderr, done.stderr[-3000:]
        return done


@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    require(os.path.exists(tls_registry.REGISTRY_BINARY) and shutil.which("skopeo"), "docker-registry and skopeo")
    gen = tls_registry.start(tmp_path_factory.mktemp("walkthrough-registry"))
    reg = next(gen)
    yield reg
    gen.close()


def test_the_readme_walkthrough_as_written(tmp_path, docker_engine, registry):
    clone = tmp_path / "repo"
    clone_checkout(REPO, clone)
    for args in (["config", "user.name", "Walk Through"], ["config", "user.email", "walk@example.invalid"]):
        subprocess.run(["git", *args], cwd=clone, check=True)
    sh = Shell(clone, newcomer_env(COSIGN_PASSWORD=PASSWORD, REGISTRY_AUTH_FILE=str(registry.auth_file)))
    # Set up: the README's command does this step for the toolkit (scripts/setup-host.sh: toolenv.ensure).
    sh("python", "-c", "from qualify import toolenv; toolenv.ensure()")

    # Build and qualify (README: Set up 1b; docs/qualify.md).
    sh("python", "-m", "nox", "-s", "build-sm120", "--", "--base", "hermetic", "--profile", "smoke", timeout=1800)
    manifest = clone / "build" / "manifests" / "sm120.json"
    assert manifest.is_file()
    ref = json.loads(manifest.read_text())["predicate"]["image"]["reference"]
    assert "Traceback" not in sh("python", "-m", "qualify", "show", "build/manifests/sm120.json").stderr

    # The release key, committed as generate-key says; then the release (README: the release loop; docs/release-and-verify.md).
    made = sh("python", "-m", "qualify", "sign", "generate-key")
    assert "git add cosign.pub" in made.stdout
    fingerprint = made.stdout.split("RELEASE_KEY_FINGERPRINT=", 1)[1].split()[0]
    sh("git", "add", "cosign.pub")
    sh("git", "commit", "-q", "-m", "release key")
    # The images were built before the key commit: qualify again at this commit, as a release needs one revision.
    sh("python", "-m", "nox", "-s", "qualify-sm120", "--", "--base", "hermetic", "--profile", "smoke", "--force",
       timeout=1800)
    sh("python", "-m", "nox", "-s", "release", "--", "v0.1.0", "--dry-run")
    sh("python", "-m", "nox", "-s", "release", "--", "v0.1.0", "--no-upload")
    again = sh("python", "-m", "qualify", "release", "v0.1.0", "--key", "cosign.key", "--no-upload")
    assert "Recovered from an earlier, interrupted run" in again.stdout  # a re-run converges, and says so

    # Clone the tag; verify there (docs/release-and-verify.md).
    tagged = tmp_path / "tagged"
    subprocess.run(["git", "clone", "-q", "--branch", "v0.1.0", str(clone), str(tagged)], check=True, timeout=300)
    tsh = Shell(tagged, sh.env)
    tsh("python", "-c", "from qualify import toolenv; toolenv.ensure()")
    verified = tsh("python", "-m", "qualify", "verify", "manifests/v0.1.0/sm120.json", "--key", "cosign.pub",
                   "--image", ref, "--require-pass")
    assert "release v0.1.0 (sequence 1)" in verified.stdout

    # Publish to the TLS + htpasswd registry and verify from it (docs/release-and-verify.md, Publish).
    dest = f"{registry.address}/walk"
    sh("python", "-m", "nox", "-s", "publish", "--", "v0.1.0", "--to", dest, timeout=1800)
    published = json.loads((clone / "manifests" / "v0.1.0" / "published.json").read_text())
    image = published["images"][0]["reference"]
    from_registry = sh("python", "-m", "qualify", "verify", "--image", image, "--key", "cosign.pub", "--require-pass")
    assert "verified from the registry" in from_registry.stdout

    # ./start.sh on a Blackwell host (the stand-in nvidia-smi): a smoke release cannot serve, and says so.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").symlink_to(REPO / "tests" / "standin" / "nvidia-smi")
    env_file = tmp_path / "deploy.env"
    env_file.write_text(f"RELEASE_KEY_FINGERPRINT={fingerprint}\nGPU_RUNTIME=none\nMIN_FREE_DISK_GIB=1\n"
                        f"DEPLOY_DIR={tmp_path / 'deploy'}\nAPI_PORT=18999\n")
    deploy = tsh("./start.sh", "--dry-run", "--allow-no-gpu-runtime", "--env-file", str(env_file), ok=False,
                 PATH=f"{bin_dir}{os.pathsep}{sh.env['PATH']}", STANDIN_GPUS="12.0|NVIDIA GeForce RTX 5090|32607 MiB|GPU-1")
    assert deploy.returncode == 4, deploy.stderr[-3000:]
    assert "release key: " + fingerprint + " (pinned)" in deploy.stderr
    assert "the image is the smoke profile, which holds no vLLM server" in deploy.stderr

    # GPU evidence from an enrolled host, then promote (docs/deploy.md, The loop). This host has no GPU runtime: the
    # command says what to install; `--gpus none` rehearses the path, and the record is infrastructure.
    sh("python", "-m", "qualify", "sign", "generate-key", "--output-key-prefix", str(tmp_path / "host"))
    sh("python", "-m", "qualify", "hosts", "add", "lab-host", "--key", str(tmp_path / "host.pub"),
       "--release-key", "cosign.key")
    evidence = tmp_path / "sm120.evidence.json"
    refused = sh("python", "-m", "qualify", "gpu-evidence", "sm120", "--image", ref, "--profile", "smoke",
                 "--out", str(evidence), ok=False, timeout=900)
    assert refused.returncode != 0 and "NVIDIA container toolkit" in refused.stderr and not evidence.exists()
    ran = sh("python", "-m", "qualify", "gpu-evidence", "sm120", "--image", ref, "--profile", "smoke", "--gpus", "none",
             "--out", str(evidence), "--sign-key", str(tmp_path / "host.key"), timeout=900)
    assert evidence.is_file() and Path(f"{evidence}.sig").is_file(), ran.stdout[-2000:] + ran.stderr[-3000:]
    promoted = sh("python", "-m", "qualify", "promote", "v0.1.0", "--key", "cosign.key", "--evidence", str(evidence))
    assert "sm120: unverified (0 of 7 consecutive passes; 1 records, 1 new)" in promoted.stdout, promoted.stdout
    assert "infrastructure" in promoted.stdout
    sh("python", "-m", "qualify", "verify", "manifests/v0.1.0/sm120.json", "--key", "cosign.pub")

    # Independently (docs/release-and-verify.md; VERIFYING.md): openssl, jq and sha256sum over the promoted folder,
    # the probe-manifest evidence's identity among them; publish again after the promote, then the registry too.
    independent = sh("bash", "scripts/verify-independent.sh", "manifests/v0.1.0", "--fingerprint", fingerprint)
    assert "sm120.promotion.json: 1 run(s)" in independent.stdout, independent.stdout[-3000:]
    sh("python", "-m", "nox", "-s", "publish", "--", "v0.1.0", "--to", dest, timeout=1800)
    registry_check = sh("bash", "scripts/verify-independent.sh", "manifests/v0.1.0", "--fingerprint", fingerprint,
                        "--registry")
    assert "release statement v0.1.0 (sequence 1, promotion 1)" in registry_check.stdout, registry_check.stdout[-3000:]
    # Every record the walkthrough's commands wrote, against its schema (check-jsonschema, as a consumer runs it).
    folder = clone / "manifests" / "v0.1.0"
    kept = [p for p in (folder / "evidence" / "sm120").glob("*.json") if not p.name.endswith(".sigstore.json")]
    for schema, files in (("release", [folder / "release.json"]), ("promotion", [folder / "sm120.promotion.json"]),
                          ("manifest", [folder / "sm120.json"]), ("publication", [folder / "published.json"]),
                          ("enrolled-hosts", [clone / "manifests" / "hosts.json"]), ("evidence", [evidence, *kept])):
        done = subprocess.run([str(Path(sys.executable).parent / "check-jsonschema"), "--schemafile",
                               str(clone / "manifests" / f"{schema}.schema.json"), *map(str, files)],
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, f"{schema}: {done.stdout}{done.stderr}"
