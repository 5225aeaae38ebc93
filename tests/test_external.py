"""Qualifying images this toolkit did not build, and comparing them with ours (issue 34).

The "external" images are built the way people commonly build them: `pip install triton` into a venv on the
same hermetic base, without our wiring (no TRITON_*_PATH, no TORCH_CUDA_ARCH_LIST, no allocator hook), once
with the Triton our smoke image has (3.8.0) and once with Triton 3.5.0, whose bundled CUDA 12.8 ptxas rejects
sm_121a (the sm_121a field report). Real images, a real engine, the real loopback registry; sm121 runs under qemu.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
from conftest import REPO, require

import images
from qualify.config import targets
from qualify.core import manifest
from qualify.host import paths
from qualify.host.engine import Engine
from qualify.host.registry import Registry
from qualify.qualification import external
from qualify.qualification import stage as qualification
from qualify.release import assess
from qualify.release.model import Candidate, Withheld

SCHEMA = json.loads((REPO / "manifests" / "manifest.schema.json").read_text())
PASSWORD = "external image test key"
VERSIONS = ("3.8.0", "3.5.0")
pytestmark = pytest.mark.engine


def cli(*args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "COSIGN_PASSWORD": PASSWORD}
    return subprocess.run([sys.executable, "-m", "qualify", *args], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)


def checks(doc) -> dict:
    return {c["id"]: c for c in manifest.predicate(doc)["checks"]}


@pytest.fixture(scope="module")
def engine(docker_engine, loopback_registry):
    return Engine("docker").check()


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    return tmp_path_factory.mktemp("external")


@pytest.fixture(scope="module")
def qualified(engine, work):
    """(target, triton version) -> (tag, manifest path, CLI result), qualified through `qualify --image TAG`."""
    registry = Registry.from_env().address
    out = {}
    for target in ("sm120", "sm121"):
        for version in VERSIONS:
            tag = images.external(target, version, work, registry)
            path = work / f"{target}-{version}.json"
            done = cli("qualify", "--image", tag, "--target", target, "--out", str(path))
            out[(target, version)] = (tag, path, done)
    return out


@pytest.fixture(scope="module")
def ours(engine):
    """Our own smoke images, qualified as our builds: the column to compare the others with."""
    tf = targets.load()
    return {t: qualification.qualify(tf, images.smoke(t), engine, force=True).path for t in ("sm120", "sm121")}


@pytest.mark.parametrize("target", ["sm120", "sm121"])
@pytest.mark.parametrize("version", VERSIONS)
def test_the_manifest_is_about_the_digest_and_invents_no_build_facts(qualified, target, version):
    tag, path, done = qualified[(target, version)]
    assert done.returncode == 1, done.stderr  # a failing verdict (below): exit 1, as for our own images
    doc = manifest.load(path)
    jsonschema.validate(doc, SCHEMA)
    p = manifest.predicate(doc)
    name, _, tag_name = tag.rpartition(":")
    served = Registry.from_env().manifest_digest(name.split("/", 1)[1], tag_name)
    assert manifest.subject_digest(doc) == served and manifest.subject_name(doc) == name
    image = p["image"]
    assert image["origin"] == "external" and image["requested"] == tag and image["resolved_by"] == "registry"
    assert image["reference"] == f"{name}@{served}" and image["platform"] == targets.load().get(target).platform
    assert "PATH=/opt/venv/bin:/usr/local/cuda/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" in image["env"]
    assert image["labels"]["org.opencontainers.image.title"] == "blackwell-qualify hermetic CUDA base"  # inherited
    assert p["base"] == {"kind": "unknown"} and "build" not in p
    assert p["target"]["profile"] == "smoke"  # detected: no vLLM in the image
    assert "census.smoke-extension" not in checks(doc)  # our build's own extension is not expected of others
    assert f"manifest: {path}" in done.stdout and f"{target}: verdict fail" in done.stdout


@pytest.mark.parametrize("target", ["sm120", "sm121"])
@pytest.mark.parametrize("version", VERSIONS)
def test_the_missing_wiring_is_named_with_what_it_breaks_and_the_fix(qualified, target, version):
    doc = manifest.load(qualified[(target, version)][1])
    found = checks(doc)
    env = "TRITON_PTXAS_BLACKWELL_PATH" if version == "3.8.0" else "TRITON_PTXAS_PATH"  # 3.5 has one ptxas knob
    wiring = found["triton.ptxas-wiring"]
    assert wiring["status"] == "warn", wiring
    assert f"not wired: {env} is not set" in wiring["reason"] and "the ptxas it bundles" in wiring["reason"]
    assert f"Fix: set {env}=/usr/local/cuda/bin/ptxas" in wiring["reason"]
    alloc = found["triton.allocator"]
    assert alloc["status"] == "fail" and "no allocator hook is registered" in alloc["reason"]
    assert "no allocator was set" in alloc["reason"] and "fix: install a start-up hook" in alloc["reason"]
    arch_list = found["env.torch-cuda-arch-list"]
    assert arch_list["status"] == "warn" and "TORCH_CUDA_ARCH_LIST is not set" in arch_list["reason"]
    assert arch_list["required"] is False and "Fix: ENV TORCH_CUDA_ARCH_LIST=" in arch_list["reason"]
    assert found["env.cuda-toolkit"]["status"] == "pass"  # the hermetic base has CUDA 13.0
    assert not [c for c in found.values() if "Traceback" in c["reason"]]
    assert manifest.predicate(doc)["verdict"] == "fail"


def test_the_old_triton_bundled_ptxas_rejects_sm121a_and_assembles_sm120a(qualified):
    """The sm_121a field report's failure, named; and the same ptxas is no failure on 12.0 (CUDA 12.8 knows sm_120a): the
    assembly test writes the PTX ISA version that first names the target, not one its ptxas does not know."""
    gb10 = checks(manifest.load(qualified[("sm121", "3.5.0")][1]))
    asm = gb10["triton.ptxas-assembles"]
    assert asm["status"] == "fail" and "V12.8" in asm["reason"]
    assert "Value 'sm_121a' is not defined for option 'gpu-name'" in asm["reason"]
    assert "every Triton kernel fails at its first compile" in asm["reason"]
    assert "Fix: set TRITON_PTXAS_PATH=/usr/local/cuda/bin/ptxas" in asm["reason"]
    compiled = gb10["triton.cross-compile"]
    assert compiled["status"] == "fail" and "sm_121a" in compiled["reason"] and "not defined" in compiled["reason"]
    rtx = checks(manifest.load(qualified[("sm120", "3.5.0")][1]))
    assert rtx["triton.ptxas-assembles"]["status"] == "pass" and "V12.8" in rtx["triton.ptxas-assembles"]["reason"]
    assert rtx["triton.cross-compile"]["status"] == "pass"
    for target in ("sm120", "sm121"):  # the newer Triton's own ptxas (CUDA 13.x) knows both
        newer = checks(manifest.load(qualified[(target, "3.8.0")][1]))
        assert newer["triton.ptxas-assembles"]["status"] == "pass" and newer["triton.cross-compile"]["status"] == "pass"


@pytest.mark.parametrize("target", ["sm120", "sm121"])
def test_compare_shows_them_beside_ours(qualified, ours, target):
    paths = [str(ours[target])] + [str(qualified[(target, v)][1]) for v in VERSIONS]
    done = cli("compare", *paths, "--json")
    assert done.returncode == 1, done.stderr  # ours passes, theirs fail: the verdicts differ
    result = json.loads(done.stdout)
    assert result["target"] == target and result["verdicts_differ"] is True
    assert [i["origin"] for i in result["images"]] == ["built", "external", "external"]
    rows = {(r["section"], r["name"]): r for r in result["rows"]}
    assert rows[("result", "verdict")]["values"][0] in ("pass", "warn")
    assert rows[("result", "verdict")]["values"][1:] == ["fail", "fail"]
    assert rows[("package", "triton")]["values"] == ["3.8.0", "3.8.0", "3.5.0"]
    assert rows[("check", "triton.ptxas-wiring")]["values"] == ["pass", "warn", "warn"]
    assert rows[("check", "triton.allocator")]["values"] == ["pass", "fail", "fail"]
    asm = rows[("check", "triton.ptxas-assembles")]
    assert asm["values"] == (["pass", "pass", "fail"] if target == "sm121" else ["pass", "pass", "pass"])
    assert asm["differs"] is (target == "sm121")
    assert rows[("library", "ext/libsmoke_ext.so")]["values"] == ["native", None, None]
    assert rows[("check", "census.smoke-extension")]["values"] == ["pass", None, None]
    markdown = cli("compare", *paths, "--markdown")
    assert markdown.returncode == 1 and "| **triton.allocator** | **pass** | **fail** | **fail** |" in markdown.stdout
    text = cli("compare", *paths, "--width", "200")
    line = next(ln for ln in text.stdout.splitlines() if "triton.allocator" in ln)
    assert line.startswith("*") and line.split()[-3:] == ["pass", "fail", "fail"]


def test_compare_refuses_manifests_for_different_gpus_unless_told_which(qualified, ours):
    paths = [str(ours["sm120"]), str(qualified[("sm120", "3.8.0")][1]), str(qualified[("sm121", "3.5.0")][1])]
    mixed = cli("compare", *paths)
    assert mixed.returncode == 2 and "the manifests are for different targets" in mixed.stderr
    assert "--target" in mixed.stderr
    chosen = cli("compare", *paths, "--target", "sm120", "--json")
    assert chosen.returncode == 1 and len(json.loads(chosen.stdout)["images"]) == 2
    same = cli("compare", str(ours["sm120"]), str(ours["sm120"]))
    assert same.returncode == 0 and "the verdicts agree" in same.stdout
    bogus = cli("compare", str(ours["sm120"]), str(REPO / "pyproject.toml"))
    assert bogus.returncode == 9 and "pyproject.toml" in bogus.stderr and "Traceback" not in bogus.stderr


def test_an_image_of_another_platform_is_refused(qualified):
    amd64 = qualified[("sm120", "3.8.0")][0]
    done = cli("qualify", "--image", amd64, "--target", "sm121")
    assert done.returncode == 2, done.stderr
    assert f"--image {amd64} is a linux/amd64 image" in done.stderr and "runs linux/arm64" in done.stderr
    assert "NVIDIA GB10" in done.stderr and "Traceback" not in done.stderr


def test_a_tag_is_resolved_once_and_never_trusted(qualified, engine, work, tmp_path):
    """The tag moves after qualification: the manifest still names the digest that was probed, and
    `verify --image TAG` then refuses the image the tag names now."""
    registry = Registry.from_env().address
    moving = f"{registry}/qualify-test/external-moving:sm120-{images.CHECKOUT}"
    plain, old = qualified[("sm120", "3.8.0")][0], qualified[("sm120", "3.5.0")][0]
    subprocess.run(["/usr/bin/docker", "tag", plain, moving], check=True)
    subprocess.run(["/usr/bin/docker", "push", moving], check=True, capture_output=True)
    path = tmp_path / "moving.json"
    assert cli("qualify", "--image", moving, "--target", "sm120", "--out", str(path)).returncode == 1
    doc = manifest.load(path)
    first = manifest.subject_digest(doc)
    assert manifest.predicate(doc)["image"]["reference"] == f"{moving.rsplit(':', 1)[0]}@{first}"
    key = tmp_path / "cosign"
    assert cli("sign", "generate-key", "--output-key-prefix", str(key)).returncode == 0
    assert cli("sign", str(path), "--key", f"{key}.key").returncode == 0
    assert cli("verify", str(path), "--key", f"{key}.pub", "--image", moving).returncode == 0
    subprocess.run(["/usr/bin/docker", "tag", old, moving], check=True)
    subprocess.run(["/usr/bin/docker", "push", moving], check=True, capture_output=True)
    moved = cli("verify", str(path), "--key", f"{key}.pub", "--image", moving)
    assert moved.returncode == 9 and "image digest check failed" in moved.stderr
    assert manifest.subject_digest(manifest.load(path)) == first
    subprocess.run(["/usr/bin/docker", "rmi", moving], capture_output=True)


def test_a_vendor_image_can_be_vouched_for_and_a_failing_one_is_refused(qualified, tmp_path):
    """Signed and verified like our own: our smoke image, qualified as if someone else had built it, passes
    `verify --require-pass` (it carries its own wiring, which the external judgement accepts); the plain pip
    image is refused, naming its failing check."""
    smoke = images.smoke("sm120")
    path = tmp_path / "vendor.json"
    done = cli("qualify", "--image", smoke.image_reference, "--target", "sm120", "--out", str(path))
    assert done.returncode == 0, done.stderr
    doc = manifest.load(path)
    found = checks(doc)
    assert manifest.predicate(doc)["image"]["resolved_by"] == "digest"
    assert manifest.subject_digest(doc) == smoke.digest
    for cid in ("triton.ptxas-wiring", "triton.allocator", "env.torch-cuda-arch-list", "env.cuda-toolkit"):
        assert found[cid]["status"] == "pass", found[cid]
    assert "as the image sets TRITON_PTXAS_BLACKWELL_PATH" in found["triton.ptxas-wiring"]["reason"]
    key = tmp_path / "cosign"
    assert cli("sign", "generate-key", "--output-key-prefix", str(key)).returncode == 0
    plain = qualified[("sm120", "3.8.0")]
    for manifest_path in (path, plain[1]):
        assert cli("sign", str(manifest_path), "--key", f"{key}.key").returncode == 0
    vouched = cli("verify", str(path), "--key", f"{key}.pub", "--image", smoke.image_reference, "--require-pass")
    assert vouched.returncode == 0, vouched.stderr
    refused = cli("verify", str(plain[1]), "--key", f"{key}.pub", "--image", plain[0], "--require-pass")
    assert refused.returncode == 9 and "triton.allocator" in refused.stderr


def test_a_local_image_id_is_its_own_digest(engine, qualified, tmp_path):
    """An image only this engine has (never pushed): its id is what it is."""
    image_id = engine.image_id(qualified[("sm120", "3.8.0")][0])
    done = cli("qualify", "--image", image_id, "--target", "sm120")  # to the default place: build/external/
    assert done.returncode == 1, done.stderr
    path = external.default_path("sm120", external.resolve(engine, image_id, "linux/amd64"))
    assert f"manifest: {path.relative_to(REPO)}" in done.stdout and path.parent == external.EXTERNAL_DIR
    released = paths.HERE.release_input("sm120")  # the release input is never an external manifest
    assert not released.exists() or manifest.subject_digest(manifest.load(released)) != image_id
    doc = manifest.load(path)
    jsonschema.validate(doc, SCHEMA)
    image = manifest.predicate(doc)["image"]
    assert image["resolved_by"] == "local" and image["digest"] == image_id == image["reference"] == image["id"]
    assert manifest.subject_digest(doc) == image_id


def test_no_cuda_toolkit_and_a_vllm_distribution(engine, docker_engine, qualified, tmp_path):
    """An image with no CUDA toolkit gets the finding plainly (and Triton still compiles with its own ptxas);
    a vLLM distribution in the image makes the detected profile vllm."""
    plain = qualified[("sm120", "3.8.0")][0]
    bare = images.derived(docker_engine, plain, f"qualify-test/external-no-cuda:{images.CHECKOUT}",
                          "RUN rm -rf /usr/local/cuda\nENV CUDA_HOME=", {}, tmp_path, "linux/amd64")
    try:
        path = tmp_path / "no-cuda.json"
        assert cli("qualify", "--image", bare, "--target", "sm120", "--out", str(path)).returncode == 1
        found = checks(manifest.load(path))
        toolkit = found["env.cuda-toolkit"]
        assert toolkit["status"] == "warn" and "no CUDA toolkit" in toolkit["reason"]
        assert "install a CUDA 13 compiler" in toolkit["reason"]
        assert "install a CUDA 13 ptxas" in found["triton.ptxas-wiring"]["reason"]
        assert found["triton.cross-compile"]["status"] == "pass"
        assert not [c for c in found.values() if "Traceback" in c["reason"]]
    finally:
        subprocess.run([docker_engine, "rmi", bare], capture_output=True)
    site = "/opt/venv/lib/python3.11/site-packages/vllm-0.33.0.dist-info"
    fake = images.derived(docker_engine, plain, f"qualify-test/external-vllm-dist:{images.CHECKOUT}",
                          f"COPY METADATA {site}/METADATA", {"METADATA": b"Metadata-Version: 2.1\nName: vllm\n"
                                                             b"Version: 0.33.0\n"}, tmp_path, "linux/amd64")
    try:
        img = external.resolve(engine, fake, "linux/amd64")
        assert img.resolved_by == "local" and external.detect_profile(engine, img) == "vllm"
        assert external.detect_profile(engine, external.resolve(engine, plain, "linux/amd64")) == "smoke"
    finally:
        subprocess.run([docker_engine, "rmi", fake], capture_output=True)


def test_no_python3_and_python_3_8_are_clear_errors(engine, docker_engine, tmp_path):
    """A real image without python3, and one whose python3 is a real CPython 3.8 (pyenv's build on this
    machine, copied in): the error names the image and what the probe needs, never a traceback."""
    require(Path(images.PYENV_38, "bin", "python3.8").exists(), f"{images.PYENV_38} (a CPython 3.8) is missing")
    base = images.smoke("sm120").base_image
    bare = images.derived(docker_engine, base, f"qualify-test/external-no-python:{images.CHECKOUT}",
                          "RUN rm -f /usr/bin/python3*", {}, tmp_path, "linux/amd64")
    ctx_files = images.python38_files(tmp_path)
    old = images.derived(docker_engine, base, f"qualify-test/external-python38:{images.CHECKOUT}",
                         f"ADD python38.tar /\nRUN ln -s {images.PYENV_38}/bin/python3.8 /usr/local/bin/python3",
                         ctx_files, tmp_path, "linux/amd64")
    try:
        said = subprocess.run(["/usr/bin/docker", "run", "--rm", old, "python3", "-c",
                               "import sys; print(sys.version_info[:2])"], capture_output=True, text=True, timeout=120)
        assert said.stdout.strip() == "(3, 8)", said.stderr  # a real interpreter, not a stand-in
        none = cli("qualify", "--image", bare, "--target", "sm120")
        assert none.returncode == 3 and "has no python3 on its PATH" in none.stderr, none.stderr
        assert "external-no-python" in none.stderr and "3.9 or newer" in none.stderr
        too_old = cli("qualify", "--image", old, "--target", "sm120", "--profile", "smoke")
        assert too_old.returncode == 3 and "its python3 is 3.8; the probe needs 3.9 or newer" in too_old.stderr
        assert "external-python38" in too_old.stderr
        assert "Traceback" not in none.stderr + too_old.stderr
    finally:
        subprocess.run([docker_engine, "rmi", bare, old], capture_output=True)


def test_a_release_never_takes_an_external_qualification(qualified):
    path = qualified[("sm120", "3.8.0")][1]
    result = assess.assess(Candidate("sm120", path, path.read_bytes()), "unverified", lambda ref: None)
    assert isinstance(result, Withheld) and "origin external" in result.reason
