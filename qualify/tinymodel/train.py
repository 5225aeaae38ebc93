"""The tiny Llama: its config, the training loop, and the check that greedy decoding gives every reply.

Deterministic: one seed, one thread (a thread count changes the order of float sums), a fixed schedule,
and a stopping rule that depends only on the model's own outputs. It trains until greedy decoding gives
every example's reply in float32 and in bfloat16 (vLLM's CPU backend computes in bfloat16 unless told
float32) and the reply's tokens win by a margin, so a server's slightly different arithmetic cannot flip
them. With a needle task (needle.py) each step also trains on freshly drawn haystacks, and the stopping
rule also needs the matrix's own haystacks answered with that margin, in both precisions.
"""

from __future__ import annotations

import copy
import random
import time
from dataclasses import dataclass
from typing import Any, Callable, List, Optional, Sequence, Tuple

import torch
from tokenizers import Tokenizer
from transformers import LlamaConfig, LlamaForCausalLM

from qualify.core.errors import QualifyError
from qualify.tinymodel import vocab
from qualify.tinymodel.tasks import Example

SEED = 0
MAX_POSITIONS = 8192  # the deploy's default MAX_MODEL_LEN must fit
MARGIN = 6.0  # logits: the reply's token over the runner-up, at every position
MAX_STEPS = 1500  # about 2 minutes on 2 cores; a recipe that needs more is a recipe to change
CHECK_EVERY = 50
LEARNING_RATE = 3e-3
CLIP_NORM = 1.0


@dataclass(frozen=True)
class Shape:
    """Sizes: head_dim 64 is one vLLM's CPU attention supports."""

    hidden: int = 128
    intermediate: int = 256
    layers: int = 2
    heads: int = 2
    head_dim: int = 64


@dataclass(frozen=True)
class Trained:
    model: LlamaForCausalLM
    steps: int
    seconds: float
    margin: float  # the smallest winning margin over every reply token
    needle_margin: Optional[float] = None  # the same over the matrix's haystacks (bfloat16 and float32)


def config(tok: Tokenizer, shape: Shape = Shape()) -> LlamaConfig:
    ids = {t: tok.token_to_id(t) for t in vocab.SPECIAL}
    return LlamaConfig(
        vocab_size=tok.get_vocab_size(), hidden_size=shape.hidden, intermediate_size=shape.intermediate,
        num_hidden_layers=shape.layers, num_attention_heads=shape.heads, num_key_value_heads=shape.heads,
        head_dim=shape.head_dim, max_position_embeddings=MAX_POSITIONS, rope_theta=10000.0, rms_norm_eps=1e-5,
        tie_word_embeddings=False, bos_token_id=ids[vocab.BOS], eos_token_id=ids[vocab.EOS],
        pad_token_id=ids[vocab.PAD], torch_dtype="float32")


def encode(tok: Tokenizer, example: Example) -> Tuple[List[int], List[int]]:
    """(prompt ids, reply ids ending in end-of-turn): the prompt as a server tokenizes the rendered chat."""
    prompt = tok.encode(vocab.render(example.chat()), add_special_tokens=False).ids
    reply = tok.encode(example.reply, add_special_tokens=False).ids + [tok.token_to_id(vocab.EOS)]
    return prompt, reply


def batch(pairs: Sequence[Tuple[List[int], List[int]]], pad: int) -> Tuple[torch.Tensor, ...]:
    width = max(len(p) + len(r) for p, r in pairs)
    ids = torch.full((len(pairs), width), pad, dtype=torch.long)
    labels = torch.full((len(pairs), width), -100, dtype=torch.long)
    mask = torch.zeros((len(pairs), width), dtype=torch.long)
    for row, (p, r) in enumerate(pairs):
        seq = p + r
        ids[row, :len(seq)] = torch.tensor(seq)
        labels[row, len(p):len(seq)] = torch.tensor(r)
        mask[row, :len(seq)] = 1
    return ids, labels, mask


@torch.no_grad()
def margin(model: LlamaForCausalLM, pairs: Sequence[Tuple[List[int], List[int]]]) -> float:
    """The smallest (reply token's logit - best other logit) over every reply position, teacher-forced."""
    worst = float("inf")
    for p, r in pairs:
        logits = model(torch.tensor([p + r])).logits[0, len(p) - 1:len(p) + len(r) - 1].float()
        want = torch.tensor(r)
        right = logits[torch.arange(len(r)), want]
        others = logits.clone()
        others[torch.arange(len(r)), want] = float("-inf")
        worst = min(worst, float((right - others.max(dim=1).values).min()))
    return worst


@torch.no_grad()
def greedy(model: LlamaForCausalLM, prompt: List[int], eos: int, limit: int) -> List[int]:
    seq = list(prompt)
    for _ in range(limit):
        nxt = int(model(torch.tensor([seq])).logits[0, -1].argmax())
        seq.append(nxt)
        if nxt == eos:
            break
    return seq[len(prompt):]


def decodes_right(model: LlamaForCausalLM, pairs: Sequence[Tuple[List[int], List[int]]], eos: int) -> bool:
    return all(greedy(model, p, eos, len(r) + 2) == r for p, r in pairs)


def train(tok: Tokenizer, examples: List[Example], shape: Shape = Shape(),
          progress: Optional[Callable[[str], None]] = None, needles: Any = None) -> Trained:
    """`needles`: a needle.NeedleTask, or None for the fixed examples alone."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _train(tok, examples, shape, progress or (lambda _: None), needles)
    finally:
        torch.set_num_threads(threads)


def _learned(model: LlamaForCausalLM, pairs, checks, eos: int) -> Tuple[bool, Optional[float]]:
    """Every fixed reply decoded greedily in float32 and bfloat16; and the smallest margin over the needle
    checks in both (None without them; teacher-forced margins above 0 are what greedy decoding gives)."""
    half = copy.deepcopy(model).to(torch.bfloat16)
    if not (decodes_right(model, pairs, eos) and decodes_right(half, pairs, eos)):
        return False, None
    if not checks:
        return True, None
    worst = min(margin(model, checks), margin(half, checks))
    return worst >= MARGIN, worst


def _train(tok: Tokenizer, examples: List[Example], shape: Shape, say: Callable[[str], None], needles) -> Trained:
    torch.manual_seed(SEED)
    rng = random.Random(SEED)
    cfg = config(tok, shape)
    model = LlamaForCausalLM(cfg)
    pairs = [encode(tok, e) for e in examples]
    checks = needles.checks(tok) if needles is not None else []
    ids, labels, mask = batch(pairs, cfg.pad_token_id)
    opt = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE, weight_decay=0.0)
    start = time.monotonic()
    reach = needles.start if needles is not None else 0
    for step in range(1, MAX_STEPS + 1):
        model.train()
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        if needles is not None:
            h_ids, h_labels, h_mask, h_pos = needles.batch(tok, rng, reach, cfg.pad_token_id)
            found = model(input_ids=h_ids, attention_mask=h_mask, labels=h_labels, position_ids=h_pos).loss
            reach = needles.grow(reach, found.item())
            loss = loss + found
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP_NORM)  # one bad haystack batch cannot undo it all
        opt.step()
        if step % CHECK_EVERY:
            continue
        model.eval()
        worst = margin(model, pairs)
        line = f"step {step}: loss {loss.item():.4f}, smallest margin {worst:.2f} (wanted {MARGIN:g})" + (
            f", haystacks up to {int(reach)} tokens" if needles is not None else "")
        done, needle_worst = _learned(model, pairs, checks, cfg.eos_token_id) if worst >= MARGIN else (False, None)
        say(line + (f", needles {needle_worst:.2f}" if needle_worst is not None else ""))
        if done:
            return Trained(model, step, time.monotonic() - start, worst, needle_worst)
    raise QualifyError(f"the tiny model did not learn its {len(examples)} examples"
                       + (f" and {len(checks)} haystacks" if checks else "") + f" in {MAX_STEPS} steps on this CPU",
                       hint="training is reproducible per CPU, not across CPUs: `python -m qualify tiny-model` "
                            "writes the committed model and needs no training; to change the recipe, remake it "
                            "on a host where it converges (nox -s tiny-model-remake -- --write)")
