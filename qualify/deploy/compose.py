"""The compose project start.sh runs: one service, only our GPU, literal values."""

from __future__ import annotations

import ipaddress
import json
from dataclasses import dataclass, field
from typing import Any, Dict, List, Tuple

from qualify.core.ncclenv import is_collective
from qualify.deploy.collectives import ServerCollectives
from qualify.deploy.errors import DeployError
from qualify.host import paths

CONTAINER_PORT = 8000
SERVICE = "vllm"
# The OpenAI-compatible server, named as a module so the image's ENTRYPOINT does not matter.
SERVE_ENTRYPOINT = ("python3", "-m", "vllm.entrypoints.openai.api_server")
# Owned by the image's non-root user (images/runtime-user/add-user.sh): a new named volume mounted
# there takes that owner. A volume an older, root image filled keeps root's files: see docs/deploy.md.
CACHE_ROOT = "/var/cache/blackwell"
HF_HOME = f"{CACHE_ROOT}/huggingface"
VLLM_CACHE = f"{CACHE_ROOT}/vllm"
TRITON_HOME = f"{CACHE_ROOT}/triton"
VOLUMES = {"hf-cache": HF_HOME, "vllm-cache": VLLM_CACHE, "triton-cache": TRITON_HOME}
MODEL_DIR = f"{CACHE_ROOT}/model"  # MODEL_PATH, bound read-only (deploy/modelpath.py checks it first)
# `cpu`: the cpu target, which asks for no GPU; `none`: a GPU target's container without one (the stand-in's).
GPU_RUNTIMES = ("nvidia", "cdi", "none", "cpu")


@dataclass(frozen=True)
class ComposeSpec:
    image: str
    target: str
    model: str
    revision: str
    served_model_name: str
    gpu_memory_utilization: float
    max_model_len: int
    gpu_runtime: str = "nvidia"
    gpu_device: str = "0"  # UUID for the nvidia runtime, CDI device name for cdi; several: comma-separated
    tensor_parallel_size: int = 1  # vLLM's --tensor-parallel-size: one rank per GPU of gpu_device
    selinux_label_disable: bool = False
    bind_address: str = "127.0.0.1"
    port: int = 8000
    # The NCCL environment, shared memory, IPC namespace and limits: the one value the all-reduce gate runs under.
    collectives: ServerCollectives = field(default_factory=ServerCollectives)
    tool_call_parser: str = ""
    extra_args: Tuple[str, ...] = ()
    extra_env: Tuple[Tuple[str, str], ...] = ()
    health_start_period_s: int = 1800
    labels: Tuple[Tuple[str, str], ...] = field(default_factory=tuple)
    model_path: str = ""  # a host folder served instead of model/revision, offline
    cpu_kv_cache_gib: int = 0  # the cpu target: VLLM_CPU_KVCACHE_SPACE

    @property
    def shm_size(self) -> str:
        return self.collectives.shm_size

    @property
    def devices(self) -> Tuple[str, ...]:
        return tuple(d for d in self.gpu_device.split(",") if d) if self.gpu_runtime in ("nvidia", "cdi") else ()

    def validate(self) -> None:
        if self.gpu_runtime not in GPU_RUNTIMES:
            raise DeployError(f"GPU_RUNTIME={self.gpu_runtime!r}: use one of {', '.join(GPU_RUNTIMES)}")
        if not 1 <= self.port <= 65535:
            raise DeployError(f"API_PORT={self.port} is not a port number", hint="set API_PORT in .env to 1..65535")
        self.collectives.validate(self.tensor_parallel_size)
        apart = [k for k, v in self.extra_env if is_collective(k) and self.collectives.env.get(k) != v]
        if apart:
            raise DeployError(f"the container variable {apart[0]} is not in the server's collectives (collectives.py: "
                              "for_server makes them from the same container variables)")
        gpus = len(self.devices)
        if self.tensor_parallel_size > 1 and self.gpu_runtime in ("nvidia", "cdi") and self.tensor_parallel_size != gpus:
            raise DeployError(f"--tensor-parallel-size {self.tensor_parallel_size} needs as many GPUs; the container "
                              f"is given {gpus} ({self.gpu_device or 'none'})")
        try:
            ipaddress.ip_address(self.bind_address)
        except ValueError:
            raise DeployError(f"BIND_ADDRESS={self.bind_address!r} is not an IP address",
                              hint="set BIND_ADDRESS in .env to 127.0.0.1 (this host only) or 0.0.0.0") from None


# Compose expands ${VAR} here, on purpose: the token comes from start.sh's environment.
HF_TOKEN_REF = "${HF_TOKEN:-}"


def _escape(value: str) -> str:
    """Compose interpolates `$`; our values are literal."""
    return value.replace("$", "$$")


def _literal(node: Any) -> Any:
    """Every string in the document escaped, so no value can reach compose's interpolation."""
    if isinstance(node, str):
        return _escape(node)
    if isinstance(node, list):
        return [_literal(v) for v in node]
    if isinstance(node, dict):
        return {_escape(k): _literal(v) for k, v in node.items()}
    return node


def serve_args(s: ComposeSpec) -> List[str]:
    model = ["--model", MODEL_DIR] if s.model_path else ["--model", s.model, "--revision", s.revision,
                                                         "--tokenizer-revision", s.revision]
    memory = [] if s.gpu_runtime == "cpu" else ["--gpu-memory-utilization", f"{s.gpu_memory_utilization:g}"]
    args = [*model, "--served-model-name", s.served_model_name, "--host", "0.0.0.0", "--port", str(CONTAINER_PORT),
            *memory, "--max-model-len", str(s.max_model_len)]
    if s.tensor_parallel_size > 1:
        args += ["--tensor-parallel-size", str(s.tensor_parallel_size)]
    if s.tool_call_parser:
        args += ["--enable-auto-tool-choice", "--tool-call-parser", s.tool_call_parser]
    return args + list(s.extra_args)


def _environment(s: ComposeSpec) -> Dict[str, str]:
    env = {"HF_HOME": HF_HOME, "HF_HUB_OFFLINE": "1" if s.model_path else "0", "VLLM_CACHE_ROOT": VLLM_CACHE,
           "TRITON_CACHE_DIR": f"{TRITON_HOME}/cache"}
    if s.gpu_runtime == "nvidia":
        env["NVIDIA_VISIBLE_DEVICES"] = s.gpu_device
    if s.gpu_runtime == "cpu":
        env["VLLM_CPU_KVCACHE_SPACE"] = str(s.cpu_kv_cache_gib)
    else:  # the GPUs' order and NCCL's settings: what the all-reduce gate ran under (collectives.py)
        env.update(s.collectives.env.as_dict())
    # The collective ones among them come from s.collectives alone (validate: the same values), so no second
    # source can set what the server's NCCL runs under.
    env.update({k: v for k, v in s.extra_env if not is_collective(k)})
    return env


def _healthcheck(s: ComposeSpec) -> Dict[str, Any]:
    probe = f"import urllib.request; urllib.request.urlopen('http://127.0.0.1:{CONTAINER_PORT}/health', timeout=5)"
    return {"test": ["CMD", "python3", "-c", probe], "interval": "15s", "timeout": "10s", "retries": 3,
            "start_period": f"{s.health_start_period_s}s"}


def _publish(s: ComposeSpec) -> str:
    host = f"[{s.bind_address}]" if ":" in s.bind_address else s.bind_address
    return f"{host}:{s.port}:{CONTAINER_PORT}"


def compose_document(s: ComposeSpec) -> Dict[str, Any]:
    """The compose project as a dict (written as JSON, which is valid YAML)."""
    s.validate()
    service: Dict[str, Any] = {
        "image": s.image,
        "entrypoint": list(SERVE_ENTRYPOINT),
        "command": serve_args(s),
        "restart": "unless-stopped",
        **s.collectives.compose_fields(s.tensor_parallel_size),
        "ports": [_publish(s)],
        "environment": _environment(s),
        "volumes": [f"{name}:{path}" for name, path in VOLUMES.items()] + (
            [{"type": "bind", "source": s.model_path, "target": MODEL_DIR, "read_only": True}] if s.model_path else []),
        "healthcheck": _healthcheck(s),
        "labels": {paths.LABEL_TARGET: s.target, **dict(s.labels)},
    }
    if s.gpu_runtime == "nvidia":
        service["deploy"] = {"resources": {"reservations": {"devices": [
            {"driver": "nvidia", "device_ids": list(s.devices), "capabilities": ["gpu"]}]}}}
    elif s.gpu_runtime == "cdi":
        service["devices"] = [f"nvidia.com/gpu={d}" for d in s.devices]
    if s.selinux_label_disable:
        # Podman on an SELinux-enforcing host: without it NVML reports 'Insufficient Permissions' (the GB10 compatibility report).
        service["security_opt"] = ["label=disable"]
    service = _literal(service)
    if not s.model_path:  # a local folder is served offline: no token
        # Taken from start.sh's environment when compose runs; never written into the file.
        service["environment"]["HF_TOKEN"] = HF_TOKEN_REF
    return {"services": {SERVICE: service}, "volumes": {name: {} for name in VOLUMES}}


def compose_json(s: ComposeSpec) -> str:
    return json.dumps(compose_document(s), indent=2, sort_keys=True) + "\n"
