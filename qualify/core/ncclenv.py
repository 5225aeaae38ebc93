"""The environment a tensor-parallel server's ranks talk under: NCCL, its multicast, the GPUs' order.

One definition (issue 51): the deploy writes it into the server's compose file (deploy/collectives.py) and
hands the very same value to the all-reduce gate, whose probe passes it to its NCCL and P2P children
(probe/gpu.py, probe/p2p.py); each child reports the environment its ranks saw, and the deploy compares that
with what the server gets (deploy/allreduce.py). A gate that ran under other NCCL settings than the server
proved nothing about the server (local-inference-lab/vllm#261, vllm-project/vllm#51513, #30630,
NVIDIA/nccl#1769).

- NVLink multicast (NVLS) off in NCCL, PyTorch's symmetric memory and NVSHMEM: it can take shared GPUs out of
  service, and neither the server nor the gate needs it.
- CUDA_DEVICE_ORDER=PCI_BUS_ID: CUDA numbers the GPUs as nvidia-smi does, so rank i is nvidia-smi's GPU i
  and a pair the probe tests is the pair `nvidia-smi topo -m` describes.

What a user adds with CONTAINER_ENV_<NAME> joins it when NAME is one of these (`is_collective`): the server
and the gate then both get it, a setting that breaks NCCL breaks the gate too.

Standard library only, Python 3.9 compatible: the probe imports it inside images, the deploy on the host.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Iterable, List, Mapping, Optional, Tuple

DEFAULTS: Tuple[Tuple[str, str], ...] = (
    ("CUDA_DEVICE_ORDER", "PCI_BUS_ID"),
    ("NCCL_NVLS_ENABLE", "0"),
    ("NVSHMEM_DISABLE_NVLS", "1"),
    ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"),
)
# The variables that change how the ranks talk: NCCL's own, PyTorch's NCCL and symmetric-memory settings,
# NVSHMEM's, and vLLM's P2P check (VLLM_SKIP_P2P_CHECK=1 trusts the driver's P2P report: probe/p2p.py).
PREFIXES = ("NCCL_", "TORCH_NCCL_", "NVSHMEM_", "TORCH_SYMM_MEM_")
NAMES = ("CUDA_DEVICE_ORDER", "VLLM_SKIP_P2P_CHECK")
MAX_VALUE_CHARS = 4096


def is_collective(name: str) -> bool:
    return name in NAMES or any(name.startswith(p) and len(name) > len(p) for p in PREFIXES)


@dataclass(frozen=True)
class CollectiveEnv:
    """The variables, sorted by name, each once."""

    pairs: Tuple[Tuple[str, str], ...] = DEFAULTS

    def __post_init__(self) -> None:
        pairs = tuple(sorted((str(k), str(v)) for k, v in self.pairs))
        names = [k for k, _ in pairs]
        bad = next((k for k in names if not is_collective(k)), None)
        if bad is not None:
            raise ValueError(f"{bad} is not a collective setting (NCCL_*, TORCH_NCCL_*, NVSHMEM_*, TORCH_SYMM_MEM_*, "
                             f"{', '.join(NAMES)})")
        twice = next((k for k in names if names.count(k) > 1), None)
        if twice is not None:
            raise ValueError(f"{twice} is set twice")
        long = next((k for k, v in pairs if len(v) > MAX_VALUE_CHARS or "\0" in v), None)
        if long is not None:
            raise ValueError(f"{long}: a value of more than {MAX_VALUE_CHARS} characters, or with a NUL")
        object.__setattr__(self, "pairs", pairs)

    @classmethod
    def with_overrides(cls, overrides: Iterable[Tuple[str, str]]) -> CollectiveEnv:
        """The defaults, with every collective variable of `overrides` (the user's container variables) set as
        given; the others are not the collectives' and are left out."""
        env = dict(DEFAULTS)
        env.update({k: v for k, v in overrides if is_collective(k)})
        return cls(tuple(env.items()))

    @classmethod
    def from_mapping(cls, mapping: Optional[Mapping[str, str]]) -> CollectiveEnv:
        """From JSON (the probe target's `collective_env`); empty or None: the defaults."""
        return cls(tuple(mapping.items())) if mapping else cls()

    def as_dict(self) -> Dict[str, str]:
        return dict(self.pairs)

    def get(self, name: str) -> Optional[str]:
        return self.as_dict().get(name)

    def differences(self, seen: Mapping[str, Optional[str]]) -> List[str]:
        """How an environment a child reported differs from this one: `NAME=seen, not wanted` per variable."""
        out = []
        for name, wanted in self.pairs:
            got = seen.get(name)
            if got != wanted:
                out.append(f"{name}={got if got is not None else '(unset)'}, not {wanted}")
        return out

    def describe(self) -> str:
        return " ".join(f"{k}={v}" for k, v in self.pairs)


DEFAULT = CollectiveEnv()
