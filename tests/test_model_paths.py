"""Issue 50, the deploy side, first half: a model's config.json mapped to the serving paths vLLM takes
(deploy/modelpaths.py), with vLLM 0.33's own readers as the reference (the module's docstring names them).

The config.json files are under tests/standin/hub/ (the stand-in hub's files, a TEST DOUBLE of the Hugging Face
Hub that the stand-in image also carries): trimmed copies of real checkpoints' configs, each named for the model it
is modelled on. tests/test_serving_paths.py judges these paths by a verified manifest.
"""

from __future__ import annotations

import json
import shutil

import pytest
from conftest import REPO

from qualify.core.errors import ConfigError
from qualify.core.servingpaths import PATHS
from qualify.deploy import modelpaths

HUB = REPO / "tests" / "standin" / "hub"
TINY = REPO / "qualify" / "tinymodel" / "model"
NVFP4_MOE = "nvidia/Qwen3-30B-A3B-NVFP4"  # ModelOpt NVFP4, MoE, FP8 KV cache scheme in config.json
NVFP4_MLA_LEGACY = "nvidia/DeepSeek-R1-FP4"  # ModelOpt NVFP4 in the legacy hf_quant_config.json, MLA, MoE
NVFP4_DENSE_CT = "RedHatAI/Qwen3-8B-NVFP4"  # compressed-tensors nvfp4-pack-quantized, dense
FP8_BLOCK = "deepseek-ai/DeepSeek-V3"  # fp8, weight_block_size [128, 128], MLA, MoE
FP8_TENSOR = "neuralmagic/Mixtral-8x7B-Instruct-v0.1-FP8"  # fp8 per-tensor (AutoFP8, static activations), MoE
MXFP4 = "openai/gpt-oss-20b"  # mxfp4 MoE experts
GPTQ = "Qwen/Qwen2.5-7B-Instruct-GPTQ-Int4"
BNB = "unsloth/Llama-3.2-3B-Instruct-bnb-4bit"


def mapped(model: str, *args: str) -> modelpaths.ModelPaths:
    return modelpaths.read(HUB / model / "config.json", args)


# --- the model's config -> its paths (vLLM 0.33's reading) ---------------------------------------------------------


@pytest.mark.parametrize("model, paths, quantization", [
    (NVFP4_MOE, ("attention.fp8-kv", "linear.nvfp4", "moe.nvfp4"), "modelopt NVFP4"),
    (NVFP4_MLA_LEGACY, ("attention.mla", "linear.nvfp4", "moe.nvfp4"), "modelopt NVFP4"),
    (NVFP4_DENSE_CT, ("attention.bf16", "linear.nvfp4"), "compressed-tensors NVFP4 (nvfp4-pack-quantized)"),
    (FP8_BLOCK, ("attention.mla", "linear.fp8-block", "moe.fp8-block"), "fp8 (weight_block_size [128, 128])"),
    (FP8_TENSOR, ("attention.bf16", "linear.fp8", "moe.fp8"), "fp8 (per-tensor, static activations)"),
    (MXFP4, ("attention.bf16", "moe.mxfp4"), "mxfp4 (MoE experts)"),
    (GPTQ, ("attention.bf16", "linear.w4a16"), "gptq int4 (group 128)"),
])
def test_a_checkpoints_config_maps_to_the_paths_vllm_takes(model, paths, quantization):
    m = mapped(model)
    assert m.paths == paths and m.quantization == quantization and m.undescribed == (), m
    assert all(p in PATHS for p in m.paths)


def test_the_tiny_model_is_dense_bf16_and_takes_attention_bf16_only():
    m = modelpaths.read(TINY / "config.json", ())
    assert (m.paths, m.moe, m.mla, m.quantization, m.undescribed) == (("attention.bf16",), "", "", "none", ())


def test_the_legacy_modelopt_file_is_read_only_where_config_json_names_no_quantization(tmp_path):
    m = mapped(NVFP4_MLA_LEGACY)
    assert m.source.endswith("config.json and hf_quant_config.json") and m.mla == "kv_lora_rank 512"
    assert m.moe == "n_routed_experts 256"
    folder = tmp_path / "m"
    shutil.copytree(HUB / NVFP4_MLA_LEGACY, folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "quantization_config": {"quant_method": "fp8"}}))
    assert modelpaths.read(folder / "config.json", ()).paths == ("attention.mla", "linear.fp8", "moe.fp8")


def test_the_serve_arguments_choose_the_kv_cache_and_an_online_quantization():
    assert mapped(NVFP4_DENSE_CT, "--kv-cache-dtype", "fp8").paths == ("attention.fp8-kv", "linear.nvfp4")
    assert mapped(NVFP4_MOE, "--kv-cache-dtype=bfloat16").paths == ("attention.bf16", "linear.nvfp4", "moe.nvfp4")
    online = modelpaths.read(TINY / "config.json", ("--quantization", "fp8"))
    assert online.paths == ("attention.bf16", "linear.fp8")
    # MLA over an FP8 KV cache is neither attention.mla nor attention.fp8-kv: said, never passed.
    mla = mapped(FP8_BLOCK, "--kv-cache-dtype", "fp8")
    assert mla.paths == ("linear.fp8-block", "moe.fp8-block")
    assert any("MLA attention (kv_lora_rank 512) over an FP8 KV cache" in u for u in mla.undescribed)
    assert mapped(FP8_BLOCK, "--moe-backend", "marlin").override("moe").value == "marlin"


@pytest.mark.parametrize("edit, undescribed", [
    (None, "quant_method bitsandbytes"),
    ({"quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized", "config_groups": {"g": {
        "targets": ["Linear"], "weights": {"num_bits": 4, "type": "float", "strategy": "tensor_group",
                                           "group_size": 16}, "input_activations": None}}},
     "compressed-tensors NVFP4 weight-only (W4A16"),
    ({"quant_method": "modelopt", "quant_algo": "MXFP8"}, "ModelOpt quant_algo MXFP8"),
    ({"quant_method": "gptq", "bits": 8, "group_size": 128}, "bits 8"),
])
def test_a_quantization_no_manifest_path_describes_is_listed_never_passed(tmp_path, edit, undescribed):
    config = json.loads((HUB / BNB / "config.json").read_text())
    if edit is not None:
        config["quantization_config"] = edit
    (tmp_path / "config.json").write_text(json.dumps(config))
    m = modelpaths.read(tmp_path / "config.json", ())
    assert m.paths == ("attention.bf16",) and any(undescribed in u for u in m.undescribed), m.undescribed


def test_a_wrapped_models_text_config_decides():
    """A multimodal model keeps the language model under text_config: its experts and quantization count."""
    inner = json.loads((HUB / NVFP4_MOE / "config.json").read_text())
    m = modelpaths.of_config({"model_type": "qwen3_vl_moe", "text_config": inner}, (), "wrapped/config.json")
    assert m.paths == ("attention.fp8-kv", "linear.nvfp4", "moe.nvfp4") and m.moe == "num_experts 128"


@pytest.mark.parametrize("edit, words", [
    ({"quantization_config": "fp8"}, "quantization_config is str, not an object"),
    ({"quantization_config": {"quant_method": "fp8", "weight_block_size": [128]}},
     "quantization_config.weight_block_size is [128], not two whole numbers"),
    ({"quantization_config": {"quant_method": "compressed-tensors", "config_groups": {}}},
     "quantization_config.config_groups is {}"),
])
def test_a_config_vllm_would_refuse_is_an_error_naming_the_file_and_key(edit, words):
    config = {**json.loads((TINY / "config.json").read_text()), **edit}
    with pytest.raises(ConfigError, match="bad/config.json: " + words.replace("[", r"\[").replace("]", r"\]")
                       .replace("{", r"\{").replace("}", r"\}")):
        modelpaths.of_config(config, (), "bad/config.json")
