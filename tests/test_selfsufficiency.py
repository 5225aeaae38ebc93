"""qualify.probe.selfsufficiency: run-time downloads and JIT compilation in a vLLM image."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from qualify.core.arch import Capability
from qualify.probe import cubinusers, providers
from qualify.probe import selfsufficiency as S
from qualify.probe.model import FAIL, PASS, WARN

# vLLM 0.33.0 pins flashinfer-python==0.7.2.post1 and not flashinfer-cubin, whose newest
# PyPI release is 0.6.13: an unpinned install of both gives this pair.
PINS = {"vllm": "0.33.0", "flashinfer-python": "0.7.2.post1", "torch": "2.14.0"}
MISMATCH = dict(PINS, **{"flashinfer-cubin": "0.6.13"})
MATCH = dict(PINS, **{"flashinfer-cubin": "0.7.2.post1"})
ALL_TARGETS = ("sm_75", "sm_80", "sm_90", "sm_100", "sm_103", "sm_110", "sm_120", "sm_121")


def executable(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


def fake_cuda(root: Path, release: str = "13.0", targets=ALL_TARGETS, cicc: bool = True) -> Path:
    """A toolkit whose nvcc answers --version, --list-gpu-code and --dryrun like the real one."""
    bin_dir = root / "bin"
    executable(bin_dir / "nvcc", f"""#!/bin/sh
case "$1" in
  --version) echo "Cuda compilation tools, release {release}, V{release}.88";;
  --list-gpu-code) printf '%s\\n' {' '.join(targets)};;
  --dryrun) echo "#$ _HERE_={bin_dir}" >&2; echo "#$ CICC_PATH={root}/nvvm/bin" >&2;;
  *) exit 1;;
esac
""")
    (bin_dir / "ptxas").write_text("")
    if cicc:
        (root / "nvvm/bin").mkdir(parents=True)
        (root / "nvvm/bin/cicc").write_text("")
    return root


@pytest.fixture
def world(tmp_path, monkeypatch):
    """An image root with nothing at /usr/local/cuda, ninja on PATH and a site-packages
    holding vLLM 0.33.0's bundled DeepGEMM."""
    monkeypatch.setattr(S, "DEFAULT_CUDA_HOME", str(tmp_path / "usr/local/cuda"))
    tools = tmp_path / "tools"
    executable(tools / "ninja", "#!/bin/sh\nexit 0\n")
    sp = tmp_path / "site-packages"
    (sp / "vllm/third_party/deep_gemm").mkdir(parents=True)
    (sp / "vllm/third_party/deep_gemm/_C_extension.abi3.so").write_bytes(b"")
    return {"root": tmp_path, "sp": sp, "env": {"PATH": str(tools)}}


def by_id(results):
    return {r.id: r for r in results}


def jit(world, packages, cap, cuda_home=None, env=None):
    env = dict(world["env"], **(env or {}))
    return by_id(S.check(packages, [str(world["sp"])], cuda_home, capability=Capability.parse(cap) if cap else None,
                         env=env))["runtime.jit-nvcc"]


# --- runtime.flashinfer-cubin ---------------------------------------------------


def users(cap: str):
    """The target's providers that run FlashInfer's downloaded cubins, from vLLM 0.33's provider rules."""
    return cubinusers.users(providers.RULES, Capability.parse(cap))


def test_the_rules_say_which_targets_run_flashinfers_downloaded_cubins():
    """10.x: trtllm-gen attention (FLASHINFER on 10.x), MLA and MoE; 12.x and 9.0: none (issue 51)."""
    on_b200 = users("10.0")
    assert "attention.bf16: FLASHINFER (its trtllm-gen kernels on 10.x)" in on_b200
    assert "attention.mla: FLASHINFER_MLA" in on_b200 and "moe.nvfp4: FLASHINFER_TRTLLM" in on_b200
    assert users("10.3") == on_b200
    assert users("12.0") == users("12.1") == users("9.0") == ()
    assert cubinusers.users(providers.RULES, None) == ()  # the cpu target


@pytest.mark.parametrize("packages", [MISMATCH, PINS])
def test_a_cubin_wheel_that_does_not_match_fails_where_the_targets_providers_download(packages):
    """flashinfer-ai/flashinfer#2941: an air-gapped sm100 deploy fails at the first trtllm-gen launch. The pair
    of the project's own lock (flashinfer-cubin 0.6.13 beside flashinfer-python 0.7.2.post1), and no wheel at all."""
    r = S.check_flashinfer_cubin(packages, {}, users("10.0"), Capability.parse("10.0"))
    assert r.status == FAIL and r.required
    assert ("flashinfer-cubin 0.6.13 differs from flashinfer-python 0.7.2.post1" in r.reason
            if "flashinfer-cubin" in packages else "flashinfer-cubin is not installed" in r.reason)
    assert S.CUBIN_CDN in r.reason and "not self-sufficient" in r.reason and "flashinfer-ai/flashinfer#2941" in r.reason
    assert "on 10.0 vLLM's providers run them: attention.bf16: FLASHINFER" in r.reason
    assert "flashinfer-cubin==0.7.2.post1" in r.reason and "download-cubin" in r.reason
    assert r.evidence["flashinfer-python"] == "0.7.2.post1" and r.evidence["cubin_users"] == list(users("10.0"))


def test_where_no_provider_runs_them_nothing_is_fetched_and_it_says_why():
    r = S.check_flashinfer_cubin(MISMATCH, {}, users("12.0"), Capability.parse("12.0"))
    assert r.status == PASS
    assert "on 12.0 no provider vLLM 0.33 can select runs them" in r.reason and "XQA decode" in r.reason
    assert "nothing is fetched here" in r.reason and r.evidence["cubin_users"] == []


def test_who_runs_them_not_said_is_taken_as_needed():
    assert S.check_flashinfer_cubin(MISMATCH, {}).status == FAIL


@pytest.mark.parametrize("packages,env", [(MATCH, {}), ({"vllm": "0.33.0"}, {}),
                                          (MISMATCH, {"FLASHINFER_CUBIN_DIR": "/opt/cubins"})])
def test_cubin_pass(packages, env):
    assert S.check_flashinfer_cubin(packages, env).status == PASS


# --- runtime.jit-nvcc ---------------------------------------------------------


def test_nvcc_from_cuda_home_passes(world):
    cuda = fake_cuda(world["root"] / "cuda")
    r = jit(world, PINS, "12.1", env={"CUDA_HOME": str(cuda)})
    assert r.status == PASS, r.reason
    assert r.evidence["consumers"] == ["FlashInfer", "DeepGEMM"]
    assert r.evidence["nvcc"]["FlashInfer"]["found_by"] == "CUDA_HOME"
    assert r.evidence["nvcc"]["DeepGEMM"]["version"] == "13.0"


def test_cuda_home_argument_is_used(world):
    cuda = fake_cuda(world["root"] / "cuda")
    assert jit(world, PINS, "12.1", cuda_home=str(cuda)).status == PASS


def test_nvcc_on_path_passes(world):
    cuda = fake_cuda(world["root"] / "cuda")
    r = jit(world, PINS, "10.0", env={"PATH": world["env"]["PATH"] + os.pathsep + str(cuda / "bin")})
    assert r.status == PASS, r.reason
    assert r.evidence["nvcc"]["FlashInfer"]["found_by"] == "PATH"


def test_wheel_nvcc_alone_is_not_found(world):
    fake_cuda(world["sp"] / "nvidia/cu13")  # nvidia-cuda-nvcc's layout, wired to nothing
    r = jit(world, PINS, "12.1")
    assert r.status == WARN
    assert "no nvcc at CUDA_HOME, CUDA_PATH, PATH or /usr/local/cuda" in r.reason
    assert str(world["sp"] / "nvidia/cu13/bin/nvcc") in r.reason
    assert r.evidence["wheel_nvcc"].endswith("nvidia/cu13/bin/nvcc")


@pytest.mark.parametrize("packages,cap", [(PINS, "10.0"), (MATCH, "12.1"), (MISMATCH, "12.0")])
def test_no_nvcc_fails_where_vllm_uses_flashinfer_anyway(world, packages, cap):
    # 10.x: FlashInfer is vLLM's first attention backend; with flashinfer-cubin installed,
    # vLLM enables FlashInfer kernels without looking for nvcc.
    r = jit(world, packages, cap)
    assert r.status == FAIL and "FlashInfer" in r.reason


def test_old_nvcc_cannot_target_12_1(world):
    cuda = fake_cuda(world["root"] / "cuda", release="12.8", targets=("sm_90", "sm_100", "sm_120"))
    r = jit(world, PINS, "12.1", env={"CUDA_HOME": str(cuda)})
    assert r.status == WARN
    assert "cannot target 12.1" in r.reason and "older than 12.9" in r.reason


def test_old_nvcc_fails_on_10x(world):
    cuda = fake_cuda(world["root"] / "cuda", release="12.6", targets=("sm_80", "sm_90"))
    r = jit(world, PINS, "10.0", env={"CUDA_HOME": str(cuda)})
    assert r.status == FAIL and "cannot target 10.0" in r.reason


def test_incomplete_toolkit(world):
    cuda = fake_cuda(world["root"] / "cuda", cicc=False)
    r = jit(world, PINS, "12.1", env={"CUDA_HOME": str(cuda)})
    assert r.status == WARN and "missing nvvm/bin/cicc" in r.reason


def test_flashinfer_needs_ninja(world):
    cuda = fake_cuda(world["root"] / "cuda")
    r = jit(world, PINS, "12.1", env={"CUDA_HOME": str(cuda), "PATH": str(world["root"] / "nowhere")})
    assert r.status == WARN and "no ninja on PATH" in r.reason


def test_consumer_overrides(world):
    cuda = fake_cuda(world["root"] / "cuda")
    env = {"FLASHINFER_NVCC": str(cuda / "bin/nvcc"), "DG_JIT_NVCC_COMPILER": str(cuda / "bin/nvcc")}
    r = jit(world, PINS, "12.1", env=env)
    assert r.status == PASS
    assert r.evidence["nvcc"]["DeepGEMM"]["found_by"] == "DG_JIT_NVCC_COMPILER"


def test_matching_jit_cache_removes_flashinfer_and_13_0_removes_deepgemm(world):
    pkgs = dict(MATCH, **{"flashinfer-jit-cache": "0.7.2.post1+cu130"})
    r = jit(world, pkgs, "13.0")
    assert r.status == PASS and r.evidence["consumers"] == []


def test_nothing_to_compile(world):
    r = by_id(S.check({}, [str(world["root"] / "empty")], None, capability=Capability.parse("12.1"),
                      env=world["env"]))["runtime.jit-nvcc"]
    assert r.status == PASS and r.evidence["consumers"] == []


def test_toolchain_for_providers(world):
    cuda = fake_cuda(world["root"] / "cuda")
    tc = S.toolchain([str(world["sp"])], None, env=dict(world["env"], CUDA_HOME=str(cuda)))
    assert tc["nvcc"] == str(cuda / "bin/nvcc") and tc["nvcc_version"] == "13.0"
    assert "sm_121" in tc["nvcc_targets"] and tc["ninja"].endswith("ninja")
    tc = S.toolchain([str(world["sp"])], None, env=world["env"])
    assert tc["nvcc"] is None


def test_cuda_home_resolution(tmp_path, monkeypatch):
    monkeypatch.setattr(S, "DEFAULT_CUDA_HOME", "/nonexistent/cuda")
    assert S.cuda_home({"CUDA_HOME": "/a", "CUDA_PATH": "/b"}, None) == ("/a", "CUDA_HOME")
    assert S.cuda_home({"CUDA_PATH": "/b"}, None) == ("/b", "CUDA_PATH")
    cuda = fake_cuda(tmp_path / "c")
    assert S.cuda_home({"PATH": str(cuda / "bin")}, None) == (str(cuda), "PATH")
    assert S.cuda_home({"PATH": ""}, None) == ("/nonexistent/cuda", "default /usr/local/cuda")


# --- runtime.downloads --------------------------------------------------------


def test_a_cubin_download_withholds_the_offline_claim_where_the_target_needs_them():
    r = S.check_downloads(MISMATCH, {}, users("10.0"), Capability.parse("10.0"))
    assert r.status == FAIL and r.required and r.reason.startswith("not air-gap self-sufficient: ")
    assert S.CUBIN_CDN in r.reason and "0.6.13" in r.reason and r.evidence["offline"] is False
    assert S.check_downloads(MISMATCH, {}).status == FAIL  # who needs them not said: needed
    ok = S.check_downloads(MATCH, {"HF_HUB_OFFLINE": "1"}, users("10.0"), Capability.parse("10.0"))
    assert ok.status == PASS and ok.evidence["offline"] is True


def test_the_sm120_image_fetches_no_cubin_and_says_what_it_needs_instead():
    """The project's sm120 vLLM image: the mismatched pair, and no 12.x provider runs the downloaded cubins."""
    r = S.check_downloads(MISMATCH, {}, users("12.0"), Capability.parse("12.0"))
    assert r.status == PASS and r.evidence["offline"] is True and r.evidence["fetches"] == []
    assert "trtllm-gen FMHA" in r.reason and "compiled at first use (runtime.jit-nvcc)" in r.reason
    assert "no provider vLLM 0.33 can select runs them" in r.evidence["flashinfer_cubins"]


def test_downloads_openai_harmony_vocab(tmp_path):
    pkgs = dict(MATCH, **{"openai-harmony": "0.0.4"})
    r = S.check_downloads(pkgs, {})
    assert r.status == FAIL and S.HARMONY_VOCAB_URL in r.reason and "TIKTOKEN_ENCODINGS_BASE" in r.reason
    (tmp_path / "o200k_base.tiktoken").write_text("x")
    assert S.check_downloads(pkgs, {"TIKTOKEN_ENCODINGS_BASE": str(tmp_path)}).status == PASS


def test_oss_harmony_of_vllm_0_33_is_self_contained():
    r = S.check_downloads(dict(MATCH, **{"oss-harmony": "0.0.11"}), {})
    assert r.status == PASS and "embeds" in r.evidence["harmony"]


def test_download_notes_are_evidence_not_findings():
    r = S.check_downloads(MATCH, {})
    assert r.status == PASS
    assert any("HF_HUB_OFFLINE" in n for n in r.evidence["notes"])
    assert any("stats.vllm.ai" in n for n in r.evidence["notes"])
    quiet = S.check_downloads(MATCH, {"HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1"})
    assert quiet.evidence["notes"] == []


# --- the whole check and package reading ---------------------------------------


def test_check_ids_and_versions_from_dist_info(world):
    sp = world["sp"]
    for name, version in (("flashinfer_python", "0.7.2.post1"), ("flashinfer_cubin", "0.6.13"), ("vllm", "0.33.0")):
        info = sp / f"{name}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name.replace('_', '-')}\nVersion: {version}\n")
    pkgs = S.installed_packages([str(sp)])
    assert pkgs == {"flashinfer-python": "0.7.2.post1", "flashinfer-cubin": "0.6.13", "vllm": "0.33.0"}
    results = S.check(pkgs, [str(sp)], None, capability=Capability.parse("12.1"), env=world["env"],
                      cubin_users=users("12.1"))
    assert [r.id for r in results] == ["runtime.flashinfer-cubin", "runtime.jit-nvcc", "runtime.downloads"]
    assert results[0].status == PASS and "0.6.13" in results[0].reason and results[2].status == PASS
    on_b200 = S.check(pkgs, [str(sp)], None, capability=Capability.parse("10.0"), env=world["env"],
                      cubin_users=users("10.0"))
    assert [on_b200[0].status, on_b200[2].status] == [FAIL, FAIL]
