"""./start.sh with several stand-in GPUs (issue 44): preflight and compose for 1, 2 and 8 GPUs, the refusals, and
the all-reduce gate in the deploy itself driven by a stand-in result. TEST DOUBLES (labelled where used): the
stand-in nvidia-smi with `topo -m`, a stand-in nvidia-container-runtime-hook, a stand-in NCCL result
(tests/multigpu_standins.py). Nothing here ran on GPUs."""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path

import pytest
from conftest import REPO
from deploy_host import PASSWORD as DEPLOY_KEY_PASSWORD
from deploy_host import RTX5090, released
from evidence_helpers import TF
from multigpu_standins import B200, PRO, gpus_of, standin_p2p, standin_result, standin_sysfs
from signing_helpers import DIGEST_A, statement

from qualify.core import ncclenv, topology
from qualify.deploy import settings
from qualify.deploy.ui import Stop
from qualify.probe import gpu
from qualify.release import evidence as ev
from qualify.trust import gpuconfig

# --- ./start.sh, as a user runs it, with stand-in GPUs --------------------------------------------------------


def nvidia_hook(host) -> None:
    """TEST DOUBLE: an `nvidia-container-runtime-hook` on PATH is how preflight tells the NVIDIA container
    runtime is installed; the dry run then writes the compose file of the nvidia runtime (nothing starts)."""
    hook = host.root / "bin" / "nvidia-container-runtime-hook"
    hook.write_text("#!/bin/sh\necho 'stand-in: never run' >&2\nexit 1\n")
    hook.chmod(0o755)


def dry_run(host, gpus: str, topo: str = "", *args: str, **env: str):
    nvidia_hook(host)
    extra = {"STANDIN_TOPO": topo} if topo else {}
    env.setdefault("HF_HOME", str(host.root / "no-hf-cache"))  # this host's own cache stays out of it
    return host.run("start.sh", "--dry-run", *args, gpus=gpus, **extra, **env)


def compose_of(done) -> dict:
    return json.loads(done.stdout)["services"]["vllm"]


@pytest.mark.parametrize("n, model, target, topo, kind", [
    (1, PRO, "sm120", "", "single"), (2, PRO, "sm120", "PHB", "host-bridge"), (8, B200, "sm100", "NV18", "nvlink")])
def test_preflight_and_compose_for_1_2_and_8_standin_gpus(host, docker_engine, n, model, target, topo, kind):
    capability = "10.0" if target == "sm100" else "12.0"
    host.settings(GPU_RUNTIME="nvidia", GPU_DEVICE="all" if n == 8 else ",".join(map(str, range(n))))
    host.release(statement(target, DIGEST_A, capability=capability))
    done = dry_run(host, gpus_of(model, n), topo)
    assert done.returncode == 0, done.stderr[-3000:]
    service = compose_of(done)
    (devices,) = service["deploy"]["resources"]["reservations"]["devices"]
    assert devices["device_ids"] == [model.split("|")[3].format(i) for i in range(n)]
    assert f"target: {target}" in done.stderr
    for i in range(n):
        assert f"GPU {i}: {model.split('|')[1]}" in done.stderr
    if n == 1:
        assert "--tensor-parallel-size" not in service["command"] and "topology:" not in done.stderr
        return
    assert service["command"][service["command"].index("--tensor-parallel-size") + 1] == str(n)
    assert service["ipc"] == "private" and service["ulimits"]["memlock"] == -1
    floor = topology.floor_for(TF.allreduce_floors, kind, n).min_bus_gbps
    assert f"topology: {kind} ({topo} between {n * (n - 1) // 2} GPU pair" in done.stderr
    assert f"all-reduce floor: {floor:g} GB/s bus bandwidth for {n} GPUs joined by {kind}" in done.stderr
    assert f"dry run: would run the NCCL all-reduce gate on {n} GPUs" in done.stderr
    assert f"floor {floor:g} GB/s busbw; P2P and vLLM's custom all-reduce checked too" in done.stderr
    assert "python3 -m qualify.probe --only" in done.stderr
    # The gate's container and the server's get the one value (collectives.py): its settings and its variables.
    assert "--shm-size 8g --ipc private --ulimit memlock=-1:-1 --ulimit stack=67108864:67108864 ..." in done.stderr
    assert service["shm_size"] == "8g" and service["ulimits"] == {"memlock": -1, "stack": 67108864}
    assert {k: service["environment"][k] for k, _ in ncclenv.DEFAULTS} == dict(ncclenv.DEFAULTS)
    assert f"collectives, for the server and the all-reduce gate alike: {ncclenv.DEFAULT.describe()}" in done.stderr
    assert "attention heads: not checked" in done.stderr  # no config of the model is cached on this host


def test_mixed_gpu_models_are_refused_by_name(host):
    host.settings(GPU_DEVICE="0,1")
    done = host.run("start.sh", gpus=f"{RTX5090};{PRO.format(1)}", STANDIN_TOPO="PHB")
    assert done.returncode == 3, done.stderr
    assert ("mixes GPU models (GPU 0: NVIDIA GeForce RTX 5090 (12.0); GPU 1: NVIDIA RTX PRO 6000 Blackwell "
            "Workstation Edition (12.0))") in done.stderr
    assert "NVIDIA GeForce RTX 5090: GPU_DEVICE=0" in done.stderr


@pytest.mark.parametrize("devices, message, listed", [
    ("0,5", "GPU_DEVICE=0,5: 5 does not name a GPU on this host (nvidia-smi lists 2)", True),
    ("0,GPU-pro6000-0", "GPU_DEVICE=0,GPU-pro6000-0 names GPU 0 (GPU-pro6000-0) twice", False),
])
def test_a_list_naming_a_missing_gpu_or_one_gpu_twice_is_refused(host, devices, message, listed):
    host.settings(GPU_DEVICE=devices)
    done = host.run("start.sh", gpus=gpus_of(PRO, 2), STANDIN_TOPO="PHB")
    assert done.returncode == 3 and message in done.stderr, done.stderr
    assert ("GPU 1: NVIDIA RTX PRO 6000" in done.stderr) is listed  # nvidia-smi -L's list, to choose from


def _model_folder(root: Path, **config) -> Path:
    folder_ = root / "model"
    folder_.mkdir()
    (folder_ / "config.json").write_text(json.dumps({"model_type": "qwen2", **config}))
    for p in (root, folder_, folder_ / "config.json"):
        p.chmod(p.stat().st_mode | stat.S_IROTH | stat.S_IXOTH)  # the image's user (uid 1000) reads it
    return folder_


def test_a_tp_size_that_does_not_divide_the_heads_is_refused_from_model_path(host, docker_engine):
    model = _model_folder(host.root, num_attention_heads=14, num_key_value_heads=2)
    host.settings(GPU_RUNTIME="nvidia", GPU_DEVICE="all", MODEL_PATH=model)
    host.release(statement("sm120", DIGEST_A))
    done = dry_run(host, gpus_of(PRO, 4), "PIX")
    assert done.returncode == 3, done.stderr[-2000:]
    assert (f"TENSOR_PARALLEL_SIZE=4: 4 does not divide the model's 14 attention heads ({model / 'config.json'}: "
            "num_attention_heads 14, num_key_value_heads 2)") in done.stderr
    assert "use a tensor-parallel size that splits them (1, 2, 14)" in done.stderr
    assert "pulling" not in done.stderr


def test_a_tp_size_is_checked_against_a_cached_config_of_model_id(host, docker_engine, tmp_path):
    """No MODEL_PATH: the hub's cache layout on this host ($HF_HOME/hub), as huggingface_hub writes it."""
    revision = "7ae557604adf67be50417f59c2c2f167def9a775"  # .env.example's MODEL_REVISION
    snap = tmp_path / "hf" / "hub" / "models--Qwen--Qwen2.5-0.5B-Instruct" / "snapshots" / revision
    snap.mkdir(parents=True)
    (snap / "config.json").write_text(json.dumps({"num_attention_heads": 14, "num_key_value_heads": 2}))
    host.settings(GPU_RUNTIME="nvidia", GPU_DEVICE="0,1,2,3")
    host.release(statement("sm120", DIGEST_A))
    done = dry_run(host, gpus_of(PRO, 4), "NV4", HF_HOME=str(tmp_path / "hf"))
    assert done.returncode == 3 and "4 does not divide the model's 14 attention heads" in done.stderr, done.stderr
    host.settings(GPU_RUNTIME="nvidia", GPU_DEVICE="0,1")
    two = dry_run(host, gpus_of(PRO, 4), "NV4", HF_HOME=str(tmp_path / "hf"))
    assert two.returncode == 0, two.stderr[-2000:]
    assert f"attention heads: 14 (2 key-value) split over 2 GPUs ({snap / 'config.json'})" in two.stderr


@pytest.mark.parametrize("kw, topo, message", [
    ({"GPU_DEVICE": "all", "TENSOR_PARALLEL_SIZE": "2"}, "PIX",
     "TENSOR_PARALLEL_SIZE=2, but GPU_DEVICE=all names 4 GPUs"),
    ({"GPU_DEVICE": "0,1"}, "", "cannot tell how the GPUs are joined: nvidia-smi topo -m failed"),
    ({"GPU_DEVICE": "0,1"}, "XYZ", "nvidia-smi topo -m joins the GPUs by XYZ, which this toolkit does not know"),
])
def test_multi_gpu_preflight_refusals(host, kw, topo, message):
    released(host, settings=kw)  # the target's facts are the release's (issue 52)
    done = host.run("start.sh", gpus=gpus_of(PRO, 4), **({"STANDIN_TOPO": topo} if topo else {}))
    assert done.returncode == 3 and message in done.stderr, done.stderr


def test_each_gpu_needs_the_free_memory_its_fraction_asks_for(host):
    released(host, settings={"GPU_DEVICE": "0,1"})
    busy = PRO.format(1) + "|580.95.05|20000 MiB"
    done = host.run("start.sh", gpus=f"{PRO.format(0)};{busy}", STANDIN_TOPO="PHB")
    assert done.returncode == 3, done.stderr
    assert "GPU 1 has 19.5 of 95.6 GiB free, the server asks for 86.0 GiB" in done.stderr
    assert "GPU_MEMORY_UTILIZATION=0.2" in done.stderr and "GPU 0 has" not in done.stderr


def test_without_a_gpu_runtime_the_allreduce_gate_cannot_run_and_refuses(host, docker_engine):
    released(host, settings={"GPU_DEVICE": "0,1"})
    done = host.run("start.sh", "--dry-run", "--allow-no-gpu-runtime", gpus=gpus_of(PRO, 2), STANDIN_TOPO="NV4")
    assert done.returncode == 4, done.stderr[-2000:]
    assert "the NCCL all-reduce gate cannot run on 2 GPUs with GPU_RUNTIME=none" in done.stderr


# --- the all-reduce gate, in the deploy itself, with a stand-in result ----------------------------------------


def _deploy(host, monkeypatch, result, settings_=None, options=None, peers=None, topo: str = "NV4"):
    """The deploy in this process up to serving: real preflight (stand-in nvidia-smi and runtime hook), the real
    trust gate over a real release, then the probe container replaced by a STAND-IN: the real probe runner,
    whose NCCL and P2P children are stand-in results (the P2P one: every pair working, unless `peers`); a result
    that is a function is called with the environment the probe passed its child."""
    from qualify.deploy import run
    from qualify.deploy.ui import Ui
    from qualify.probe import p2p, runner, versions
    from qualify.qualification import container

    # Baseline (released and promoted by seven signed passes): the GPU checks are skipped, the gate is not.
    released(host, settings={"GPU_RUNTIME": "nvidia", "GPU_DEVICE": "0,1", "HEALTH_TIMEOUT_S": 5, **(settings_ or {})},
             options=options or {})
    nvidia_hook(host)
    monkeypatch.setenv("PATH", f"{host.root / 'bin'}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("STANDIN_GPUS", gpus_of(PRO, 2))
    monkeypatch.setenv("STANDIN_TOPO", topo)
    monkeypatch.setenv("HF_HOME", str(host.root / "no-hf-cache"))
    for key in settings.known_keys():
        monkeypatch.delenv(key, raising=False)
    seen = {}

    def probe_in_image(engine, image, target, *, scope, gpus=None, devices=(), options=(), **_):
        seen.update(scope=scope, gpus=gpus, target=target, options=options)
        monkeypatch.setattr(versions, "nvidia_smi", lambda: [
            {"index": str(i), "name": PRO.split("|")[1], "uuid": f"GPU-pro6000-{i}", "compute_cap": "12.0",
             "driver_version": "580.95.05", "memory.total": "97887", "memory.used": "0", "pci.bus_id": f"{i}"}
            for i in range(2)])
        # The children get what the probe passes them; the stand-ins report it as theirs unless told otherwise.
        def child(made):
            return lambda world, env: json.loads(json.dumps(made(env) if callable(made) else made))

        monkeypatch.setattr(gpu, "_nccl_child", child(result))
        monkeypatch.setattr(p2p, "_child", child(peers or standin_p2p(2)))
        joined = topology.Topology(topology.link_kind(topo), (topology.Link(0, 1, topo),))
        monkeypatch.setattr(gpu, "read_topology", lambda n: joined)
        predicate = runner.run(target, scope=scope)
        return container.ProbeRun(predicate, predicate["toolkit"]["probe_sha256"])

    monkeypatch.setattr(container, "run_probe", probe_in_image)
    monkeypatch.setattr(run.Deploy, "pull", lambda self, image: None)
    composed = {}

    def compose_up(self, text):
        composed["text"] = text
        raise Stop(5, "stand-in: stopped before compose starts anything")

    monkeypatch.setattr(run.Deploy, "compose_up", compose_up)
    s = settings.load(host.env_file, Ui("test"), environ={})
    return run.Deploy(s, run.Options(), Ui("test")), seen, composed


def test_the_allreduce_gate_refuses_below_the_floor_with_the_measured_numbers(host, docker_engine, monkeypatch,
                                                                             capsys):
    deploy, seen, composed = _deploy(host, monkeypatch, standin_result(busbw=40.0))
    with pytest.raises(Stop) as stop:
        deploy.main()
    assert stop.value.code == 4 and "text" not in composed  # nothing served
    assert ("trust gate: REFUSED: the NCCL all-reduce gate refused 2 x NVIDIA RTX PRO 6000 Blackwell Workstation "
            "Edition (nvlink (NV4 between 1 GPU pair)): gpu.nccl-allreduce fail: busbw 40 GB/s is below the floor of "
            "150 GB/s for 2 GPUs joined by nvlink") in str(stop.value.what)
    assert seen["scope"] == "allreduce" and seen["gpus"] == '"device=GPU-pro6000-0,GPU-pro6000-1"'
    assert seen["target"].tensor_parallel_size == 2
    (saved,) = sorted((host.manifests / "v1.0.0").glob("sm120.gpu-evidence.*.json"))
    record = ev.load(saved)
    assert record.configuration == gpuconfig.Configuration(2, 2, "nvlink")
    assert record.outcome is ev.Outcome.PRODUCT_FAILURE and record.figures["allreduce_busbw_gbs"] == 40.0


def test_the_allreduce_gate_passes_and_the_server_spans_the_gpus(host, docker_engine, monkeypatch):
    deploy, seen, composed = _deploy(host, monkeypatch, standin_result(busbw=290.0))
    with pytest.raises(Stop, match="stand-in: stopped before compose"):
        deploy.main()
    service = json.loads(composed["text"])["services"]["vllm"]
    assert service["command"][service["command"].index("--tensor-parallel-size") + 1] == "2"
    assert "NCCL all-reduce passed on 2 GPUs (nvlink, busbw 290 GB/s)" in service["labels"][
        "dev.blackwell-qualify.gate"]
    record = ev.load(deploy.evidence[0])
    assert record.outcome is ev.Outcome.INFRASTRUCTURE  # the gate alone: the single-GPU checks did not run
    assert "required GPU checks missing: gpu.memory" in record.reason and record.configuration.multi_gpu


def test_the_gate_and_the_server_run_under_one_set_of_collective_settings(host, docker_engine, monkeypatch):
    """Issue 51 (local-inference-lab/vllm#261, vllm-project/vllm#51513): the gate's all-reduce used to run under
    NCCL settings the server never got. Now one value (deploy/collectives.py) goes into the compose file and into
    the gate's container and children; the STAND-IN children report the environment the probe passed them."""
    extra = {"CONTAINER_ENV_NCCL_P2P_LEVEL": "NVL", "CONTAINER_ENV_NCCL_DEBUG": "WARN",
             "CONTAINER_ENV_VLLM_LOGGING_LEVEL": "DEBUG", "SHM_SIZE": "16g"}
    deploy, seen, composed = _deploy(host, monkeypatch, lambda env: standin_result(busbw=290.0, env=env.as_dict()),
                                     settings_=extra, peers=lambda env: standin_p2p(2, env=env.as_dict()))
    with pytest.raises(Stop, match="stand-in: stopped before compose"):
        deploy.main()
    service = json.loads(composed["text"])["services"]["vllm"]
    server_env = {k: v for k, v in service["environment"].items() if ncclenv.is_collective(k)}
    assert server_env == seen["target"].collective_env  # the probe was handed exactly the server's
    assert server_env["NCCL_P2P_LEVEL"] == "NVL" and server_env["NCCL_NVLS_ENABLE"] == "0"
    assert "VLLM_LOGGING_LEVEL" not in server_env and service["environment"]["VLLM_LOGGING_LEVEL"] == "DEBUG"
    limits = [a for name, value in service["ulimits"].items() for a in ("--ulimit", f"{name}={value}:{value}")]
    assert seen["options"] == ("--shm-size", "16g", "--ipc", service["ipc"], *limits) and service["shm_size"] == "16g"
    checks = {c["id"]: c for c in ev.load(deploy.evidence[0]).checks}
    assert [r["env"] for r in checks["gpu.nccl-allreduce"]["evidence"]["ranks"]] == [server_env] * 2
    assert checks["gpu.p2p"]["evidence"]["env"] == server_env
    assert "P2P consistent" in service["labels"]["dev.blackwell-qualify.gate"]


def test_a_gate_whose_ranks_ran_under_other_nccl_settings_is_refused(host, docker_engine, monkeypatch):
    other = {**ncclenv.DEFAULT.as_dict(), "NCCL_NVLS_ENABLE": "1"}  # NVLink multicast on, which the server has off
    deploy, _, composed = _deploy(host, monkeypatch, standin_result(busbw=290.0, env=other))
    with pytest.raises(Stop) as stop:
        deploy.main()
    assert stop.value.code == 4 and "text" not in composed
    assert "rank 0 ran under NCCL_NVLS_ENABLE=1, not 0 (the server's)" in stop.value.what


def test_p2p_a_transfer_refutes_is_refused_naming_the_iommu_and_acs_preflight_read(host, docker_engine, monkeypatch,
                                                                                  tmp_path, capfd):
    """Two GPUs below one PCIe switch (PIX) on a STAND-IN sysfs: the IOMMU translates, ACS redirects on the
    switch's ports. Preflight warns with the fix; the STAND-IN P2P child reports what such a host does (the driver
    says P2P, the transfer fails); the gate refuses, naming preflight's finding."""
    monkeypatch.setenv("BLACKWELL_STANDIN_HOST_ROOT", str(standin_sysfs(tmp_path / "host-root")))
    deploy, _, composed = _deploy(host, monkeypatch, standin_result(busbw=290.0), topo="PIX",
                                  peers=standin_p2p(2, transfer=False))
    with pytest.raises(Stop) as stop:
        deploy.main()
    assert stop.value.code == 4 and "text" not in composed
    said = capfd.readouterr().err
    assert "THIS DEPLOY READS STAND-IN HOST FILES" in said
    assert "WARNING: P2P: IOMMU in translated mode (0000:18:00.0's IOMMU group type DMA-FQ) with ACS redirect on the " \
        "GPUs' bridges (0000:11:00.0, 0000:11:01.0)" in said and "; fix: boot with iommu=pt" in said
    assert "P2P: gpu.p2p fail: the driver reports P2P between GPU 0 -> 1, GPU 1 -> 0, but a transfer through it " \
        "failed" in stop.value.what and "preflight found: IOMMU in translated mode" in stop.value.what
    fix = " ".join(stop.value.fixes)
    assert "boot with iommu=pt" in fix and "setpci -s BDF ECAP_ACS+0x6.w=0000" in fix
    assert "CONTAINER_ENV_NCCL_P2P_DISABLE=1 and --disable-custom-all-reduce in EXTRA_SERVE_ARGS" in fix


def test_the_probe_cli_takes_the_world_size(tmp_path):
    """The probe's own entry point, as scripts/allreduce-evidence.sh runs it: no GPU here, so the required
    collectives are not-run and the run is incomplete (exit 3), never a pass."""
    import subprocess

    out = tmp_path / "ar.json"
    done = subprocess.run([sys.executable, "-m", "qualify", "probe", "--target", "sm120", "--only", "allreduce",
                           "--tensor-parallel-size", "2", "--out", str(out)], cwd=REPO, capture_output=True,
                          text=True, timeout=120, env={**os.environ, "PATH": "/usr/bin:/bin"})
    assert done.returncode == 3, done.stderr
    pred = json.loads(out.read_text())["predicate"]
    (check,) = [c for c in pred["checks"] if c["id"] == "gpu.nccl-allreduce"]
    assert (check["status"], check["required"]) == ("not-run", True)
    assert pred["gpu"]["tensor_parallel_size"] == 2 and pred["gpu"]["topology"]["kind"] == "unknown"


# --- the floor is the verified release's signed one, never this checkout's targets file ----------------------


def _targets_copy(tmp_path: Path, nvlink) -> Path:
    from test_multigpu import targets_with_floors

    return targets_with_floors(tmp_path, nvlink)


def test_the_gate_applies_the_released_floor_whatever_the_targets_file_says_at_deploy_time(host, docker_engine,
                                                                                          monkeypatch, tmp_path):
    """The release signed a 300 GB/s nvlink floor; this checkout's targets file says 10 when start.sh runs: a
    stand-in 290 GB/s is refused by the signed floor, and the probe in the image was given that floor."""
    from qualify.config import targets

    deploy, seen, composed = _deploy(host, monkeypatch, standin_result(busbw=290.0),
                                     options={"targets_file": _targets_copy(tmp_path, 300.0)})
    edited = targets.load(_targets_copy(tmp_path, 10.0))
    monkeypatch.setattr(targets, "load", lambda *a, **k: edited)  # what preflight reads now
    with pytest.raises(Stop) as stop:
        deploy.main()
    assert stop.value.code == 4 and "text" not in composed
    assert "busbw 290 GB/s is below the floor of 300 GB/s for 2 GPUs joined by nvlink" in str(stop.value.what)
    assert seen["target"].allreduce_floors == (topology.AllReduceFloor("nvlink", 2, 300.0),)


@pytest.mark.parametrize("how", ["no [allreduce]", "no policy"])
def test_a_multi_gpu_deploy_without_a_signed_floor_is_refused(host, docker_engine, tmp_path, how):
    """Fail closed: a release whose policy signs no floor for the GPUs' topology (its checkout had no
    [allreduce]), or one signed before release.json held a policy, cannot judge the all-reduce: refused before
    anything is pulled; this checkout's targets file (which has floors) does not stand in for the release."""
    from evidence_helpers import sign_with

    from qualify.signing import signer

    host.settings(GPU_RUNTIME="nvidia", GPU_DEVICE="0,1")
    options = {"targets_file": _targets_copy(tmp_path, None)} if how == "no [allreduce]" else {}
    manifest = host.release(statement("sm120", DIGEST_A), **options)
    if how == "no policy":
        path = manifest.parent / "release.json"
        index = json.loads(path.read_text())
        del index["policy"]  # as releases were signed before issue 37
        path.write_bytes(json.dumps(index, indent=2, sort_keys=True).encode() + b"\n")
        signer.write_signature(sign_with(Path(f"{host.key}.key"), DEPLOY_KEY_PASSWORD)[0], path)
    done = dry_run(host, gpus_of(PRO, 2), "NV4")
    assert done.returncode == 4, done.stderr[-3000:]
    if how == "no policy":  # issue 52: refused sooner, in preflight: it signs no deploy facts either
        assert "release v1.0.0" in done.stderr and "was signed before releases carried the deploy facts" in \
            done.stderr and "pulling" not in done.stderr
        return
    said = "release v1.0.0's signed policy has no all-reduce floor for 2 GPUs joined by nvlink (it signs: none)"
    assert "a tensor-parallel deploy on 2 GPUs is judged by the all-reduce floor its release signs" in done.stderr
    assert said in done.stderr and "pulling" not in done.stderr and "dry run: would run" not in done.stderr


def test_the_registry_only_path_signs_no_floor_and_a_multi_gpu_deploy_is_refused():
    """Trusted from the registry's attestation alone (no release folder): a release statement carries no
    policy, so there is no signed floor. Deploy.signed_floor on a plan of two GPUs (the plan is a stand-in)."""
    from types import SimpleNamespace

    from qualify.deploy import run
    from qualify.deploy.ui import Ui

    s = SimpleNamespace(env_file=Path(".env"))
    deploy = run.Deploy(s, run.Options(), Ui("test"))
    deploy.target = "sm120"
    deploy.plan = SimpleNamespace(multi_gpu=True, tensor_parallel_size=2, topology=topology.Topology("nvlink"))
    trust = run.Trust("registry/sm120@sha256:" + "a" * 64, manifest=object(), folder=None, tag="v1.0.0",
                      reason="", need_probe=False)
    with pytest.raises(Stop) as stop:
        deploy.signed_floor(trust)
    assert stop.value.code == 4 and "trusted from its registry attestation alone" in str(stop.value.what)
    signed = run.Trust(trust.image, object(), Path("release"), "v1.0.0", "", False,
                       allreduce_floors=(topology.AllReduceFloor("nvlink", 2, 150.0),))
    assert deploy.signed_floor(signed) is signed and deploy.floor.min_bus_gbps == 150.0
