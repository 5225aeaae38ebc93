"""Run every check and assemble the manifest's predicate.

Runs inside the image (its own python3, standard library + pyelftools) or on
a host. Torch, Triton and vLLM are only ever touched in child interpreters.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import socket
import sys
import time
import uuid
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from qualify import __version__
from qualify.core import arch, kernelnames, manifest, ncclenv, topology
from qualify.core.enums import CPU_CAPABILITY, Accelerator, CheckStatus, Profile, SupportLevel
from qualify.core.errors import ConfigError
from qualify.core.readlimit import strict_json
from qualify.core.report import Reporter
from qualify.probe import (
    census_check,
    cpu,
    cubinusers,
    environment,
    gpu,
    identity,
    p2p,
    providers,
    runtime_env,
    selfsufficiency,
    triton_checks,
    versions,
)
from qualify.probe.model import CheckResult
from qualify.probe.providers import families

REPORT = Reporter("probe")

# allreduce: only the device and the NCCL collectives (the deploy's gate before a tensor-parallel server).
SCOPES = ("all", "static", "gpu", "allreduce")
# Who built the image: "built" (this toolkit: its wiring is expected) or "external" (judged by what it holds).
ORIGINS = ("built", "external")


@dataclass(frozen=True)
class ProbeTarget:
    """What the probe must know about the target (the host passes it as JSON).

    Text from JSON or the command line is parsed once, here: the capability
    into an arch.Capability, the level and profile into their enums.
    """

    name: str
    capability: Optional[arch.Capability]  # None for a cpu target (`cpu` on the wire)
    platform: str
    torch_cuda_arch_list: str
    triton_env: Dict[str, str]
    intended_support_level: SupportLevel
    profile: Optional[Profile] = None
    unified_memory: bool = False
    gpu_memory_utilization: float = 0.9
    min_gpu_memory_gib: int = 16
    cross_compile: List[arch.Capability] = field(default_factory=list)  # extra capabilities to compile for
    emulated: bool = False  # the probe runs under qemu-user (image platform is not the host's)
    accelerator: str = Accelerator.CUDA.value
    # A deployment's tensor-parallel size (0: not a deployment; the all-reduce spans every visible GPU) and the
    # all-reduce floors its bandwidth is judged by (core/topology.py; the host passes the targets file's).
    tensor_parallel_size: int = 0
    allreduce_floors: Tuple[topology.AllReduceFloor, ...] = ()
    # What the collectives run under (core/ncclenv.py): a deployment passes its server's; empty: the defaults.
    collective_env: Dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        def typed(name: str, value: Any) -> None:
            object.__setattr__(self, name, value)

        typed("accelerator", Accelerator(self.accelerator).value)
        if self.accelerator == Accelerator.CPU:
            typed("capability", None)
        elif not isinstance(self.capability, arch.Capability):
            typed("capability", arch.Capability.parse(self.capability))
        typed("intended_support_level", SupportLevel(self.intended_support_level))
        typed("profile", Profile(self.profile) if self.profile else None)
        typed("cross_compile", [c if isinstance(c, arch.Capability) else arch.Capability.parse(c)
                                for c in self.cross_compile])
        if not isinstance(self.tensor_parallel_size, int) or isinstance(self.tensor_parallel_size, bool) or \
                self.tensor_parallel_size < 0:
            raise ValueError(f"tensor_parallel_size {self.tensor_parallel_size!r} is not a whole number")
        typed("allreduce_floors", tuple(f if isinstance(f, topology.AllReduceFloor) else
                                        topology.floors_from_json([f])[0] for f in self.allreduce_floors))
        typed("collective_env", ncclenv.CollectiveEnv.from_mapping(self.collective_env).as_dict())

    @property
    def collectives(self) -> ncclenv.CollectiveEnv:
        return ncclenv.CollectiveEnv.from_mapping(self.collective_env)

    @property
    def capability_text(self) -> str:
        return CPU_CAPABILITY if self.capability is None else str(self.capability)

    @classmethod
    def from_json(cls, text: str) -> ProbeTarget:
        return cls(**strict_json(text, "the probe's target (--target-json)", ConfigError))

    def to_json(self) -> str:
        """The wire form from_json reads: capabilities as text, enums as their values."""
        data = asdict(self)
        data.update(capability=self.capability_text, cross_compile=[str(c) for c in self.cross_compile],
                    allreduce_floors=[f.as_json() for f in self.allreduce_floors],
                    intended_support_level=self.intended_support_level.value,
                    profile=self.profile.value if self.profile else None)
        return json.dumps(data, sort_keys=True)


def _progress(msg: str) -> None:
    REPORT.say(f"{msg}")


def _record(results: List[CheckResult], items: List[CheckResult]) -> None:
    """Add checks computed elsewhere (census, providers) with the same progress lines."""
    for item in items:
        _timed(results, lambda item=item: item)


def _timed(results: List[CheckResult], fn, *args) -> Any:
    start = time.monotonic()
    out = fn(*args)
    items = out if isinstance(out, list) else [out]
    for item in items:
        if isinstance(item, CheckResult) and not item.seconds:
            item.seconds = round(time.monotonic() - start, 2)
        if isinstance(item, CheckResult):
            results.append(item)
            _progress(f"{item.status:>7}  {item.id}: {item.reason[:150]}")
    return out


def run(t: ProbeTarget, scope: str = "all", extra_paths: Optional[List[str]] = None,
        origin: str = "built") -> Dict[str, Any]:
    if scope not in SCOPES:
        raise ValueError(f"scope must be one of {SCOPES}")
    if origin not in ORIGINS:
        raise ValueError(f"origin must be one of {ORIGINS}")
    external = origin == "external"
    start = time.monotonic()
    cap = t.capability
    checks: List[CheckResult] = []
    pkgs = versions.packages(extra_paths or [])
    triton_version = pkgs.get("triton")
    gpus = versions.nvidia_smi()
    has_gpu = bool(gpus)
    predicate: Dict[str, Any] = {
        "schema_version": manifest.SCHEMA_VERSION,
        "created": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        # This run's own id: evidence from it counts once, however often or however it is handed in.
        "run_id": uuid.uuid4().hex,
        "target": {"name": t.name, "capability": t.capability_text, "platform": t.platform,
                   "torch_cuda_arch_list": t.torch_cuda_arch_list,
                   "profile": t.profile.value if t.profile else None,
                   "intended_support_level": t.intended_support_level.value, "triton_env": t.triton_env},
        "host": {"hostname": socket.gethostname(), "machine": platform.machine(), "python": sys.version.split()[0],
                 "executable": sys.executable, "emulated": t.emulated},
        "toolkit": {"version": __version__, "probe_sha256": identity.sources_digest()},
        "gpu": {"visible": has_gpu, "devices": gpus or []},
    }
    if t.accelerator == Accelerator.CPU:
        predicate["target"]["accelerator"] = t.accelerator
    _progress(f"target {t.name} ({t.capability_text}), scope {scope}, {'GPU visible' if has_gpu else 'no GPU visible'}")
    if t.accelerator == Accelerator.CPU:
        return _finish_cpu(predicate, t, scope, pkgs, external, start)

    torch_view: Dict[str, Any] = {}
    if scope in ("all", "static"):
        tk = versions.toolkit()
        torch_view = versions.torch_view(pkgs, emulated=t.emulated)
        _timed(checks, versions.check, pkgs, tk, torch_view, t.profile)
        predicate["versions"] = {"packages": pkgs, "toolkit": tk, "torch": torch_view}
        engines = providers.engines_in(pkgs)
        census = census_check.run(cap, t.torch_cuda_arch_list, census_check.search_paths(extra_paths or []),
                                  torch_view.get("arch_list"), t.profile, torch_view.get("reason"),
                                  own_extension=not external, engine_libraries=engine_libraries(engines, pkgs, cap),
                                  coverage=[folder for r in engines for folder in r.coverage])
        _record(checks, census["checks"])
        predicate["census"] = {k: v for k, v in census.items() if k != "checks"}
        _record(checks, [environment.torch_cuda_arch_list(cap, t.torch_cuda_arch_list, "torch" in pkgs),
                         environment.cuda_toolkit(cap, tk)])
        runtime = {"user": runtime_env.user(), "cuda": runtime_env.image_cuda(pkgs, tk, torch_view),
                   "libcuda": runtime_env.libcuda()}
        predicate["runtime"] = runtime
        _record(checks, [runtime_env.user_check(runtime["user"], not external and runtime["user"]["in_container"]),
                         runtime_env.compat_check(runtime["libcuda"])])
        _static_triton(checks, t, cap, triton_version, external, (tk.get("ptxas") or {}).get("path"))
        _providers(checks, predicate, cap, pkgs, census, has_gpu)

    if scope in ("all", "gpu"):
        _gpu_checks(checks, t, cap, gpus, has_gpu, triton_version, pkgs)
    if scope == "allreduce":
        _timed(checks, gpu.device_check, gpus, cap)
    if scope in ("all", "gpu", "allreduce"):
        _allreduce(checks, predicate, t, gpus, pkgs, scope)

    for c in checks:
        # GPU checks count once a GPU is there to run them, and always when only
        # GPU checks were asked for (start.sh on a new host): not-run is never a pass.
        if c.id in gpu.REQUIRED_GPU_CHECKS and (has_gpu or scope == "gpu"):
            c.required = True
    predicate["checks"] = [c.to_dict() for c in checks]
    predicate["scope"] = "gpu" if has_gpu and scope != "static" else "static"
    verdict = manifest.verdict(predicate["checks"])
    on_target = has_gpu and scope in ("all", "gpu") and arch.Capability.parse(gpus[0]["compute_cap"]) == cap and all(
        c.status == CheckStatus.PASS for c in checks if c.id.startswith("gpu."))
    predicate["gpu_evidence_on_target"] = bool(on_target)
    predicate["verdict"] = verdict.value
    predicate["support_level"] = manifest.support_level(verdict, t.intended_support_level, bool(on_target),
                                                        arch.is_recognised(cap)).value
    predicate["probe_seconds"] = round(time.monotonic() - start, 1)
    _progress(f"verdict {verdict}, support level {predicate['support_level']} in {predicate['probe_seconds']} s")
    return predicate


def _finish_cpu(predicate: Dict[str, Any], t: ProbeTarget, scope: str, pkgs: Dict[str, str], external: bool,
                start: float) -> Dict[str, Any]:
    """A cpu target (probe/cpu.py): what its image needs instead of GPU code; no GPU checks apply."""
    checks: List[CheckResult] = []
    if scope in ("all", "static"):
        tk = versions.toolkit()
        torch_view = versions.torch_view(pkgs, emulated=t.emulated)
        version = versions.check(pkgs, tk, torch_view, None)
        warning = cpu.versions_warning(pkgs, t.profile)
        if warning:
            version.status, version.reason = CheckStatus.WARN, warning
        _timed(checks, lambda: version)
        predicate["versions"] = {"packages": pkgs, "toolkit": tk, "torch": torch_view}
        predicate["census"] = {"libraries": []}
        _record(checks, [cpu.census_check(), cpu.torch_build_check(torch_view)])
        runtime = {"user": runtime_env.user(), "cuda": {"version": None, "from": None}, "libcuda": runtime_env.libcuda()}
        predicate["runtime"] = runtime
        _record(checks, [runtime_env.user_check(runtime["user"], not external and runtime["user"]["in_container"])])
        cpuinfo = _read_cpuinfo()
        _timed(checks, cpu.kernels_check, cpuinfo, census_check.search_paths([]))
        began = time.monotonic()
        serving_check, found = cpu.serving(pkgs)
        serving_check.seconds = round(time.monotonic() - began, 2)
        _record(checks, [serving_check])
        _timed(checks, cpu.vllm_cli_check, pkgs)
        predicate["providers"] = found
    if scope == "gpu" or not checks:
        _timed(checks, cpu.gpu_scope_check)
    predicate["checks"] = [c.to_dict() for c in checks]
    predicate["scope"] = "static"
    verdict = manifest.verdict(predicate["checks"])
    predicate["gpu_evidence_on_target"] = False
    predicate["verdict"] = verdict.value
    # No GPU evidence can raise it: the serving correctness matrix will (issue 39).
    predicate["support_level"] = manifest.support_level(verdict, t.intended_support_level, False).value
    predicate["probe_seconds"] = round(time.monotonic() - start, 1)
    _progress(f"verdict {verdict}, support level {predicate['support_level']} in {predicate['probe_seconds']} s")
    return predicate


def _read_cpuinfo() -> Optional[str]:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            return fh.read(1 << 22)
    except OSError:
        return None


def _static_triton(checks: List[CheckResult], t: ProbeTarget, cap: arch.Capability, triton_version: Optional[str],
                   external: bool = False, toolkit_ptxas: Optional[str] = None) -> None:
    wiring = _timed(checks, triton_checks.wiring, cap, t.triton_env, triton_version, external, toolkit_ptxas)
    used = wiring.evidence.get("ptxas_path") if wiring.evidence else None
    env = triton_checks.knob_env(wiring.evidence or {}, cap)[1]
    wired = t.triton_env.get(env) if not external else None
    _timed(checks, triton_checks.assembles, cap, used or (wired if wired and os.path.exists(wired) else None), env,
           toolkit_ptxas)
    caps = [cap] + [c for c in t.cross_compile if c != cap]
    _timed(checks, triton_checks.cross_compile, caps, cap, triton_version)
    _timed(checks, triton_checks.allocator, triton_version)


def library_reader(site_packages: List[str], decompress: bool = True):
    """A library's kernel names (core/kernelnames.py) and bytes (host symbols), each read once from the first
    site-packages that has it."""
    def find(rel: str) -> Optional[str]:
        return next((os.path.join(sp, rel) for sp in site_packages if os.path.isfile(os.path.join(sp, rel))), None)

    def read(rel: str):
        path = find(rel)
        return kernelnames.scan(path, decompress=decompress) if path else None

    def raw(rel: str):
        path = find(rel)
        if path is None:
            return families.ABSENT
        try:
            if os.path.getsize(path) > families.SYMBOL_LIMIT:
                return None
            with open(path, "rb") as fh:
                return fh.read(families.SYMBOL_LIMIT)
        except OSError:
            return None

    return providers.cached_names(read, raw)


def engine_libraries(engines, pkgs: Dict[str, str], cap: arch.Capability) -> List[census_check.EngineLibrary]:
    """What each installed engine loads at start-up on the target, per its rules (SGLang: sgl_kernel)."""
    return [census_check.EngineLibrary(f"{r.name} {pkgs.get(r.dist, '')}".strip(), lib.what, lib.paths_for(cap))
            for r in engines for lib in r.serving]


def _providers(checks, predicate, cap, pkgs, census, has_gpu) -> None:
    """Predicted from each installed engine's own rules (vLLM's, SGLang's; vLLM's not-run checks when neither
    is installed) and the census; observed through vLLM when a GPU answers."""
    paths = census["paths"]
    cuda_home = os.environ.get("CUDA_HOME")  # raw: FlashInfer and DeepGEMM search in their own order
    tools = selfsufficiency.toolchain(paths, cuda_home)
    names_of = library_reader(paths)
    found_all, results_all, serving_all = [], [], []
    for rules in providers.engines_in(pkgs) or [providers.RULES]:
        found, results = providers.predict(cap, pkgs, providers.index_rows(census["libraries"]),
                                           predicate["gpu"] if has_gpu else None, toolchain=tools,
                                           site_packages=paths, names_of=names_of, rules=rules)
        # The serving paths are the prediction's: the kernels a path needs are in the files, whatever is observed.
        serving = providers.serving_paths(found, rules) if rules.dist in pkgs else []
        if has_gpu and rules.engine == "vllm" and "vllm" in pkgs:  # SGLang's choices are predicted only
            child = providers.observe(cap)
            why_not = providers.observation_failure(child)
            predicate["providers_observation"] = why_not or "observed"
            if why_not is None:
                found = providers.merge(found, providers.observed_providers(child.data, found))
                results = providers.provider_checks(found, cap, pkgs["vllm"], paths=serving)
        found_all += found
        results_all += results
        serving_all += serving
    predicate["providers"] = [entry.to_json() for entry in found_all]
    if serving_all:
        predicate["serving_paths"] = [p.to_json() for p in serving_all]
    _record(checks, results_all + selfsufficiency.check(pkgs, paths, cuda_home, capability=cap,
                                                        cubin_users=cubinusers.users(providers.RULES, cap)))


def _allreduce(checks: List[CheckResult], predicate: Dict[str, Any], t: ProbeTarget, gpus, pkgs, scope: str) -> None:
    """P2P and vLLM's custom all-reduce, then the NCCL collectives, under the environment the target names; a
    multi-GPU run records its tensor-parallel size and topology beside the devices."""
    rows = predicate.get("census", {}).get("libraries", [])
    no_torch = None if "torch" in pkgs else "torch is not installed in this image"
    required = scope == "allreduce" or t.tensor_parallel_size > 1
    world = t.tensor_parallel_size or len(gpus or [])
    if world > 1 and len(gpus or []) == world:
        _timed(checks, p2p.p2p_check, gpus, no_torch, world, gpu.read_topology(world), t.collectives)
    check = _timed(checks, gpu.nccl_allreduce, gpus, rows, no_torch, t.tensor_parallel_size, t.allreduce_floors,
                   required, t.collectives)
    if world > 1:
        seen = len(gpus or [])
        joined = (check.evidence or {}).get("topology") or (
            gpu.read_topology(seen) if seen > 1 else topology.Topology(topology.UNKNOWN)).as_json()
        predicate["gpu"].update(tensor_parallel_size=world, topology=joined)


def _gpu_checks(checks, t: ProbeTarget, cap, gpus, has_gpu, triton_version, pkgs) -> None:
    _timed(checks, gpu.device_check, gpus, cap)
    _timed(checks, gpu.memory_check, gpus, t.unified_memory, t.gpu_memory_utilization, t.min_gpu_memory_gib)
    no_torch = None if "torch" in pkgs else "torch is not installed in this image"
    _timed(checks, gpu.allocator_on_gpu, has_gpu, triton_version, no_torch)
    _timed(checks, gpu.simple, "gpu.bf16-matmul", "A bf16 matmul matches an fp32 reference", "matmul", has_gpu, no_torch)
    _timed(checks, gpu.simple, "gpu.torch-compile", "torch.compile (Inductor -> Triton -> ptxas) runs and matches eager",
           "compile", has_gpu, no_torch)
