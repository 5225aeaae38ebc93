"""Qualification of real smoke images, and of deliberately broken ones.

No GPU exists on this machine: GPU checks must come out `not-run`, never
`pass`, and the support level `unverified`.
"""

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import jsonschema
import pytest

import images
from qualify.config import targets
from qualify.core import manifest
from qualify.host.engine import Engine
from qualify.qualification import container
from qualify.qualification import stage as qualification

REPO = Path(__file__).resolve().parent.parent
SCHEMA = json.loads((REPO / "manifests" / "manifest.schema.json").read_text())
pytestmark = pytest.mark.engine


def statuses(predicate):
    return {c["id"]: c for c in predicate["checks"]}


@pytest.fixture(scope="module")
def engine(docker_engine, loopback_registry):
    return Engine("docker").check()


@pytest.fixture(scope="module", params=["sm120", "sm121"])
def qualified(request, engine):
    record = images.smoke(request.param)
    path = qualification.qualify(targets.load(), record, engine, force=True).path
    return record, manifest.load(path)


def test_manifest_validates_and_names_the_image(qualified):
    record, doc = qualified
    jsonschema.validate(doc, SCHEMA)
    assert manifest.subject_digest(doc) == record.digest
    p = manifest.predicate(doc)
    assert p["image"]["reference"] == record.image_reference and p["base"]["image"] == record.base_image
    assert p["toolkit"]["source_revision"] and p["target"]["name"] == record.target
    path = qualification.qualified_path(record)
    assert path.read_bytes() == manifest.dumps(doc)  # canonical bytes on disk


@pytest.mark.parametrize("where", ["", "target", "image", "base", "build", "toolkit", "host", "gpu", "census",
                                   "runtime", "runtime.user", "runtime.libcuda", "versions", "versions.toolkit",
                                   "checks.0", "census.libraries.0", "census.libraries.0.link_only"])
def test_the_schema_refuses_a_key_we_do_not_write_in_our_own_objects(qualified, where):
    """Issue 42: the schema accepted unknown predicate keys. Where the format is ours it is closed: the real
    manifest validates, the same with one unknown key anywhere in our objects does not."""
    _, doc = qualified
    changed = json.loads(json.dumps(doc))
    obj = changed["predicate"]
    for part in filter(None, where.split(".")):
        obj = obj[int(part)] if isinstance(obj, list) else obj[part]
    obj["unexpected"] = 1
    with pytest.raises(jsonschema.ValidationError, match="'unexpected' was unexpected"):
        jsonschema.validate(changed, SCHEMA)
    # Open by design: a check's evidence, the image's labels, package versions.
    for open_part in (changed["predicate"]["checks"][0]["evidence"], changed["predicate"]["image"]["labels"]):
        open_part["anything"] = "x"
    obj.pop("unexpected")
    jsonschema.validate(changed, SCHEMA)


def test_a_promoted_manifest_still_validates(engine, tmp_path):
    """What `qualify promote` writes into the manifest of a release/v2 folder (the predicate's promotion object, the
    new level) over a real manifest; from release/v3 it never rewrites one (issue 52)."""
    from evidence_helpers import Lab

    record = images.smoke("sm120")
    doc = manifest.load(qualification.qualify(targets.load(), record, engine).path)
    lab = Lab(tmp_path, stmt=doc)
    lab.as_release_v2()
    lab.run([lab.record(i, digest=record.digest, image_reference=record.image_reference) for i in range(1, 7)])
    promoted = lab.manifest().statement
    assert promoted["predicate"]["promotion"]["level"] == "experimental"
    jsonschema.validate(dict(promoted), SCHEMA)


def test_static_checks_pass_and_gpu_checks_do_not_run(qualified):
    _, doc = qualified
    p = manifest.predicate(doc)
    checks = statuses(p)
    for cid in ("triton.ptxas-wiring", "triton.ptxas-assembles", "triton.cross-compile", "triton.allocator",
                "census.smoke-extension", "census.serving-path"):
        assert checks[cid]["status"] == "pass", (cid, checks[cid]["reason"])
    gpu = [c for c in p["checks"] if c["id"].startswith("gpu.")]
    assert gpu and all(c["status"] == "not-run" and "no GPU" in c["reason"] for c in gpu)
    assert p["support_level"] == "unverified" and p["gpu_evidence_on_target"] is False
    assert p["verdict"] in ("pass", "warn")


def test_the_image_runs_as_its_non_root_user_and_the_manifest_says_who(qualified, docker_engine):
    """Issue 32 item 4: the image's USER is the targets file's [defaults.user]; the probe, run as that user,
    records it and the required env.runtime-user check passes. The image also carries NVIDIA_REQUIRE_CUDA
    (item 1), so the container toolkit refuses a driver too old for its CUDA before the server starts."""
    record, doc = qualified
    t = targets.load().get(record.target)
    p = manifest.predicate(doc)
    user = p["runtime"]["user"]
    assert (user["uid"], user["name"], user["in_container"]) == (t.user.uid, t.user.name, True), user
    check = statuses(p)["env.runtime-user"]
    assert check["status"] == "pass" and check["required"] is True, check
    assert p["runtime"]["cuda"]["version"] == t.cuda
    assert statuses(p)["env.cuda-compat"]["status"] == "pass" and p["runtime"]["libcuda"]["first"] is None
    config = json.loads(subprocess.run([docker_engine, "image", "inspect", "--format", "{{json .Config}}",
                                        record.image_reference], capture_output=True, text=True, check=True).stdout)
    assert config["User"] == f"{t.user.uid}:{t.user.uid}"
    assert f"NVIDIA_REQUIRE_CUDA=cuda>={t.cuda}" in config["Env"]
    who = images.run(docker_engine, record.image_reference, "id -un; id -u; touch /var/cache/blackwell/vllm/w && "
                     "echo writable; test -w /opt/venv || echo venv-read-only", t.platform)
    assert who.returncode == 0 and who.stdout.split() == [t.user.name, str(t.user.uid), "writable", "venv-read-only"], \
        who.stdout + who.stderr


def test_cross_compiled_cubin_is_for_the_target(qualified):
    record, doc = qualified
    cap = targets.load().get(record.target).capability
    check = statuses(manifest.predicate(doc))["triton.cross-compile"]
    assert check["evidence"]["cubin_arches"] == [f"sm_{cap.number}a"]
    assert f"sm_{cap.number}a" in check["evidence"]["ptx_target"]


def test_show_and_diff_read_manifests(qualified):
    record, _ = qualified
    path = qualification.qualified_path(record)
    shown = subprocess.run([sys.executable, "-m", "qualify", "show", str(path)], capture_output=True, text=True)
    assert shown.returncode == 0 and "triton.cross-compile" in shown.stdout and "unverified" in shown.stdout
    diff = subprocess.run([sys.executable, "-m", "qualify", "diff", str(path), str(path)], capture_output=True, text=True)
    assert diff.returncode == 0 and "no differences" in diff.stdout


# --- deliberately broken images -------------------------------------------------


def _probe(engine, image, target_name):
    return container.run_probe(engine, image, container.probe_target(targets.load().get(target_name), "smoke")).predicate


def test_missing_allocator_hook_fails(engine, docker_engine, tmp_path):
    good = images.smoke("sm120")
    bad = images.derived(docker_engine, good.image_reference, "qualify-test/broken:no-hook",
                         "RUN rm /opt/venv/lib/python3*/site-packages/blackwell_triton_allocator.pth", {}, tmp_path,
                         "linux/amd64")
    p = _probe(engine, bad, "sm120")
    check = statuses(p)["triton.allocator"]
    assert check["status"] == "fail" and "NullAllocator" in check["reason"] and "no allocator hook" in check["reason"]
    assert p["verdict"] == "fail" and p["support_level"] == "unsupported"


def _ptxas_12_8(tmp_path, platform_tag):
    """Triton 3.5.0's bundled ptxas (CUDA 12.8): it rejects sm_121a, as the sm_121a field report saw."""
    out = tmp_path / "wheel"
    subprocess.run([sys.executable, "-m", "pip", "download", "--isolated", "--quiet", "--no-deps", "--only-binary=:all:",
                    "--platform", platform_tag, "--python-version", "3.11", "--index-url", "https://pypi.org/simple",
                    "--cert", "/etc/ssl/certs/ca-certificates.crt", "-d", str(out), "triton==3.5.0"], check=True,
                   timeout=900)
    wheel = next(out.glob("triton-3.5.0-*.whl"))
    with zipfile.ZipFile(wheel) as zf:
        return zf.read("triton/backends/nvidia/bin/ptxas")


def test_wiring_to_a_ptxas_that_rejects_sm121a_fails(engine, docker_engine, tmp_path):
    good = images.smoke("sm121")
    ptxas = _ptxas_12_8(tmp_path, "manylinux_2_27_aarch64")
    bad = images.derived(
        docker_engine, good.image_reference, "qualify-test/broken:old-ptxas",
        "COPY ptxas /opt/cuda-12.8/bin/ptxas\n"
        "ENV TRITON_PTXAS_PATH=/opt/cuda-12.8/bin/ptxas TRITON_PTXAS_BLACKWELL_PATH=/opt/cuda-12.8/bin/ptxas",
        {"ptxas": ptxas}, tmp_path, "linux/arm64")
    checks = statuses(_probe(engine, bad, "sm121"))
    assert checks["triton.ptxas-wiring"]["status"] == "fail"
    assert "/opt/cuda-12.8/bin/ptxas" in checks["triton.ptxas-wiring"]["reason"]
    assert checks["triton.ptxas-assembles"]["status"] == "fail"
    compile_check = checks["triton.cross-compile"]
    assert compile_check["status"] == "fail"
    # Triton 3.5 itself stops at ptxas ('Value sm_121a is not defined'); Triton 3.8 derives the PTX version
    # from that ptxas (12.8 -> PTX 8.7) and LLVM refuses sm_121a first. Both name the cause.
    reason = compile_check["reason"]
    assert "sm_121a" in reason and ("not defined" in reason or "does not support target" in reason), reason


@pytest.mark.parametrize("arch_list,found", [("8.0", "sm_80"), ("12.0a", "sm_120a")])
def test_extension_without_code_for_sm121_fails(engine, docker_engine, arch_list, found):
    name = "sm121-only-" + arch_list.replace(".", "")
    record = images.variant("sm121", name, torch_cuda_arch_list=arch_list)
    checks = statuses(_probe(engine, record.image_reference, "sm121"))
    ext = checks["census.smoke-extension"]
    assert ext["status"] == "fail" and found in ext["reason"] and "sm_121" in ext["reason"]
    serving = checks["census.serving-path"]
    assert serving["status"] == "fail" and "libsmoke_ext.so" in serving["reason"] and "no runnable code" in serving["reason"]


def test_probe_boundary_no_torch_triton_or_vllm_in_the_probe_process():
    code = ("import sys; from qualify.probe import runner, census_check, triton_checks, gpu, versions; "
            "from qualify.probe import cli; "
            "bad = [m for m in sys.modules if m.split('.')[0] in ('torch', 'triton', 'vllm', 'flashinfer', 'numpy')]; "
            "print(bad)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert out.stdout.strip() == "[]", out.stderr


def test_host_probe_writes_a_statement_without_gpu(tmp_path):
    """`python -m qualify probe` directly on a host (the GPU-evidence path), here with no GPU."""
    out = tmp_path / "host.json"
    proc = subprocess.run([sys.executable, "-m", "qualify", "probe", "--target", "sm120", "--only", "gpu", "--out",
                           str(out)], capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 3, proc.stderr  # incomplete: required GPU checks did not run
    doc = manifest.load(out)
    jsonschema.validate(doc, SCHEMA)
    p = manifest.predicate(doc)
    assert p["verdict"] == "incomplete" and p["support_level"] == "unverified"
    assert manifest.subject_name(doc).startswith("host:")


def test_the_probe_decodes_inside_the_image_with_the_decoders_staged_for_its_interpreter(qualified):
    """Issue 29, item 1: the census inside an image reads compressed containers as the host's does. The
    decoders (zstandard, lz4) are staged for the image's own python3, on amd64 and under arm64 emulation."""
    record, doc = qualified
    p = manifest.predicate(doc)
    assert p["census"]["decoders"] == {"zstd": True, "lz4": True}
    assert not [lib for lib in p["census"]["libraries"] if lib.get("undecodable")]
    machine = {"linux/amd64": "x86_64", "linux/arm64": "aarch64"}[record.platform]
    assert p["host"]["machine"] == machine


def test_an_image_without_python3_or_with_an_old_one_is_a_clear_error(engine, docker_engine, tmp_path):
    """The probe needs the image's own python3 (3.9+). A stand-in python3 (a shell script that answers as a
    3.8 interpreter would: a TEST DOUBLE, no Python 3.8 image can be made here) gives the version error."""
    from qualify.core.errors import EngineError

    base = images.smoke("sm120").image_reference
    bare = images.derived(docker_engine, base, "qualify-test/no-python:1",
                          "RUN rm -f /usr/bin/python3* /usr/local/bin/python3* /opt/venv/bin/python3*", {}, tmp_path,
                          "linux/amd64")
    old = images.derived(docker_engine, base, "qualify-test/python38:1",
                         "COPY python3 /usr/local/sbin/python3\nENV PATH=/usr/local/sbin:$PATH",
                         {"python3": b"#!/bin/sh\necho cpython-38-x86_64 3.8\n"}, tmp_path, "linux/amd64")
    try:
        with pytest.raises(EngineError, match="qualify-test/no-python:1: has no python3 on its PATH"):
            container.interpreter(engine, bare, "linux/amd64")
        with pytest.raises(EngineError, match="its python3 is 3.8; the probe needs 3.9 or newer"):
            container.interpreter(engine, old, "linux/amd64")
        assert container.interpreter(engine, base, "linux/amd64")[0] == "cpython-311-x86_64"
    finally:
        subprocess.run([docker_engine, "rmi", bare, old], capture_output=True)


@pytest.mark.parametrize("said,words", [
    ("Error response from daemon: pull access denied for ghcr.io/acme/sm120, repository does not exist or may "
     "require 'docker login': denied: requested access to the resource is denied", "docker login ghcr.io"),
    ("docker: Error response from daemon: could not select device driver \"\" with capabilities: [[gpu]].",
     "NVIDIA container toolkit"),
])
def test_what_the_engine_said_is_named_not_a_missing_python3(said, words):
    """Issue 30, item 5: gpu-evidence said 'the image needs a python3' for missing credentials, then no driver."""
    problem = container._engine_problem(said, "ghcr.io/acme/sm120@sha256:" + "a" * 64)
    assert problem is not None and words in problem.hint and "python3" not in problem.message
