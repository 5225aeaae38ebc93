"""Issue 41: runs killed at a printed step or a test hook (QUALIFY_KILL_AT, qualify/core/killpoint.py), and
the same command run again: it converges and says what it found and recovered. Real engine, real registry,
real debootstrap from Debian's mirror; what a kill leaves is looked for where users would find it."""

from __future__ import annotations

import dataclasses
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from clean_helpers import tiny_image
from conftest import REPO, require

import images
from qualify.config import targets
from qualify.host import cacheledger, clean, ledger, paths, workdirs
from qualify.host.engine import Engine
from qualify.imagebuild import hermetic, image

pytestmark = pytest.mark.engine

ENV = {**os.environ, "PYTHONPATH": str(REPO)}


def _spawn(script: str, *args: str, env=None) -> subprocess.Popen:
    """`python -c script` in a session of its own (a kill of its group takes every child, as kill -9 of a
    terminal's job does), stderr read line by line."""
    return subprocess.Popen([sys.executable, "-c", script, *args], cwd=REPO, env=env or ENV, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)


def _until(proc: subprocess.Popen, text: str, timeout: float = 600) -> list:
    """Lines of stderr up to and including the first holding `text`."""
    deadline, seen = time.monotonic() + timeout, []
    for line in proc.stderr:
        seen.append(line)
        if text in line:
            return seen
        assert time.monotonic() < deadline, "".join(seen[-30:])
    raise AssertionError(f"the run ended before printing {text!r}:\n" + "".join(seen[-30:]))


def _kill(proc: subprocess.Popen) -> None:
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=60)
    deadline = time.monotonic() + 30  # the group's other processes too (a zombie counts as gone)
    while any(workdirs.running(pid) for pid in _group(proc.pid)) and time.monotonic() < deadline:
        time.sleep(0.1)


def _group(pgid: int) -> list:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()
        except OSError:
            continue
        if len(fields) > 2 and fields[2] == str(pgid):
            found.append(int(stat.parent.name))
    return found


def _run(script: str, *args: str, env=None, timeout: float = 1200) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", script, *args], cwd=REPO, env=env or ENV, capture_output=True,
                          text=True, timeout=timeout)


# --- item 5: a build killed during its push ------------------------------------------------------

BUILD = """
import sys
from qualify.config import targets
from qualify.imagebuild import image
opts = image.BuildOptions("sm120", "hermetic", "smoke", keep_cache=True, tag_suffix=sys.argv[1],
                          source_date_epoch=sys.argv[2])
print(image.build(targets.load(), opts).image_id)
"""


def test_a_build_killed_during_its_push_is_this_checkouts_for_its_rerun_and_its_clean(docker_engine,
                                                                                     loopback_registry):
    """The re-run said the previous image 'is another checkout's: kept', and this checkout's clean neither
    listed nor removed it. A scratch tag of the smoke image (cached: a new SOURCE_DATE_EPOCH changes only the
    image's created label), killed at the push's first stream message."""
    images.smoke("sm120")  # the layers, so the builds below are served from cache
    suffix, epoch = f"killed{uuid.uuid4().hex[:6]}", str(1764374400 + int(time.time()) % 10**6)
    tag = f"{loopback_registry.ref('blackwell/sm120')}:smoke-hermetic-{suffix}"
    engine = Engine("docker")
    made = []
    try:
        killed = _run(BUILD, suffix, epoch, env={**ENV, "QUALIFY_KILL_AT": "push:streaming"})
        assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
        first = engine.image_id(tag)
        made.append(first)
        assert first and first in {m.image_id for m in ledger.made()}, "the killed build's image is in no ledger"
        listed = clean.clean(engine, loopback_registry, REPO / "manifests", dry_run=True)
        assert tag in listed.images, listed.lines()
        same = _run(BUILD, suffix, epoch)  # the same command again: the same image, pushed now
        assert same.returncode == 0, same.stderr[-3000:]
        assert same.stdout.strip() == first and loopback_registry.manifest_digest("blackwell/sm120",
                                                                                  f"smoke-hermetic-{suffix}")
        changed = _run(BUILD, suffix, str(int(epoch) + 1))  # a rebuild after a change: the old image goes
        assert changed.returncode == 0, changed.stderr[-3000:]
        made.append(changed.stdout.strip())
        assert f"removed the previous image of this tag ({first[:19]})" in changed.stderr
        assert "not in this checkout's ledger" not in changed.stderr + same.stderr
        assert first not in engine.image_ids()
    finally:
        engine.remove_created([i for i in made if i and i in engine.image_ids()])
        loopback_registry.delete_tag(tag)
        with cacheledger.locked():
            book = cacheledger.load()
            book.latest.pop(f"sm120-smoke-hermetic-{suffix}", None)
            cacheledger.save(book)


def test_a_push_interrupted_by_ctrl_c_never_says_done(docker_engine, own_registry):
    """A push interrupted by Ctrl-C printed 'done in 11.4 s ... 0.36 GB sent' before 'interrupted'. SIGINT
    once the registry has received 20 MB of the layer's upload."""
    registry, state, env = own_registry
    tag = tiny_image(docker_engine, f"{registry.address}/qualify-test/ctrl-c:{uuid.uuid4().hex[:6]}", 300 << 20)
    script = ("import sys\nfrom qualify.host.engine import Engine\n"
              "try:\n    Engine('docker').push(sys.argv[1])\n"
              "except KeyboardInterrupt:\n    print('interrupted', file=sys.stderr)\n    sys.exit(130)\n")
    uploads = state / f"registry-{registry.port}" / "data" / "docker" / "registry" / "v2" / "repositories"
    try:
        proc = _spawn(script, tag, env={**env, "PYTHONPATH": str(REPO)})
        deadline = time.monotonic() + 120
        while sum(f.stat().st_size for f in uploads.glob("qualify-test/ctrl-c/_uploads/*/data")) < 20 << 20:
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 130, err
        assert "done in" not in err, err
        assert "push stopped after" in err and err.index("push stopped after") < err.index("\ninterrupted"), err
    finally:
        subprocess.run([docker_engine, "rmi", tag], capture_output=True)


# --- left behind: debootstrap, the hermetic base's context ---------------------------------------

ROOTFS = """
from qualify.config import targets
from qualify.imagebuild import rootfs
h = targets.load().hermetic
print(rootfs.debian_rootfs("amd64", h.suite, h.mirror, ()))
"""


def test_debootstrap_killed_in_either_stage_leaves_nothing_the_next_run_does_not_remove(tmp_path):
    """Killed in the first stage (downloading) and in the second (its root's proc mounted), debootstrap left
    /tmp/rootfs.* (142-276 MB), the second with a live proc mount. Its work folder is in the state folder now,
    and the next run unmounts and removes what the killed ones left, saying so, and finishes."""
    require(shutil.which("debootstrap") is not None and os.geteuid() == 0, "debootstrap, as root")
    require(os.uname().machine == "x86_64", "an amd64 host (the second stage runs natively)")
    state, tmp = tmp_path / "state", tmp_path / "tmp"
    tmp.mkdir()
    env = {**ENV, "QUALIFY_STATE_DIR": str(state), "TMPDIR": str(tmp)}
    work = paths.work_dirs(state)
    first = _spawn(ROOTFS, env=env)
    _until(first, "[rootfs] debootstrap")
    deadline = time.monotonic() + 60
    while not list(work.glob("rootfs.*/root")):  # debootstrap has begun its first stage
        assert first.poll() is None and time.monotonic() < deadline
        time.sleep(0.1)
    time.sleep(3)
    _kill(first)
    (left_first,) = [f for f in work.iterdir() if f.name.startswith("rootfs.")]
    second = _spawn(ROOTFS, env=env)
    seen = _until(second, "[rootfs] debootstrap")
    deadline = time.monotonic() + 600
    while not [m for m in workdirs.mounts_under(work) if m.endswith("/root/proc")]:
        assert second.poll() is None and time.monotonic() < deadline, "".join(seen) + second.stderr.read()
        time.sleep(0.2)
    _kill(second)
    assert not left_first.exists() and f"removed {left_first}" in "".join(seen)
    mounted = workdirs.mounts_under(work)
    assert mounted, "the kill in the second stage left no proc mount: the case is not reproduced"
    (left_second,) = [f for f in work.iterdir() if f.name.startswith("rootfs.")]
    try:
        done = _run(ROOTFS, env=env, timeout=1800)
        assert done.returncode == 0, done.stderr[-3000:]
        assert f"removed {left_second}" in done.stderr and "unmounted" in done.stderr and "/root/proc" in done.stderr
        assert Path(done.stdout.strip()).is_file()
        assert workdirs.mounts_under(state) == [] and list(work.iterdir()) == [] and list(tmp.iterdir()) == []
    finally:
        for point in workdirs.mounts_under(state):
            subprocess.run(["umount", "--lazy", point], capture_output=True)


HERMETIC = """
import dataclasses, sys
from qualify.config import targets
from qualify.host.engine import Engine
from qualify.host.registry import Registry
from qualify.imagebuild import hermetic
tf = targets.load()
tf = dataclasses.replace(tf, hermetic=dataclasses.replace(tf.hermetic, repository=sys.argv[1]))
print(hermetic.ensure_base(Engine("docker").check(), tf, tf.get("sm120"), Registry.from_env()))
"""


def test_a_hermetic_base_build_killed_while_unpacking_the_cuda_wheels_is_swept_by_its_rerun(docker_engine,
                                                                                           loopback_registry):
    """A kill while unpacking CUDA wheels left state/tmp* (130 MB) that clean never listed. Under a scratch
    repository (the real base's tag is left alone; its wheels and rootfs are reused)."""
    images.smoke("sm120")  # the hermetic base's wheelhouse and rootfs cache are there
    repository = f"qualify-test/hermetic-killed-{uuid.uuid4().hex[:6]}"
    killed = _spawn(HERMETIC, repository)
    _until(killed, "unpacking the CUDA wheels")
    _kill(killed)
    left = list(paths.work_dirs().glob(f"hermetic.{killed.pid}.*"))
    assert left, "the killed base build left no work folder: the case is not reproduced"
    tf = targets.load()
    tag = hermetic.base_tag(dataclasses.replace(tf, hermetic=dataclasses.replace(tf.hermetic, repository=repository)),
                            tf.get("sm120"), loopback_registry)
    try:
        done = _run(HERMETIC, repository)
        assert done.returncode == 0, done.stderr[-3000:]
        assert f"removed {left[0]}" in done.stderr and "the work folder of a run that was killed" in done.stderr
        assert not left[0].exists() and not list(paths.work_dirs().glob(f"hermetic.{killed.pid}.*"))
        assert loopback_registry.manifest_digest(repository, tag.rsplit(":", 1)[1])
    finally:
        subprocess.run([docker_engine, "rmi", tag], capture_output=True)
        loopback_registry.delete_tag(tag)


# --- builders ------------------------------------------------------------------------------------


@pytest.mark.parametrize("command", [["build", "sm120", "--base", "hermetic", "--profile", "smoke", "--no-qualify"],
                                     ["repro", "sm120", "--base", "hermetic", "--profile", "smoke"]],
                         ids=["build", "repro"])
def test_the_classic_builder_is_refused_before_anything_is_built(docker_engine, command, tmp_path):
    """`DOCKER_BUILDKIT=0 nox -s repro-sm120` failed with 'the --mount option requires BuildKit' after a
    first build; refused at once now, saying what to do."""
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "qualify", *command], cwd=REPO, capture_output=True, text=True,
                          timeout=120, env={**ENV, "DOCKER_BUILDKIT": "0", "QUALIFY_STATE_DIR": str(tmp_path)})
    assert done.returncode == 2, done.stderr
    assert "the classic docker builder (DOCKER_BUILDKIT=0) cannot build these images" in done.stderr
    assert "unset DOCKER_BUILDKIT" in done.stderr and "--engine podman" in done.stderr
    assert "[hermetic]" not in done.stderr and "[wheelhouse]" not in done.stderr
    assert not (tmp_path / "registry-5555").exists() and time.monotonic() - started < 60


# --- item 3: qualify killed between its manifest and the release input -------------------------------------

QUALIFY = """
import sys
from pathlib import Path
from qualify.config import targets
from qualify.host import paths
from qualify.host.engine import Engine
from qualify.imagebuild import image
from qualify.qualification import stage
class Scratch(paths.Checkout):  # this checkout, with the build/ folder of the test's own
    build_dir = property(lambda self: Path(sys.argv[1]) / "build")
paths.HERE = Scratch(paths.HERE.root)
done = stage.qualify(targets.load(), image.read_record(Path(sys.argv[2])), Engine("docker").check())
sys.exit(stage.report(done, sys.stdout))
"""


def _elsewhere(data: bytes) -> bytes:
    """The same manifest about another image: what an earlier qualification of the target left."""
    import json

    from qualify.core import manifest

    doc = json.loads(data)
    other = "sha256:" + "1" * 64
    doc["subject"][0]["digest"]["sha256"] = other.split(":", 1)[1]
    doc["predicate"]["image"]["digest"] = other
    doc["predicate"]["image"]["reference"] = doc["predicate"]["image"]["reference"].split("@")[0] + "@" + other
    return manifest.dumps(doc)


@pytest.mark.parametrize("before", ["missing", "an earlier image's"])
def test_a_qualify_killed_before_its_hand_off_is_finished_by_its_rerun(docker_engine, loopback_registry, tmp_path,
                                                                       before):
    """Killed between writing build/qualified/<t>.json and build/manifests/<t>.json, qualify and build said
    'already qualified' and release withheld the target ('re-qualify the target') until an unmentioned --force.
    The re-run finishes the hand-off and says what it found; release then takes the target."""
    from qualify.core import manifest
    from qualify.release import assess
    from qualify.release.model import Candidate, ReleasedTarget, Withheld
    from qualify.release.verify import registry_digest

    record = images.smoke("sm120")
    checkout = paths.Checkout(tmp_path / "checkout")
    built = checkout.build_record("sm120", "smoke", "hermetic")
    built.parent.mkdir(parents=True)
    shutil.copyfile(image.record_path("sm120", "smoke", "hermetic"), built)
    killed = _run(QUALIFY, str(checkout.root), str(built), env={**ENV, "QUALIFY_KILL_AT": "qualify:written"})
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    qualified = checkout.qualified("sm120", "smoke", "hermetic")
    release_input = checkout.release_input("sm120")
    assert qualified.is_file() and not release_input.exists(), "the kill did not come between the two writes"
    if before != "missing":
        release_input.parent.mkdir(parents=True)
        release_input.write_bytes(_elsewhere(qualified.read_bytes()))

    def offered():
        c = Candidate.of(release_input, release_input.read_bytes())
        return assess.assess(c, "unverified", registry_digest, checkout.root)

    if before != "missing":
        withheld = offered()
        assert isinstance(withheld, Withheld) and "re-qualify the target" in withheld.reason, withheld
    again = _run(QUALIFY, str(checkout.root), str(built))
    assert again.returncode == 0, again.stderr[-3000:]
    assert "already qualified by this probe" in again.stderr  # the probe did not run again
    said = {"missing": f"recovered: {release_input} was missing (a qualify killed before it handed over)",
            "an earlier image's": f"recovered: {release_input} held image sha256:{'1' * 64}, not this qualification"}
    assert said[before] in again.stderr, again.stderr
    assert release_input.read_bytes() == qualified.read_bytes()
    assert manifest.Manifest.load(release_input).digest == record.digest
    assert isinstance(offered(), ReleasedTarget)
    third = _run(QUALIFY, str(checkout.root), str(built))  # converged: nothing more to recover
    assert third.returncode == 0 and "recovered" not in third.stderr, third.stderr[-3000:]


# --- item 6: a publish killed during the SBOM's export ------------------------------------------

EXPORT = """
import sys
from qualify.host.engine import Engine
with Engine("docker").exported_filesystem(sys.argv[1]) as stream:
    stream.read()
"""


def test_clean_removes_the_container_a_killed_export_left_and_never_aborts_on_one(docker_engine, own_registry):
    """A publish killed during the SBOM's container step left a created container of the image; this
    checkout's `clean` then aborted ("image is being used by stopped container"). The export publish makes
    (Engine.exported_filesystem), killed with SIGKILL once its container exists: clean lists and removes that
    container, then the image. A container that is not a killed export's (a live one, another's) keeps the
    image it uses, said so, and clean goes on instead of aborting."""
    from qualify.host import workcontainers

    registry, state, env = own_registry
    tag = tiny_image(docker_engine, f"{registry.address}/blackwell/qualify-test-export:{uuid.uuid4().hex[:6]}")
    other = tiny_image(docker_engine, f"{registry.address}/blackwell/qualify-test-export:{uuid.uuid4().hex[:6]}")
    engine = Engine("docker")
    made = [engine.image_id(tag), engine.image_id(other)]
    for image_id, ref in zip(made, (tag, other)):
        ledger.record(image_id, ref, state, REPO)
    holder = subprocess.run([docker_engine, "create", other, "true"], capture_output=True, text=True,
                            check=True).stdout.strip()
    try:
        killed = _run(EXPORT, tag, env={**env, "PYTHONPATH": str(REPO), "QUALIFY_KILL_AT": "export:created"})
        assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
        left = workcontainers.leftovers(docker_engine)
        assert [c.image for c in left if c.image == tag], f"the killed export left no labelled container: {left}"
        dry = clean.clean(engine, registry, REPO / "manifests", dry_run=True, state_dir=state, checkout=REPO)
        assert any(tag in c for c in dry.containers) and tag in dry.images, dry.lines()
        done = clean.clean(engine, registry, REPO / "manifests", state_dir=state, checkout=REPO)
        assert any(tag in c and "left by a killed export step" in c for c in done.containers), done.lines()
        assert made[0] not in engine.image_ids() and not [c for c in workcontainers.leftovers(docker_engine)
                                                          if c.image == tag]
        assert made[1] in engine.image_ids(), "clean removed an image a container uses"
        assert any(other in k and "used by container" in k for k in done.notes), "\n".join(done.lines())
    finally:
        subprocess.run([docker_engine, "rm", "-f", holder], capture_output=True)
        engine.remove_created([i for i in made if i and i in engine.image_ids()])
