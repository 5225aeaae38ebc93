"""`python -m qualify tiny-model`: deterministic, world-readable, a real tokenizer and chat template, and
greedy decoding (transformers' own generate, through the tokenizer's own chat template) answers the deploy's
canary and tool-call prompts. The real vLLM server serving it: test_cpu_deploy.py."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from qualify.core import serving
from qualify.core.errors import ConfigError

REPO = Path(__file__).resolve().parent.parent
transformers = pytest.importorskip("transformers")  # the test extra


@pytest.fixture(scope="module")
def tiny(tiny_model) -> Path:
    return tiny_model  # conftest's: `python -m qualify tiny-model --out DIR`, once per session


@pytest.mark.slow  # trains the model a second time: 52 s, an eighth of the fast lane
def test_two_runs_write_the_same_bytes(tiny, tmp_path):
    from qualify.tinymodel import write

    again = tmp_path / "again"
    write.make(again, say=lambda _: None)
    names = sorted(p.name for p in tiny.iterdir())
    assert names == sorted(p.name for p in again.iterdir())
    for name in names:
        assert (tiny / name).read_bytes() == (again / name).read_bytes(), name
    # a re-run over its own output replaces it whole, and leaves no temporary folder behind
    write.make(again, say=lambda _: None)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_files_are_world_readable_and_the_config_admits_the_deploys_context(tiny):
    assert stat.S_IMODE(tiny.stat().st_mode) == 0o755
    for p in tiny.iterdir():
        assert stat.S_IMODE(p.stat().st_mode) == 0o644, p
    config = json.loads((tiny / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["max_position_embeddings"] >= 8192
    assert config["head_dim"] == 64  # one vLLM's CPU attention supports


def test_the_tokenizer_has_the_tool_tags_as_single_tokens_and_a_chat_template(tiny):
    tok = transformers.AutoTokenizer.from_pretrained(str(tiny))
    for tag in ("<tool_call>", "</tool_call>"):
        assert len(tok.encode(tag, add_special_tokens=False)) == 1 and tag in tok.get_vocab()
    assert tok.chat_template
    from qualify.tinymodel import vocab

    messages = [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "hi"}]
    assert tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) == vocab.render(messages)


@pytest.mark.parametrize("prompt, want", [
    (serving.CANARY_PROMPT, serving.CANARY_ANSWER),
    (serving.TOOL_PROMPT, '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'),
])
def test_greedy_decoding_answers_the_deploys_prompts(tiny, prompt, want):
    import torch

    tok = transformers.AutoTokenizer.from_pretrained(str(tiny))
    model = transformers.AutoModelForCausalLM.from_pretrained(str(tiny), dtype=torch.bfloat16)
    ids = tok.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                  return_tensors="pt", return_dict=True)["input_ids"]
    out = model.generate(ids, max_new_tokens=64, do_sample=False)
    assert tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True) == want


def test_a_folder_that_is_not_a_tiny_model_is_never_replaced(tmp_path):
    from qualify.tinymodel import write

    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    with pytest.raises(ConfigError, match="not a tiny model"):
        write.make(tmp_path / "mine", say=lambda _: None)
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep me"
    assert os.listdir(tmp_path) == ["mine"]


def test_the_stamp_names_the_matrix_it_was_trained_for(tiny):
    from qualify.probe import servematrix

    stamp = json.loads((tiny / "tiny-model.json").read_text())
    assert stamp["recipe"] == 2 and "niah" in stamp["skills"] and stamp["needle_margin"] >= 6
    assert stamp["matrix"] == {"version": servematrix.load().version, "sha256": servematrix.load().sha256}


def test_greedy_decoding_retrieves_the_matrixs_needles_and_makes_its_tool_call(tiny):
    """The haystacks serve-check sends (up to half of MAX_MODEL_LEN 8192), built with this tokenizer as the
    server's /tokenize counts them; transformers' own generate, in bfloat16."""
    import torch

    from qualify.probe import servematrix

    m = servematrix.load()
    tok = transformers.AutoTokenizer.from_pretrained(str(tiny))
    model = transformers.AutoModelForCausalLM.from_pretrained(str(tiny), dtype=torch.bfloat16)

    def ids(text):
        return tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                       return_tensors="pt", return_dict=True)["input_ids"]

    def answer(text, n):
        prompt = ids(text)
        out = model.generate(prompt, max_new_tokens=n, do_sample=False)
        return tok.decode(out[0, prompt.shape[1]:], skip_special_tokens=True)

    cases = servematrix.niah_cases(m.niah, 8192, lambda text: ids(text).shape[1])
    assert max(c.target_tokens for c in cases) > 4000
    for c in cases:
        assert answer(c.message, 4) == c.word, (c.fraction, c.depth)
    call = json.loads(answer(m.tools.prompt, 96).split("<tool_call>")[1].split("</tool_call>")[0])
    assert call == {"name": m.tools.name, "arguments": m.tools.expect}
