"""The serving paths a model takes (issue 50): its config.json read as vLLM 0.33 reads it, mapped to the
manifest's path names (core/servingpaths.py: attention.bf16 ... linear.w4a16), so the deploy can judge them by
the verified manifest's `serving_paths` (deploy/pathgate.py) before anything is pulled.

The reference is vLLM's own reading, not a guess at it:
- which quantization config: `quantization_config`, else compressed-tensors' `compression_config`, else the
  text config's (multimodal models), else ModelOpt's legacy `hf_quant_config.json` beside config.json, a
  ModelOpt producer's `quant_algo` naming the method (transformers_utils/config.py, model_arch_config_convertor.py
  `_normalize_quantization_config`);
- each method's keys: fp8.py (`weight_block_size`), modelopt.py (`quant_algo`: FP8, FP8_PER_CHANNEL_PER_TOKEN,
  FP8_PB_WO, NVFP4, ...), compressed_tensors.py `_get_scheme_from_parts` (per config group: weights and input
  activations' type, bits, strategy, group size; the format), mxfp4.py (MoE experts only; linears stay
  unquantized), auto_gptq.py / auto_awq.py (`bits` / `w_bit`);
- MoE: vLLM's expert-count aliases (num_experts, moe_num_experts, n_routed_experts, num_local_experts) above 0;
  MLA: `kv_lora_rank` set (model_arch_config_convertor.py is_deepseek_mla);
- the KV cache: `--kv-cache-dtype` in EXTRA_SERVE_ARGS, else "auto", which vLLM 0.33 resolves from a ModelOpt
  config's `kv_cache_quant_algo` / `kv_cache_scheme` only (utils/torch_utils.py resolve_kv_cache_dtype_string).

A quantization the manifest's paths do not describe (bitsandbytes, int8, MXFP8, weight-only NVFP4 or FP8, an
int4 MoE, ...) is listed in `undescribed`, which the deploy reports as not checked: never a silent pass.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from qualify.core.errors import ConfigError
from qualify.core.servingpaths import PATHS

EXPERT_KEYS = ("num_experts", "moe_num_experts", "n_routed_experts", "num_local_experts")  # vLLM's aliases
NESTED = ("text_config", "llm_config", "language_config")  # as heads.py: the language model of a wrapped one
LEGACY_MODELOPT_FILE = "hf_quant_config.json"  # ModelOpt 0.29 and before, beside config.json
# EXTRA_SERVE_ARGS flags that choose a provider instead of vLLM's default pick, per kind of path.
BACKEND_FLAGS = {"attention": "--attention-backend", "moe": "--moe-backend", "linear": "--linear-backend"}
FP8_KV = ("fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc", "fp8_ds_mla")  # vLLM 0.33's CacheDType FP8 values
MODEL_DTYPE_KV = ("auto", "bfloat16", "float16")
# ModelOpt quant_algo -> (linear path, MoE path); modelopt.py LINEAR_ALGOS and _BLOCK_FP8_MOE_ALGOS.
MODELOPT = {"FP8": ("linear.fp8", "moe.fp8"), "FP8_PER_CHANNEL_PER_TOKEN": ("linear.fp8", "moe.fp8"),
            "FP8_PB_WO": ("linear.fp8-block", "moe.fp8-block"), "FP8_BLOCK_SCALES": ("linear.fp8-block", "moe.fp8-block"),
            "NVFP4": ("linear.nvfp4", "moe.nvfp4")}
GPTQ_AWQ = ("gptq", "auto_gptq", "gptq_marlin", "awq", "auto_awq", "awq_marlin")


@dataclass(frozen=True)
class Need:
    """One serving path the model takes, and the keys that say so."""

    path: str  # one of servingpaths.PATHS
    why: str

    @property
    def kind(self) -> str:
        return self.path.split(".", 1)[0]


@dataclass(frozen=True)
class Override:
    """A provider chosen in EXTRA_SERVE_ARGS instead of vLLM's default pick (--moe-backend marlin)."""

    kind: str  # attention | moe | linear
    flag: str
    value: str


@dataclass(frozen=True)
class ModelPaths:
    source: str  # the file(s) read
    needs: Tuple[Need, ...]
    undescribed: Tuple[str, ...]  # what the manifest's paths do not describe: reported as not checked
    quantization: str  # for people: "none", "fp8 (weight_block_size [128, 128])", ...
    moe: str  # "" for a dense model, else the key that says MoE ("n_routed_experts 256")
    mla: str  # "" without MLA, else "kv_lora_rank 512"
    kv_cache: str  # "bfloat16 (the model's dtype)", "fp8 (--kv-cache-dtype fp8)", ...
    overrides: Tuple[Override, ...] = ()
    notes: Tuple[str, ...] = ()

    @property
    def paths(self) -> Tuple[str, ...]:
        return tuple(n.path for n in self.needs)

    def override(self, kind: str) -> Optional[Override]:
        return next((o for o in self.overrides if o.kind == kind), None)

    def describe(self) -> str:
        """One line: what the config says and the paths it maps to."""
        shape = ", ".join(x for x in (f"MoE ({self.moe})" if self.moe else "dense", f"MLA ({self.mla})" if self.mla
                                      else "", f"quantization {self.quantization}", f"KV cache {self.kv_cache}") if x)
        return f"{shape} -> {', '.join(self.paths) or 'no path the manifest names'}"


def serve_option(args: Sequence[str], *names: str) -> Optional[str]:
    """The value of a vLLM option in an argument list (`--x v` or `--x=v`; the last one counts, as argparse)."""
    found = None
    for i, arg in enumerate(args):
        name, eq, value = arg.partition("=")
        if name in names:
            found = value if eq else (args[i + 1] if i + 1 < len(args) else "")
    return found


def _layers(config: Mapping[str, Any]) -> List[Mapping[str, Any]]:
    return [config] + [config[k] for k in NESTED if isinstance(config.get(k), Mapping)]


def _text_config(config: Mapping[str, Any]) -> Mapping[str, Any]:
    """vLLM's hf_text_config: the text config of a wrapped model, else the config itself."""
    return next((config[k] for k in NESTED if isinstance(config.get(k), Mapping)), config)


def _experts(config: Mapping[str, Any]) -> str:
    text = _text_config(config)
    for key in EXPERT_KEYS:
        value = text.get(key)
        if isinstance(value, list):
            value = value[0] if value else 0
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return f"{key} {value}"
    blocks = text.get("block_configs")
    if isinstance(blocks, list):
        most = max((b.get("n_routed_experts") or 0 for b in blocks if isinstance(b, Mapping)
                    and isinstance(b.get("n_routed_experts"), int)), default=0)
        if most > 0:
            return f"block_configs n_routed_experts {most}"
    return ""


def _mla(config: Mapping[str, Any]) -> str:
    rank = _text_config(config).get("kv_lora_rank")
    return f"kv_lora_rank {rank}" if isinstance(rank, int) and not isinstance(rank, bool) and rank > 0 else ""


def quant_config(config: Mapping[str, Any], legacy: Optional[Mapping[str, Any]], where: str) \
        -> Tuple[Optional[Dict[str, Any]], str]:
    """(the quantization config vLLM reads, the key it came from), normalised as vLLM normalises it."""
    # vLLM's order: config.json's quantization_config, else the legacy file (loaded in its place), else
    # compressed-tensors' compression_config, else the same two keys of the text config.
    nested = next((k for k in NESTED if isinstance(config.get(k), Mapping)), "")
    candidates = [(config.get("quantization_config"), "quantization_config"), (legacy, LEGACY_MODELOPT_FILE),
                  (config.get("compression_config"), "compression_config")]
    if nested:
        candidates += [(config[nested].get(name), f"{nested}.{name}") for name in ("quantization_config",
                                                                                 "compression_config")]
    found, key = next(((c, k) for c, k in candidates if c is not None), (None, ""))
    if found is None:
        return None, ""
    if not isinstance(found, Mapping):
        raise ConfigError(f"{where}: {key} is {type(found).__name__}, not an object",
                          hint="vLLM reads the same file at start-up: repair or re-download the model")
    qc = dict(found)
    inner = qc.get("quantization")
    producer = qc.get("producer")
    legacy_shape = isinstance(inner, Mapping) and "modelopt_quant_config" in inner
    if (isinstance(producer, Mapping) and producer.get("name") == "modelopt") or legacy_shape:
        algo = str((inner or {}).get("quant_algo") or "").upper() if isinstance(inner, Mapping) else ""
        qc["quant_method"] = {"NVFP4": "modelopt_fp4", "MIXED_PRECISION": "modelopt_mixed"}.get(
            algo, "modelopt" if algo else qc.get("quant_method", ""))
    method = qc.get("quant_method", "")
    if not isinstance(method, str):
        raise ConfigError(f"{where}: {key}.quant_method is {method!r}, not a name")
    qc["quant_method"] = method.lower().replace("compressed_tensors", "compressed-tensors")
    return qc, key


@dataclass
class _Mapped:
    linear: List[Tuple[str, str]]  # (path, why)
    moe: List[Tuple[str, str]]
    undescribed: List[str]
    summary: str
    kv_from_config: str = ""  # a ModelOpt config's KV cache algo ("fp8", "nvfp4"), which "auto" resolves to


def _int(value: Any) -> Optional[int]:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _fp8(qc: Mapping[str, Any], key: str, where: str) -> _Mapped:
    block = qc.get("weight_block_size")
    if block is not None:
        if not (isinstance(block, list) and len(block) == 2 and all(_int(b) and b > 0 for b in block)):
            raise ConfigError(f"{where}: {key}.weight_block_size is {block!r}, not two whole numbers",
                              hint="vLLM refuses it at start-up (fp8.py: the block size must have 2 dimensions)")
        why = f"quant_method fp8, weight_block_size {block}"
        return _Mapped([("linear.fp8-block", why)], [("moe.fp8-block", why)], [], f"fp8 (weight_block_size {block})")
    scheme = qc.get("activation_scheme") or "dynamic"
    why = f"quant_method fp8 (per-tensor weight scales, {scheme} activation scales)"
    return _Mapped([("linear.fp8", why)], [("moe.fp8", why)], [], f"fp8 (per-tensor, {scheme} activations)")


def _modelopt(qc: Mapping[str, Any]) -> _Mapped:
    inner = qc.get("quantization") if isinstance(qc.get("quantization"), Mapping) else qc
    algo = str(inner.get("quant_algo") or "").upper()
    kv = inner.get("kv_cache_scheme") or qc.get("kv_cache_scheme") or inner.get("kv_cache_quant_algo") \
        or qc.get("kv_cache_quant_algo")
    if isinstance(kv, Mapping):  # torch_utils.get_kv_cache_quant_algo_string
        kv = "fp8" if (kv.get("dynamic") is False and kv.get("num_bits") == 8 and kv.get("type") == "float") else \
            "nvfp4" if (kv.get("num_bits") == 4 and kv.get("type") == "float") else ""
    kv_algo = {"fp8": "fp8_e4m3", "nvfp4": "nvfp4"}.get(str(kv).lower(), "") if kv else ""
    if algo in MODELOPT:
        linear, moe = MODELOPT[algo]
        why = f"ModelOpt quant_algo {algo}"
        return _Mapped([(linear, why)], [(moe, why)], [], f"modelopt {algo}", kv_algo)
    return _Mapped([], [], [f"ModelOpt quant_algo {algo or '(none)'} (none of the manifest's paths: FP8, "
                            "FP8_PER_CHANNEL_PER_TOKEN, FP8_PB_WO and NVFP4 are)"], f"modelopt {algo or '?'}", kv_algo)


def _ct_group(name: str, group: Mapping[str, Any], fmt: str, where: str) -> Tuple[Optional[str], str]:
    """(the linear path of one compressed-tensors config group, or None with what it is)."""
    w, a = group.get("weights"), group.get("input_activations")
    if not isinstance(w, Mapping):
        raise ConfigError(f"{where}: compressed-tensors config group {name!r} has no weights object")
    a = a if isinstance(a, Mapping) else None
    fmt = str(group.get("format") or fmt or "")
    wtype, bits, strategy, gsize = w.get("type"), w.get("num_bits"), w.get("strategy"), w.get("group_size")
    shape = f"group {name}: weights {wtype} {bits}-bit {strategy}" + (f" group {gsize}" if gsize else "") + \
        (f", activations {a.get('type')} {a.get('num_bits')}-bit {a.get('strategy')}" if a else ", no activations") + \
        (f", format {fmt}" if fmt else "")
    if wtype == "float" and bits == 4 and strategy == "tensor_group" and gsize == 16:
        if a is None:
            return None, f"compressed-tensors NVFP4 weight-only (W4A16, {shape})"
        return "linear.nvfp4", f"compressed-tensors NVFP4 ({shape})"
    if wtype == "float" and bits == 4 and strategy == "group" and gsize == 32:
        return None, f"compressed-tensors MXFP4 ({shape})"
    if wtype == "float" and bits == 8 and strategy in ("tensor", "channel", "block"):
        if a is None or a.get("type") != "float" or a.get("num_bits") != 8:
            return None, f"compressed-tensors FP8 weight-only (W8A16, {shape})"
        if strategy == "block":
            return "linear.fp8-block", f"compressed-tensors FP8 block ({shape}, block {w.get('block_structure')})"
        return "linear.fp8", f"compressed-tensors FP8 ({shape})"
    if wtype == "int" and bits == 4 and strategy in ("group", "channel") and a is None and fmt == "pack-quantized":
        return "linear.w4a16", f"compressed-tensors int4 weight-only ({shape})"
    return None, f"compressed-tensors {shape}"


CT_LABELS = {"linear.fp8": "FP8", "linear.fp8-block": "FP8 block", "linear.nvfp4": "NVFP4",
             "linear.w4a16": "int4 weight-only"}
MOE_OF_LINEAR = {"linear.fp8": "moe.fp8", "linear.fp8-block": "moe.fp8-block", "linear.nvfp4": "moe.nvfp4"}


def _compressed_tensors(qc: Mapping[str, Any], key: str, where: str) -> _Mapped:
    groups = qc.get("config_groups")
    if not isinstance(groups, Mapping) or not groups:
        raise ConfigError(f"{where}: {key}.config_groups is {groups!r}, not a non-empty object",
                          hint="vLLM reads the same file at start-up: repair or re-download the model")
    out = _Mapped([], [], [], "")
    kinds = []
    for name, group in groups.items():
        if not isinstance(group, Mapping):
            raise ConfigError(f"{where}: {key}.config_groups.{name} is not an object")
        targets = group.get("targets")
        if isinstance(targets, list) and len(targets) == 1 and str(targets[0]).endswith("Attention"):
            continue  # vLLM skips it: attention quantization comes with the KV cache's (compressed_tensors.py)
        path, why = _ct_group(str(name), group, str(qc.get("format") or ""), where)
        if path is None:
            out.undescribed.append(why)
            kinds.append(why.split(" (", 1)[0])
            continue
        out.linear.append((path, why))
        kinds.append(path)
        if path in MOE_OF_LINEAR:
            out.moe.append((MOE_OF_LINEAR[path], why))
        else:
            out.moe.append(("", f"{why}: its MoE experts (int4 weight-only MoE) are not one of the manifest's paths"))
    fmt = f" ({qc.get('format')})" if qc.get("format") else ""
    out.summary = "compressed-tensors " + ", ".join(dict.fromkeys(CT_LABELS.get(k, k) for k in kinds)) + fmt
    return out


def _gptq_awq(method: str, qc: Mapping[str, Any]) -> _Mapped:
    bits = qc.get("bits") if "bits" in qc else qc.get("w_bit")
    group = qc.get("group_size") if "group_size" in qc else qc.get("q_group_size")
    why = f"quant_method {method}, bits {bits}, group_size {group}"
    if bits == 4:
        return _Mapped([("linear.w4a16", why)], [("", f"{why}: int4 weight-only MoE experts (Marlin / WNA16) are not "
                                                       "one of the manifest's paths")], [], f"{method} int4 (group {group})")
    return _Mapped([], [], [f"{why} (only 4-bit is a manifest path: linear.w4a16)"], f"{method} {bits}-bit")


def _mxfp4(method: str, model_type: str) -> _Mapped:
    why = f"quant_method {method} (model_type {model_type or 'not given'}): MXFP4 MoE experts; linear layers stay " \
          "unquantized (mxfp4.py)"
    return _Mapped([], [("moe.mxfp4", why)], [], f"{method} (MoE experts)")


def _quantized(qc: Optional[Dict[str, Any]], key: str, config: Mapping[str, Any], where: str) -> _Mapped:
    if qc is None:
        return _Mapped([], [("moe.bf16", "no quantization_config: unquantized experts")], [], "none")
    method = qc["quant_method"]
    if method == "fp8":
        return _fp8(qc, key, where)
    if method.startswith("modelopt"):
        return _modelopt(qc)
    if method == "compressed-tensors":
        return _compressed_tensors(qc, key, where)
    if method in ("mxfp4", "gpt_oss_mxfp4"):
        return _mxfp4(method, str(_text_config(config).get("model_type") or config.get("model_type") or ""))
    if method in GPTQ_AWQ:
        return _gptq_awq(method, qc)
    return _Mapped([], [], [f"quant_method {method or '(empty)'} in {key} (not one of the methods the manifest's paths "
                            "describe: fp8, modelopt FP8/NVFP4, compressed-tensors FP8/NVFP4/int4, mxfp4, gptq/awq "
                            "4-bit)"], method or "?")


def _overrides(args: Sequence[str]) -> Tuple[Override, ...]:
    out = []
    for kind, flag in BACKEND_FLAGS.items():
        value = serve_option(args, flag)
        if value and value.lower() != "auto":
            out.append(Override(kind, flag, value))
    return tuple(out)


def of_config(config: Mapping[str, Any], serve_args: Sequence[str], source: str,
              legacy: Optional[Mapping[str, Any]] = None) -> ModelPaths:
    """The paths a model with this config.json takes when served with `serve_args` (EXTRA_SERVE_ARGS)."""
    if not isinstance(config, Mapping):
        raise ConfigError(f"{source}: not a JSON object", hint="point MODEL_PATH at the model's own folder")
    qc, key = quant_config(config, legacy, source)
    notes: List[str] = []
    online = serve_option(serve_args, "--quantization", "-q")
    if online and qc is None:
        # vLLM quantizes an unquantized checkpoint at load time: `--quantization fp8` is linear.fp8's own case.
        qc, key = ({"quant_method": online.lower()}, "EXTRA_SERVE_ARGS --quantization")
    elif online:
        notes.append(f"EXTRA_SERVE_ARGS sets --quantization {online}: the checkpoint's {key} decides (vLLM refuses "
                     "a method that does not match it)")
    moe, mla = _experts(config), _mla(config)
    mapped = _quantized(qc, key, config, source)
    needs: List[Need] = []
    undescribed = list(mapped.undescribed)
    kv_arg = serve_option(serve_args, "--kv-cache-dtype")
    kv = (kv_arg or "auto").lower()
    if kv == "auto" and mapped.kv_from_config:
        kv, kv_text = mapped.kv_from_config, f"{mapped.kv_from_config} ({key}'s KV cache algorithm; --kv-cache-dtype auto)"
    else:
        kv_text = f"{kv} (--kv-cache-dtype {kv_arg})" if kv_arg else "the model's dtype (--kv-cache-dtype auto)"
        if kv == "auto" and isinstance((qc or {}).get("kv_cache_scheme"), Mapping) and \
                not qc["quant_method"].startswith("modelopt"):
            notes.append(f"{key}.kv_cache_scheme is used only with --kv-cache-dtype fp8: vLLM 0.33 resolves 'auto' "
                         "from a ModelOpt config alone")
    if kv in MODEL_DTYPE_KV:
        needs.append(Need("attention.mla", f"{mla} (DeepSeek-style MLA), KV cache in the model's dtype") if mla else
                     Need("attention.bf16", "attention without MLA, KV cache in the model's dtype"))
    elif kv in FP8_KV and not mla:
        needs.append(Need("attention.fp8-kv", f"KV cache {kv_text}"))
    elif kv in FP8_KV:
        undescribed.append(f"MLA attention ({mla}) over an FP8 KV cache, {kv_text}: attention.fp8-kv is the "
                           "non-MLA case, attention.mla the one over a KV cache in the model's dtype")
    else:
        undescribed.append(f"attention over a KV cache {kv_text}: not one of the manifest's paths")
    needs += [Need(p, w) for p, w in mapped.linear]
    if moe:
        for path, why in mapped.moe:
            if path:
                needs.append(Need(path, f"{moe}; {why}"))
            else:
                undescribed.append(why)
    elif any(p == "moe.mxfp4" for p, _ in mapped.moe):
        notes.append(f"{mapped.summary}: the config names no experts ({', '.join(EXPERT_KEYS)}), so nothing is MXFP4")
    unique = list({n.path: n for n in needs}.values())
    assert all(n.path in PATHS for n in unique), unique
    return ModelPaths(source, tuple(unique), tuple(dict.fromkeys(undescribed)), mapped.summary, moe, mla, kv_text,
                      _overrides(serve_args), tuple(notes))


def read(config_path: Path, serve_args: Sequence[str]) -> ModelPaths:
    """config.json (and, where config.json has no quantization config, a legacy hf_quant_config.json beside it),
    read bounded and strict through heads.read_config, mapped."""
    from qualify.deploy.heads import read_config

    config = read_config(config_path)
    legacy_path = config_path.with_name(LEGACY_MODELOPT_FILE)
    legacy = None
    if isinstance(config, Mapping) and config.get("quantization_config") is None and legacy_path.is_file():
        legacy = read_config(legacy_path)
        if not isinstance(legacy, Mapping):
            raise ConfigError(f"{legacy_path}: not a JSON object")
    source = str(config_path) + (f" and {legacy_path.name}" if legacy is not None else "")
    return of_config(config, serve_args, source, legacy)
