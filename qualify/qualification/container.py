"""The probe in a container: the one way the host runs the image-side probe.

Qualification (build host, no GPU) and the deploy's GPU gate (a Blackwell
host) both come here. Only the image side is staged and mounted: the package
root's `__init__.py`, `qualify/core` and `qualify/probe`, plus pyelftools; the
target is passed as JSON, so nothing in the image reads the targets file.
The container gets no network and one writable directory for its output,
an init process as PID 1 (`--init`), and runs the image's own python3, so it
qualifies what users will run.

What is mounted is staged fresh for each run into a private folder, and the
run records the digest of that copy (`ProbeRun.probe_sha256`), never the digest
of a checkout it might differ from (staging.py: private_run, copy_probe).
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, Optional, Sequence, Tuple

from qualify.config.targets import Target
from qualify.core.errors import EngineError
from qualify.core.readlimit import MANIFEST_LIMIT, read_small, strict_json
from qualify.core.report import Reporter, emit
from qualify.core.topology import AllReduceFloor
from qualify.host import paths, workdirs
from qualify.probe import identity, staged
from qualify.probe.runner import ProbeTarget

REPORT = Reporter("qualify")

if TYPE_CHECKING:  # the engine (python-on-whales) is not needed to describe a target on a GPU host
    from qualify.host.engine import Engine

PACKAGE_ROOT, IMAGE_SIDE = identity.PACKAGE_ROOT, identity.IMAGE_SIDE
CONTAINER_ROOT = "/opt/qualify"
STAGED_ROOT = "/opt/qualify-staged"  # the decoders for the image's interpreter (probe/staged.py)
PROBE_EXITS = (0, 1, 3)  # pass/warn, fail, incomplete: each wrote its result


def probe_target(target: Target, profile: Optional[str], emulated: bool = False, tensor_parallel_size: int = 0,
                 allreduce_floors: Sequence[AllReduceFloor] = (),
                 collective_env: Optional[Dict[str, str]] = None) -> ProbeTarget:
    """What the probe needs to know about a target of the targets file (and, for a multi-GPU run, the
    all-reduce's world size, the floors its bandwidth is judged by and the environment its collectives run
    under: a deployment's server's, deploy/collectives.py)."""
    return ProbeTarget(
        name=target.name, capability=target.capability, platform=target.platform, accelerator=target.accelerator.value,
        torch_cuda_arch_list=target.torch_cuda_arch_list, triton_env=target.triton_env,
        intended_support_level=target.support_level, profile=profile,
        unified_memory=target.runtime.unified_memory,
        gpu_memory_utilization=target.runtime.gpu_memory_utilization,
        min_gpu_memory_gib=target.runtime.min_gpu_memory_gib, emulated=emulated,
        tensor_parallel_size=tensor_parallel_size, allreduce_floors=tuple(allreduce_floors),
        collective_env=dict(collective_env or {}),
    )


def probe_sources_digest(root: Path = PACKAGE_ROOT) -> str:
    """What the probe is made of: a manifest from other probe code is not reused.

    Only the image side counts, so editing host-side code (release, deploy)
    keeps every cached qualification valid.
    """
    return identity.sources_digest(root)


def stage_probe(digest: str) -> Path:
    """A read-only copy of the image side + pyelftools to mount or bundle (probe bundles, vllm-rules), by the
    digest of its sources. An existing stage is used only when it is exactly this probe (staging.stage_problem:
    re-hashed, nothing writable by others); otherwise it is staged again."""
    from qualify.qualification import staging

    dest = paths.probe_stage(digest)
    if dest.exists() or dest.is_symlink():
        problem = staging.stage_problem(dest, digest)
        if not problem:
            return dest
        REPORT.say(f"the staged probe {dest} is not this checkout's ({problem}): staging it again")
        aside = workdirs.make("probe-stale")
        dest.rename(aside / "stage")
        shutil.rmtree(aside, ignore_errors=True)
    tmp = workdirs.make("probe")  # a kill before the rename leaves it to `clean` (host/workdirs.py)
    copied = staging.copy_probe(tmp / "stage")
    if copied != digest:
        shutil.rmtree(tmp, ignore_errors=True)
        raise EngineError(f"the probe's sources changed while they were staged ({copied}, expected {digest})",
                          hint="run again once the checkout is not being edited")
    dest.parent.mkdir(parents=True, exist_ok=True)
    try:
        (tmp / "stage").rename(dest)
    except OSError:  # another process staged the same digest first: checked like any existing stage
        pass
    shutil.rmtree(tmp, ignore_errors=True)
    problem = staging.stage_problem(dest, digest)
    if problem:
        raise EngineError(f"the staged probe {dest} is not this checkout's: {problem}")
    return dest


@dataclass(frozen=True)
class ProbeRun:
    """One probe run: its predicate, and the sources digest of the image side the host mounted for it."""

    predicate: Dict[str, Any] = field(repr=False)
    probe_sha256: str


def _forward_progress(line: str) -> None:
    """The probe's progress lines, shown live while it runs (a long step is not silence)."""
    if line.startswith("[probe]"):
        emit("  " + line)


_INTERPRETER = ("import platform, sys; print(sys.implementation.cache_tag + '-' + platform.machine(), "
                "'%d.%d' % sys.version_info[:2])")


def interpreter(engine: Engine, image: str, platform: str) -> Tuple[str, str]:
    """(`cache tag-machine`, `major.minor`) of the image's python3, from a throw-away container; an image
    without one, or with one older than the probe needs, is a clear error naming the image."""
    proc = engine.run_container(image, ["python3", "-c", _INTERPRETER], mounts=[], env={}, network="none",
                                platform=platform, timeout=300, init=True)
    said = (proc.stderr or proc.stdout or "").strip()
    words = proc.stdout.split() if proc.returncode == 0 else []
    engine_said = _engine_problem(said, image)
    if engine_said is not None:
        raise engine_said
    if len(words) != 2:
        missing = proc.returncode in (126, 127) or "executable file not found" in said or "not found" in said
        raise EngineError(f"{image}: " + ("has no python3 on its PATH" if missing else
                                          f"python3 did not answer (exit {proc.returncode}): {said[-300:]}"),
                          hint="the probe runs with the image's own python3 (3.9 or newer); install one in the image"
                          if missing else "see the output above")
    tag, version = words
    if tuple(int(x) for x in version.split(".")) < (3, 9):
        raise EngineError(f"{image}: its python3 is {version}; the probe needs 3.9 or newer",
                          hint="qualify an image with a newer python3 (the probe uses the image's own interpreter)")
    return tag, version


def _engine_problem(said: str, image: str) -> Optional[EngineError]:
    """What the engine said before the image's python3 ran at all, in the user's terms (issue 30, item 5: this
    used to read 'the image needs a python3' when credentials or the GPU driver were the cause)."""
    low = said.lower()
    host = image.split("/", 1)[0]
    if any(m in low for m in ("unauthorized", "authentication required", "pull access denied", "denied:")):
        return EngineError(f"cannot pull {image}: the registry wants credentials the engine does not have ({said[-200:]})",
                           hint=f"docker reads its own login, not REGISTRY_AUTH_FILE: run `docker login {host}` "
                                "(podman: `podman login`), then again")
    if "could not select device driver" in low or "nvidia-container-cli" in low or "unknown or invalid runtime" in low:
        return EngineError(f"the engine cannot give {image} a GPU ({said[-200:]})",
                           hint="install the NVIDIA container toolkit (nvidia-ctk runtime configure) or CDI specs, "
                                "and check `nvidia-smi` works on this host")
    if "manifest unknown" in low or "not found: manifest" in low or "no such image" in low:
        return EngineError(f"cannot pull {image}: the registry does not have it ({said[-200:]})",
                           hint="check the reference (repository@sha256:...) and that it was published there")
    return None


def run_probe(engine: Engine, image: str, target: ProbeTarget, *, scope: str = "all", gpus: Optional[str] = None,
              timeout: float = 900, origin: str = "built", devices: Sequence[str] = (),
              options: Sequence[str] = ()) -> ProbeRun:
    """The probe's predicate, from a throw-away container of `image`, with the decoders for its python3
    staged beside it (qualification/staging.py), and the digest of the probe that was mounted. `origin`
    "external": an image this toolkit did not build, judged by what it holds rather than against our wiring.
    `gpus` is docker's --gpus; `devices` are --device values (CDI names: nvidia.com/gpu=...), so a
    deployment's probe sees exactly its GPUs; `options` are more `run` options (the deploy's gate gives the probe
    the server's shared memory, IPC namespace and limits)."""
    from qualify.qualification import staging

    tag, version = interpreter(engine, image, target.platform)
    with staging.private_run() as run:
        mounted = staging.copy_probe(run / "probe")
        staged_dir = staging.decoders_into(tag, run / "staged")
        predicate = _run_in(engine, image, target, scope, gpus, timeout, origin, run / "probe", staged_dir, version,
                            tag, devices, options)
    toolkit = predicate.get("toolkit")
    said = toolkit.get("probe_sha256") if isinstance(toolkit, dict) else None
    if said is not None and said != mounted:
        raise EngineError(f"the probe in {image} reports its sources as {said}, but the host mounted {mounted}: "
                          "the image changed what ran", hint="qualify an image that does not shadow the probe")
    return ProbeRun(predicate, mounted)


def _run_in(engine: Engine, image: str, target: ProbeTarget, scope: str, gpus: Optional[str], timeout: float,
            origin: str, mount: Path, staged_dir: Optional[Path], version: str, tag: str,
            devices: Sequence[str], options: Sequence[str] = ()) -> Dict[str, Any]:
    if staged_dir is None:
        REPORT.say(f"no decoder wheels for {tag} (python {version}): compressed containers stay unknown")
    mounts = [(str(mount), CONTAINER_ROOT, "ro")]
    env = {"PYTHONPATH": CONTAINER_ROOT, "PYTHONDONTWRITEBYTECODE": "1"}
    if staged_dir is not None:
        mounts.append((str(staged_dir.parent), STAGED_ROOT, "ro"))
        env[staged.ENV] = STAGED_ROOT
    with tempfile.TemporaryDirectory(prefix="qualify-out-") as out:
        out_dir = Path(out)
        out_dir.chmod(0o777)
        where = f"with GPUs {gpus or ' '.join(devices)}" if gpus or devices else "no GPU"
        REPORT.say(f"probing {image} in a container (no network, {where}, checks: {scope})")
        proc = engine.run_container(
            image,
            ["python3", "-m", "qualify.probe", "--target-json", target.to_json(),
             "--only", scope, "--predicate-only", "--out", "/out/predicate.json",
             *(["--origin", origin] if origin != "built" else [])],
            mounts=[*mounts, (str(out_dir), "/out", "rw")], env=env,
            network="none", platform=target.platform, timeout=timeout, gpus=gpus, devices=devices,
            on_stderr_line=_forward_progress, options=options,
            # An init as PID 1: a probe that crashes (under qemu-user) exits instead of hanging until the timeout.
            init=True,
        )
        result = out_dir / "predicate.json"
        engine_said = _engine_problem((proc.stderr or proc.stdout or "").strip(), image)
        if engine_said is not None and not result.exists():
            raise engine_said
        if proc.returncode not in PROBE_EXITS or not result.exists():
            raise EngineError(
                f"the probe did not complete in {image} (exit {proc.returncode}):\n"
                + "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-25:]),
                hint=f"the image's python3 ({version}) started the probe, which then stopped: see its output above",
            )
        # Written by the image: bounded like a manifest, strict JSON, an object.
        predicate = strict_json(read_small(result, MANIFEST_LIMIT, "probe result", EngineError),
                                f"the probe's result in {image}", EngineError)
        if not isinstance(predicate, dict):
            raise EngineError(f"the probe's result in {image} is not a JSON object")
        return predicate
