"""Issue 52: the deploy reads only .env and the verified release. `qualify release` signs the target facts the
deploy needs (release.json policy.deploy, trust/deployfacts.py); start.sh takes the GPU's target, its driver
floor, memory and user from there, never from the checkout's images/targets.toml (deploy/signed.py)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from deploy_host import RTX5090, released

from qualify.config import targets
from qualify.core.errors import VerificationError
from qualify.trust import deployfacts, policy, records

REPO = Path(__file__).resolve().parent.parent


def _policy_doc(released_targets=("sm120",)):
    tf = targets.load()
    chosen = [tf.get(t) for t in released_targets] + [t for t in tf.cpu_targets() if t.name not in released_targets]
    return policy.for_release({t: "baseline" for t in released_targets}, 7, tf.allreduce_floors,
                              tf.promotion_level_checks, tf.ptx_jit,
                              deployfacts.of_targets(chosen, tf.drivers)).as_json()


def _parse(doc, released_targets=("sm120",)):
    return policy.ReleasePolicy.parse(records.Fields(doc, "release.json: policy"), list(released_targets))


def test_release_signs_the_deploy_facts_and_reads_them_back_strictly():
    tf = targets.load()
    doc = _policy_doc()
    read = _parse(doc).deploy
    sm120, cpu = read.get("sm120"), read.get("cpu")
    want = tf.get("sm120")
    assert (sm120.capability, sm120.platform, sm120.cuda, sm120.driver_floor, sm120.runtime, sm120.user) == \
        (want.capability, want.platform, want.cuda, want.driver_floor, want.runtime, want.user)
    assert dict(sm120.triton_env) == want.triton_env and sm120.torch_cuda_arch_list == want.torch_cuda_arch_list
    assert cpu.is_cpu and cpu.runtime == tf.get("cpu").runtime and cpu.capability is None
    assert read.driver_table == dict(tf.drivers)
    assert "deploy" in policy.ENFORCED
    assert [t.name for t in read.targets] == ["cpu", "sm120"]  # the released target and the cpu target only
    # a release without the facts keeps the bytes it had before issue 52 (and the deploy refuses it)
    assert "deploy" not in policy.for_release({"sm120": "baseline"}, 7).as_json()


def _edited(doc, edit):
    doc = json.loads(json.dumps(doc))
    edit(doc["deploy"])
    return doc


@pytest.mark.parametrize("edit,words", [
    (lambda d: d["targets"].pop(1), "sm120 missing"),  # the released target's facts removed
    (lambda d: d["targets"][1].update(driver_floor="580"), None),  # a short driver version is still one
    (lambda d: d["targets"][1].update(driver_floor="newest"), "not an NVIDIA driver version"),
    (lambda d: d["targets"][1].update(accelerator="rocm"), "accelerator 'rocm' is not one"),
    (lambda d: d["targets"][1].update(platform="linux/riscv64"), "platform 'linux/riscv64'"),
    (lambda d: d["targets"][1]["runtime"].update(gpu_memory_utilization=1.5), "between 0 and 1"),
    (lambda d: d["targets"][1]["runtime"].update(host_reserve_gib=8.0), "host_reserve_gib"),
    (lambda d: d["targets"][1]["user"].update(uid=-1), "uid"),
    (lambda d: d["targets"][1].update(extra=1), "keys this toolkit does not write"),
    (lambda d: d["targets"][0].update(cuda="13.0"), "a cpu target has capability 'cpu', and no CUDA"),
    (lambda d: d["drivers"].append(dict(d["drivers"][0])), "names one CUDA version twice"),
    (lambda d: d["targets"].append(dict(d["targets"][1], target="sm100")), "sm100 is not"),  # not released
])
def test_deploy_facts_that_a_release_does_not_write_are_refused(edit, words):
    doc = _edited(_policy_doc(), edit)
    if words is None:
        assert _parse(doc).deploy.get("sm120").driver_floor.parts[0] == 580
        return
    with pytest.raises(VerificationError, match=words):
        _parse(doc)


def test_a_toolkit_that_does_not_apply_the_facts_refuses_a_release_that_signs_them(monkeypatch):
    monkeypatch.setattr(policy, "ENFORCED", frozenset({"level_checks", "allreduce_floors", "ptx_jit"}))
    with pytest.raises(VerificationError, match="sets deploy, which this toolkit does not apply"):
        _parse(_policy_doc())


# --- the deploy: a checkout's targets file steers nothing --------------------------------------------------

TOOLKIT = ("start.sh", "scripts", "qualify", "images", ".env.example", "pyproject.toml")


def _toolkit_copy(dest: Path) -> Path:
    """This toolkit as a deploy host's checkout has it, to edit its images/targets.toml."""
    dest.mkdir()
    for name in TOOLKIT:
        src = REPO / name
        if src.is_dir():
            shutil.copytree(src, dest / name, ignore=shutil.ignore_patterns("__pycache__"), symlinks=True)
        else:
            shutil.copy2(src, dest / name)
    return dest


def _start(toolkit: Path, host, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH"}}
    env.update(QUALIFY_PYTHON=sys.executable, STANDIN_GPUS=RTX5090,
               PATH=f"{host.root / 'bin'}{os.pathsep}{os.environ['PATH']}")
    return subprocess.run([str(toolkit / "start.sh"), *args, "--env-file", str(host.env_file)], env=env,
                          capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)


def _facts_lines(err: str):
    return [line.split("] ", 1)[-1] for line in err.splitlines()
            if any(w in line for w in ("target: ", "driver: ", "memory: ", "trust gate: passed"))]


def test_a_deploy_hosts_edited_targets_file_changes_nothing(host, docker_engine, tmp_path):
    released(host)
    plain = _start(_toolkit_copy(tmp_path / "plain"), host, "--dry-run", "--allow-no-gpu-runtime")
    assert plain.returncode == 0, plain.stderr[-3000:]
    edited = _toolkit_copy(tmp_path / "edited")
    tf_path = edited / "images" / "targets.toml"
    text = tf_path.read_text()
    # sm120 made another GPU's target (the RTX 5090's 12.0 then matches none), a fraction and a minimum it fails
    text = text.replace('[defaults.runtime]\ngpu_memory_utilization = 0.90\n', '[defaults.runtime]\n'
                        'gpu_memory_utilization = 0.55\n').replace('min_gpu_memory_gib = 16', 'min_gpu_memory_gib = 4000')
    start = text.index("[targets.sm120]")
    text = text[:start] + text[start:].replace('capability = "12.0"', 'capability = "12.1"', 1).replace(
        'torch_cuda_arch_list = "12.0;12.0a"', 'torch_cuda_arch_list = "12.1;12.1a"', 1)
    tf_path.write_text(text)
    steered = targets.load(tf_path)  # the edit is one the targets file's reader takes: had the deploy read it...
    assert (str(steered.get("sm120").capability), steered.get("sm120").runtime.gpu_memory_utilization,
            steered.get("sm120").runtime.min_gpu_memory_gib) == ("12.1", 0.55, 4000)
    same = _start(edited, host, "--dry-run", "--allow-no-gpu-runtime")
    assert same.returncode == 0, same.stderr[-3000:]
    assert same.stdout == plain.stdout  # the very compose file: gpu_memory_utilization 0.9 as the release signs
    assert _facts_lines(same.stderr) == _facts_lines(plain.stderr)
    assert "target: sm120 (signed in release v1.0.0's policy)" in same.stderr
    assert "gpu_memory_utilization 0.9" in same.stderr and "0.55" not in same.stderr


def test_a_release_signed_before_the_deploy_facts_is_refused(host, docker_engine, monkeypatch):
    from qualify.trust import deployfacts

    monkeypatch.setattr(deployfacts, "of_targets", lambda *a: None)  # as a toolkit before issue 52 signed
    released(host)
    done = host.run("start.sh", "--dry-run", "--allow-no-gpu-runtime", "--allow-unqualified")
    assert done.returncode == 4, done.stderr[-3000:]
    assert "release v1.0.0" in done.stderr and "was signed before releases carried the deploy facts" in done.stderr
    assert "re-release with this toolkit" in done.stderr
    assert "target: sm120" not in done.stderr and "memory:" not in done.stderr  # no target fact was used
