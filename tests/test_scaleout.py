"""Beyond one machine: the bake file, the release workflow, the GPU Jobs and merged evidence.

Every generated file is compared with a fresh generation from images/targets.toml
and run through its validator: a JSON Schema of bake's documented format,
actionlint, kubernetes-validate. Each validator is also shown a broken file,
so a validator that accepts everything cannot pass these tests.
"""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import yaml
from conftest import IN_CI, REPO

from qualify.config import targets
from qualify.core.errors import ConfigError
from qualify.host import paths
from qualify.imagebuild import image
from qualify.qualification.container import probe_sources_digest, probe_target
from qualify.scaleout import bake, k8s, merge, workflow, yamlout

TF = targets.load()
BAKE_SCHEMA = json.loads((REPO / "tests" / "schemas" / "docker-bake.subset.schema.json").read_text())
VENV_BIN = Path(sys.executable).parent
DIGEST_A = "sha256:" + "a" * 64
DIGEST_B = "sha256:" + "b" * 64


def _tool(name: str) -> str:
    found = shutil.which(name, path=f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}")
    if not found:
        if IN_CI:
            pytest.fail(f"CI=true and {name} is not installed: pip install -e '.[test]'")
        pytest.skip(f"{name} is not installed (pip install -e '.[test]')")
    return found


# --- bake ----------------------------------------------------------------------


def test_the_committed_bake_file_is_the_targets_files():
    assert (REPO / "docker-bake.json").read_text() == bake.dumps(bake.generate(TF)), \
        "docker-bake.json is stale: run `nox -s bake`"


def test_generation_is_byte_stable():
    assert bake.dumps(bake.generate(TF)) == bake.dumps(bake.generate(targets.load()))


@pytest.mark.parametrize("bt", bake.bake_targets(TF), ids=lambda bt: bt.name)
def test_each_bake_target_is_exactly_what_the_build_passes(bt):
    """Arguments, labels, platform, stage and Dockerfile of `nox -s build-<target>` (its --dry-run plan)."""
    values = bake.current_variables()
    resolved = bake.resolve(bake.generate(TF), bt.name, values)
    plan = image.plan(TF, image.BuildOptions(target=bt.target.name, base="pinned", profile=bt.profile,
                                             source_date_epoch=values["SOURCE_DATE_EPOCH"]))
    assert resolved["args"] == plan.build_args
    assert resolved["labels"] == plan.labels
    assert resolved["platforms"] == [plan.platform]
    assert resolved["target"] == plan.profile
    assert resolved["dockerfile"] == "Dockerfile"  # stage_context puts images/Dockerfile at the context's root
    assert resolved["tags"] == [f"{values['REGISTRY']}/{image.image_repository(bt.target)}:{bt.profile}-pinned"]
    assert set(resolved["attest"]) == {"type=provenance,mode=max", "type=sbom"}
    assert resolved["cache-from"] and resolved["cache-to"][0].startswith(resolved["cache-from"][0])


def test_the_bake_file_matches_bakes_documented_format():
    doc = json.loads((REPO / "docker-bake.json").read_text())
    jsonschema.Draft202012Validator(BAKE_SCHEMA).validate(doc)
    names = set(doc["target"]) | set(doc["group"])
    for group in doc["group"].values():
        assert set(group["targets"]) <= names
    for block in doc["target"].values():
        assert set(block.get("inherits", [])) <= set(doc["target"])
    used = set(re.findall(r"(?<!\$)\$\{([A-Za-z_][A-Za-z0-9_]*)\}", json.dumps(doc)))
    assert used == set(doc["variable"]), "every ${VAR} is declared and every declared variable is used"


@pytest.mark.parametrize("breakage", ["platform", "cache_from", "bad-group"])
def test_the_bake_schema_refuses_what_bake_would(breakage):
    doc = copy.deepcopy(bake.generate(TF))
    t = doc["target"]["sm120-vllm"]
    if breakage == "platform":
        t["platform"] = t.pop("platforms")  # bake's attribute is `platforms`
    elif breakage == "cache_from":
        t["cache_from"] = t.pop("cache-from")
    else:
        doc["group"]["vllm"] = {"targets": "sm120-vllm"}  # a list, not a string
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft202012Validator(BAKE_SCHEMA).validate(doc)


def test_a_group_per_profile_and_shared_settings_by_inheritance():
    doc = bake.generate(TF)
    for profile in targets.PROFILES:
        assert doc["group"][profile]["targets"] == [f"{n}-{profile}" for n, t in TF.targets.items() if profile in t.profiles]
    assert all(doc["target"][bt.name]["inherits"] == [bake.COMMON] for bt in bake.bake_targets(TF))
    common = doc["target"][bake.COMMON]["args"]
    for bt in bake.bake_targets(TF):  # the GPU targets share today's base pin; the cpu target has its own
        assert "BASE_IMAGE" in {**common, **doc["target"][bt.name].get("args", {})}


def test_a_label_value_with_a_template_sign_stays_literal():
    assert bake._fill({"x": bake._escape("a ${b} %{c}")}, {}) == {"x": "a ${b} %{c}"}


def test_check_names_the_stale_file(tmp_path):
    stale = tmp_path / "docker-bake.json"
    stale.write_text("{}\n")
    with pytest.raises(ConfigError, match="docker-bake.json is not what .*targets.toml gives"):
        bake.check(stale, TF)


def test_record_from_bake_metadata(tmp_path, monkeypatch):
    from qualify.scaleout import bakestage

    monkeypatch.setattr(paths, "HERE", paths.Checkout(tmp_path))
    meta = tmp_path / "meta.json"
    meta.write_text(json.dumps({"sm120-vllm": {"containerimage.digest": DIGEST_A,
                                               "containerimage.config.digest": DIGEST_B}}))
    values = {**bake.current_variables(), "REGISTRY": "ghcr.io/org"}
    path = bakestage.record(TF, bake.BakeTarget(TF.get("sm120"), "vllm"), meta, values)
    rec = image.load_record("sm120", "vllm", "pinned")
    assert path.exists() and rec.image_reference == f"ghcr.io/org/blackwell/sm120@{DIGEST_A}"
    assert rec.labels == image.plan(TF, image.BuildOptions(target="sm120", source_date_epoch=values["SOURCE_DATE_EPOCH"])).labels
    with pytest.raises(ConfigError, match="no containerimage.digest for bake target 'sm121-vllm'"):
        bakestage.record(TF, bake.BakeTarget(TF.get("sm121"), "vllm"), meta, values)


# --- the release workflow -------------------------------------------------------


def test_the_committed_workflow_is_the_targets_files():
    for path, text in workflow.files(TF).items():
        assert path.read_text() == text, f"{path} is stale: run `nox -s workflow`"


def test_the_workflow_follows_the_targets_file():
    doc = yaml.safe_load(workflow.WORKFLOW_FILE.read_text())
    build = doc["jobs"]["build"]
    include = build["strategy"]["matrix"]["include"]
    assert [m["target"] for m in include] == list(TF.targets)
    for m in include:  # arm64 targets on arm64 runners: native, no qemu
        assert m["runner"].endswith("-arm") == (TF.get(m["target"]).platform == "linux/arm64")
    assert build["permissions"]["id-token"] == "write"
    run = "\n".join(s.get("run", "") for s in build["steps"])
    assert "--keyless" in run and "docker buildx bake -f docker-bake.json --push" in run
    assert "qemu" not in json.dumps(doc)
    assert "gpu-cpu" not in doc["jobs"]  # a cpu target has no GPU checks: its build job is all it has
    for t in (t for t in TF.targets.values() if not t.is_cpu):
        job = doc["jobs"][f"gpu-{t.name}"]
        assert "self-hosted" in job["runs-on"] and f"cuda-capability-{t.capability}" in job["runs-on"]
        # The evidence is signed keyless with the job's identity: what promote counts once it is enrolled.
        assert job["permissions"]["id-token"] == "write"
        gpu_run = "\n".join(s.get("run", "") for s in job["steps"])
        signing = 'qualify sign "evidence/$TARGET.$RUNNER_NAME.json" --keyless'
        assert gpu_run.index("qualify gpu-evidence") < gpu_run.index(signing)
    promote = "\n".join(s.get("run", "") for s in doc["jobs"]["promote"]["steps"])
    assert 'python -m qualify promote "$GITHUB_REF_NAME" --key "$RUNNER_TEMP/cosign.key"' in promote
    assert "--hosts manifests/hosts.json --evidence evidence/*.json" in promote


def test_actionlint_passes_the_workflow():
    exe = _tool("actionlint")
    out = subprocess.run([exe, "-config-file", str(workflow.ACTIONLINT_CONFIG), str(workflow.WORKFLOW_FILE)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr


def test_actionlint_catches_a_broken_workflow(tmp_path):
    exe = _tool("actionlint")
    doc = workflow.generate(TF)
    doc["jobs"]["gpu-sm120"]["needs"] = "no-such-job"
    broken = tmp_path / ".github" / "workflows" / "release.yml"
    broken.parent.mkdir(parents=True)
    broken.write_text(yamlout.dumps(doc))
    out = subprocess.run([exe, "-config-file", str(workflow.ACTIONLINT_CONFIG), str(broken)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode != 0 and "no-such-job" in out.stdout


def test_the_yaml_writer_round_trips():
    for doc in (workflow.generate(TF), {"a": ["yes", "on", "1.0", "x: y", "#", "", None, True, 3, "l1\nl2\n", "l1\nl2"]}):
        assert yaml.safe_load(yamlout.dumps(doc)) == doc


# --- Kubernetes -----------------------------------------------------------------


def _job(name: str, **kw) -> k8s.GpuJob:
    return k8s.job_for(TF.get(name), f"ghcr.io/org/blackwell/{name}@{DIGEST_A}", probe_sources_digest(), **kw)


def _validate(path: Path) -> subprocess.CompletedProcess:
    exe = _tool("kubernetes-validate")
    return subprocess.run([exe, "--strict", str(path)], capture_output=True, text=True, timeout=120)


GPU_TARGETS = [n for n, t in TF.targets.items() if not t.is_cpu]


def test_a_cpu_target_has_no_gpu_job():
    with pytest.raises(ConfigError, match="cpu target: no GPU checks apply"):
        k8s.job_for(TF.get("cpu"), "127.0.0.1:5555/blackwell/cpu@sha256:" + "a" * 64, "0" * 64)


@pytest.mark.parametrize("name", GPU_TARGETS)
def test_each_targets_job_passes_kubernetes_validate(tmp_path, name):
    path = tmp_path / f"{name}.yaml"
    path.write_text(k8s.dumps(_job(name, namespace="gpu-qualify")))
    out = _validate(path)
    assert out.returncode == 0 and out.stdout.count("passed") == 2, out.stdout + out.stderr


def test_kubernetes_validate_refuses_a_broken_job(tmp_path):
    docs = k8s.manifests(_job("sm120"))
    docs[1]["spec"]["template"]["spec"]["containers"][0]["resourcez"] = {}  # unknown field
    path = tmp_path / "broken.yaml"
    path.write_text(yamlout.dumps_all(docs))
    assert _validate(path).returncode != 0


@pytest.mark.parametrize("name", GPU_TARGETS)
def test_the_job_follows_the_targets_file(name):
    t = TF.get(name)
    policy, job = yaml.safe_load_all(k8s.dumps(_job(name)))
    pod = job["spec"]["template"]
    spec = pod["spec"]
    assert spec["nodeSelector"] == {"nvidia.com/gpu.compute.major": str(t.capability.major),
                                    "nvidia.com/gpu.compute.minor": str(t.capability.minor),
                                    "kubernetes.io/arch": t.arch_tag}
    probe = spec["containers"][0]
    assert probe["resources"]["limits"] == {"nvidia.com/gpu": 1}
    assert probe["image"] == f"ghcr.io/org/blackwell/{name}@{DIGEST_A}"
    env = {e["name"]: e["value"] for e in probe["env"]}
    assert json.loads(env["QUALIFY_TARGET_JSON"]) == json.loads(probe_target(t, None).to_json())
    assert "python3 -m qualify.probe --target-json \"$QUALIFY_TARGET_JSON\" --only gpu" in probe["command"][2]
    assert spec["initContainers"][0]["image"].startswith("ghcr.io/org/blackwell/qualify-probe:probe-")
    # deny all: both policy types, no rules, selecting exactly this pod
    assert policy["spec"]["policyTypes"] == ["Ingress", "Egress"]
    assert "ingress" not in policy["spec"] and "egress" not in policy["spec"]
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()


def test_a_job_needs_the_image_by_digest():
    with pytest.raises(ConfigError, match="not pinned by digest"):
        k8s.job_for(TF.get("sm120"), "ghcr.io/org/blackwell/sm120:v1", probe_sources_digest())


def test_the_pods_command_runs_the_probe_and_frames_its_evidence(tmp_path):
    """The container's script, run here with this checkout as the staged probe (no GPU: gpu checks not-run)."""
    job = _job("sm120")
    container = k8s.manifests(job)[1]["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e["value"] for e in container["env"]}
    env.update(PYTHONPATH=str(REPO), EVIDENCE_DIR=str(tmp_path), TERMINATION_LOG=str(tmp_path / "termination-log"),
               PATH=f"{VENV_BIN}{os.pathsep}{os.environ['PATH']}", CUDA_VISIBLE_DEVICES="")
    out = subprocess.run(container["command"], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode in (0, 1, 3), out.stderr
    log = tmp_path / "pod.log"
    log.write_text(out.stderr + out.stdout)  # kubectl logs gives both streams
    (ev,) = merge.parse(log)
    assert ev.digest == DIGEST_A and ev.target == "sm120"
    assert json.loads((tmp_path / "termination-log").read_text())["verdict"] in ("pass", "warn", "fail", "incomplete")


# --- merge ----------------------------------------------------------------------


REAL = REPO / "manifests" / "evidence" / "h200" / "probe-sm120.json"


def _statement(tmp_path: Path, name: str, digest: str, target: str = "sm120", created: str = "2026-11-30T00:00:00Z") -> Path:
    from qualify.core import manifest

    doc = json.loads(REAL.read_text())
    doc = manifest.statement(f"ghcr.io/org/blackwell/{target}", digest,
                             {**doc["predicate"], "created": created,
                              "target": {**doc["predicate"]["target"], "name": target}})
    path = tmp_path / name
    path.write_bytes(manifest.dumps(doc))
    return path


def test_merge_counts_the_same_evidence_once(tmp_path):
    a = _statement(tmp_path, "host1.json", DIGEST_A)
    copy_ = tmp_path / "sub" / "host1-again.json"
    copy_.parent.mkdir()
    copy_.write_text(json.dumps(json.loads(a.read_text())))  # same content, other spelling
    other = _statement(tmp_path, "host2.json", DIGEST_A, created="2026-11-30T01:00:00Z")
    merged = merge.merge([tmp_path])
    assert len(merged.evidence) == 2 and len(merged.duplicates) == 1
    written = merge.write(merged, tmp_path / "out")
    assert sorted(p.read_bytes() for p in written) == sorted([a.read_bytes(), other.read_bytes()])
    assert merge.write(merge.merge([tmp_path / "host1.json", tmp_path / "host2.json"]), tmp_path / "out")  # again: same files


def test_merge_refuses_two_images_for_one_target_naming_both(tmp_path):
    a = _statement(tmp_path, "a.json", DIGEST_A)
    b = _statement(tmp_path, "b.json", DIGEST_B)
    with pytest.raises(merge.MergeError) as err:
        merge.merge([a, b])
    text = str(err.value)
    assert str(a) in text and str(b) in text and DIGEST_A in text and DIGEST_B in text


def test_merge_keeps_targets_apart_and_takes_real_host_evidence(tmp_path):
    a = _statement(tmp_path, "a.json", DIGEST_A)
    b = _statement(tmp_path, "b.json", DIGEST_B, target="sm121")
    h200x2 = REPO / "manifests" / "evidence" / "h200x2" / "probe-sm120.json"
    merged = merge.merge([a, b, REAL, h200x2])
    assert len(merged.evidence) == 4
    assert sum(e.is_host for e in merged.evidence) == 2


def test_merge_refuses_what_is_not_evidence(tmp_path):
    bad = tmp_path / "x.json"
    bad.write_text('{"schema": "https://blackwell-qualify.dev/gpu-evidence/v1"}')
    with pytest.raises(merge.MergeError, match="x.json: not a probe manifest"):
        merge.merge([bad])
    broken = _statement(tmp_path, "broken.json", DIGEST_A)
    doc = json.loads(broken.read_text())
    doc["predicate"]["verdict"] = "great"
    broken.write_text(json.dumps(doc))
    with pytest.raises(merge.MergeError, match="broken.json: manifest does not match"):
        merge.merge([broken])


def test_merge_will_not_mix_into_a_directory_of_other_files(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "promote-me.json").write_text("{}")
    with pytest.raises(merge.MergeError, match="holds files this merge did not make: promote-me.json"):
        merge.write(merge.merge([_statement(tmp_path, "a.json", DIGEST_A)]), out)


# --- the command line -----------------------------------------------------------


def _cli(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "qualify", *args], capture_output=True, text=True, cwd=cwd, timeout=120)


def test_cli_checks_pass_on_the_committed_files():
    for args in (("bake", "--check"), ("workflow", "--check")):
        out = _cli(*args)
        assert out.returncode == 0, out.stderr


def test_cli_merge_prints_what_promote_takes(tmp_path):
    _statement(tmp_path, "a.json", DIGEST_A)
    out = _cli("merge", str(tmp_path), "--out", str(tmp_path / "merged"))
    assert out.returncode == 0, out.stderr
    files = out.stdout.split()
    assert len(files) == 1 and Path(files[0]).parent == tmp_path / "merged"
    bad = _cli("merge", str(tmp_path / "a.json"), str(_statement(tmp_path, "b.json", DIGEST_B)), "--out", str(tmp_path / "m2"))
    assert bad.returncode != 0 and "two images" in bad.stderr


def test_cli_k8s_refuses_an_unknown_target():
    out = _cli("k8s", "sm999", "--image", f"r/x@{DIGEST_A}")
    assert out.returncode != 0 and "no target named 'sm999'" in out.stderr


def test_a_log_of_the_jobs_container_on_a_real_gpu_host_merges():
    """tests/scaleout/h200-job-container.log: the Job container's env and command (h200-job-container.sh,
    generated by k8s.py) run on the lent 2 x H200 host's torch venv, outside Kubernetes and outside any image.
    H200 is 9.0, so it is no evidence for sm120, and the bare venv has no allocator hook (gpu.triton-scratch
    fails): what it shows is that the script runs the probe on a GPU and frames its Statement for merge."""
    log = REPO / "tests" / "scaleout" / "h200-job-container.log"
    (ev,) = merge.parse(log)
    assert ev.target == "sm120" and ev.digest == DIGEST_A
    pred = json.loads(ev.data)["predicate"]
    assert pred["gpu"]["visible"] and pred["verdict"] == "fail"
    assert {c["id"]: c["status"] for c in pred["checks"]}["gpu.nccl-allreduce"] == "pass"


def test_stage_lays_out_the_builds_own_context_at_the_bake_files_path(tmp_path, monkeypatch):
    from qualify.imagebuild import wheelhouse
    from qualify.scaleout import bakestage

    bt = bake.BakeTarget(TF.get("sm121"), "smoke")
    lock = bt.target.lock_path("smoke", bt.target.base.python)
    pins = wheelhouse.parse_lock(lock)
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    for pin in pins:  # a stand-in wheel file per pin: no download here
        (wheels / f"{pin.name.replace('-', '_')}-{pin.version}-py3-none-any.whl").write_bytes(b"wheel")
    monkeypatch.setattr(wheelhouse, "prepare", lambda lock, platform, python, sources=None: wheels)
    monkeypatch.setattr(paths, "STATE_DIR", tmp_path / "state")
    monkeypatch.setattr(bakestage, "REPO_ROOT", tmp_path / "repo")
    link = bakestage.stage(TF, bt)
    assert link == tmp_path / "repo" / bt.context and link.is_symlink()
    assert (link / "Dockerfile").read_bytes() == (REPO / "images" / "Dockerfile").read_bytes()
    # The layout `nox -s build-<target>` stages: per payload layer of [build] its wheels and its lock slice.
    slots = sorted((link / "payload").iterdir())
    assert len(slots) == image.payload_slots()
    listed = "".join((slot / "requirements.txt").read_text() for slot in slots)
    assert sorted(line.split("==")[0] for line in listed.splitlines()) == sorted(p.name for p in pins)
    assert len([w for slot in slots for w in slot.glob("*.whl")]) == len(pins)
    assert (link / "runtime-user" / "add-user.sh").is_file()


def test_cli_gpu_evidence_wants_the_image_by_digest(tmp_path):
    out = _cli("gpu-evidence", "sm120", "--image", "ghcr.io/org/blackwell/sm120:v1", "--out", str(tmp_path / "e.json"))
    assert out.returncode != 0 and "not pinned by digest" in out.stderr


def test_the_committed_h200_evidence_travels_signed_by_an_enrolled_test_host(tmp_path):
    """The committed H200 probe manifests are signed by tests/keys/test-gpu-host (a labelled TEST key): merge
    carries the signatures, and an enrolled-hosts list naming that key recognises who signed them."""
    from qualify.release import evidence as ev
    from qualify.trust import records
    from qualify.trust.verify import TrustedKey

    merged = merge.merge([REAL, REPO / "manifests" / "evidence" / "h200x2" / "probe-sm120.json"])
    written = merge.write(merged, tmp_path / "out")
    key = TrustedKey.read(REPO / "tests" / "keys" / "test-gpu-host.pub")
    hosts = records.EnrolledHosts(1, (records.EnrolledHost("test-gpu-host", key_pem=key.pem.decode(),
                                                           fingerprint=key.fingerprint),))
    for path in written:
        sig, bundle = path.with_name(path.name + ".sig"), path.with_name(path.name + ".sigstore.json")
        assert sig.is_file() and bundle.is_file()
        assert ev.signed_by(hosts, path.read_bytes(), sig.read_bytes(), bundle.read_bytes()) == ("test-gpu-host", "")
    other = records.EnrolledHosts(1, ())
    assert ev.signed_by(other, written[0].read_bytes(), None, None)[0] == ""


def test_the_probe_bundle_carries_the_decoders_for_the_images_interpreters(tmp_path, monkeypatch):
    """Issue 29: the Kubernetes Job's probe decodes compressed containers too: the bundle carries zstandard and
    lz4 for the targets' interpreters on both platforms, and the Job names them (QUALIFY_STAGED)."""
    from qualify.scaleout import bakestage

    monkeypatch.setattr(bakestage, "REPO_ROOT", tmp_path / "repo")
    bundle = bakestage.stage_probe()
    for tag in ("cpython-311-x86_64", "cpython-312-x86_64", "cpython-311-aarch64", "cpython-312-aarch64"):
        assert (bundle / "staged" / tag / "zstandard").is_dir() and (bundle / "staged" / tag / "lz4").is_dir(), tag
    assert (bundle / "qualify" / "probe" / "decoders.lock").is_file()
    container = k8s.manifests(_job("sm120"))[1]["spec"]["template"]["spec"]["containers"][0]
    assert {"name": "QUALIFY_STAGED", "value": "/probe/staged"} in container["env"]


def test_the_pod_signs_its_evidence_with_the_key_its_secret_mounts_and_merge_keeps_the_signature(tmp_path):
    """Issue 27: every evidence path can sign. The Job's container script, run here as the pod runs it (this
    checkout as the staged probe, no GPU), signs with an EC P-256 key (what the Secret would mount) through
    probe/sign.py and the cryptography staged for this interpreter; merge reads the signature block and the
    enrolled cluster key recognises it."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    from qualify.probe import staged
    from qualify.qualification import staging
    from qualify.release import evidence as ev
    from qualify.trust import records
    from qualify.trust.verify import TrustedKey

    key = ec.generate_private_key(ec.SECP256R1())
    pem = tmp_path / "key.pem"
    pem.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                      serialization.NoEncryption()))
    public = key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    assert staging.stage(staged.tag()) is not None  # cryptography for this interpreter, as the bundle carries it
    job = _job("sm120")
    container = k8s.manifests(job)[1]["spec"]["template"]["spec"]["containers"][0]
    assert {"name": "SIGNING_KEY", "value": "/signing/key.pem"} in container["env"]
    env = {e["name"]: e["value"] for e in container["env"]}
    env.update(PYTHONPATH=str(REPO), EVIDENCE_DIR=str(tmp_path), TERMINATION_LOG=str(tmp_path / "termination-log"),
               PATH=f"{VENV_BIN}{os.pathsep}{os.environ['PATH']}", CUDA_VISIBLE_DEVICES="", SIGNING_KEY=str(pem),
               QUALIFY_STAGED=str(staging.root()))
    out = subprocess.run(container["command"], env=env, capture_output=True, text=True, timeout=300)
    log = tmp_path / "pod.log"
    log.write_text(out.stderr + out.stdout)
    assert k8s.SIG_BEGIN in out.stdout, out.stderr[-2000:]
    (found,) = merge.parse(log)
    hosts = records.EnrolledHosts(1, (records.EnrolledHost("k8s-lab", key_pem=public.decode(),
                                                           fingerprint=TrustedKey.from_bytes(public, "k").fingerprint),))
    assert found.signature and ev.signed_by(hosts, found.data, found.signature, None) == ("k8s-lab", "")
    written = merge.write(merge.merge([log]), tmp_path / "merged")
    assert written[0].with_name(written[0].name + ".sig").read_bytes() == found.signature
