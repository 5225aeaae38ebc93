"""qualify/deploy/ and `python -m qualify deploy`: the data-shaped half of start.sh.

API checks run against the stand-in server (tests/standin/server.py, a test
double for vLLM) in this process; compose documents are also validated by the
real docker-compose where it is installed.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from conftest import REPO, require
from signing_helpers import DIGEST_A, DIGEST_B, make_key_pair, make_release, statement

from qualify.config import targets
from qualify.core import manifest as mf
from qualify.core import nvsmi
from qualify.core.errors import VerificationError
from qualify.deploy import api, choice, compose, errors, gate, memory, netcheck
from qualify.trust.verify import KeyAnchor, TrustedKey

TF = targets.load()
SM120, SM121 = TF.get("sm120").runtime, TF.get("sm121").runtime
GIB_KB = 1024 * 1024


def _load_standin():
    spec = importlib.util.spec_from_file_location("standin_server", REPO / "tests" / "standin" / "server.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


standin = _load_standin()


def meminfo(total_gib: float, available_gib: float, free_gib: float) -> str:
    return (f"MemTotal:       {int(total_gib * GIB_KB)} kB\nMemFree:        {int(free_gib * GIB_KB)} kB\n"
            f"MemAvailable:   {int(available_gib * GIB_KB)} kB\n")


# --- memory -----------------------------------------------------------------------


@pytest.mark.parametrize("text,mib", [("32607 MiB", 32607.0), ("32607", 32607.0), ("[N/A]", None),
                                      ("[Not Supported]", None), ("Not Supported", None)])
def test_nvml_memory_text(text, mib):
    assert nvsmi.mib(text) == mib


@pytest.mark.parametrize("bus_id,sysfs", [("00000000:18:00.0", "0000:18:00.0"), ("00000001:AF:00.0", "0001:af:00.0"),
                                          ("0000:18:00.0", "0000:18:00.0"), ("zz:18:00.0", "zz:18:00.0")])
def test_nvidia_smi_bus_ids_as_sysfs_names_them(bus_id, sysfs):
    assert nvsmi.pci_name(bus_id) == sysfs


def test_discrete_gpu_uses_the_targets_fraction():
    fit = memory.memory_fit(SM120, "32607 MiB")
    assert (fit.gpu_memory_utilization, fit.unified, fit.source) == (SM120.gpu_memory_utilization, False, "nvml")
    assert fit.pool_gib == 31.8


def test_discrete_gpu_too_small_is_refused():
    with pytest.raises(errors.DeployError, match=r"7\.8 GiB .* at least 16 GiB"):
        memory.memory_fit(SM120, "8000 MiB")


def test_fraction_from_env_is_range_checked():
    assert memory.memory_fit(SM120, "32607 MiB", fraction=0.7).gpu_memory_utilization == 0.7
    with pytest.raises(errors.DeployError, match="outside 0.05..0.98"):
        memory.memory_fit(SM120, "32607 MiB", fraction=1.5)


def test_gb10_sizes_the_unified_pool_from_meminfo_with_the_lower_fraction():
    fit = memory.memory_fit(SM121, "[N/A]", meminfo(119.6, 110.0, 100.0))
    assert SM121.gpu_memory_utilization < SM120.gpu_memory_utilization  # targets.toml: lower on unified memory
    assert (fit.gpu_memory_utilization, fit.pool_gib, fit.unified) == (SM121.gpu_memory_utilization, 119.6, True)
    assert fit.source == "/proc/meminfo"


def test_gb10_lowers_the_fraction_when_the_host_uses_the_pool():
    # The GB10 compatibility report: 0.9 of 119.6 GB asked for while 39.9 GB was free.
    fit = memory.memory_fit(SM121, "[N/A]", meminfo(119.6, 39.9, 39.0))
    assert fit.gpu_memory_utilization == 0.30
    assert any("lowered" in n for n in fit.notes)


def test_gb10_page_cache_is_a_refusal_with_the_two_fixes():
    """Issue 32 item 3 (vllm#48140): MemFree far below MemAvailable. torch sees MemFree on unified memory,
    so the server would stop at start-up: refused before anything is pulled, naming both numbers and both fixes."""
    with pytest.raises(errors.DeployError) as err:
        memory.memory_fit(SM121, "[N/A]", meminfo(119.6, 110.0, 20.0))
    text = f"{err.value.message} {err.value.hint}"
    assert "59.8 GiB" in text and "20.0 GiB is free" in text and "110.0 GiB available" in text, text
    assert "echo 3 | sudo tee /proc/sys/vm/drop_caches" in text and "GPU_MEMORY_UTILIZATION=0.16" in text, text


def test_gb10_a_fraction_that_leaves_the_host_less_than_its_reserve_is_refused():
    """Issue 32 item 3 (vllm#46307): a fraction set too high wedges the host; the floor is the targets file's."""
    assert SM121.host_reserve_gib == 8
    with pytest.raises(errors.DeployError) as err:
        memory.memory_fit(SM121, "[N/A]", meminfo(119.6, 119.0, 119.0), fraction=0.98)
    text = f"{err.value.message} {err.value.hint}"
    assert "leaves the host 2.4 GiB" in text and "at least 8 GiB" in text and "0.93 or less" in text, text
    fit = memory.memory_fit(SM121, "[N/A]", meminfo(119.6, 119.0, 119.0), fraction=0.85)
    assert fit.gpu_memory_utilization == 0.85


def test_gb10_refuses_when_too_little_is_available_or_the_fraction_is_forced():
    with pytest.raises(errors.DeployError, match="only .* of the unified pool"):
        memory.memory_fit(SM121, "[N/A]", meminfo(119.6, 12.0, 10.0))
    with pytest.raises(errors.DeployError, match="GPU_MEMORY_UTILIZATION=0.9 asks for"):
        memory.memory_fit(SM121, "[N/A]", meminfo(119.6, 39.9, 39.0), fraction=0.9)


def test_no_memory_size_on_a_discrete_target_is_refused():
    with pytest.raises(errors.DeployError, match="not a unified-memory target"):
        memory.memory_fit(SM120, "[N/A]", meminfo(64, 60, 60))


# --- port ---------------------------------------------------------------------------


def test_port_problem_sees_a_listener_and_a_foreign_address():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        assert "already in use" in netcheck.port_problem("127.0.0.1", port)
    assert netcheck.port_problem("127.0.0.1", port) is None
    assert "not an address of this host" in netcheck.port_problem("192.0.2.1", port)  # TEST-NET-1


# --- release and image (releases made by the real release steps; signing_helpers.make_release) ---------


@pytest.fixture(scope="module")
def release_key(tmp_path_factory):
    return make_key_pair(tmp_path_factory.mktemp("release-key"))


def _released(root: Path, key, tags, target: str = "sm120", **kw) -> Path:
    for tag in tags:
        make_release(root / "repo", tag, [statement(target, DIGEST_A, **kw)], key[0])
    return root / "repo" / "manifests"


def test_newest_release_is_chosen_by_semver_not_by_text(tmp_path, release_key):
    """v1.10.0 above v1.9.0 and v1.2.0; a release above its pre-release (v1.1.0 above v1.1.0-rc.1)."""
    manifests = _released(tmp_path, release_key, ["v1.9.0", "v1.10.0", "v1.2.0", "v1.11.0-rc.1", "v1.11.0"])
    make_release(tmp_path / "repo", "v2.0.0", [statement("sm100", DIGEST_A)], release_key[0])
    assert choice.choose_release(manifests, "sm120", "", KeyAnchor()).tag == "v1.11.0"
    assert choice.choose_release(manifests, "sm120", "v1.2.0", KeyAnchor()).tag == "v1.2.0"
    assert choice.choose_release(manifests, "sm100", "", KeyAnchor()).tag == "v2.0.0"


def test_missing_release_names_the_ones_there_are(tmp_path, release_key):
    manifests = _released(tmp_path, release_key, ["v1.0.0"])
    with pytest.raises(errors.DeployError, match="releases here with target sm120: v1.0.0") as info:
        choice.choose_release(manifests, "sm120", "v9.0.0", KeyAnchor())
    assert not isinstance(info.value, errors.NoReleaseError)  # a typo is no licence for another image
    with pytest.raises(errors.NoReleaseError, match="no release under"):
        choice.choose_release(manifests, "sm121", "", KeyAnchor())
    assert errors.NoReleaseError.exit_code != errors.DeployError.exit_code  # start.sh tells them apart


def test_a_release_without_its_signatures_is_refused(tmp_path, release_key):
    manifests = _released(tmp_path, release_key, ["v1.0.0"])
    (manifests / "v1.0.0" / "sm120.json.sig").unlink()
    with pytest.raises(VerificationError, match="signature of manifest not found|signature not found"):
        choice.choose_release(manifests, "sm120", "v1.0.0", KeyAnchor())
    with pytest.raises(errors.DeployError, match="does not verify"):
        choice.choose_release(manifests, "sm120", "", KeyAnchor())  # never passed over silently


def test_a_pinned_key_fingerprint_must_match(tmp_path, release_key):
    manifests = _released(tmp_path, release_key, ["v1.0.0"])
    actual = TrustedKey.read(release_key[1]).fingerprint
    assert choice.choose_release(manifests, "sm120", "v1.0.0", KeyAnchor(pinned=actual)).key.fingerprint == actual
    with pytest.raises(VerificationError, match="not the pinned RELEASE_KEY_FINGERPRINT"):
        choice.choose_release(manifests, "sm120", "v1.0.0", KeyAnchor(pinned="sha256:" + "0" * 64))


def _manifest(stmt) -> mf.Manifest:
    return mf.Manifest.from_statement(stmt, "test")


def test_image_is_the_manifests_reference_or_the_same_digest_elsewhere():
    m = _manifest(statement("sm120", DIGEST_A))
    assert choice.image_to_deploy(m) == m.reference
    mirror = f"mirror.example:5000/vllm/sm120@{DIGEST_A}"
    assert choice.image_to_deploy(m, mirror) == mirror
    assert choice.image_to_deploy(m, "", mirror) == mirror  # the published reference


@pytest.mark.parametrize("override,message", [
    (f"127.0.0.1:5000/qualify/sm120@{DIGEST_B}", "is not the image the manifest qualified"),
    ("127.0.0.1:5000/qualify/sm120:latest", "not pinned by digest"),
])
def test_image_override_must_be_the_manifests_digest(override, message):
    with pytest.raises(errors.DeployError, match=message):
        choice.image_to_deploy(_manifest(statement("sm120", DIGEST_A)), override)


def test_a_manifest_for_another_target_capability_or_platform_is_refused():
    m = _manifest(statement("sm120", DIGEST_A))
    choice.check_for_gpu(m, "sm120", "12.0", "linux/amd64")
    for wanted in (("sm100", "12.0", "linux/amd64"), ("sm120", "12.1", "linux/amd64"), ("sm120", "12.0", "linux/arm64")):
        with pytest.raises(errors.DeployError, match="the verified manifest is for sm120"):
            choice.check_for_gpu(m, *wanted)
    inconsistent = _manifest(statement("sm120", DIGEST_A, reference=f"127.0.0.1:5000/qualify/sm120@{DIGEST_B}"))
    with pytest.raises(errors.DeployError, match="inconsistent"):
        choice.image_to_deploy(inconsistent)


# --- trust gate decision ----------------------------------------------------------------


@pytest.mark.parametrize("kw,action", [
    ({"level": "baseline"}, "deploy"),
    ({"level": "experimental", "statuses": {"a": "warn"}}, "probe"),  # only promoted levels skip the probe
    ({"level": "unverified", "statuses": {"a": "pass", "gpu": "not-run"}}, "probe"),
    ({"level": "unverified"}, "probe"),
    ({"level": "unsupported", "statuses": {"triton-compile": "fail"}}, "refuse"),
    ({"level": "unsupported"}, "refuse"),
    ({"level": "bogus"}, "refuse"),
])
def test_gate_decision(kw, action):
    assert gate.gate_decision(_manifest(statement("sm120", DIGEST_A, **kw))).action == action


def test_the_gate_takes_the_level_from_the_promotion_record_not_the_released_manifest():
    """Issue 52: a release/v3 manifest keeps its released level; the verified target's current level (its signed
    promotion record's) decides, and a baseline only a release signed, without a promotion record, still probes."""
    from qualify.trust.verify import CurrentLevel

    released = _manifest(statement("sm120", DIGEST_A, level="experimental"))
    promoted = gate.gate_decision(released, current=CurrentLevel("baseline", 2))
    assert promoted.action == "deploy" and "support level baseline" in promoted.reason
    assert gate.gate_decision(released, current=CurrentLevel("experimental")).action == "probe"
    assert gate.gate_decision(released, current=CurrentLevel("baseline")).action == "probe"  # not by evidence
    demoted = _manifest(statement("sm120", DIGEST_A, level="baseline"))  # a release/v2 manifest's level is ignored
    assert gate.gate_decision(demoted, current=CurrentLevel("experimental", 3)).action == "probe"
    failing = _manifest(statement("sm120", DIGEST_A, level="unsupported", statuses={"triton-compile": "fail"}))
    assert gate.gate_decision(failing, current=CurrentLevel("baseline", 2)).action == "refuse"  # the verdict still


def test_gate_refusal_names_the_failing_checks():
    decision = gate.gate_decision(_manifest(statement("sm120", DIGEST_A, level="unsupported",
                                                      statuses={"triton-compile": "fail", "x": "pass"})))
    assert decision.action == "refuse" and "triton-compile" in decision.reason


# --- compose ---------------------------------------------------------------------------------


def spec(**kw) -> compose.ComposeSpec:
    base = dict(image=f"127.0.0.1:5000/qualify/sm120@{DIGEST_A}", target="sm120", model="Qwen/Qwen2.5-0.5B-Instruct",
                revision="7ae557604adf67be50417f59c2c2f167def9a775", served_model_name="qwen",
                gpu_memory_utilization=0.9, max_model_len=8192, gpu_device="GPU-5090")
    return compose.ComposeSpec(**{**base, **kw})


def test_compose_exposes_only_our_gpu_through_the_nvidia_runtime():
    svc = compose.compose_document(spec())["services"]["vllm"]
    assert svc["deploy"]["resources"]["reservations"]["devices"] == [
        {"driver": "nvidia", "device_ids": ["GPU-5090"], "capabilities": ["gpu"]}]
    assert svc["environment"]["NVIDIA_VISIBLE_DEVICES"] == "GPU-5090"
    assert svc["environment"]["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert "devices" not in svc and "security_opt" not in svc


def test_compose_cdi_and_selinux_and_none():
    cdi = compose.compose_document(spec(gpu_runtime="cdi", gpu_device="0",
                                       selinux_label_disable=True))["services"]["vllm"]
    assert cdi["devices"] == ["nvidia.com/gpu=0"] and cdi["security_opt"] == ["label=disable"]
    assert "deploy" not in cdi and "NVIDIA_VISIBLE_DEVICES" not in cdi["environment"]
    none = compose.compose_document(spec(gpu_runtime="none", gpu_device=""))["services"]["vllm"]
    assert "deploy" not in none and "devices" not in none


def test_compose_service_shape():
    doc = compose.compose_document(spec(tool_call_parser="hermes", extra_args=("--enforce-eager",),
                                       extra_env=(("VLLM_LOGGING_LEVEL", "DEBUG"), ("PRICE", "$5"))))
    svc = doc["services"]["vllm"]
    assert svc["image"].endswith(DIGEST_A) and svc["restart"] == "unless-stopped" and svc["shm_size"] == "8g"
    assert svc["ports"] == ["127.0.0.1:8000:8000"]
    assert svc["entrypoint"] == ["python3", "-m", "vllm.entrypoints.openai.api_server"]
    cmd = svc["command"]
    assert cmd[cmd.index("--revision") + 1] == "7ae557604adf67be50417f59c2c2f167def9a775"
    assert cmd[cmd.index("--gpu-memory-utilization") + 1] == "0.9"
    assert "--enable-auto-tool-choice" in cmd and cmd[-1] == "--enforce-eager"
    assert sorted(doc["volumes"]) == ["hf-cache", "triton-cache", "vllm-cache"]
    assert "hf-cache:/var/cache/blackwell/huggingface" in svc["volumes"]
    assert svc["environment"]["PRICE"] == "$$5"  # literal, not interpolated by compose
    assert svc["environment"]["HF_TOKEN"] == "${HF_TOKEN:-}"  # from the environment, never in the file
    assert svc["healthcheck"]["test"][:2] == ["CMD", "python3"] and svc["healthcheck"]["start_period"] == "1800s"


@pytest.mark.parametrize("address,published", [("0.0.0.0", "0.0.0.0:9000:8000"), ("::1", "[::1]:9000:8000")])
def test_compose_bind_address(address, published):
    assert compose.compose_document(spec(bind_address=address, port=9000))["services"]["vllm"]["ports"] == [published]


def test_compose_rejects_an_unknown_runtime():
    with pytest.raises(errors.DeployError, match="GPU_RUNTIME"):
        compose.compose_document(spec(gpu_runtime="magic"))


@pytest.mark.parametrize("kw", [{}, {"gpu_runtime": "cdi", "selinux_label_disable": True}])
def test_real_docker_compose_accepts_the_document(tmp_path, kw):
    require(shutil.which("docker-compose") is not None, "docker-compose is not installed")
    path = tmp_path / "compose.json"
    path.write_text(compose.compose_json(spec(**kw)))
    done = subprocess.run(["docker-compose", "-p", "bwunit", "-f", str(path), "config", "-q"], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("bind,url", [("127.0.0.1", "http://127.0.0.1:8000"), ("0.0.0.0", "http://127.0.0.1:8000"),
                                      ("::", "http://[::1]:8000"), ("192.0.2.7", "http://192.0.2.7:8000")])
def test_api_url(bind, url):
    assert api.api_url(bind, 8000) == url


# --- API checks against the stand-in ------------------------------------------------------------


@pytest.fixture()
def server(request):
    """The stand-in vLLM (a test double) on a free loopback port; yields (base URL, settings)."""
    kw = getattr(request, "param", {})
    settings = standin.Settings("Qwen/Qwen2.5-0.5B-Instruct", "qwen", **kw)
    srv = standin.serve(settings, "127.0.0.1", 0)
    thread = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}", settings
    srv.shutdown()
    srv.server_close()


def test_checks_pass_against_a_healthy_server(server):
    url, _ = server
    for check in (api.health(url), api.models(url, "qwen"), api.canary(url, "qwen"),
                  api.determinism(url, "qwen", max_tokens=300), api.tool_call(url, "qwen")):
        assert check.ok, check.detail
    assert "437" in api.canary(url, "qwen").detail


@pytest.mark.parametrize("server", [{"never_healthy": True}], indirect=True)
def test_health_fails_while_the_server_is_not_ready(server):
    url, _ = server
    result = api.health(url)
    assert not result.ok and "503" in result.detail


def test_wrong_model_name_fails_routing_and_canary(server):
    url, _ = server
    assert not api.models(url, "other").ok
    result = api.canary(url, "other")
    assert not result.ok and "does not exist" in result.detail


def test_canary_catches_a_wrong_answer(server, monkeypatch):
    url, _ = server
    monkeypatch.setattr(standin, "arithmetic", lambda prompt: "19 times 23 is 436.")
    result = api.canary(url, "qwen")
    assert not result.ok and "expected 437" in result.detail


def test_determinism_catches_sampling(server, monkeypatch):
    url, _ = server
    real = standin.complete
    monkeypatch.setattr(standin, "complete", lambda request: real({**request, "temperature": 1.0, "seed": None}))
    assert not api.determinism(url, "qwen", max_tokens=200).ok


def test_nothing_listening_is_a_failed_check():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    assert not api.health(f"http://127.0.0.1:{port}").ok


# --- the CLI start.sh calls ------------------------------------------------------------------------


def qualify_cli(*args: str, stdin: str = "") -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "qualify", "deploy", *args], cwd=REPO, input=stdin,
                          capture_output=True, text=True, timeout=60)


def test_compose_carries_extra_args_env_and_labels():
    spec = compose.ComposeSpec(image=f"r/x@{DIGEST_A}", target="sm120", model="m", revision="r",
                               served_model_name="s", gpu_memory_utilization=0.5, max_model_len=4096,
                               gpu_runtime="none", extra_args=("--enforce-eager",), extra_env=(("A", "1"),),
                               labels=(("k", "v"),))
    svc = json.loads(compose.compose_json(spec))["services"]["vllm"]
    assert svc["command"][-1] == "--enforce-eager" and svc["environment"]["A"] == "1" and svc["labels"]["k"] == "v"


def test_the_trust_gate_has_no_debug_action_that_reads_a_release_on_its_own():
    """The gate runs only inside `start`, on the release it read once (issue 26: one reader)."""
    for action in ("release", "gate"):
        assert qualify_cli(action, "--help").returncode == 2
    # Nor key=value debug actions that only tests called (issue 28): start does their work in one process.
    for action in ("memory", "port", "compose", "url"):
        assert qualify_cli(action, "--help").returncode == 2


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_the_typed_settings_hold_every_key_env_example_documents():
    """Issue 28: one field per documented key, so a key added to .env.example without a field (or the reverse)
    fails here, not on a user's host."""
    from qualify.deploy import settings

    assert sorted(settings.keys()) == sorted(settings.known_keys())


# --- what start.sh says when the start goes wrong (issue 48) -----------------------------------------------


def test_vllms_reason_is_its_last_distinct_error_lines():
    from qualify.deploy.startup import reasons

    log = ["INFO 12-05 10:00:00 [__init__.py:239] Automatically detected platform cuda.",
           "(EngineCore_DP0 pid=7) ERROR 12-05 10:00:09 [core.py:708] EngineCore failed to start.",
           "(EngineCore_DP0 pid=7) ERROR 12-05 10:00:09 [core.py:708] Traceback (most recent call last):",
           "(EngineCore_DP0 pid=7) ERROR 12-05 10:00:09 [core.py:708] ValueError: Free memory on device (19.5/95.6 "
           "GiB) on startup is less than desired GPU memory utilization (0.9, 86.0 GiB).",
           "Traceback (most recent call last):",
           "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}"]
    said = ["ValueError: Free memory on device (19.5/95.6 GiB) on startup is less than desired GPU memory "
            "utilization (0.9, 86.0 GiB).",
            "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}"]
    assert reasons(log) == said
    assert reasons(log + log) == said  # three restarts repeat it: said once
    assert reasons(["torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", "AssertionError"]) == [
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", "AssertionError"]
    assert reasons(["INFO ERROR handling is set up", "WARNING the ValueErrors counter is 0"]) == []


def test_the_throughput_line_names_a_busy_host_and_only_a_busy_one():
    from qualify.deploy import hostload
    from qualify.deploy.startup import Startup

    figures = api.Throughput(0.051, 195.0, 256, 1.31)
    busy = hostload.busy_note(hostload.Load(4.2, 2), hostload.Load(3.9, 2))
    assert busy == ("host busy: load 3.9 on 2 cores (4.2 before the server started: other work keeps every core "
                    "busy); the figure is low")
    assert Startup.figures_line(figures, busy).endswith("from the first to the last chunk); " + busy)
    # The server's own load raises the second reading, never the first: a quiet host before it is not busy.
    assert hostload.busy_note(hostload.Load(0.1, 2), hostload.Load(2.6, 2)) == ""
    assert hostload.busy_note(hostload.Load(3.0, 2), hostload.Load(1.2, 2)) == ""  # the other work ended
    assert hostload.busy_note(None, hostload.Load(9.0, 2)) == ""  # no load average: nothing claimed
    assert Startup.figures_line(figures, "") == ("canary figures: time to first token 0.051 s, 195 tokens/s (256 "
                                                 "tokens in 1.31 s, from the first to the last chunk)")
