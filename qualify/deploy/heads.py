"""Does a tensor-parallel size split the model's attention heads? Checked in preflight when its config is
readable here, so a size vLLM would refuse after loading ("Total number of attention heads (14) must be
divisible by tensor parallel size (4)") is refused before anything is pulled.

Where the config is read: MODEL_PATH's config.json, else a cached copy of MODEL_ID at MODEL_REVISION in a
Hugging Face cache on this host: the deployment's own cache volume (`<project>_hf-cache`, what an earlier
start filled), $HF_HOME, ~/.cache/huggingface. A config found nowhere is not checked, and the deploy says so
(vLLM then checks at start-up). Every read is bounded; a config that is there but not JSON stops the deploy,
naming the file.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, List, Mapping, Optional, Tuple

from qualify.core.errors import ConfigError
from qualify.core.readlimit import read_small, strict_json
from qualify.deploy.settings import Settings
from qualify.deploy.ui import EX_PREFLIGHT, Stop, Ui
from qualify.host import cmd

CONFIG_LIMIT = 1 << 20
_REVISION = re.compile(r"[0-9a-f]{40}")
# Multimodal and wrapped models keep the language model's numbers under one of these.
_NESTED = ("text_config", "llm_config", "language_config")


@dataclass(frozen=True)
class Heads:
    attention: int
    kv: Optional[int]  # None: as many as attention (no grouped-query attention)
    source: Path

    def problem(self, tp: int) -> str:
        """Why vLLM cannot split these heads over `tp` ranks ("" when it can)."""
        if self.attention % tp:
            return f"{tp} does not divide the model's {self.attention} attention heads"
        kv = self.kv or self.attention
        if (kv >= tp and kv % tp) or (kv < tp and tp % kv):
            return (f"{tp} does not split the model's {kv} key-value heads (vLLM needs the size to divide them, or "
                    "them to divide the size)")
        return ""

    def sizes(self, most: int) -> List[int]:
        return [n for n in range(1, max(most, 1) + 1) if not self.problem(n)]


def _number(cfg: Mapping[str, Any], *keys: str) -> Optional[int]:
    for key in keys:
        value = cfg.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def heads_of(config: Mapping[str, Any], source: Path) -> Optional[Heads]:
    layers = [config] + [config[k] for k in _NESTED if isinstance(config.get(k), Mapping)]
    for cfg in layers:
        attention = _number(cfg, "num_attention_heads", "n_head", "num_heads")
        if attention:
            kv = _number(cfg, "num_key_value_heads", "n_head_kv", "num_kv_heads")
            if kv is None and cfg.get("multi_query") is True:
                kv = 1
            return Heads(attention, kv, source)
    return None


def _volume_hub(s: Settings, engine_cli: str) -> Optional[Path]:
    """The hub folder of this deployment's own cache volume, where an earlier start downloaded the model."""
    proc = cmd.ask([engine_cli, "volume", "inspect", "--format", "{{.Mountpoint}}", f"{s.compose_project}_hf-cache"])
    mount = proc.stdout.strip() if proc.returncode == 0 else ""
    return Path(mount) / "hub" if mount else None


def _hubs(s: Settings, engine_cli: str) -> List[Path]:
    """The deployment's own cache volume, then this host's hub cache as huggingface_hub finds it
    (HF_HUB_CACHE, else HF_HOME/hub, else ~/.cache/huggingface/hub)."""
    env = os.environ
    here = Path(env["HF_HUB_CACHE"]) if env.get("HF_HUB_CACHE") else Path(env["HF_HOME"]) / "hub" \
        if env.get("HF_HOME") else Path.home() / ".cache" / "huggingface" / "hub"
    return [h for h in (_volume_hub(s, engine_cli) if engine_cli else None, here) if h is not None]


def cached_config(s: Settings, engine_cli: str) -> Optional[Path]:
    """MODEL_ID's config.json at MODEL_REVISION in a Hugging Face cache here (the hub's layout:
    models--ORG--NAME/snapshots/<commit>/config.json, refs/<branch> naming the commit)."""
    if not s.model_id or "/" not in s.model_id or ".." in s.model_id or not s.model_revision:
        return None
    folder = "models--" + s.model_id.replace("/", "--")
    for hub in _hubs(s, engine_cli):
        repo = hub / folder
        commit = s.model_revision
        if not _REVISION.fullmatch(commit):
            try:
                commit = read_small(repo / "refs" / commit, 100, "hub ref", ConfigError).decode().strip()
            except (ConfigError, UnicodeDecodeError):
                continue
            if not _REVISION.fullmatch(commit):
                continue
        path = repo / "snapshots" / commit / "config.json"
        try:
            if path.is_file():
                return path
        except OSError:
            continue
    return None


def read_config(path: Path) -> Any:
    """A model's config file (config.json, hf_quant_config.json) as strict JSON, bounded; one that is there but
    cannot be read stops the deploy, naming the file."""
    try:
        return strict_json(read_small(path, CONFIG_LIMIT, "model config", ConfigError), str(path), ConfigError)
    except ConfigError as exc:
        raise Stop(EX_PREFLIGHT, f"the model's config cannot be read: {exc.message}",
                   "vLLM reads the same file at start-up: repair or re-download the model") from None


def read_heads(path: Path) -> Optional[Heads]:
    config = read_config(path)
    return heads_of(config, path) if isinstance(config, dict) else None


def check(s: Settings, tp: int, model_dir: Optional[Path], engine_cli: str, ui: Ui) -> Tuple[Optional[Heads], str]:
    """(the heads, a note) for a tensor-parallel size above 1; refuses a size that does not split them."""
    if tp < 2:
        return None, ""
    path = model_dir / "config.json" if model_dir else cached_config(s, engine_cli)
    what = f"MODEL_PATH={model_dir}" if model_dir else f"{s.model_id} at {s.model_revision}"
    if path is None:
        note = (f"attention heads: not checked: no config of {what} is cached on this host (vLLM checks "
                f"--tensor-parallel-size {tp} against them at start-up)")
        ui.say(note)
        return None, note
    heads = read_heads(path)
    if heads is None:
        note = f"attention heads: not checked: {path} names no attention heads (num_attention_heads)"
        ui.say(note)
        return None, note
    problem = heads.problem(tp)
    if problem:
        fits = ", ".join(map(str, heads.sizes(64)))
        raise Stop(EX_PREFLIGHT, f"TENSOR_PARALLEL_SIZE={tp}: {problem} ({path}: num_attention_heads "
                   f"{heads.attention}" + (f", num_key_value_heads {heads.kv}" if heads.kv else "") + "); vLLM would "
                   "refuse it after the image is pulled",
                   f"use a tensor-parallel size that splits them ({fits}), with as many GPUs in GPU_DEVICE, in "
                   f"{s.env_file}")
    note = (f"attention heads: {heads.attention}" + (f" ({heads.kv} key-value)" if heads.kv else "")
            + f" split over {tp} GPUs ({path})")
    ui.say(note)
    return heads, note

