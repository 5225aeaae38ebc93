"""The cpu target on this host: when it is chosen, and what preflight checks instead of a GPU.

Chosen when DEPLOY_TARGET names it, or when this host has no nvidia-smi on PATH and GPU_RUNTIME is auto
(said so); an nvidia-smi that is there but fails still stops the deploy (the driver is broken, not absent).
Never through GPU_RUNTIME=none, which is the stand-in's. Checked: the CPU flags vLLM's CPU build needs,
host memory for its KV cache, the model and the server (disk and port as for any target). Which targets are
cpu targets, and their memory, come from the verified release's signed policy (signed.py), never a targets file.
"""

from __future__ import annotations

import os
import platform
import shutil
from pathlib import Path
from typing import Optional

from qualify.core.errors import ConfigError
from qualify.core.readlimit import read_json
from qualify.deploy import memory, signed
from qualify.deploy.settings import Settings
from qualify.deploy.ui import EX_PREFLIGHT, Stop, Ui
from qualify.probe import cpu as cpu_checks
from qualify.trust.deployfacts import DeployTarget

GIB = 1 << 30
MAX_CONFIG_BYTES = 1 << 20


def choose(releases: signed.Releases, s: Settings, ui: Ui) -> Optional[signed.Chosen]:
    """The cpu target to deploy (with the verified release that signs it), or None for this host's GPU target."""
    machine = platform.machine()
    if s.deploy_target:
        chosen = releases.named(s.deploy_target)
        t = chosen.target
        if not t.is_cpu:
            return None  # a GPU target: preflight checks that it is this GPU's
        if t.uname_machine != machine:
            raise Stop(EX_PREFLIGHT, f"DEPLOY_TARGET={t.name} is a {t.platform} target; this host is {machine}",
                       f"leave DEPLOY_TARGET empty in {s.env_file}, or run on a {t.uname_machine} host")
        ui.say(f"target: {t.name} (DEPLOY_TARGET={t.name} in {s.env_file}): vLLM's CPU build, no GPU is used")
        return chosen
    if shutil.which("nvidia-smi") is not None or s.gpu_runtime.value != "auto":
        return None  # a GPU host, or one whose GPU runtime was named: the GPU preflight says what is wrong
    found = releases.find(lambda f: next(iter(f.cpu_targets(machine)), None))
    if found is None:
        return None  # no release signs a cpu target for this platform: the GPU preflight's "no NVIDIA GPU found"
    ui.say(f"target: {found.target.name}: this host has no nvidia-smi on PATH (no NVIDIA driver) and GPU_RUNTIME=auto, "
           f"so the deploy serves on the CPU (vLLM's CPU build); set DEPLOY_TARGET in {s.env_file} to choose")
    return found


def cpu_name(cpuinfo: str) -> str:
    for line in cpuinfo.splitlines():
        if line.startswith("model name") and ":" in line:
            return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def check_flags(cpuinfo: str, ui: Ui) -> str:
    """The CPU must have what vLLM's CPU kernels need (x86: AVX2 at least); the kernel library it will load."""
    flags = cpu_checks.cpu_flags(cpuinfo)
    chosen = cpu_checks.kernel_for(flags)
    if chosen is None:
        raise Stop(EX_PREFLIGHT, "CPU: this CPU has no AVX2, and vLLM's CPU build has kernels only for AVX2, AVX512 "
                   "and AVX512 with BF16 (/proc/cpuinfo flags); nothing was pulled",
                   "deploy on a host with an AVX2 (x86-64-v3) or newer CPU")
    need, lib = chosen
    ui.say(f"CPU: {cpu_name(cpuinfo)}, {os.cpu_count()} cores; {', '.join(need)}: vLLM loads its {lib} kernels")
    return lib


def kv_bytes_per_token(model: Optional[Path]) -> Optional[int]:
    """bfloat16 K and V per token over all layers, from the model folder's config.json (None when unknown)."""
    if model is None:
        return None
    try:
        cfg = read_json(model / "config.json", MAX_CONFIG_BYTES, "model config", ConfigError)
        layers, heads = int(cfg["num_hidden_layers"]), int(cfg.get("num_key_value_heads", cfg["num_attention_heads"]))
        head_dim = int(cfg.get("head_dim") or int(cfg["hidden_size"]) // int(cfg["num_attention_heads"]))
    except (ConfigError, ValueError, KeyError, TypeError, AttributeError, ZeroDivisionError):
        return None
    return 2 * layers * heads * head_dim * 2


def check_memory(target: DeployTarget, s: Settings, model_bytes: int, meminfo: str, ui: Ui) -> memory.MemoryFit:
    """Host memory: the KV cache vLLM reserves (kv_cache_gib), the model and the server must fit MemAvailable,
    and the KV cache must hold one sequence of MAX_MODEL_LEN tokens."""
    rt = target.runtime
    available = memory.parse_meminfo(meminfo).get("MemAvailable", 0)
    need = (rt.kv_cache_gib + rt.server_memory_gib) * GIB + model_bytes
    if available < need:
        raise Stop(EX_PREFLIGHT, f"memory: {available / GIB:.1f} GiB available (MemAvailable), and the server needs "
                   f"{need / GIB:.1f} GiB: its KV cache {rt.kv_cache_gib} GiB, the model {model_bytes / GIB:.2f} GiB "
                   f"and {rt.server_memory_gib} GiB for the server itself (signed in the release's policy for "
                   f"{target.name}, from [targets.{target.name}.runtime]); nothing was pulled",
                   "free memory (stop other services), or serve a smaller model")
    per_token = kv_bytes_per_token(s.model_path)
    if per_token:
        fits = rt.kv_cache_gib * GIB // per_token
        if fits < s.max_model_len:
            raise Stop(EX_PREFLIGHT, f"memory: a KV cache of {rt.kv_cache_gib} GiB holds {fits} tokens of this model, "
                       f"fewer than MAX_MODEL_LEN={s.max_model_len}", f"lower MAX_MODEL_LEN in {s.env_file}")
        ui.say(f"memory: {available / GIB:.1f} GiB available; KV cache {rt.kv_cache_gib} GiB ({fits} tokens of this "
               f"model, MAX_MODEL_LEN {s.max_model_len}), model {model_bytes / GIB:.2f} GiB, server "
               f"{rt.server_memory_gib} GiB")
    else:
        ui.say(f"memory: {available / GIB:.1f} GiB available; KV cache {rt.kv_cache_gib} GiB, server "
               f"{rt.server_memory_gib} GiB")
    return memory.MemoryFit(rt.gpu_memory_utilization, available / GIB, False, "/proc/meminfo",
                            (f"vLLM's CPU KV cache: {rt.kv_cache_gib} GiB",))
