"""arm64 images under the registered emulator see an arm64 CPU (issue 31).

Debian 12's qemu-user 7.2 hands arm64 programs the x86 host's /proc/cpuinfo;
torch's CPU detection reads it and `import torch` dies with SIGSEGV, so the
sm121 vLLM image cannot be qualified. This checks what broke torch, not a
version string: an arm64 container's /proc/cpuinfo must describe an arm64
CPU. On a native arm64 host the same test reads the real CPU.

A program that crashes as PID 1 under qemu-user does not exit (PID 1 ignores
the signal qemu sends itself), so probe containers run with an init.
"""

import platform
import signal
import subprocess
from pathlib import Path

import pytest
from conftest import require

from qualify.config import targets
from qualify.host.engine import Engine
from qualify.imagebuild import hermetic
from qualify.qualification import container

BINFMT = Path("/proc/sys/fs/binfmt_misc/qemu-aarch64")


@pytest.fixture(scope="module")
def arm64_image(docker_engine, loopback_registry) -> str:
    """The hermetic arm64 base (the sm121 images' base; built once per host, shared with the build tests)."""
    tf = targets.load()
    return hermetic.ensure_base(Engine("docker"), tf, tf.get("sm121"), loopback_registry).by_digest


def _fields(text: str) -> dict:
    """`key : value` lines of a cpuinfo, keys as written, the first value of each."""
    out = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            out.setdefault(key.strip(), value.strip())
    return out


@pytest.mark.engine
def test_an_arm64_container_sees_an_arm64_cpu(docker_engine, arm64_image):
    if platform.machine() not in ("aarch64", "arm64"):
        require(BINFMT.exists(), "no qemu-aarch64 emulator is registered with binfmt_misc")
    proc = subprocess.run([docker_engine, "run", "--rm", "--network", "none", "--platform", "linux/arm64",
                           arm64_image, "sh", "-c", "uname -m && cat /proc/cpuinfo"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    machine, _, cpuinfo = proc.stdout.partition("\n")
    assert machine == "aarch64"  # the container really runs arm64 code
    fields = _fields(cpuinfo)
    # x86's own fields (qemu 10 writes an arm64 "model name" too, as the arm64 kernel does for 32-bit tasks)
    x86 = sorted(k for k in ("vendor_id", "cpu family", "flags") if k in fields)
    assert not x86 and fields.get("CPU architecture") == "8" and "Features" in fields, (
        "arm64 programs see the host's x86 /proc/cpuinfo (qemu-user 7.2 does this; torch's import dies on it): "
        f"x86 fields {x86}, CPU architecture {fields.get('CPU architecture')!r}; run scripts/setup-host.sh\n"
        + "\n".join(cpuinfo.splitlines()[:12]))


@pytest.mark.engine
def test_a_crash_under_emulation_ends_a_container_that_runs_under_an_init(arm64_image):
    # Without init=True this container hangs until the timeout (measured: still running after 600 s).
    proc = Engine("docker").run_container(arm64_image, ["python3", "-c", "import ctypes; ctypes.string_at(0)"],
                                          platform="linux/arm64", init=True, timeout=120,
                                          name="qualify-test-emulated-crash")
    assert proc.returncode == 128 + signal.SIGSEGV, proc.stderr


def test_the_probe_container_runs_under_an_init():
    seen = {}

    class Recorder:
        def run_container(self, image, command, **options):
            """A recorder of the options the probe's containers get (both: the interpreter question, the probe)."""
            seen.setdefault("inits", []).append(options["init"])
            if not any(inside == "/out" for _, inside, _ in options["mounts"]):  # which python3 the image has
                return subprocess.CompletedProcess(command, 0, "cpython-311-aarch64 3.11\n", "")
            seen.update(options)
            out = next(Path(host) for host, inside, _ in options["mounts"] if inside == "/out")
            (out / "predicate.json").write_text("{}")
            return subprocess.CompletedProcess(command, 0, "", "")

    container.run_probe(Recorder(), "image", container.probe_target(targets.load().get("sm121"), "smoke"))
    assert seen["init"] is True and seen["inits"] == [True, True]
