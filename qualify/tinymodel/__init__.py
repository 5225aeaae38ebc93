"""`python -m qualify tiny-model`: a small Llama the toolkit made itself, for serving a real vLLM offline.

It answers the deploy's own requests (core/serving.py) under greedy decoding, so `./start.sh` on the `cpu`
target can run every check against a real server with no hub download. The parts, one job each:

  tasks     what the model must answer: `Example`s (chat messages and the reply); a new skill (issue 39's
            needle-in-a-haystack retrieval) is a new generator of examples here, nothing else changes
  vocab     the tokenizer (byte-level BPE built with `tokenizers`) and the chat template
  train     the Llama config and the deterministic training loop, with the check that greedy decoding
            gives every example's reply in float32 and in bfloat16 (vLLM's CPU default)
  files     the committed model (model/) and its stamp of sha256 digests: users get these bytes, on every CPU
  write     the model folder, copied from them and checked, written whole or not at all, world-readable
  remake    training them again (`nox -s tiny-model-remake`), with torch's arithmetic pinned

`files` and `write` need only the standard library; tasks, vocab, train and remake need torch, transformers
and tokenizers (the `test` extra).
"""
