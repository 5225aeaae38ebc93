"""Issue 50, the deploy side, second half: the paths a model takes (tests/test_model_paths.py) judged by the
verified manifest's `serving_paths` before anything is pulled (deploy/pathgate.py), and the path the server took
recorded by serve-check (deploy/servecheck/providers.py).

The deploy tests run ./start.sh against releases made as `qualify release` makes them (signing_helpers.make_release)
whose manifests carry serving_paths, on the stand-in nvidia-smi (a TEST DOUBLE: this machine has no GPU) describing
an RTX 5090 (sm120); the hub-model tests pull the stand-in vLLM image (tests/standin/, a TEST DOUBLE) whose stand-in
huggingface_hub serves tests/standin/hub/.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Dict, Optional

import pytest
from conftest import REPO, require
from deploy_host import containers_of
from signing_helpers import DIGEST_A, make_key_pair, make_release, statement
from test_model_paths import FP8_BLOCK, FP8_TENSOR, GPTQ, HUB, MXFP4, NVFP4_MOE, TINY, mapped

from qualify.core.servingpaths import PATHS, ServingPaths
from qualify.deploy import pathgate
from qualify.deploy.pathgate import Action
from qualify.deploy.servecheck import providers
from qualify.probe import servematrix as sm

# --- the manifest's verdicts -> the deploy's decision ------------------------------------------------------------

FAMILY = {"name": "kernels", "library": "vllm/_C.abi3.so", "present": True, "code": ["sm_120"]}


def path(name: str, verdict: str = "present", provider: str = "CUTLASS", runs: Optional[str] = "same",
         fallback: Optional[dict] = None, reason: str = "") -> dict:
    """One predicate.serving_paths item as the probe writes it (core/servingpaths.py)."""
    present = verdict in ("present", "fallback")
    return {"path": name, "provider": provider, "runs": provider if runs == "same" else runs,
            "families": [{**FAMILY, "present": present, "code": FAMILY["code"] if present else []}],
            "fallback": fallback, "verdict": verdict, "reason": reason or f"{provider}: {verdict} on sm_120"}


# vLLM 0.33's picks on 12.0 (probe/rules/vllm-0.33.json: selections), all present unless a test says otherwise.
PICKS = {"attention.bf16": "FLASH_ATTN(FA2)", "attention.mla": "TRITON_MLA", "attention.fp8-kv": "FLASHINFER",
         "moe.bf16": "FLASHINFER_CUTLASS", "moe.fp8": "FLASHINFER_CUTLASS", "moe.fp8-block": "FLASHINFER_CUTLASS",
         "moe.nvfp4": "FLASHINFER_CUTLASS", "moe.mxfp4": "FLASHINFER_CUTLASS", "linear.fp8": "CUTLASS",
         "linear.fp8-block": "CUTLASS", "linear.nvfp4": "FLASHINFER_CUTLASS", "linear.w4a16": "MARLIN"}
MARLIN_MOE = {"provider": "MARLIN", "cli": "--moe-backend marlin",
              "note": "weight-only: the 4-bit weights are dequantized in the kernel, activations stay bf16"}
MARLIN_LINEAR = {"provider": "MARLIN", "cli": "--linear-backend marlin", "note": "weight-only FP8 (W8A16)"}
# The verdicts issue 50 is about, as the probe would record them on sm_120.
MISSING = {
    "moe.nvfp4": path("moe.nvfp4", "missing", "FLASHINFER_CUTLASS", "MARLIN", MARLIN_MOE,
                      "flashinfer's fused MoE CUTLASS NVFP4 kernels carry sm_100a code only"),
    "linear.fp8": path("linear.fp8", "missing", "CUTLASS", "MARLIN", MARLIN_LINEAR,
                       "No compiled cutlass_scaled_mm for CUDA device capability: 120"),
    "linear.fp8-block": path("linear.fp8-block", "missing", "CUTLASS", "TRITON",
                             {"provider": "TRITON", "cli": "--linear-backend triton", "note": "Triton block-scaled GEMM"},
                             "cutlass_scaled_mm's blockwise kernels carry sm_90a and sm_100a code only"),
    "moe.mxfp4": path("moe.mxfp4", "none", "FLASHINFER_CUTLASS", None, None,
                      "no provider of MXFP4 MoE carries code for sm_120"),
}


def serving_paths(changed: Optional[Dict[str, dict]] = None) -> list:
    """All twelve paths, present, with the items of `changed` (by path) in their place."""
    return [(changed or {}).get(p) or path(p, provider=PICKS[p]) for p in PATHS]


def judged(model: str, items: list, *args: str) -> pathgate.Judgement:
    return pathgate.judge(mapped(model, *args), ServingPaths.of_predicate({"serving_paths": items}), "12.0", ".env")


def test_a_missing_path_is_refused_naming_the_provider_the_reports_and_the_manifests_fallback():
    j = judged(NVFP4_MOE, serving_paths({"moe.nvfp4": MISSING["moe.nvfp4"]}))
    (row,) = j.refused
    assert row.path == "moe.nvfp4" and "vLLM's pick FLASHINFER_CUTLASS has no kernels for this GPU" in row.text
    assert "quantized kernel families absent on sm_12x: vllm-project/vllm#24921, #32109, #41738" in row.text
    assert row.fixes[0].startswith("EXTRA_SERVE_ARGS=--moe-backend marlin in .env") and "MARLIN" in row.fixes[0]
    assert "slower: weight-only" in row.fixes[0]
    assert [r.action for r in j.rows if r.path != "moe.nvfp4"] == [Action.SERVES, Action.SERVES]


def test_none_unknown_and_a_damaged_verdict_are_refused_fallback_is_a_warning():
    none = judged(MXFP4, serving_paths({"moe.mxfp4": MISSING["moe.mxfp4"]})).refused
    assert [r.path for r in none] == ["moe.mxfp4"] and "no provider of this path can run" in none[0].text
    assert "no override selects a provider of moe.mxfp4 that runs here" in none[0].fixes[0]
    unknown = judged(GPTQ, serving_paths({"linear.w4a16": path("linear.w4a16", "unknown", "MARLIN", None)})).refused
    assert "could not read its kernel families" in unknown[0].text and "unknown is never a pass" in unknown[0].text
    damaged = judged(GPTQ, serving_paths({"linear.w4a16": path("linear.w4a16", "works", "MARLIN")})).refused
    assert [r.path for r in damaged] == ["linear.w4a16"]
    slower = judged(GPTQ, serving_paths({"linear.w4a16": path("linear.w4a16", "fallback", "MARLIN")}))
    assert [r.action for r in slower.rows] == [Action.SERVES, Action.SLOWER] and not slower.refused
    unlisted = judged(GPTQ, [i for i in serving_paths() if i["path"] != "linear.w4a16"])
    assert unlisted.rows[1].action is Action.NOT_CHECKED and "do not list it" in unlisted.rows[1].text


def test_a_backend_chosen_in_extra_serve_args_is_judged_only_where_the_manifest_names_it():
    items = serving_paths({"moe.nvfp4": MISSING["moe.nvfp4"]})
    fallback = judged(NVFP4_MOE, items, "--moe-backend", "marlin")
    row = next(r for r in fallback.rows if r.path == "moe.nvfp4")
    assert row.action is Action.SLOWER and "selects MARLIN, which the manifest names as this path's fallback" in row.text
    own = judged(NVFP4_MOE, items, "--moe-backend=flashinfer_cutlass")
    assert [r.path for r in own.refused] == ["moe.nvfp4"] and "selects vLLM's own pick" in own.refused[0].text
    other = judged(NVFP4_MOE, items, "--moe-backend", "triton")
    row = next(r for r in other.rows if r.path == "moe.nvfp4")
    assert row.action is Action.NOT_CHECKED and "the manifest judged that pick (FLASHINFER_CUTLASS: missing)" in row.text


# --- serve-check: the path the server took, beside the prediction ---------------------------------------------

NVFP4_LOG = """INFO [cuda.py:448] Using AttentionBackendEnum.FLASHINFER backend.
INFO [nvfp4.py:242] Using 'MARLIN' NvFp4 MoE backend out of potential backends: ['FLASHINFER_CUTLASS', 'MARLIN'].
INFO [__init__.py:1303] Using MarlinNvFp4LinearKernel for NVFP4 GEMM
INFO [core.py:133] Initializing a V1 LLM engine with config: quantization=modelopt_fp4, kv_cache_dtype=fp8_e4m3,"""


def test_serve_check_records_which_provider_each_path_took_beside_the_prediction():
    m = sm.load()
    seen = providers.observe(NVFP4_LOG, m.providers)
    assert ("attention", "FLASHINFER") in {(s.kind, s.name) for s in seen}  # the enum member's name
    items = serving_paths({"moe.nvfp4": MISSING["moe.nvfp4"]})
    serving = providers.ServingInput(mapped(NVFP4_MOE, "--moe-backend", "marlin"), "",
                                     ServingPaths.of_predicate({"serving_paths": items}), "")
    result = providers.providers(NVFP4_LOG, "log", [], "manifest", m.providers, serving)
    rows = {r["path"]: r for r in result.evidence["serving_paths"]["paths"]}
    assert rows["moe.nvfp4"]["observed"] == ["MARLIN"] and rows["moe.nvfp4"]["took"] == "fallback"
    assert rows["moe.nvfp4"]["predicted"] == {"provider": "FLASHINFER_CUTLASS", "runs": "MARLIN",
                                              "verdict": "missing", "fallback": "MARLIN"}
    assert rows["attention.fp8-kv"]["took"] == "pick" and rows["linear.nvfp4"]["took"] == "other"
    assert rows["linear.nvfp4"]["observed"] == ["MARLIN"]
    unread = providers.ServingInput(None, "no config here", None, "no release")
    evidence = providers.providers(NVFP4_LOG, "log", [], "m", m.providers, unread).evidence["serving_paths"]
    assert evidence == {"model": None, "manifest": "no release", "why": "no config here"}


def test_serve_check_writes_the_paths_the_server_took_into_its_signed_record(tmp_path):
    """`qualify serve-check` against the honest TEST DOUBLE server (tests/matrix_double.py), its start-up log given
    with --server-log, the release (signed as `qualify release` signs it) naming sm120's serving paths."""
    stmt = statement("sm120", DIGEST_A)
    stmt["predicate"]["serving_paths"] = serving_paths({"moe.nvfp4": MISSING["moe.nvfp4"]})
    folder = make_release(tmp_path / "repo", "v1.0.0", [stmt], make_key_pair(tmp_path)[0])
    model = tmp_path / "model"
    shutil.copytree(HUB / NVFP4_MOE, model)
    (tmp_path / "server.log").write_text(NVFP4_LOG + "\n")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    double = subprocess.Popen([sys.executable, str(REPO / "tests" / "matrix_double.py"), "--port", str(port),
                               "--mode", "honest"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(100):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1).close()
                break
            except OSError:
                time.sleep(0.1)
        out = tmp_path / "record.json"
        subprocess.run([sys.executable, "-m", "qualify", "serve-check", "--url", f"http://127.0.0.1:{port}", "--model",
                        "double", "--tool-call-parser", "hermes", "--target", "sm120", "--release-dir", str(folder),
                        "--server-log", str(tmp_path / "server.log"), "--reference-model", str(model), "--out",
                        str(out)], cwd=REPO, capture_output=True, text=True, timeout=600)
    finally:
        double.kill()
        double.wait(timeout=30)
    checks = {c["id"]: c for c in json.loads(out.read_text())["predicate"]["checks"]}
    recorded = checks["serve.providers"]["evidence"]["serving_paths"]
    assert recorded["model"] == str(model / "config.json") and recorded["manifest"] == "recorded"
    took = {r["path"]: (r["observed"], r["took"]) for r in recorded["paths"]}
    assert took == {"attention.fp8-kv": (["FLASHINFER"], "pick"), "linear.nvfp4": (["MARLIN"], "other"),
                    "moe.nvfp4": (["MARLIN"], "fallback")}


# --- ./start.sh: refused before anything is pulled -------------------------------------------------------------


def model_folder(root: Path, model: str) -> Path:
    """The model's files as MODEL_PATH holds them (its configs; weights do not matter to preflight)."""
    folder = root / model.replace("/", "--")
    shutil.copytree(HUB / model if (HUB / model).is_dir() else TINY, folder)
    for p in [root, folder, *folder.iterdir()]:
        p.chmod(0o755 if p.is_dir() else 0o644)  # the image's user (uid 1000) reads it
    return folder


def release(host, items: Optional[list], tag: str = "v1.0.0", **settings) -> None:
    """sm120 at baseline (promoted by seven signed passes), its manifest carrying `items` as serving_paths."""
    host.settings(**settings)
    stmt = statement("sm120", DIGEST_A, level="baseline")
    if items is not None:
        stmt["predicate"]["serving_paths"] = items
    host.release(stmt, tag)


def dry_run(host, *args: str, **env: str):
    env.setdefault("HF_HOME", str(host.root / "no-hf-cache"))  # this host's own hub cache stays out of it
    return host.run("start.sh", "--dry-run", "--allow-no-gpu-runtime", *args, **env)


@pytest.mark.parametrize("model, missing", [(NVFP4_MOE, "moe.nvfp4"), (FP8_TENSOR, "linear.fp8"),
                                            (FP8_BLOCK, "linear.fp8-block"), (MXFP4, "moe.mxfp4")])
def test_preflight_refuses_a_model_whose_path_the_verified_manifest_marks_missing(host, docker_engine, model, missing):
    folder = model_folder(host.root, model)
    release(host, serving_paths({missing: MISSING[missing]}), MODEL_PATH=folder)
    done = dry_run(host)
    assert done.returncode == 3, done.stderr[-3000:]
    sp = MISSING[missing]
    assert f"ERROR: serving paths: {missing} (" in done.stderr and sp["reason"] in done.stderr
    assert "kernel families absent on sm_12x: vllm-project/vllm#24921, #32109, #41738" in done.stderr
    assert "(the verified manifest of sm120, release v1.0.0); nothing was pulled" in done.stderr
    if sp["fallback"]:
        assert f"fix: EXTRA_SERVE_ARGS={sp['fallback']['cli']} in {host.env_file}" in done.stderr
    assert "fix: or, at your own risk: ./start.sh --allow-unqualified" in done.stderr
    assert f"model paths: {folder / 'config.json'}" in done.stderr and "pulling" not in done.stderr
    assert not host.compose_file.exists()


def test_the_same_model_deploys_when_the_path_is_present_and_is_warned_on_a_fallback(host, docker_engine):
    folder = model_folder(host.root, NVFP4_MOE)
    release(host, serving_paths(), MODEL_PATH=folder)
    done = dry_run(host)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "serving path moe.nvfp4: NVFP4 MoE: FLASHINFER_CUTLASS, kernels present" in done.stderr
    assert "every path the model takes serves here" in done.stderr
    assert json.loads(done.stdout)["services"]["vllm"]["command"][:2] == ["--model", "/var/cache/blackwell/model"]
    slow = path("moe.nvfp4", "fallback", "MARLIN", fallback=MARLIN_MOE)
    release(host, serving_paths({"moe.nvfp4": slow}), "v1.1.0", MODEL_PATH=folder)
    warned = dry_run(host)
    assert warned.returncode == 0, warned.stderr[-3000:]
    assert "WARNING: serving path moe.nvfp4: NVFP4 MoE: MARLIN (a slower fallback: weight-only" in warned.stderr


def test_the_manifests_fallback_chosen_in_extra_serve_args_deploys_with_a_warning(host, docker_engine):
    folder = model_folder(host.root, NVFP4_MOE)
    release(host, serving_paths({"moe.nvfp4": MISSING["moe.nvfp4"]}), MODEL_PATH=folder,
            EXTRA_SERVE_ARGS="--moe-backend marlin")
    done = dry_run(host)
    assert done.returncode == 0, done.stderr[-3000:]
    assert ("WARNING: serving path moe.nvfp4: EXTRA_SERVE_ARGS --moe-backend marlin selects MARLIN, which the "
            "manifest names as this path's fallback") in done.stderr
    assert json.loads(done.stdout)["services"]["vllm"]["command"][-2:] == ["--moe-backend", "marlin"]


def test_an_unknown_path_is_refused_and_allow_unqualified_overrides_it_loudly(host, docker_engine):
    folder = model_folder(host.root, GPTQ)
    release(host, serving_paths({"linear.w4a16": path("linear.w4a16", "unknown", "MARLIN", None,
                                                  reason="the census could not read libmarlin.so")}), MODEL_PATH=folder)
    done = dry_run(host)
    assert done.returncode == 3 and "unknown is never a pass" in done.stderr, done.stderr[-3000:]
    forced = dry_run(host, "--allow-unqualified")
    assert forced.returncode == 0, forced.stderr[-3000:]
    assert "--allow-unqualified: SERVING A MODEL WHOSE PATH THE VERIFIED MANIFEST REFUSES ON THIS GPU" in forced.stderr
    labels = json.loads(forced.stdout)["services"]["vllm"]["labels"]
    assert "UNQUALIFIED (--allow-unqualified): serving path linear.w4a16 refused" in labels["dev.blackwell-qualify.gate"]


def test_the_tiny_model_takes_attention_bf16_only_and_deploys_as_before(host, docker_engine):
    folder = model_folder(host.root, "tiny")
    release(host, serving_paths({"moe.nvfp4": MISSING["moe.nvfp4"]}), MODEL_PATH=folder)  # not its path
    done = dry_run(host)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (f"model paths: {folder / 'config.json'}: dense, quantization none, KV cache the model's dtype "
            "(--kv-cache-dtype auto) -> attention.bf16") in done.stderr
    assert "serving path attention.bf16: bf16 attention: FLASH_ATTN(FA2), kernels present" in done.stderr
    assert "moe.nvfp4" not in done.stderr and "trust gate: passed: support level baseline" in done.stderr


def test_a_manifest_from_before_serving_paths_says_they_were_not_checked(host, docker_engine):
    release(host, None, MODEL_PATH=model_folder(host.root, NVFP4_MOE))
    done = dry_run(host)
    assert done.returncode == 0, done.stderr[-3000:]
    assert ("WARNING: serving paths: not checked: the verified manifest of sm120 (release v1.0.0) was qualified "
            "before serving paths were recorded") in done.stderr
    assert "-> attention.fp8-kv, linear.nvfp4, moe.nvfp4" in done.stderr  # the mapping is still shown


def test_a_hub_model_is_judged_from_its_cached_config_and_said_not_checked_without_one(host, docker_engine, tmp_path):
    revision = "0" * 40
    snap = tmp_path / "hf" / "hub" / f"models--{NVFP4_MOE.replace('/', '--')}" / "snapshots" / revision
    shutil.copytree(HUB / NVFP4_MOE, snap)
    release(host, serving_paths({"moe.nvfp4": MISSING["moe.nvfp4"]}), MODEL_ID=NVFP4_MOE, MODEL_REVISION=revision)
    cached = dry_run(host, HF_HOME=str(tmp_path / "hf"))
    assert cached.returncode == 3 and f"model paths: {snap / 'config.json'}" in cached.stderr, cached.stderr[-3000:]
    absent = dry_run(host)
    assert absent.returncode == 0, absent.stderr[-3000:]
    assert (f"WARNING: serving paths: {NVFP4_MOE}'s config.json is not on this host yet: its quantized paths are not "
            "checked before the image is pulled (a dry run pulls nothing") in absent.stderr


# --- a hub model's config read through the image after the pull, before the server starts --------------------


@pytest.fixture(scope="module")
def standin_hub_image(docker_engine, debian_python_image, loopback_registry):
    """The stand-in vLLM (tests/standin/, a TEST DOUBLE) with its stand-in huggingface_hub, which serves the files
    under tests/standin/hub/ instead of the Hugging Face Hub; pushed to the loopback registry."""
    require(shutil.which("docker-compose") is not None or subprocess.run(
        [docker_engine, "compose", "version"], capture_output=True).returncode == 0, "no docker compose")
    repo = f"qualify-test/standin-hub-{uuid.uuid4().hex[:10]}"
    tag = f"{loopback_registry.ref(repo)}:test"
    subprocess.run([docker_engine, "build", "-q", "--build-arg", f"BASE={debian_python_image}", "-t", tag,
                    str(REPO / "tests" / "standin")], check=True, capture_output=True, timeout=600)
    subprocess.run([docker_engine, "push", tag], check=True, capture_output=True, timeout=300)
    ref = f"{loopback_registry.ref(repo)}@{loopback_registry.manifest_digest(repo, 'test')}"
    yield ref
    subprocess.run([docker_engine, "rmi", tag, ref], capture_output=True, timeout=120)
    req = urllib.request.Request(f"{loopback_registry.url}/v2/{repo}/manifests/{ref.split('@')[1]}", method="DELETE")
    try:
        urllib.request.urlopen(req, timeout=10).close()
    except OSError:
        pass  # the registry keeps it; it is uniquely named


def hub_release(host, image: str, items: list, model: str) -> None:
    host.settings(MODEL_ID=model, MODEL_REVISION="main", HEALTH_TIMEOUT_S=90)
    stmt = statement("sm120", image.split("@", 1)[1], reference=image, level="baseline")
    stmt["predicate"]["serving_paths"] = items
    host.release(stmt)


def test_a_hub_models_config_is_read_through_the_image_after_the_pull_and_refused_before_the_server_starts(
        host, docker_engine, standin_hub_image):
    hub_release(host, standin_hub_image, serving_paths({"moe.nvfp4": MISSING["moe.nvfp4"]}), NVFP4_MOE)
    done = host.run("start.sh", "--allow-no-gpu-runtime", timeout=240, HF_HOME=str(host.root / "no-hf-cache"))
    assert done.returncode == 3, done.stderr[-3000:]
    assert f"pulling {standin_hub_image}" in done.stderr
    assert f"serving paths: reading {NVFP4_MOE}'s config.json at main from the hub" in done.stderr
    assert "-> attention.fp8-kv, linear.nvfp4, moe.nvfp4" in done.stderr
    assert "ERROR: serving paths: moe.nvfp4 (NVFP4 MoE)" in done.stderr
    assert "the image was pulled; the server was not started" in done.stderr
    assert "starting compose project" not in done.stderr and containers_of(docker_engine, host.project) == []


def test_a_hub_config_the_image_cannot_fetch_is_said_not_checked(host, docker_engine, standin_hub_image):
    hub_release(host, standin_hub_image, serving_paths(), "nobody/not-on-the-stand-in-hub")
    done = host.run("start.sh", "--allow-no-gpu-runtime", timeout=240, HF_HOME=str(host.root / "no-hf-cache"))
    assert "WARNING: serving paths: not checked: nobody/not-on-the-stand-in-hub's config.json could not be read " \
           "through the image" in done.stderr, done.stderr[-3000:]
    assert done.returncode == 0, done.stderr[-3000:]
