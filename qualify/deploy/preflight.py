"""Preflight: this host's GPU, its target, memory, engine and compose, GPU runtime, disk and port.

Nothing is pulled or started here; each problem stops the deploy with what
to do about it (exit 3, or 2 for a setting that is not one of the choices).
The host is found here (nvidia-smi, uname, /proc); what its target is and
needs (the GPU's target, driver floor, memory, image user) comes only from the
verified release's signed policy (signed.py), chosen before any of it is used.
"""

from __future__ import annotations

import platform
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import List, Mapping, Optional, Sequence, Tuple

from qualify.core import arch, driver, topology
from qualify.core import manifest as mf
from qualify.deploy import cpuhost, gpus, heads, hostfiles, iommu, memory, modelpath, netcheck, signed
from qualify.deploy.errors import DeployError
from qualify.deploy.gpus import DRIVER_FIX, Gpu
from qualify.deploy.settings import Settings
from qualify.deploy.ui import EX_PREFLIGHT, Stop, Ui
from qualify.host import clients, cmd
from qualify.trust.deployfacts import DeployTarget


@dataclass(frozen=True)
class EngineChoice:
    kind: str  # docker | podman
    cli: str
    compose: Tuple[str, ...]


@dataclass(frozen=True)
class GpuRuntime:
    kind: str  # nvidia | cdi | none | cpu (the cpu target: no GPU, and none is asked for)
    container_gpu: str  # what the container is given, comma-separated ('' for none): UUIDs, or CDI device names
    run_args: Tuple[str, ...]  # for `engine run` (the probe)
    selinux_off: bool

    def probe_gpus(self) -> Tuple[Optional[str], Tuple[str, ...]]:
        """(docker's --gpus value, --device values) that give the probe exactly the deployment's GPUs."""
        if self.kind == "nvidia":
            # docker reads --gpus as CSV: a list of devices is one quoted field.
            return (f'"device={self.container_gpu}"' if "," in self.container_gpu
                    else f"device={self.container_gpu}"), ()
        if self.kind == "cdi":
            return None, tuple(f"nvidia.com/gpu={d}" for d in self.container_gpu.split(","))
        return None, ()


@dataclass(frozen=True)
class HostPlan:
    gpu: Gpu
    target: DeployTarget  # from the chosen release's signed policy (signed.py)
    fit: memory.MemoryFit
    engine: EngineChoice
    runtime: GpuRuntime
    drivers: Mapping[str, driver.DriverVersion] = field(default_factory=dict)  # the release's signed [drivers]
    model: Optional[modelpath.ModelFolder] = None  # MODEL_PATH, checked
    # Tensor parallelism (GPU_DEVICE naming several GPUs): every GPU chosen (`gpu` is the first), how they are
    # joined and the size. The all-reduce floor is not preflight's: it comes from the verified release's signed
    # policy, after the trust gate (run.py: Deploy.signed_floor), never from this checkout's targets file.
    gpus: Tuple[Gpu, ...] = ()
    topology: topology.Topology = topology.Topology(topology.SINGLE)
    tensor_parallel_size: int = 1
    heads_note: str = ""  # what preflight said of the model's attention heads ("" for one GPU)
    p2p_host: Optional[iommu.P2pHost] = None  # several GPUs: what on this host can break P2P between them
    chosen: Optional[signed.Chosen] = None  # the verified release the target facts came from (the trust gate's)

    @property
    def multi_gpu(self) -> bool:
        return self.tensor_parallel_size > 1


def _smi(args: Sequence[str]) -> cmd.Result:
    return gpus.smi(args)


def _out(proc: cmd.Result) -> str:
    return ((proc.stdout or "") + (proc.stderr or "")).strip()


def check_driver() -> None:
    if shutil.which("nvidia-smi") is None:
        raise Stop(EX_PREFLIGHT, "no NVIDIA GPU found: nvidia-smi is not on PATH, so this host has no NVIDIA driver "
                   "and no visible NVIDIA GPU",
                   "install the NVIDIA driver (an R580-branch driver or newer: our images carry CUDA 13); it provides "
                   "nvidia-smi",
                   "this deploy needs an NVIDIA Blackwell GPU: RTX 5090 / RTX PRO 6000, B200, B300, GB200 or DGX Spark (GB10)")
    proc = _smi(["-L"])
    if proc.returncode != 0:
        first = _out(proc).splitlines()[0] if _out(proc) else ""
        raise Stop(EX_PREFLIGHT, f"nvidia-smi cannot reach the NVIDIA driver: {first}",
                   "load the driver (reboot after installing it, or: sudo modprobe nvidia), then check with nvidia-smi")


def match_target(releases: signed.Releases, gpu: Gpu, s: Settings, ui: Ui) -> signed.Chosen:
    """The GPU's target, from the newest verified release whose signed facts name one for it."""
    cap, machine = arch.Capability.parse(gpu.capability), platform.machine()
    chosen = releases.find(lambda f: next(iter(f.for_capability(cap, machine)), None))
    if chosen:
        ui.say(f"target: {chosen.target.name} (signed in release {chosen.release.tag}'s policy)")
        return chosen
    tf = releases.newest_facts()  # what a refusal names as supported
    same_cap = tf.for_capability(cap)
    if same_cap:
        plats = ", ".join(f"{t.name} ({t.platform})" for t in same_cap)
        raise Stop(EX_PREFLIGHT, f"platform mismatch: {gpu.name} (compute capability {gpu.capability}) on this {machine} "
                   f"host. capability {cap} is supported only on: {plats}; this host is {machine}",
                   "images are built per CPU platform: run on a host of the platform named above (DGX Spark / GB10 is arm64)")
    supported = ", ".join(f"{t.name} ({t.capability}, {t.platform})" for t in tf.targets if not t.is_cpu)
    raise Stop(EX_PREFLIGHT, f"unsupported GPU: {gpu.name} (compute capability {gpu.capability}). capability {cap} "
               f"({arch.describe(cap)}) is not one of our targets; supported: {supported} (as release "
               f"{releases.candidates()[0].tag} signs them)",
               f"deploy on one of the supported GPUs, or set GPU_DEVICE in {s.env_file} to one",
               *[f"or serve on the CPU: DEPLOY_TARGET={t.name} in {s.env_file} (vLLM's CPU build)"
                 for t in tf.cpu_targets(machine)])


def check_driver_version(found: str, cuda: str, floor: driver.DriverVersion, what: str, ui: Ui) -> None:
    """The host driver against the floor of the CUDA `what` carries (vllm#18813: 'unsatisfied condition: cuda>=')."""
    problem = driver.driver_problem(driver.DriverVersion.maybe(found), floor, cuda)
    if problem:
        raise Stop(EX_PREFLIGHT, f"driver: {problem} ({what}); nothing was pulled",
                   f"install {DRIVER_FIX}")
    ui.say(f"driver: {found} runs CUDA {cuda} ({what}; needs {floor} or newer)")


def check_memory(target: DeployTarget, gpu: Gpu, s: Settings, ui: Ui) -> memory.MemoryFit:
    fraction = s.gpu_memory_utilization
    try:
        fit = memory.memory_fit(target.runtime, gpu.memory, hostfiles.read_text("/proc/meminfo"), fraction)
    except DeployError as exc:
        raise Stop.because(EX_PREFLIGHT, f"GPU memory: the model server does not fit {gpu.name}", exc,
                           "free memory or choose another GPU (GPU_DEVICE), then run ./start.sh again") from None
    for note in fit.notes:
        ui.say(f"note: {note}")
    ui.say(f"memory: {fit.pool_gib:g} GiB ({fit.source}), gpu_memory_utilization {fit.gpu_memory_utilization:g}")
    return fit


# --- engine ------------------------------------------------------------------------


def _no_engine(what: str, error: str) -> Stop:
    detail = f": {error.splitlines()[0]}" if error else ""
    if "permission denied" in error:
        return Stop(EX_PREFLIGHT, f"{what}{detail}", "add yourself to the docker group (sudo usermod -aG docker $USER, "
                    "then log in again), or run as root")
    return Stop(EX_PREFLIGHT, f"{what}{detail}", "install Docker Engine (https://docs.docker.com/engine/install/) and "
                "start it: sudo systemctl enable --now docker", "or install Podman with podman-compose")


def detect_engine(s: Settings) -> EngineChoice:
    choice = s.container_engine.value  # settings.load refused anything but auto, docker and podman
    kinds = ("docker", "podman") if choice == "auto" else (choice,)
    error = ""
    for kind in kinds:
        cli, error = clients.answering(kind)
        if cli:
            compose = clients.compose(kind)
            if compose is None:
                if kind == "docker":
                    raise Stop(EX_PREFLIGHT, "Docker answers but has no compose: neither 'docker compose' nor "
                               "'docker-compose' works",
                               "install the Compose plugin (package docker-compose-plugin) or docker-compose")
                raise Stop(EX_PREFLIGHT, "Podman works but podman-compose does not",
                           "install podman-compose (pip install podman-compose, or your distribution's package)")
            return EngineChoice(kind, cli, compose)
    what = {"docker": "Docker does not answer", "podman": "Podman does not work"}.get(
        choice, "no container engine answers (neither docker nor podman)")
    raise _no_engine(what, error)


# --- GPU runtime ---------------------------------------------------------------------


def cdi_usable(engine: EngineChoice, s: Settings) -> bool:
    if not clients.cdi_spec_files(s.cdi_spec_dirs):
        return False
    if engine.kind == "podman":
        return True
    # Docker reads CDI specs from 25 on (feature flag; default from 28); 20.10 has no such field.
    proc = cmd.ask([engine.cli, "info", "--format", "{{json .CDISpecDirs}}"])
    return proc.returncode == 0 and proc.stdout.startswith('["')


def _no_gpu_runtime(engine: EngineChoice, s: Settings) -> Stop:
    if engine.kind == "podman":
        return Stop(EX_PREFLIGHT, "Podman cannot give the container a GPU: no CDI spec naming nvidia.com/gpu in "
                    f"{' '.join(map(str, s.cdi_spec_dirs))}",
                    "install the NVIDIA Container Toolkit and run: sudo nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml")
    return Stop(EX_PREFLIGHT, "Docker cannot give the container a GPU: no NVIDIA container runtime, and no usable CDI spec",
                "install the NVIDIA Container Toolkit, then: sudo nvidia-ctk runtime configure --runtime=docker && "
                "sudo systemctl restart docker",
                "or, with Docker 25+ and CDI enabled: sudo nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml")


def _cdi_devices(chosen: Sequence[Gpu], s: Settings) -> str:
    return ",".join(_cdi_device(g, s) for g in chosen)


def _cdi_device(gpu: Gpu, s: Settings) -> str:
    """The CDI name of our GPU (nvidia-ctk names devices by index and, lately, by UUID)."""
    if any(gpu.uuid in f.read_text(errors="replace") for f in clients.cdi_spec_files(s.cdi_spec_dirs)):
        return gpu.uuid
    if gpu.device.isdigit():
        return gpu.device
    raise Stop(EX_PREFLIGHT, f"the CDI spec does not name {gpu.uuid}",
               "regenerate it: sudo nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml; or set GPU_DEVICE to an index")


def selinux_enforcing() -> bool:
    try:
        return Path("/sys/fs/selinux/enforce").read_text().strip() == "1"
    except OSError:
        return False


def gpu_runtime(engine: EngineChoice, chosen: Sequence[Gpu], s: Settings, ui: Ui, allow_none: bool) -> GpuRuntime:
    kind = s.gpu_runtime.value
    if kind == "auto":
        if clients.nvidia_runtime_present(engine.kind, engine.cli):
            kind = "nvidia"
        elif cdi_usable(engine, s):
            kind = "cdi"
        else:
            raise _no_gpu_runtime(engine, s)
    selinux_off = engine.kind == "podman" and selinux_enforcing()
    extra = ("--security-opt", "label=disable") if selinux_off else ()
    if kind == "nvidia":
        if not clients.nvidia_runtime_present(engine.kind, engine.cli):
            raise _no_gpu_runtime(engine, s)
        uuids = ",".join(g.uuid for g in chosen)
        rt = GpuRuntime("nvidia", uuids, ("--gpus", f'"device={uuids}"' if len(chosen) > 1 else f"device={uuids}")
                        + extra, selinux_off)
    elif kind == "cdi":
        if not cdi_usable(engine, s):
            raise _no_gpu_runtime(engine, s)
        devs = _cdi_devices(chosen, s)
        rt = GpuRuntime("cdi", devs, tuple(a for d in devs.split(",") for a in ("--device", f"nvidia.com/gpu={d}"))
                        + extra, selinux_off)
    elif kind == "none":
        if not allow_none:
            raise Stop(EX_PREFLIGHT, "GPU_RUNTIME=none would start the server WITHOUT a GPU; refused",
                       f"set GPU_RUNTIME=auto in {s.env_file}",
                       "to test the deploy machinery with a stand-in server, pass --allow-no-gpu-runtime")
        ui.banner(["GPU_RUNTIME=none: THE CONTAINER GETS NO GPU.",
                   "Only a stand-in server (testing the deploy machinery) can serve like this;",
                   "a real vLLM image will fail. Set GPU_RUNTIME=auto for a real deployment."])
        rt = GpuRuntime("none", "", extra, selinux_off)
    else:  # settings.load admits only the kinds above
        raise AssertionError(f"GPU_RUNTIME={kind}")
    if selinux_off:
        ui.say("SELinux is enforcing: the container runs with label=disable "
               "(else NVML reports 'Insufficient Permissions')")
    ui.say(f"GPU runtime: {rt.kind}" + (f" (device{'s' * (',' in rt.container_gpu)} {rt.container_gpu} only)"
                                        if rt.container_gpu else ""))
    return rt


# --- disk and port -------------------------------------------------------------------


def engine_storage(engine: EngineChoice) -> Path:
    fmt = "{{.DockerRootDir}}" if engine.kind == "docker" else "{{.Store.GraphRoot}}"
    proc = cmd.ask([engine.cli, "info", "--format", fmt])
    path = Path(proc.stdout.strip()) if proc.returncode == 0 and proc.stdout.strip() else Path("/")
    return path if path.is_dir() else Path("/")


def check_disk(engine: EngineChoice, s: Settings, ui: Ui) -> None:
    where = engine_storage(engine)
    try:
        free = shutil.disk_usage(where).free // (1 << 30)
    except OSError:
        ui.warn(f"cannot tell the free space under {where}")
        return
    need = s.min_free_disk_gib
    if free < need:
        raise Stop(EX_PREFLIGHT, f"only {free} GiB free under {where} (the engine's storage, which also holds the model "
                   f"cache); need {need} GiB",
                   "free what the toolkit made on this host: `nox -s clean -- --dry-run` lists it, `nox -s clean` "
                   "removes it (`-- --all` also released images and the hermetic base); a build host's "
                   f"leftovers: `{engine.cli} system df`",
                   f"or lower MIN_FREE_DISK_GIB in {s.env_file} if the image and model are already present")
    ui.say(f"disk: {free} GiB free under {where}")


def project_containers(engine: EngineChoice, project: str, status: str = "") -> List[str]:
    argv = [engine.cli, "ps", "-aq", "--filter", f"label=com.docker.compose.project={project}"]
    if status:
        argv += ["--filter", f"status={status}"]
    return cmd.ask(argv).stdout.split()


def check_port(engine: EngineChoice, s: Settings, ui: Ui) -> None:
    if project_containers(engine, s.compose_project, "running"):
        ui.say(f"port: compose project {s.compose_project} is running already; it will be recreated")
        return
    address, port = s.bind_address, s.api_port
    problem = netcheck.port_problem(address, port)
    if problem:
        raise Stop(EX_PREFLIGHT, f"{problem}; the API port {address}:{port} is not free",
                   f"stop what holds it (see: ss -ltnp 'sport = :{port}'), or set API_PORT (and BIND_ADDRESS) in {s.env_file}")
    ui.say(f"port: {address}:{port} is free")


def _model(s: Settings, target: DeployTarget, ui: Ui) -> Optional[modelpath.ModelFolder]:
    return modelpath.check(s, target.user.uid, target.user.name, ui) if s.model_path else None


def check_p2p_host(chosen: Sequence[Gpu], joined: topology.Topology, ui: Ui) -> Optional[iommu.P2pHost]:
    """Several GPUs: the IOMMU and the PCIe bridges between them. A warning with the fix, not a refusal: the
    all-reduce gate's P2P check then proves what P2P does (and names this when it fails)."""
    if len(chosen) < 2:
        return None
    found = iommu.inspect([g.pci_bus_id for g in chosen], joined)
    if found.problem:
        ui.warn(f"P2P: {found.problem}; fix: {found.fix}")
    else:
        ui.say(f"P2P: {found.note or 'nothing on this host breaks it'}")
    return found


def run(s: Settings, ui: Ui, allow_none: bool, releases: signed.Releases) -> HostPlan:
    ui.say(f"preflight (settings: {s.env_file})")
    hostfiles.announce(ui)
    cpu_release = cpuhost.choose(releases, s, ui)
    if cpu_release is not None:
        return run_cpu(s, ui, cpu_release)
    check_driver()
    chosen = gpus.choose(s, ui)
    gpu = chosen[0]  # the same model and capability as every other one chosen
    release = match_target(releases, gpu, s, ui)
    target = release.target
    if s.deploy_target and s.deploy_target != target.name:
        raise Stop(EX_PREFLIGHT, f"DEPLOY_TARGET={s.deploy_target} in {s.env_file}, but this host's GPU {gpu.name} is "
                   f"the {target.name} target", f"leave DEPLOY_TARGET empty, or set it to {target.name} (or to a cpu "
                   "target, to serve on the CPU)")
    # Before the image's manifest is read: the release's signed facts say which CUDA this target's images carry.
    check_driver_version(gpu.driver, target.cuda, target.driver_floor,
                         f"{target.name} images, per release {release.release.tag}'s signed policy", ui)
    fit = check_memory(target, gpu, s, ui)
    gpus.check_free_memory(chosen, fit, s, ui)
    tp = gpus.tensor_parallel_size(chosen, s, target.runtime.unified_memory)
    joined = gpus.read_topology(chosen, ui)
    p2p_host = check_p2p_host(chosen, joined, ui)
    model = _model(s, target, ui)
    engine = detect_engine(s)
    ui.say(f"engine: {engine.kind} ({engine.cli}), compose: {' '.join(engine.compose)}")
    _, heads_note = heads.check(s, tp, model.path if model else None, engine.cli, ui)
    runtime = gpu_runtime(engine, chosen, s, ui, allow_none)
    check_disk(engine, s, ui)
    check_port(engine, s, ui)
    return HostPlan(gpu, target, fit, engine, runtime, release.facts.driver_table, model, tuple(chosen), joined, tp,
                    heads_note, p2p_host, release)


def run_cpu(s: Settings, ui: Ui, release: signed.Chosen) -> HostPlan:
    """The cpu target: CPU flags, host memory for the KV cache, the model folder, engine, disk, port; no GPU."""
    target = release.target
    if (s.tensor_parallel_size or 1) > 1:
        raise Stop(EX_PREFLIGHT, f"TENSOR_PARALLEL_SIZE={s.tensor_parallel_size}: the cpu target serves in one process "
                   "on this host's CPU", f"leave TENSOR_PARALLEL_SIZE empty (or 1) in {s.env_file}")
    cpuinfo = _read("/proc/cpuinfo")
    cpuhost.check_flags(cpuinfo, ui)
    model = _model(s, target, ui)
    fit = cpuhost.check_memory(target, s, model.size if model else 0, _read(str(hostfiles.path("/proc/meminfo"))), ui)
    engine = detect_engine(s)
    ui.say(f"engine: {engine.kind} ({engine.cli}), compose: {' '.join(engine.compose)}")
    ui.say("GPU runtime: none needed (cpu target)")
    check_disk(engine, s, ui)
    check_port(engine, s, ui)
    gpu = Gpu("cpu", target.capability_text, f"CPU ({cpuhost.cpu_name(cpuinfo)})", "", "", "")
    return HostPlan(gpu, target, fit, engine, GpuRuntime("cpu", "", (), False), {}, model, chosen=release)


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read(1 << 22)
    except OSError as exc:
        raise Stop(EX_PREFLIGHT, f"cannot read {path}: {exc.strerror}", "run on Linux with /proc mounted") from None


def check_verified_image(facts: mf.RuntimeFacts, plan: HostPlan, ui: Ui) -> None:
    """After the trust gate: this host's driver against what the verified manifest says the image carries
    (its CUDA, and a forward-compatibility libcuda on its loader path); never against an unverified read."""
    gpu, target = plan.gpu, plan.target
    if target.is_cpu:
        ui.say("driver: cpu target: no NVIDIA driver is needed")
        return
    if not facts.recorded or not facts.cuda:
        ui.say(f"driver: the manifest does not record the image's CUDA (qualified by an older toolkit); "
               f"checked against the CUDA {target.cuda} the release's policy signs for {target.name} only")
    else:
        floor = plan.drivers.get(facts.cuda)
        if floor is None:
            known = ", ".join(sorted(plan.drivers)) or "none"
            raise Stop(EX_PREFLIGHT, f"driver: the image carries CUDA {facts.cuda} (its verified manifest says so), "
                       f"and the release's signed [drivers] table names no driver floor for it (known: {known})",
                       f"re-release with \"{facts.cuda}\" = \"<driver>\" in images/targets.toml [drivers] (from "
                       f"NVIDIA's CUDA {facts.cuda} release notes), or deploy an image of a CUDA the table knows")
        check_driver_version(gpu.driver, facts.cuda, floor, "the image, per its verified manifest", ui)
    if facts.compat_libcuda or facts.compat_unknown:
        host = driver.DriverVersion.maybe(gpu.driver)
        compat = driver.DriverVersion.maybe(facts.compat_libcuda)
        problem = driver.compat_problem(compat, host, gpu.capability) if host and compat else (
            f"the image's loader finds CUDA's forward-compatibility libcuda {facts.libcuda_first}, whose version "
            "cannot be compared with this host's driver")
        if problem:
            raise Stop(EX_PREFLIGHT, f"driver: {problem}; nothing was pulled", driver.DROP_COMPAT_FIX,
                       f"or run a driver the same as the compat library ({facts.compat_libcuda or 'version unknown'})")
        ui.say(f"driver: the image's forward-compatibility libcuda {facts.compat_libcuda} matches this host")
