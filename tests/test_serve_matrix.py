"""The serving correctness matrix (issue 39) without a real server: the data file, the record format, the
judgement of each check, and `serve-check` itself against TEST DOUBLES (tests/matrix_double.py) that fail
the way a broken server does. The real vLLM server runs the same command in tests/test_cpu_matrix.py."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from qualify.core.errors import ConfigError
from qualify.deploy.servecheck import accuracy, providers
from qualify.probe import servematrix as sm
from qualify.release import evidence as ev
from qualify.release import servecount, serving

REPO = Path(__file__).resolve().parent.parent
MATRIX = sm.load()


# --- the data file -------------------------------------------------------------------------------------------


def test_the_matrix_file_loads_and_names_every_check_it_promotes():
    assert MATRIX.version == 1 and not hasattr(MATRIX, "baseline")  # the level's checks: the signed policy
    assert len(MATRIX.sha256) == 64 and MATRIX.tools.name == "book_table"
    assert max(MATRIX.niah.context_fractions) <= 0.5 and len(MATRIX.niah.depths) >= 3


def _edited(tmp_path, edit) -> str:
    doc = json.loads(Path(sm.DEFAULT_FILE).read_text())
    edit(doc)
    path = tmp_path / "matrix.json"
    path.write_text(json.dumps(doc))
    return str(path)


@pytest.mark.parametrize("edit, words", [
    (lambda d: d["checks"]["serve.soak"].update(concurency=4), "unknown key(s) concurency"),
    (lambda d: d["checks"]["serve.niah"].update(needle="no word here"), "must hold {word} exactly once"),
    (lambda d: d["checks"]["serve.niah"]["hay"].append("The apple tree is old."), "a needle word appears in the hay"),
    (lambda d: d["checks"]["serve.accuracy"].update(max_mean_kl=-1), "serve.accuracy.max_mean_kl"),
    (lambda d: d.update(promotion={"baseline": ["serve.determinism"]}), "unknown key(s) promotion"),
    (lambda d: d["checks"]["serve.providers"]["log_rules"].append({"kind": "attention", "pattern": "Using ("}),
     "not a regular expression"),
])
def test_a_bad_matrix_file_is_refused_naming_the_key(tmp_path, edit, words):
    with pytest.raises(ConfigError) as err:
        sm.load(_edited(tmp_path, edit))
    assert words in err.value.message and "matrix.json" in err.value.message


def test_needle_cases_fit_their_fraction_of_the_context_and_are_reproducible():
    count = len  # a counter that is not the server's: one token a character
    a, b = sm.niah_cases(MATRIX.niah, 8192 * 4, count), sm.niah_cases(MATRIX.niah, 8192 * 4, count)
    assert a == b and len(a) == len(MATRIX.niah.context_fractions) * len(MATRIX.niah.depths)
    for c in a:
        assert count(c.message) <= c.target_tokens and c.message.count(c.word) == 1
        assert sm.answer_words(MATRIX.niah, c.message) == (c.word,)
        assert count(c.message) > 0.8 * c.target_tokens  # close to its size, not a token-short haystack
    assert sm.answer_words(MATRIX.niah, "apple, or maybe river") == ("apple", "river")


# --- the judgement of single checks ------------------------------------------------------------------------


def test_the_coarse_kl_is_zero_for_the_same_distribution_and_grows_with_the_difference():
    ref = [[1, -0.1], [2, -2.4], [3, -4.0]]
    assert accuracy.kl_coarse(ref, {1: -0.1, 2: -2.4, 3: -4.0}) == pytest.approx(0.0, abs=1e-9)
    near, far = accuracy.kl_coarse(ref, {1: -0.12, 2: -2.3}), accuracy.kl_coarse(ref, {1: -3.0, 2: -0.1})
    assert 0 < near < 0.01 < far


CPU_LOG = """(EngineCore pid=18) INFO 12-02 00:14:01 [core.py:133] Initializing a V1 LLM engine (v0.32.0) with config: \
model='/m', dtype=torch.float32, max_seq_len=8192, quantization=None, quantization_config=None, kv_cache_dtype=auto, \
device_config=cpu, seed=0"""
GPU_LOG = """INFO [cuda.py:506] Using FLASHINFER attention backend out of potential backends: ['FLASHINFER', 'FLASH_ATTN'].
INFO [fp8.py:446] Using FLASHINFER_CUTLASS Fp8 MoE backend out of potential backends: ['TRITON'].
INFO [__init__.py:846] Selected CutlassFP8ScaledMMLinearKernel for QKVParallelLinear
INFO [core.py:133] Initializing a V1 LLM engine with config: dtype=torch.bfloat16, quantization=fp8, kv_cache_dtype=auto,"""


def test_the_servers_selections_are_read_from_its_log_and_named_as_the_manifest_names_them():
    seen = {(s.kind, s.name) for s in providers.observe(GPU_LOG, MATRIX.providers)}
    assert {("attention", "FLASHINFER"), ("moe", "FLASHINFER_CUTLASS"), ("linear", "CUTLASS"), ("dtype", "bfloat16"),
            ("quantization", "fp8")} <= seen
    cpu = providers.providers(CPU_LOG, "log", [{"kind": "attention", "variant": "decoder", "selected": "CPU_ATTN"}],
                              "manifest", MATRIX.providers)
    assert cpu.status.value == "pass" and "attention: CPU_ATTN as predicted" in cpu.reason
    assert "dtype float32" in cpu.reason and "not in the log: moe, linear" in cpu.reason


def test_a_selection_the_manifest_did_not_predict_is_a_named_mismatch():
    predicted = [{"kind": "attention", "variant": "bf16", "selected": "FLASH_ATTN"},
                 {"kind": "moe", "variant": "fp8", "selected": "TRITON"}]
    result = providers.providers(GPU_LOG, "log", predicted, "manifest", MATRIX.providers)
    assert result.status.value == "fail"
    assert "attention: the server selected FLASHINFER; the manifest predicted FLASH_ATTN" in result.reason
    assert "moe: the server selected FLASHINFER_CUTLASS" in result.reason
    assert providers.providers(None, "no log here", predicted, "m", MATRIX.providers).status.value == "not-run"
    assert providers.providers(GPU_LOG, "log", None, "no release", MATRIX.providers).status.value == "not-run"


# --- the record ---------------------------------------------------------------------------------------------


def check(cid: str, status: str = "pass", required: bool = True) -> dict:
    return {"id": cid, "title": cid, "status": status, "required": required, "reason": f"{cid} {status}",
            "evidence": {"n": 1}, "seconds": 0.1}


def record(statuses=None, **kw) -> serving.ServeRecord:
    statuses = statuses or {}
    checks = tuple(check(c, statuses.get(c, "pass")) for c in sm.CHECK_IDS)
    declared = serving.declared_outcome(checks)
    fields = dict(release="v1.0.0", target="cpu", capability="cpu", image="127.0.0.1:5555/blackwell/cpu@sha256:"
                  + "a1" * 32, subject_name="127.0.0.1:5555/blackwell/cpu", subject_digest="sha256:" + "a1" * 32,
                  time="2026-12-02T10:00:00Z", run_id="0" * 31 + "1", host_id_sha256=ev.hashed("host"),
                  toolkit_version="0.1.0", probe_sources_digest="sha256:" + "c" * 64, matrix_version=1,
                  matrix_sha256=MATRIX.sha256,
                  server={"url": "http://127.0.0.1:8000", "model": "tiny", "loopback": True, "max_model_len": 8192,
                          "tool_call_parser": "hermes", "found_by": "deployment"},
                  gpu_evidence=None, checks=checks, figures={"soak_p99_latency_s": 0.4}, outcome=declared.outcome,
                  reason=declared.reason)
    fields.update(kw)
    return serving.ServeRecord(**fields)


def test_a_record_round_trips_through_its_schema_and_keeps_its_identity():
    r = record()
    again = serving.parse(r.to_bytes(), "r.json")
    assert again == r and serving.identity(again) == serving.identity(r)
    assert r.outcome is ev.Outcome.PASS and r.statement()["predicateType"] == serving.SERVE_TYPE


def test_a_record_whose_outcome_its_checks_do_not_give_is_refused():
    doc = record({"serve.niah": "fail"}).statement()
    assert doc["predicate"]["outcome"] == "product-failure"
    doc["predicate"]["outcome"] = "pass"
    with pytest.raises(serving.ServeRecordError) as err:
        serving.parse(json.dumps(doc).encode(), "lying.json")
    assert "declares outcome 'pass', but its checks give 'product-failure'" in err.value.message


@pytest.mark.parametrize("edit, words", [
    (lambda p: p.update(surprise=1), "Additional properties"),
    (lambda p: p["checks"][0].update(status="great"), "checks/0/status"),
    (lambda p: p.update(run_id="x"), "run_id"),
    (lambda p: p.update(image="other@sha256:" + "b" * 64), "is not the subject"),
    (lambda p: p["checks"].append(dict(p["checks"][0])), "listed 2 times"),
])
def test_a_damaged_record_is_refused_naming_the_field(edit, words):
    doc = record().statement()
    edit(doc["predicate"])
    with pytest.raises(serving.ServeRecordError) as err:
        serving.parse(json.dumps(doc).encode(), "damaged.json")
    assert words in err.value.message


RULE = servecount.ServingRule(tuple(sm.CHECK_IDS), False, "a rule that requires the matrix")


@pytest.mark.parametrize("gpu, served, want, lifts", [
    ("pass", ["pass"], "pass", True),
    ("pass", ["fail"], "product-failure", False),  # a failed matrix is a product failure
    ("pass", [], "infrastructure", True),  # GPU checks passed, no serving evidence: lifts, counts no streak
    ("pass", ["not-run"], "infrastructure", True),
    ("product-failure", ["pass"], "product-failure", False),
    ("infrastructure", ["pass"], "infrastructure", False),
])
def test_a_run_counts_when_its_gpu_evidence_and_its_matrix_both_pass(gpu, served, want, lifts):
    records = [record({"serve.soak": s}) for s in served]
    got = servecount.combine(ev.Outcome(gpu), "gpu", records, RULE)
    assert (got.outcome.value, got.lifts) == (want, lifts)
    earlier = servecount.ServingRule((), False, "GPU evidence alone")
    assert servecount.combine(ev.Outcome(gpu), "gpu", records, earlier).outcome.value == gpu  # an earlier rule


def test_of_several_records_of_one_deployment_a_failure_decides():
    ok, bad, idle = record(), record({"serve.tools": "fail"}), record({"serve.soak": "not-run"})
    assert servecount.choose([ok], [idle, bad], RULE) is bad
    assert servecount.choose([], [idle, ok], RULE) is ok


# --- serve-check against TEST DOUBLES ---------------------------------------------------------------------------


@pytest.fixture
def double(request):
    """A TEST DOUBLE server (tests/matrix_double.py) in its own process, in the mode the test names."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    proc = subprocess.Popen([sys.executable, str(REPO / "tests" / "matrix_double.py"), "--port", str(port),
                             "--mode", request.param], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    for _ in range(100):
        try:
            urllib.request.urlopen(f"{url}/health", timeout=1)
            break
        except OSError:
            time.sleep(0.1)
    yield url
    proc.terminate()
    proc.wait(timeout=30)
    proc.stdout.close()


def serve_check(url: str, tmp_path: Path, *args: str) -> tuple:
    out = tmp_path / "record.json"
    done = subprocess.run([sys.executable, "-m", "qualify", "serve-check", "--url", url, "--model", "double",
                           "--tool-call-parser", "hermes", "--out", str(out), *args], cwd=REPO, capture_output=True,
                          text=True, timeout=600)
    checks = {c["id"]: c for c in json.loads(out.read_text())["predicate"]["checks"]} if out.exists() else {}
    return done, checks


@pytest.mark.parametrize("double", ["sampler"], indirect=True)
def test_a_server_that_samples_whatever_the_request_says_fails_determinism(double, tmp_path):
    done, checks = serve_check(double, tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    assert checks["serve.determinism"]["status"] == "fail"
    assert "tokens differ from position 0" in checks["serve.determinism"]["reason"]
    assert "serve.determinism  fail" in done.stdout and "matrix: product-failure" in done.stdout


@pytest.mark.parametrize("double", ["no-tool-flags"], indirect=True)
def test_a_server_without_tool_call_flags_fails_tools(double, tmp_path):
    done, checks = serve_check(double, tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    assert checks["serve.tools"]["status"] == "fail"
    assert "HTTP 400" in checks["serve.tools"]["reason"] and "--enable-auto-tool-choice" in checks["serve.tools"]["reason"]
    assert checks["serve.determinism"]["status"] == "pass"  # the same double is deterministic otherwise


@pytest.mark.parametrize("double", ["honest"], indirect=True)
def test_what_cannot_run_against_an_honest_double_is_not_run_with_its_reason_and_never_exit_0(double, tmp_path):
    """No release names what the server must pass (--url alone): every check is required, so a not-run is
    exit 13 (EX_INCOMPLETE), never 0 (issue 48: a gate reading the exit code let a deploy without tools through)."""
    done, checks = serve_check(double, tmp_path)
    assert done.returncode == 13, done.stdout + done.stderr
    assert {c: checks[c]["status"] for c in ("serve.determinism", "serve.niah", "serve.tools")} == \
        {"serve.determinism": "pass", "serve.niah": "pass", "serve.tools": "pass"}
    assert checks["serve.providers"]["status"] == "not-run" and "--server-log" in checks["serve.providers"]["reason"]
    assert checks["serve.accuracy"]["status"] == "not-run" and "no BF16 reference" in checks["serve.accuracy"]["reason"]
    assert checks["serve.soak"]["status"] in ("pass", "not-run")  # its memory: the listening process tree
    assert checks["serve.soak"]["evidence"]["completed"] == MATRIX.soak.requests
    assert "matrix: infrastructure" in done.stdout
    assert "not complete: serve.providers" in done.stderr and "every serving check is required" in done.stderr


def _release_for(tmp_path: Path, level_checks: str) -> Path:
    """A release signed as `qualify release` signs it, whose policy's [promotion] level_checks are these."""
    from signing_helpers import make_key_pair, make_release, statement

    targets = tmp_path / "targets.toml"
    text = (REPO / "images" / "targets.toml").read_text()
    start = text.index("level_checks = ")
    targets.write_text(text[:start] + f"level_checks = {level_checks}" + text[text.index("\n", start):])
    key, _ = make_key_pair(tmp_path)
    return make_release(tmp_path / "repo", "v1.0.0", [statement("sm120", "sha256:" + "ab" * 32)], key,
                        targets_file=targets)


@pytest.mark.parametrize("double", ["honest"], indirect=True)
def test_a_check_the_releases_level_requires_that_did_not_run_is_exit_13(double, tmp_path):
    """The reproducer: the tool-call parser disabled, the release's signed policy names serve.tools for the
    target's intended level (sm120: baseline): serve.tools is not-run and serve-check exits 13, naming it."""
    folder = _release_for(tmp_path, '{ baseline = ["serve.determinism", "serve.tools"] }')
    done, checks = serve_check(double, tmp_path, "--tool-call-parser", "", "--release-dir", str(folder),
                               "--target", "sm120")
    assert checks["serve.tools"]["status"] == "not-run", checks["serve.tools"]
    assert done.returncode == 13, done.stdout + done.stderr
    assert "not complete: serve.tools did not run" in done.stderr
    assert "release v1.0.0's signed policy for sm120 (intended level baseline)" in done.stderr


@pytest.mark.parametrize("double", ["honest"], indirect=True)
def test_what_the_releases_level_does_not_require_may_not_run(double, tmp_path):
    """The same server, a policy whose levels name only determinism: the not-runs are not required, exit 0."""
    folder = _release_for(tmp_path, '{ baseline = ["serve.determinism"] }')
    done, checks = serve_check(double, tmp_path, "--tool-call-parser", "", "--release-dir", str(folder),
                               "--target", "sm120")
    assert checks["serve.tools"]["status"] == "not-run" and checks["serve.determinism"]["status"] == "pass"
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("double", ["honest"], indirect=True)
def test_a_record_not_bound_to_an_image_is_refused_by_promote(double, tmp_path):
    done, _ = serve_check(double, tmp_path)
    r = serving.parse((tmp_path / "record.json").read_bytes(), "record.json")
    assert r.image is None and r.subject_name.startswith("server:")
    from signing_helpers import statement

    from qualify.core import manifest as mf

    m = mf.Manifest.from_statement(statement("cpu", "sha256:" + "a1" * 32, capability="cpu"), "m")
    with pytest.raises(serving.ServeRecordError) as err:
        servecount.check_binding(r, m, None, "record.json", None)
    assert "names no image" in err.value.message


def test_a_soak_refuses_a_server_that_is_not_on_this_host():
    from qualify.deploy.servecheck import soak

    got = soak.soak("http://10.1.2.3:8000", "m", MATRIX.soak, None)
    assert got.status.value == "not-run" and "not on this host" in got.reason
    assert soak.is_loopback("http://[::1]:8000") and soak.is_loopback("http://localhost:1")
    assert not soak.is_loopback("http://0.0.0.0:8000")
