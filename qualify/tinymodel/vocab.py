"""The tiny model's tokenizer and chat template.

Byte-level BPE (`tokenizers`), so any text encodes; merges learned from the examples' own text, so the
model's sequences stay short. `<tool_call>` and `</tool_call>` are single tokens, and not special ones:
vLLM's tool parsers look them up in the vocabulary, and decoded text keeps them.
"""

from __future__ import annotations

from typing import Iterable, List, Sequence

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

from qualify.tinymodel.tasks import TOOL_CALL_END, TOOL_CALL_START, Example

BOS, EOS, PAD, TURN = "<|begin_of_text|>", "<|im_end|>", "<|pad|>", "<|im_start|>"
SPECIAL = (BOS, EOS, PAD, TURN)
VOCAB_SIZE = 512

# ChatML turns. Tools offered in a request are not rendered (tasks.py says why); content that is not text
# (a tool turn's None) renders empty.
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{ '<|im_start|>' + message['role'] + '\\n' }}"
    "{%- if message['content'] is string -%}{{ message['content'] }}{%- endif -%}"
    "{{ '<|im_end|>' + '\\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n' }}{%- endif -%}"
)


def render(messages: Iterable[dict], add_generation_prompt: bool = True) -> str:
    """The template above, in Python: what the training sees (tests check it against transformers')."""
    text = "".join(f"{TURN}{m['role']}\n{m['content'] if isinstance(m['content'], str) else ''}{EOS}\n"
                   for m in messages)
    return text + (f"{TURN}assistant\n" if add_generation_prompt else "")


def corpus(examples: List[Example]) -> List[str]:
    """The examples' text without the special and tool tokens, which are whole tokens of their own."""
    out = []
    for e in examples:
        text = render(e.chat()) + e.reply
        for token in (*SPECIAL, TOOL_CALL_START, TOOL_CALL_END):
            text = text.replace(token, "\n")
        out.append(text)
    return out


def build(examples: List[Example], extra_text: Sequence[str] = (), words: Sequence[str] = ()) -> Tokenizer:
    """Deterministic: the same examples give the same vocabulary and merges. `extra_text` joins the corpus
    the merges are learned from; each of `words` (the needle's) becomes one token of its own."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=list(SPECIAL))
    tok.train_from_iterator(corpus(examples) + list(extra_text), trainer=trainer)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL])
    tok.add_tokens([AddedToken(t, special=False, normalized=False)
                    for t in (TOOL_CALL_START, TOOL_CALL_END, *words)])
    return tok
