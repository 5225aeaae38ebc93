"""Building the smoke images for real (hermetic base, Docker engine, loopback registry).

Acceptance of the build issue, checked inside the built images.
"""

import hashlib
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

import images
from qualify.config import targets
from qualify.core.errors import BuildError, ConfigError, LockError
from qualify.host import provenance
from qualify.host.engine import BuildRequest, Engine
from qualify.imagebuild import image, wheelhouse

REPO = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def sm120(docker_engine, loopback_registry):
    return images.smoke("sm120")


@pytest.fixture(scope="module")
def sm121(docker_engine, loopback_registry):
    return images.smoke("sm121")


def test_records_name_digests(sm120, sm121):
    for record in (sm120, sm121):
        assert "@sha256:" in record.image_reference and record.base_image.count("@sha256:") == 1
        assert record.image_reference.startswith("127.0.0.1:")
        on_disk = json.loads(image.record_path(record.target, "smoke", "hermetic").read_text())
        assert on_disk["image_reference"] == record.image_reference
        # The wheels the payload installed, each with its sha256, one the lock allows (SLSA and the SBOM use it).
        t = targets.load().get(record.target)
        pins = {p.name: p for p in wheelhouse.parse_lock(t.lock_path("smoke", t.python_for("hermetic", targets.load().hermetic)))}
        assert sorted(wheelhouse.wheel_name(f) for f in record.wheels) == sorted(pins)
        assert all(sha in pins[wheelhouse.wheel_name(f)].hashes for f, sha in record.wheels.items())
        assert on_disk["wheels"] == record.wheels


def test_a_wheelhouse_keeps_the_sha256_it_verified_and_a_record_refuses_bad_wheels(tmp_path):
    data = b"a wheel's bytes"
    wheel = tmp_path / "triton-3.8.0-cp311-cp311-manylinux_2_28_x86_64.whl"
    wheel.write_bytes(data)
    sha = hashlib.sha256(data).hexdigest()
    lock = tmp_path / "lock.txt"
    lock.write_text(f"triton==3.8.0 --hash=sha256:{sha}\n")
    digests = wheelhouse.verify(tmp_path, wheelhouse.parse_lock(lock), lock)
    wheelhouse._write_stamp(tmp_path / ".verified.json", tmp_path, digests)  # as prepare does after verifying
    dest = wheelhouse.prepare_into(lock, "linux/amd64", "3.11", tmp_path)  # the stamp holds: nothing to download
    assert wheelhouse.wheel_digests(dest) == {wheel.name: sha}
    (tmp_path / wheelhouse.DIGESTS_FILE).write_text(json.dumps({wheel.name: [len(data), wheel.stat().st_mtime_ns,
                                                                                "f" * 64]}))
    assert wheelhouse.wheel_digests(dest) == {wheel.name: "f" * 64}  # the recorded one, while the file is unchanged
    wheel.write_bytes(data + b"!")  # changed since: hashed again, never the recorded one
    assert wheelhouse.wheel_digests(dest) == {wheel.name: hashlib.sha256(data + b"!").hexdigest()}
    (tmp_path / wheelhouse.DIGESTS_FILE).unlink()  # none recorded (an older toolkit verified it): hashed
    assert wheelhouse.wheel_digests(dest) == {wheel.name: hashlib.sha256(data + b"!").hexdigest()}
    good = {"target": "sm120", "profile": "smoke", "base_kind": "hermetic", "platform": "linux/amd64",
            "base_image": "b@sha256:" + "0" * 64, "image_reference": "r/x@sha256:" + "1" * 64, "image_tag": "r/x:t",
            "image_id": "sha256:" + "2" * 64, "engine": "docker", "builder": "buildkit", "labels": {},
            "build_seconds": 1.0, "wheels": {wheel.name: sha}}
    assert image.BuildRecord.parse(json.dumps(good).encode(), "r.json").wheels == {wheel.name: sha}
    for bad in ({"../x.whl": sha}, {wheel.name: "sha256:" + sha}, []):
        with pytest.raises(ConfigError, match="'wheels' is not an object of wheel file names"):
            image.BuildRecord.parse(json.dumps(good | {"wheels": bad}).encode(), "r.json")


def test_a_wheelhouse_of_several_wheels_is_hashed_on_every_core_and_a_bad_one_is_named(tmp_path):
    # verify hashes the wheels on a thread per core (fsutil.sha256_files): the same digests as one by one,
    # and a wheel whose bytes the lock does not list is still named, whichever thread hashed it.
    names = [f"pkg{i}-1.0-py3-none-any.whl" for i in range(6)]
    blobs = {n: (n * 50_000).encode() for n in names}
    for n, b in blobs.items():
        (tmp_path / n).write_bytes(b)
    lock = tmp_path / "lock.txt"
    lock.write_text("".join(f"pkg{i}==1.0 --hash=sha256:{hashlib.sha256(blobs[n]).hexdigest()}\n" for i, n in enumerate(names)))
    digests = wheelhouse.verify(tmp_path, wheelhouse.parse_lock(lock), lock)
    assert digests == {n: hashlib.sha256(b).hexdigest() for n, b in blobs.items()}
    assert list(digests) == names  # in the lock's order, as before
    (tmp_path / names[3]).write_bytes(b"changed")
    with pytest.raises(LockError, match=f"{names[3]} has sha256 {hashlib.sha256(b'changed').hexdigest()}"):
        wheelhouse.verify(tmp_path, wheelhouse.parse_lock(lock), lock)


def test_sm121_image_is_arm64_and_sm120_amd64(docker_engine, sm120, sm121):
    for record, arch in ((sm120, "amd64"), (sm121, "arm64")):
        out = subprocess.run([docker_engine, "image", "inspect", "--format", "{{.Architecture}}", record.image_reference],
                             capture_output=True, text=True, check=True)
        assert out.stdout.strip() == arch
    uname = images.run(docker_engine, sm121.image_reference, "uname -m", "linux/arm64")
    assert uname.stdout.strip() == "aarch64"


@pytest.mark.parametrize("name,gpu", [("sm120", "sm_120a"), ("sm121", "sm_121a")])
def test_wiring_is_in_the_environment_and_ptxas_assembles(docker_engine, sm120, sm121, name, gpu):
    record = {"sm120": sm120, "sm121": sm121}[name]
    t = targets.load().get(name)
    script = (f"env; printf '.version 8.8\\n.target {gpu}\\n.address_size 64\\n.visible .entry e()\\n{{ ret; }}\\n' > /tmp/e.ptx"
              f" && ptxas --gpu-name {gpu} /tmp/e.ptx -o /tmp/e.cubin && echo ASSEMBLED")
    out = images.run(docker_engine, record.image_reference, script, t.platform)
    assert "ASSEMBLED" in out.stdout, out.stderr
    env = dict(line.split("=", 1) for line in out.stdout.splitlines() if "=" in line)
    assert env["TORCH_CUDA_ARCH_LIST"] == t.torch_cuda_arch_list
    for key, value in t.triton.env().items():
        assert env[key] == value
    assert env["CUDA_HOME"] == "/usr/local/cuda"


def test_smoke_extension_census_matches_the_arch_list(docker_engine, sm121):
    # the census from this repo's reader, run on the host over the image's file
    out = subprocess.run([docker_engine, "create", sm121.image_reference], capture_output=True, text=True, check=True)
    cid = out.stdout.strip()
    try:
        dest = Path(f"/tmp/smoke-ext-{cid[:12]}.so")
        subprocess.run([docker_engine, "cp", f"{cid}:/opt/blackwell/ext/libsmoke_ext.so", str(dest)], check=True)
    finally:
        subprocess.run([docker_engine, "rm", cid], capture_output=True)
    census = subprocess.run([sys.executable, "-m", "qualify", "inspect", str(dest), "--target", "12.1", "--json"],
                            capture_output=True, text=True, check=True)
    lib = json.loads(census.stdout)["libraries"][0]
    assert sorted(lib["sass"]) == ["sm_121", "sm_121a"] and lib["ptx"] == []
    assert lib["verdict"]["class"] == "native"
    dest.unlink()


@pytest.mark.parametrize("name", ["sm120", "sm121"])
def test_allocator_hook_in_fresh_interpreters(docker_engine, sm120, sm121, name):
    record = {"sm120": sm120, "sm121": sm121}[name]
    platform = targets.load().get(name).platform
    script = ("python3 -c 'import sys; print(\"triton\" in sys.modules)'; "
              "python3 -c 'import threading, triton.runtime._allocation as a\n"
              "print(type(a._allocator.get()).__name__)\n"
              "r=[]; t=threading.Thread(target=lambda: r.append(type(a._allocator.get()).__name__)); t.start(); t.join()\n"
              "print(r[0])'")
    out = images.run(docker_engine, record.image_reference, script, platform)
    assert out.stdout.split() == ["False", "TorchAllocator", "TorchAllocator"], out.stderr


def test_labels_record_base_target_and_provenance(sm120):
    labels = sm120.labels
    t = targets.load().get("sm120")
    assert labels["org.opencontainers.image.base.digest"] == sm120.base_image.split("@", 1)[1]
    assert labels["dev.blackwell-qualify.torch-cuda-arch-list"] == t.torch_cuda_arch_list
    assert labels["dev.blackwell-qualify.target"] == "sm120"
    for key in ("revision", "version", "created"):
        assert labels[f"org.opencontainers.image.{key}"]
    # The source is the repository's https URL, or absent (a clone of a local path has none): never a path.
    source = labels.get("org.opencontainers.image.source")
    assert source == (provenance.source_url() or None) and (source is None or source.startswith("https://"))
    assert "dev.blackwell-qualify.sha256sums" in labels


def test_no_change_rebuild_is_cached(sm120, capsys):
    """Reports the time of a no-change rebuild (the target is < 10 s; not asserted: shared machines are noisy)."""
    start = time.monotonic()
    again = image.build(targets.load(), image.BuildOptions("sm120", "hermetic", "smoke"))
    seconds = time.monotonic() - start
    assert again.image_reference == sm120.image_reference
    with capsys.disabled():
        print(f"\n[report] no-change rebuild of sm120 smoke: {seconds:.1f} s")


def test_floating_tag_is_refused_before_any_engine_call(tmp_path, monkeypatch):
    text = (REPO / "images" / "targets.toml").read_text()
    pinned = str(targets.load().get("sm120").base.image)
    path = tmp_path / "targets.toml"
    path.write_text(text.replace(pinned, pinned.split("@")[0]))
    monkeypatch.setattr(Engine, "__init__", lambda *a, **k: pytest.fail("the engine was called"))
    out = subprocess.run([sys.executable, "-m", "qualify", "build", "sm120", "--file", str(path), "--profile", "smoke"],
                         capture_output=True, text=True)
    assert out.returncode == ConfigError.exit_code and "floating tag" in out.stderr


def test_pinned_base_that_cannot_be_pulled_says_how_to_use_hermetic(docker_engine, loopback_registry):
    tf = targets.load()
    out = subprocess.run([sys.executable, "-m", "qualify", "build", "sm120", "--profile", "smoke", "--no-qualify"],
                         capture_output=True, text=True, timeout=300)
    digest = tf.get("sm120").base.image.digest
    if out.returncode == 0:  # a host that can pull nvidia/cuda builds for real
        return
    assert out.returncode == 4, out.stderr
    assert digest in out.stderr and "--base hermetic" in out.stderr


def test_lock_hash_mismatch_is_refused(tmp_path):
    lock = tmp_path / "lock.txt"
    lock.write_text("triton==3.8.0 \\\n    --hash=sha256:" + "0" * 64 + "\n")
    (tmp_path / "triton-3.8.0-cp311-cp311-manylinux_2_28_x86_64.whl").write_bytes(b"not the real wheel")
    with pytest.raises(LockError, match="does not list"):
        wheelhouse.verify(tmp_path, wheelhouse.parse_lock(lock), lock)
    loose = tmp_path / "loose.txt"
    loose.write_text("triton>=3.8\n")
    with pytest.raises(LockError, match="exact pin"):
        wheelhouse.parse_lock(loose)


def test_failed_run_step_shows_its_tail(docker_engine, debian_python_image, tmp_path):
    (tmp_path / "Dockerfile").write_text(f"FROM {debian_python_image}\nRUN echo about to fail && "
                                         "echo 'the real reason' >&2 && exit 3\n")
    engine = Engine("docker").check()
    with pytest.raises(BuildError) as err:
        engine.build(BuildRequest(context=tmp_path, dockerfile=tmp_path / "Dockerfile", tags=["qualify-test/fail:x"],
                                  platform="linux/amd64"))
    assert "the real reason" in str(err.value) and "exit" in str(err.value)


def test_hermetic_dry_run_prints_the_plan_without_building_the_base(monkeypatch, tmp_path):
    """Issue 20 bug 5: `build --base hermetic --dry-run` crashed with an ImageRefError traceback (exit 1)."""
    from qualify.host.registry import Registry

    monkeypatch.setattr(Engine, "__init__", lambda *a, **k: pytest.fail("the engine was called"))
    monkeypatch.setattr(Registry, "ensure", lambda *a, **k: pytest.fail("the registry was started"))
    monkeypatch.setattr(Registry, "manifest_digest", lambda *a, **k: pytest.fail("the registry was asked"))
    plan = image.plan(targets.load(), image.BuildOptions("sm121", "hermetic", "smoke"))
    assert plan.base_kind == "hermetic" and plan.platform == "linux/arm64"
    assert "hermetic-cuda@<digest once built>" in plan.base and plan.build_args["BASE_IMAGE"] == plan.base
    out = subprocess.run([sys.executable, "-m", "qualify", "build", "sm121", "--base", "hermetic", "--profile", "smoke",
                          "--dry-run"], capture_output=True, text=True, timeout=120, cwd=tmp_path,
                         env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), "QUALIFY_REGISTRY": "127.0.0.1:1"})
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr
    printed = json.loads(out.stdout)
    assert printed["labels"]["dev.blackwell-qualify.base-kind"] == "hermetic"
    assert printed["build_args"]["TORCH_CUDA_ARCH_LIST"] == "12.1;12.1a"


def test_two_concurrent_smoke_builds_both_succeed(docker_engine, loopback_registry, sm120, tmp_path):
    """Issue 20 bug 4: two checkouts building the same target at once shared one context folder
    (".iidfile: no such file or directory", exit 5). Two real builds, started together."""
    argv = [sys.executable, "-m", "qualify", "build", "sm120", "--base", "hermetic", "--profile", "smoke",
            "--no-qualify"]
    logs = [open(tmp_path / f"build-{i}.log", "w+") for i in range(2)]
    start = time.monotonic()
    procs = [subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=REPO, text=True) for log in logs]
    codes = [p.wait(timeout=1800) for p in procs]
    seconds = time.monotonic() - start
    outputs = []
    for log in logs:
        log.seek(0)
        outputs.append(log.read())
        log.close()
    assert codes == [0, 0], "\n---\n".join(o[-3000:] for o in outputs)
    refs = [next(line for line in o.splitlines() if line.startswith("127.0.0.1:") and "@sha256:" in line)
            for o in outputs]
    assert all(r.startswith(f"{loopback_registry.address}/blackwell/sm120@sha256:") for r in refs)
    print(f"\n[report] two concurrent sm120 smoke builds: {seconds:.1f} s")


def test_a_second_amd64_target_reuses_the_payload_layers_and_pushes_only_its_own(docker_engine, sm120, capfd):
    """Issue 33: the payload is installed in a stage that reads no per-target argument, so another amd64
    target's image has the same layers (same digests) but for the smoke extension's, and its push
    finds them in the registry."""
    capfd.readouterr()
    other = images.smoke("sm100")
    err = capfd.readouterr().err

    def layers(ref):
        out = subprocess.run([docker_engine, "image", "inspect", "--format", "{{json .RootFS.Layers}}", ref],
                             capture_output=True, text=True, check=True)
        return json.loads(out.stdout)

    mine, theirs = layers(sm120.image_reference), layers(other.image_reference)
    assert len(mine) == len(theirs) and mine[:-1] == theirs[:-1] and mine[-1] != theirs[-1]
    done = [line for line in err.splitlines() if "sm100:smoke-hermetic: done in" in line]
    if done:  # built here (not already by an earlier test): its push found the shared layers
        total, present = re.search(r"(\d+)/\d+ layers done \((\d+) already", done[-1]).groups()
        assert int(present) >= int(total) - 1, done[-1]
