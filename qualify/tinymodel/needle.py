"""The serving matrix's needle retrieval (serve.niah) as a skill of the tiny model.

A word hidden among hay sentences, and the question after them: the reply is the word. The words are single
tokens of the vocabulary (vocab.build adds them), so retrieval is one attention lookup from the question to
the word, which a two-layer model learns in a few hundred steps, if it is shown long distances:

- a curriculum: the haystacks start at a few sentences and grow towards TRAIN_TOKENS by GROWTH at each
  step whose haystacks were answered (loss below GROW_BELOW): a long haystack first gives attention nothing
  to learn from, and growing on a schedule outran the model;
- distances beyond what is affordable to train on: half of each batch's haystacks get a jump in their
  position ids at a random sentence, so the needle sits up to the longest checked context away from the
  question (rotary embeddings see only relative positions) while the sequence stays TRAIN_TOKENS short.

The stopping rule (train.py) checks the matrix's own haystacks, built by servematrix.niah_cases with this
tokenizer at the deploy's MAX_MODEL_LEN, exactly as `serve-check` builds them with the server's.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import List, Sequence, Tuple

import torch
from tokenizers import Tokenizer

from qualify.probe import servematrix
from qualify.tinymodel import vocab
from qualify.tinymodel.tasks import Example

TRAIN_TOKENS = 1024  # the longest haystack trained on
START_TOKENS = 32  # the curriculum's first longest haystack
GROWTH, GROW_BELOW = 1.1, 0.3
JUMP_SHARE = 0.5  # of the haystacks in a batch get a jump in their position ids
Pairs = List[Tuple[List[int], List[int]]]


@dataclass(frozen=True)
class NeedleTask:
    niah: servematrix.Niah
    max_model_len: int  # the deploy's MAX_MODEL_LEN the matrix's haystacks are built for

    @property
    def words(self) -> Tuple[str, ...]:
        return self.niah.words

    def example(self, rng: random.Random, sentences: int) -> Example:
        word = rng.choice(self.niah.words)
        text = servematrix.haystack(self.niah, sentences, rng.random(), word, rng)
        return Example("niah", (("user", text),), word)

    def corpus(self) -> List[str]:
        """Text for the tokenizer's merges: a few haystacks with every word."""
        rng = random.Random(0)
        return [servematrix.haystack(self.niah, 24, rng.random(), w, rng) for w in self.niah.words]

    def checks(self, tok: Tokenizer) -> Pairs:
        """The matrix's own haystacks (prompt ids, reply ids), as serve-check sends them."""
        from qualify.tinymodel import train

        def count(message: str) -> int:
            return len(tok.encode(vocab.render([{"role": "user", "content": message}]), add_special_tokens=False).ids)

        cases = servematrix.niah_cases(self.niah, self.max_model_len, count)
        return [train.encode(tok, Example("niah-check", (("user", c.message),), c.word)) for c in cases]

    def longest(self) -> int:
        return int(max(self.niah.context_fractions) * self.max_model_len)

    start = float(START_TOKENS)

    @staticmethod
    def grow(reach: float, loss: float) -> float:
        """The curriculum's next longest haystack, after a step whose haystack loss was `loss`."""
        return min(float(TRAIN_TOKENS), reach * GROWTH) if loss < GROW_BELOW else reach

    def batch(self, tok: Tokenizer, rng: random.Random, reach: float, pad: int) -> Tuple[torch.Tensor, ...]:
        """(ids, labels, attention mask, position ids) of haystacks of up to `reach` tokens."""
        from qualify.tinymodel import train

        per_sentence = 8.0  # tokens, about: the hay's sentences are short
        tokens = 2 ** rng.uniform(math.log2(24), math.log2(max(reach, 25)))
        sentences = max(1, int(tokens / per_sentence))
        pairs = [train.encode(tok, self.example(rng, sentences)) for _ in range(8 if tokens < 256 else 4)]
        ids, labels, mask = train.batch(pairs, pad)
        return ids, labels, mask, self.positions(pairs, ids.shape[1], rng)

    def positions(self, pairs: Sequence[Tuple[List[int], List[int]]], width: int, rng: random.Random) -> torch.Tensor:
        pos = torch.arange(width).repeat(len(pairs), 1)
        reach = int(self.longest() * 1.15)
        for row, (prompt, _) in enumerate(pairs):
            if rng.random() < JUMP_SHARE and len(prompt) > 8:
                pos[row, rng.randrange(len(prompt) - 8):] += rng.randrange(0, max(1, reach - width))
        return pos
