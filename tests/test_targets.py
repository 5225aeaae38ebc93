"""The targets file: validated strictly on load, refusals name the file, target and key."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from qualify.config import targets
from qualify.core.errors import ConfigError
from qualify.imagebuild import wheelhouse

REPO = Path(__file__).resolve().parent.parent
FILE = REPO / "images" / "targets.toml"


def qualify(*args, cwd=REPO):
    return subprocess.run([sys.executable, "-m", "qualify", *args], capture_output=True, text=True, cwd=cwd, timeout=60)


def edited(tmp_path, old, new, count=1):
    text = FILE.read_text()
    assert old in text, old
    path = tmp_path / "targets.toml"
    path.write_text(text.replace(old, new, count))
    return path


def test_repo_targets_file_is_valid():
    tf = targets.load(FILE)
    assert set(tf.targets) == {"sm100", "sm103", "sm120", "sm121", "sm100-arm64", "cpu"}
    assert tf.get("sm121").platform == "linux/arm64" and str(tf.get("sm121").capability) == "12.1"
    assert tf.get("sm121").runtime.unified_memory and tf.get("sm121").runtime.gpu_memory_utilization < 0.9
    assert all(t.base.image.pinned for t in tf.targets.values())
    # defaults are inherited, overrides win
    assert tf.get("sm120").triton.ptxas_blackwell == "/usr/local/cuda/bin/ptxas"
    assert tf.get("sm120").runtime.gpu_memory_utilization == 0.9


def test_cli_check_passes_on_the_repo_file():
    out = qualify("targets", "check", str(FILE))
    assert out.returncode == 0, out.stderr


def test_floating_tag_is_refused_naming_target_and_tag(tmp_path):
    pinned = str(targets.load(FILE).get("sm120").base.image)
    text = FILE.read_text()
    start = text.index("[targets.sm120.base]")
    bad = tmp_path / "targets.toml"
    bad.write_text(text[:start] + text[start:].replace(pinned, pinned.split("@")[0], 1))
    out = qualify("targets", "check", str(bad))
    assert out.returncode == ConfigError.exit_code
    assert "sm120" in out.stderr and "nvidia/cuda:13.0.1-devel-ubuntu24.04" in out.stderr and "floating tag" in out.stderr
    assert str(bad) in out.stderr


@pytest.mark.parametrize("old,new,words", [
    ('torch_cuda_arch_list = "12.1;12.1a"', 'torch_cuda_arch_list = "12.0"', ["sm121", "torch_cuda_arch_list", "12.1"]),
    ('torch_cuda_arch_list = "12.1;12.1a"', 'torch_cuda_arch_list = "12.1f"', ["sm121", "rejects 'f'"]),
    ('platform = "linux/arm64"\ncapability = "12.1"', 'platform = "linux/s390x"\ncapability = "12.1"',
     ["sm121", "platform", "linux/s390x"]),
    ('support_level = "experimental"', 'support_level = "supported"', ["sm121", "support_level"]),
    ('description = "DGX Spark', 'descripton = "x"\ndescription = "DGX Spark',
     ["sm121", "descripton", "did you mean 'description'"]),
    ('gpu_memory_utilization = 0.50', 'gpu_memory_utilization = 1.5', ["sm121", "gpu_memory_utilization"]),
    ('unified_memory = true', 'unified_memory = "yes"', ["sm121", "unified_memory", "bool"]),
    ('pinned = "2026-11-29"', 'pinned = "last week"', ["sm100", "pinned", "last week"]),
    ('schema = 1', 'schema = 2', ["schema"]),
    ('"13.0" = "580.65.06"', '"13.0" = "five-eighty"', ["[drivers]", "13.0", "five-eighty"]),
    ('cuda = "13.0"', 'cuda = "13.1"', ["sm120", "CUDA 13.1 has no driver floor in [drivers]"]),
    ('uid = 1000', 'uid = 0', ["user.uid", "never root"]),
    ('host_reserve_gib = 8', 'host_reserve_gib = -1', ["host_reserve_gib", "-1"]),
])
def test_bad_values_are_refused_with_names(tmp_path, old, new, words):
    bad = edited(tmp_path, old, new)
    with pytest.raises(ConfigError) as err:
        targets.load(bad)
    for word in words:
        assert word in str(err.value), (word, str(err.value))
    assert str(bad) in str(err.value)


def test_missing_file_and_bad_toml(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        targets.load(tmp_path / "nope.toml")
    broken = tmp_path / "t.toml"
    broken.write_text("[targets\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        targets.load(broken)


@pytest.mark.parametrize("code,expected", [("sm_120", "compatible"), ("sm_120a", "none"), ("compute_80", "ptx-jit"),
                                           ("sm_121", "native")])
def test_arch_compat_cli(code, expected):
    out = qualify("arch", "compat", code, "--device", "12.1")
    assert out.returncode == 0 and out.stdout.strip() == expected


def test_for_gpu_maps_capability_and_platform():
    assert qualify("targets", "for-gpu", "--capability", "12.0", "--machine", "x86_64").stdout.strip() == "sm120"
    assert qualify("targets", "for-gpu", "--capability", "10.0", "--machine", "aarch64").stdout.strip() == "sm100-arm64"
    mismatch = qualify("targets", "for-gpu", "--capability", "12.1", "--machine", "x86_64")
    assert mismatch.returncode == 3 and "sm121" in mismatch.stdout
    unknown = qualify("targets", "for-gpu", "--capability", "9.0", "--machine", "x86_64")
    assert unknown.returncode == 2 and "sm120" in unknown.stdout


def test_nox_lists_sessions_from_the_targets_file():
    nox = shutil.which("nox") or None
    argv = [nox, "-l"] if nox else [sys.executable, "-m", "nox", "-l"]
    out = subprocess.run(argv, capture_output=True, text=True, cwd=REPO, timeout=120)
    assert out.returncode == 0, out.stderr
    for name in ("sm100", "sm103", "sm120", "sm121", "sm100-arm64"):
        for kind in ("build", "qualify", "lock", "repro"):
            assert f"- {kind}-{name} -> " in out.stdout or f"* {kind}-{name} -> " in out.stdout
    for session in ("tests", "lint", "pin", "release", "sums", "bench-inventory"):
        assert f" {session} -> " in out.stdout


def test_the_build_guides_target_table_is_generated_from_the_targets_file():
    from docpages import section

    text = section("docs/build.md", "## Targets")  # the README's until issue 52
    begin, end = "<!-- targets:begin -->\n", "\n<!-- targets:end -->"
    table = text[text.index(begin) + len(begin):text.index(end)]
    generated = qualify("targets", "markdown").stdout.strip()
    assert table == generated, "docs/build.md's target table is stale: python -m qualify targets markdown"


# --- [build]: the cache budget and the payload's layers (issue 33) -------------------------------


def test_build_table_names_the_layers_and_the_last_takes_the_rest():
    build = targets.load(FILE).build
    assert [layer.name for layer in build.layers] == ["nvidia", "torch", "vllm", "rest"]
    assert build.layer_of("nvidia-cudnn-cu13") == "nvidia" and build.layer_of("torch") == "torch"
    assert build.layer_of("flashinfer-cubin") == "vllm" and build.layer_of("pyyaml") == "rest"


@pytest.mark.parametrize("old,new,words", [
    ("cache_budget_gb = 10.0", "cache_budget_gb = -1.0", ["[build]", "cache_budget_gb", "-1.0"]),
    ("cache_budget_gb = 10.0", 'cache_budget_gb = "10GB"', ["[build]", "cache_budget_gb", "must be float"]),
    ('packages = ["*"]', 'packages = ["pyyaml"]', ["last layer", 'packages = ["*"]']),
    ('name = "rest"', 'name = "torch"', ["layers[4]", "'torch' is used twice"]),
    ('packages = ["vllm",', 'packages = ["vLLM",', ["layers[3]", "packages", "normalised"]),
])
def test_bad_build_table_is_refused_naming_the_key(tmp_path, old, new, words):
    out = qualify("targets", "check", str(edited(tmp_path, old, new)))
    assert out.returncode == ConfigError.exit_code
    for word in words:
        assert word in out.stderr, out.stderr


def test_more_layers_than_the_dockerfile_has_slots_is_refused_naming_both_files(tmp_path):
    from qualify.imagebuild import image

    extra = '[[build.layers]]\nname = "extra"\npackages = ["numpy"]\n\n[[build.layers]]\nname = "rest"'
    tf = targets.load(edited(tmp_path, '[[build.layers]]\nname = "rest"', extra))
    t = tf.get("sm120")
    lock = t.lock_path("smoke", tf.hermetic.python)
    with pytest.raises(ConfigError, match=r"lists 5 layers; images/Dockerfile has 4 payload slots"):
        image.stage_context("slots-test", lock, tmp_path, tf.build, ctx=tmp_path / "ctx")


def test_the_staged_context_holds_each_layers_wheels_pinned_by_hash(tmp_path):
    """A layer's slice of the lock keeps every hash, and a re-stage leaves unchanged files as they were."""
    from qualify.imagebuild import image, wheelhouse

    tf = targets.load(FILE)
    lock = tf.get("sm120").lock_path("vllm", tf.hermetic.python)
    pins = wheelhouse.parse_lock(lock)
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    for pin in pins:  # empty stand-ins named as pip names wheels: the slicing reads names only
        (wheels / f"{pin.name.replace('-', '_')}-{pin.version}-py3-none-any.whl").write_bytes(b"")
    ctx = image.stage_context("slices", lock, wheels, tf.build, ctx=tmp_path / "ctx")
    sliced = [wheelhouse.parse_lock(ctx / f"payload/{n}/requirements.txt") for n in range(1, 5)]
    assert sorted((p.name, p.version, p.hashes) for s in sliced for p in s) == sorted(
        (p.name, p.version, p.hashes) for p in pins)
    assert {p.name for p in sliced[0]} >= {"nvidia-cublas", "nvidia-cudnn-cu13"} and "torch" in {p.name for p in sliced[1]}
    assert all(len(list((ctx / f"payload/{n}").glob("*.whl"))) == len(sliced[n - 1]) for n in range(1, 5))
    before = {p: p.stat().st_mtime_ns for p in ctx.rglob("*") if p.is_file()}
    (ctx / "payload/1/left-over.whl").write_bytes(b"x")  # e.g. a wheel of an older lock
    image.stage_context("slices", lock, wheels, tf.build, ctx=ctx)
    assert {p: p.stat().st_mtime_ns for p in ctx.rglob("*") if p.is_file()} == before


def test_the_cpu_target_has_no_gpu_and_a_lock_of_its_own():
    tf = targets.load(FILE)
    cpu = tf.get("cpu")
    assert cpu.is_cpu and cpu.capability is None and cpu.capability_text == "cpu" and not cpu.gpus
    assert cpu.triton_env == {} and cpu.driver_floor is None and cpu.profiles == ("vllm",)
    assert cpu.support_level == "experimental" and cpu.platform == "linux/amd64"
    # its own lock: under <profile>-<os>-<arch>-py<python> it would share sm120's
    lock = cpu.lock_path("vllm", tf.hermetic.python)
    assert lock.name == "vllm-cpu-linux-amd64-py3.11.txt"
    assert lock != tf.get("sm120").lock_path("vllm", tf.hermetic.python)
    names = {p.name: p.version for p in wheelhouse.parse_lock(lock)}
    assert names["vllm-cpu"] == "0.32.0" and names["torch"] == "2.13.0+cpu"
    assert not {"torchvision", "torchaudio", "torchcodec"} & set(names)  # a CUDA torchvision breaks transformers
    assert tf.cpu_targets("x86_64") == [cpu] and tf.cpu_targets("aarch64") == []


@pytest.mark.parametrize("key, value", [("capability", '"12.0"'), ("gpus", '["NVIDIA B200"]'),
                                        ("torch_cuda_arch_list", '"12.0"'), ("cuda", '"13.0"')])
def test_a_cpu_target_refuses_what_only_a_gpu_target_has(tmp_path, key, value):
    path = edited(tmp_path, 'accelerator = "cpu"\n', f'accelerator = "cpu"\n{key} = {value}\n')
    with pytest.raises(ConfigError, match=f"a cpu target has no GPU, so no '{key}'"):
        targets.load(path)


def test_an_unknown_accelerator_is_refused(tmp_path):
    path = edited(tmp_path, 'description = "workstation Blackwell', 'accelerator = "tpu"\ndescription = "workstation Blackwell')
    with pytest.raises(ConfigError, match="'accelerator': 'tpu' is not an accelerator"):
        targets.load(path)
