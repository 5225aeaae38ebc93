"""`python -m qualify tiny-model`: the committed bytes on every CPU, world-readable, a real tokenizer and chat
template, and greedy decoding (transformers' own generate, through the tokenizer's own chat template) answers the deploy's
canary and tool-call prompts. The real vLLM server serving it: test_cpu_deploy.py."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from qualify.core import serving
from qualify.core.errors import ConfigError

REPO = Path(__file__).resolve().parent.parent
transformers = pytest.importorskip("transformers")  # the test extra


@pytest.fixture(scope="module")
def tiny(tiny_model) -> Path:
    return tiny_model  # conftest's: `python -m qualify tiny-model --out DIR`, once per session


def test_the_folder_is_the_committed_files_byte_for_byte_and_a_rerun_changes_nothing(tiny, tmp_path):
    """The acceptance of issue 48: the same bytes on every CPU, because nothing is trained on the user's."""
    from qualify.tinymodel import files, write

    want = files.committed()
    assert sorted(p.name for p in tiny.iterdir()) == sorted([*want.digests, files.STAMP])
    for name, digest in want.files:
        assert hashlib.sha256((tiny / name).read_bytes()).hexdigest() == digest, name
        assert (tiny / name).read_bytes() == (files.MODEL_DIR / name).read_bytes(), name
    lines = []
    again = write.make(tmp_path / "again", say=lines.append)
    assert again.changed and "each matching its recorded sha256" in lines[-1]
    lines.clear()
    assert not write.make(tmp_path / "again", say=lines.append).changed and "unchanged" in lines[-1]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_the_deploy_guide_and_sha256sums_record_the_weights_digest():
    from docpages import section

    from qualify.tinymodel import files

    digest = files.committed().digests["model.safetensors"]
    assert digest in section("docs/deploy.md", "## The cpu target")  # the README's until issue 52
    assert f"{digest}  qualify/tinymodel/model/model.safetensors" in (REPO / "SHA256SUMS").read_text()


def test_a_damaged_file_is_refused_naming_it_and_the_folder_stays_as_it_was(tmp_path):
    from qualify.tinymodel import files, write

    source = tmp_path / "source"
    shutil.copytree(files.MODEL_DIR, source)
    data = bytearray((source / "model.safetensors").read_bytes())
    data[4096] ^= 0xFF
    (source / "model.safetensors").write_bytes(bytes(data))
    out = tmp_path / "out"
    write.make(out, say=lambda _: None)
    (out / "config.json").unlink()  # an incomplete earlier tiny model, which a good run would replace
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    with pytest.raises(ConfigError, match=r"model\.safetensors: sha256 .* the stamp records"):
        write.make(out, say=lambda _: None, source=source)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "source"]


def test_a_killed_runs_temporary_folder_is_removed_and_said(tmp_path):
    from qualify.tinymodel import write

    (tmp_path / ".model.tiny-abc123").mkdir()
    lines = []
    write.make(tmp_path / "model", say=lines.append)
    assert "removed 1 unfinished folder" in lines[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]


def test_the_command_needs_no_torch(tmp_path):
    """The host's own python3 (Debian's, no venv, no torch): the command only copies and checks files."""
    python = "/usr/bin/python3"
    if not Path(python).exists():
        pytest.skip("no /usr/bin/python3")
    probe = subprocess.run([python, "-c", "import importlib.util as u; print(u.find_spec('torch') is None)"],
                           capture_output=True, text=True)
    assert probe.stdout.strip() == "True", "the interpreter meant to lack torch has it"
    done = subprocess.run([python, "-m", "qualify", "tiny-model", "--out", str(tmp_path / "m")], cwd=REPO,
                          capture_output=True, text=True, timeout=120, env={"PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stdout + done.stderr
    assert "serve it: MODEL_PATH=" in done.stdout and (tmp_path / "m" / "model.safetensors").is_file()


def test_the_committed_weights_answer_with_their_margin_on_this_cpu(tiny):
    """The committed model meets the trainer's own stopping rule here, whatever CPU made it: greedy decoding
    gives every fixed reply in float32 and bfloat16, and the matrix's haystacks by the margin."""
    import torch
    from tokenizers import Tokenizer

    from qualify.probe import servematrix
    from qualify.tinymodel import needle, tasks, train

    tok = Tokenizer.from_file(str(tiny / "tokenizer.json"))
    model = transformers.AutoModelForCausalLM.from_pretrained(str(tiny), dtype=torch.float32).eval()
    pairs = [train.encode(tok, e) for e in tasks.examples()]
    checks = needle.NeedleTask(servematrix.load().niah, train.MAX_POSITIONS).checks(tok)
    assert train.margin(model, pairs) >= train.MARGIN
    done, needles = train._learned(model, pairs, checks, tok.token_to_id("<|im_end|>"))
    assert done and needles >= train.MARGIN, needles


def test_a_recipe_that_does_not_converge_says_what_to_do(monkeypatch):
    """The trainer's failure is a QualifyError with a hint (the CLI prints it, never a traceback)."""
    from qualify.core.errors import QualifyError
    from qualify.tinymodel import tasks, train, vocab

    monkeypatch.setattr(train, "MAX_STEPS", 2)
    monkeypatch.setattr(train, "CHECK_EVERY", 1)
    examples = tasks.examples()[:1]
    with pytest.raises(QualifyError, match="did not learn its 1 examples in 2 steps") as caught:
        train.train(vocab.build(examples, [], []), examples)
    assert "committed model" in caught.value.hint


def test_differences_name_each_file():
    from qualify.tinymodel.files import differences

    assert differences({"a": "1", "b": "2", "c": "3"}, {"a": "1", "b": "9", "d": "4"}) == {
        "b": "differs", "c": "extra", "d": "missing"}


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
