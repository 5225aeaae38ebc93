"""Issue 51, the deploy side: the PTX a verified manifest says runs here only by JIT, against what this host's
driver JIT-compiles, by the table the verified release signs (deploy/ptxgate.py), refused before anything is
pulled with both numbers and the driver branch that would.

Real parts: nvcc-built fixtures (tests/ptx_fixtures.py), the real census and probe check write the manifest's
`census.ptx_jit`, the real release steps sign it with the policy's `ptx_jit` table from images/targets.toml,
the real verifier reads it back. The GPU and its driver are tests/standin/nvidia-smi: a TEST DOUBLE (this host
has no NVIDIA GPU or driver) whose driver version each test sets.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from conftest import REPO
from deploy_host import RTX5090, Host
from ptx_fixtures import build
from signing_helpers import DIGEST_A, statement

from qualify.config import targets
from qualify.core.arch import Capability
from qualify.deploy import gpus, memory, preflight, ptxgate, run, settings
from qualify.deploy.ui import EX_PREFLIGHT, Stop, Ui
from qualify.probe import census_check
from qualify.trust import folder

SM120 = Capability.parse("12.0")


@pytest.fixture(scope="session")
def ptx(nvcc, tmp_path_factory):
    return build(nvcc, tmp_path_factory.mktemp("ptx-fixtures"))


def census_section(ptx, *names: str) -> dict:
    """predicate.census as the probe writes it (runner.py: census_check.run less its checks), for the fixtures."""
    out = census_check.run(SM120, "12.0", [str(ptx.folder(*names))], None, None, own_extension=False)
    return {k: v for k, v in out.items() if k != "checks"}


def release_with(host: Host, census: dict, **options) -> Path:
    """sm120 released (and promoted to baseline) with this census in its manifest: the release folder."""
    stmt = statement("sm120", DIGEST_A, level="baseline")
    stmt["predicate"]["census"] = census
    host.settings()
    return host.release(stmt, **options).parent


# --- the gate on a verified release, with the stand-in's driver ------------------------------------------------


def deploying(host: Host, driver: str, monkeypatch, allow: bool = False) -> run.Deploy:
    """run.Deploy as preflight leaves it for the gate: the settings, and the GPU as nvidia-smi reports it (the
    stand-in, on PATH, with this driver version)."""
    monkeypatch.setenv("PATH", f"{host.root / 'bin'}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("STANDIN_GPUS", f"{RTX5090}|{driver}")
    ui = Ui("start.sh")
    s = settings.load(host.env_file, ui, explicit=True)
    gpu = gpus.query_all(s)[0]
    target = targets.load().get("sm120")
    d = run.Deploy(s, run.Options(dry_run=True, allow_unqualified=allow), ui)
    d.plan = preflight.HostPlan(gpu, target, memory.memory_fit(target.runtime, gpu.memory),
                                preflight.EngineChoice("docker", "docker", ("docker", "compose")),
                                preflight.GpuRuntime("none", "", (), False))
    d.target = "sm120"
    return d


def verified_trust(path: Path) -> run.Trust:
    """What trust_gate hands on: the verified manifest and the release's signed PTX table."""
    release = folder.read_release(path)
    m = release.target("sm120").manifest
    return run.Trust(m.reference, m, release.path, release.tag, "test", False, None, None, ptxgate.signed(release))


def test_ptx_only_sm80_code_and_a_driver_too_old_for_its_isa_is_refused_with_both_numbers(host, ptx, monkeypatch):
    """The issue's acceptance: compute_80 PTX only, as nvcc 13.0 writes it (`.version 9.0`), and a stand-in driver
    of CUDA 12.9 Update 1's branch (575.57.08), which JIT-compiles PTX up to ISA 8.8. (Through start.sh this
    driver is refused earlier, by the CUDA 13.0 floor of our images: here the gate is asked on its own.)"""
    path = release_with(host, census_section(ptx, "ptx80-zstd"))
    d = deploying(host, "575.57.08", monkeypatch)
    assert d.plan.gpu.driver == "575.57.08"
    with pytest.raises(Stop) as err:
        ptxgate.check(d, verified_trust(path))
    stop = err.value
    assert stop.code == EX_PREFLIGHT
    assert ("this host's driver 575.57.08 JIT-compiles PTX up to ISA 8.8 (CUDA 12.9's driver branch), and the image "
            "needs PTX ISA 9.0 (drivers from 580.65.06, CUDA 13.0's, JIT-compile it)") in stop.what
    assert "libptx80-zstd.so (1 unit(s) of PTX compute_80, ISA 9.0)" in stop.what
    assert "CUDA_ERROR_UNSUPPORTED_PTX_VERSION" in stop.what and "vllm-project/vllm#47397" in stop.what
    assert "nothing was pulled" in stop.what
    assert stop.fixes[0].startswith("install a newer driver branch: R580 (580.65.06 or newer")


def test_a_driver_that_jits_the_isa_passes_and_says_so(host, ptx, monkeypatch, capsys):
    path = release_with(host, census_section(ptx, "ptx80-zstd", "sass120-ptx80"))
    trust = verified_trust(path)
    assert ptxgate.check(deploying(host, "580.65.06", monkeypatch), trust) is trust
    said = capsys.readouterr().err
    assert "PTX JIT: driver 580.65.06 JIT-compiles PTX ISA 9.0, the newest the image runs here only by JIT" in said
    assert "libsass120-ptx80" not in said  # its sm_120 SASS runs: nothing of it is JITted


def test_an_isa_the_census_could_not_read_is_refused_never_passed(host, ptx, monkeypatch):
    section = census_section(ptx, "ptx80-zstd")
    section["ptx_jit"] = census_check.ptx_jit([dict(r, ptx_jit={"units": 1, "isa": {"unknown": 1}})
                                               for r in section["libraries"]])
    trust = verified_trust(release_with(host, section))
    with pytest.raises(Stop, match="could not read their PTX ISA"):
        ptxgate.check(deploying(host, "610.43.02", monkeypatch), trust)


# --- through ./start.sh: preflight, the trust gate, then the PTX gate, before the pull -------------------------


def test_start_sh_refuses_a_newer_toolkits_ptx_on_an_r580_driver(host, docker_engine, ptx):
    """The field class (vllm-project/vllm#47397): a library built by a newer CUDA (the stand-in for a CUDA 13.1
    build: PTX `.version 9.1`, tests/ptx_fixtures.py) in an image whose own CUDA 13.0 floor the host's R580
    driver meets. Minor-version compatibility runs the image; the driver cannot JIT that PTX."""
    release_with(host, census_section(ptx, "isa91"))
    done = host.run("start.sh", "--dry-run", "--allow-no-gpu-runtime", gpus=RTX5090 + "|580.95.05")
    assert done.returncode == 3, done.stderr
    assert "driver: 580.95.05 runs CUDA 13.0 (the image, per its verified manifest" in done.stderr  # floor: met
    assert ("driver: PTX JIT: this host's driver 580.95.05 JIT-compiles PTX up to ISA 9.0 (CUDA 13.0's driver "
            "branch), and the image needs PTX ISA 9.1 (drivers from 590.44.01, CUDA 13.1's, JIT-compile it)") \
        in done.stderr
    assert "isa91-compute80.fatbin" in done.stderr and "nothing was pulled" in done.stderr
    assert "fix: install a newer driver branch: R590 (590.44.01 or newer" in done.stderr
    assert not host.compose_file.exists()


def test_start_sh_passes_nvcc_13_ptx_on_the_cuda_13_floor(host, docker_engine, ptx):
    release_with(host, census_section(ptx, "fa2-like"))
    done = host.run("start.sh", "--dry-run", "--allow-no-gpu-runtime", gpus=RTX5090 + "|580.65.06")
    assert done.returncode == 0, done.stderr
    assert "PTX JIT: driver 580.65.06 JIT-compiles PTX ISA 9.0, the newest the image runs here only by JIT" \
        in done.stderr


def test_a_release_that_signs_no_table_cannot_vouch_for_jit_and_is_refused_unless_overridden(host, docker_engine,
                                                                                             ptx, tmp_path):
    text = (REPO / "images" / "targets.toml").read_text()
    unsigned = tmp_path / "targets-without-ptx-table.toml"
    unsigned.write_text(text[:text.index("[ptx_jit]")])
    release_with(host, census_section(ptx, "ptx80-zstd"), targets_file=unsigned)
    done = host.run("start.sh", "--dry-run", "--allow-no-gpu-runtime")
    assert done.returncode == 3, done.stderr
    assert "release v1.0.0 signs no PTX JIT table" in done.stderr and "cannot be judged" in done.stderr
    loud = host.run("start.sh", "--dry-run", "--allow-no-gpu-runtime", "--allow-unqualified")
    assert loud.returncode == 0, loud.stderr
    assert "--allow-unqualified: DEPLOYING AN IMAGE WHOSE PTX THIS DRIVER CANNOT BE SHOWN TO JIT" in loud.stderr


def test_a_manifest_from_before_issue_51_is_said_not_checked(host, docker_engine):
    host.settings()
    host.release(statement("sm120", DIGEST_A, level="baseline"))
    done = host.run("start.sh", "--dry-run", "--allow-no-gpu-runtime")
    assert done.returncode == 0, done.stderr
    assert "does not record the PTX ISA its JIT-only code needs (qualified by an older toolkit)" in done.stderr
