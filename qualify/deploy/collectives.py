"""How the server's ranks talk, as one value: the NCCL environment and the container's shared memory, IPC
namespace and limits (issue 51).

`for_server` makes it once per deploy from the settings; compose.py writes it into the compose file and the
all-reduce gate runs the probe's collectives under exactly it (`run_args` for the probe's container, `env` in
the probe target, which hands it to its NCCL and P2P children). The gate then checks that the children saw
what the server will see (allreduce.py), so the gate and the server cannot drift apart again.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Dict, Sequence, Tuple

from qualify.core.ncclenv import CollectiveEnv
from qualify.deploy.errors import DeployError

# What compose and `docker run --shm-size` accept: bytes, or a number with a unit.
SHM_SIZE = re.compile(r"[0-9]+(\.[0-9]+)?([bkmgBKMG][bB]?)?")
NCCL_MIN_SHM = 1 << 30  # NCCL's guidance for containers (--shm-size=1g), below which its SHM transport fails
# NVIDIA's container guidance for NCCL and PyTorch: pinned host memory unlimited, a 64 MiB stack.
NCCL_ULIMITS: Tuple[Tuple[str, int], ...] = (("memlock", -1), ("stack", 67108864))
# vLLM's switch for its own all-reduce kernels over P2P (vllm/distributed/device_communicators/custom_all_reduce.py).
DISABLE_CUSTOM_ALL_REDUCE = "--disable-custom-all-reduce"


def shm_bytes(text: str) -> float:
    m = SHM_SIZE.fullmatch(text)
    if not m:
        return 0
    unit = (m.group(2) or "b")[0].lower()
    return float(text[:m.start(2)] if m.group(2) else text) * {"b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}[unit]


@dataclass(frozen=True)
class ServerCollectives:
    """The server's collectives: the variables its ranks run under and the container they share.

    Every rank is a process of the one server container: NCCL's shared-memory transport and CUDA IPC (vLLM's
    custom all-reduce) work in its own IPC namespace (the host's, `ipc: host`, is needed only between
    containers), given room in /dev/shm and unlimited pinned memory."""

    env: CollectiveEnv = field(default_factory=CollectiveEnv)
    shm_size: str = "8g"
    ipc: str = "private"
    ulimits: Tuple[Tuple[str, int], ...] = NCCL_ULIMITS
    custom_all_reduce: bool = True  # False: the server runs with --disable-custom-all-reduce

    def validate(self, tensor_parallel_size: int) -> None:
        if not SHM_SIZE.fullmatch(self.shm_size):
            raise DeployError(f"SHM_SIZE={self.shm_size!r} is not a size such as 8g, 512m or 2gb",
                              hint="set SHM_SIZE in .env to a number with an optional unit b, k, m or g")
        if tensor_parallel_size > 1 and shm_bytes(self.shm_size) < NCCL_MIN_SHM:
            raise DeployError(f"SHM_SIZE={self.shm_size} is below 1g: the server's {tensor_parallel_size} ranks "
                              "share tensors and NCCL's buffers through /dev/shm",
                              hint="set SHM_SIZE in .env to 1g or more (8g by default)")

    def compose_fields(self, tensor_parallel_size: int) -> Dict[str, Any]:
        """The service's shared memory always; its IPC namespace and limits when several ranks share it."""
        fields: Dict[str, Any] = {"shm_size": self.shm_size}
        if tensor_parallel_size > 1:
            fields.update(ipc=self.ipc, ulimits=dict(self.ulimits))
        return fields

    def run_args(self, tensor_parallel_size: int) -> Tuple[str, ...]:
        """The same container settings as `compose_fields`, for `engine run` (the gate's probe)."""
        if tensor_parallel_size < 2:
            return ("--shm-size", self.shm_size)
        limits = tuple(a for name, value in self.ulimits for a in ("--ulimit", f"{name}={value}:{value}"))
        return ("--shm-size", self.shm_size, "--ipc", self.ipc, *limits)

    def describe(self) -> str:
        limits = ", ".join(f"{name} {'unlimited' if value < 0 else value}" for name, value in self.ulimits)
        return (f"{self.env.describe()}; shm {self.shm_size}, ipc {self.ipc}, {limits}; vLLM's custom all-reduce "
                + ("allowed" if self.custom_all_reduce else f"off ({DISABLE_CUSTOM_ALL_REDUCE})"))


def for_server(container_env: Sequence[Tuple[str, str]], shm_size: str,
               serve_args: Sequence[str]) -> ServerCollectives:
    """From the settings: CONTAINER_ENV_ variables that are collective settings join the defaults (the server
    gets them anyway; now the gate does too), SHM_SIZE, and whether EXTRA_SERVE_ARGS turns vLLM's custom
    all-reduce off."""
    return ServerCollectives(CollectiveEnv.with_overrides(container_env), shm_size,
                             custom_all_reduce=DISABLE_CUSTOM_ALL_REDUCE not in serve_args)
