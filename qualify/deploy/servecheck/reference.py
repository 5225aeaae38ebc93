"""A BF16 reference computed on this host with transformers, in a child interpreter (accuracy.py runs it).

    python -m qualify.deploy.servecheck.reference < request.json > answer.json

Request: {"model": DIR, "prompts": [[token ids], ...], "tokens": N, "top": K}. Answer: per prompt the greedy
continuation's first N tokens (fewer where the model ends its turn) and, at each of those positions, the K
most likely next tokens with their log-probabilities, from the model loaded in bfloat16. torch and
transformers are imported here only, never into serve-check's own process.
"""

from __future__ import annotations

import json
import sys

from qualify.core.errors import ConfigError
from qualify.core.readlimit import strict_json

MAX_REQUEST_BYTES = 64 << 20  # prompts as token ids: a few kB


def main() -> int:
    import torch
    import transformers

    data = sys.stdin.buffer.read(MAX_REQUEST_BYTES + 1)
    if len(data) > MAX_REQUEST_BYTES:
        raise ConfigError(f"the reference request on stdin is more than {MAX_REQUEST_BYTES} bytes; refused")
    request = strict_json(data, "the reference request on stdin", ConfigError)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_pretrained(request["model"], dtype=torch.bfloat16)
    model.eval()
    eos = model.config.eos_token_id
    stops = set(eos if isinstance(eos, list) else [eos])
    out = []
    with torch.no_grad():
        for prompt in request["prompts"]:
            seq, tokens, top = list(prompt), [], []
            for _ in range(int(request["tokens"])):
                logits = model(torch.tensor([seq])).logits[0, -1].float()
                logprobs = torch.log_softmax(logits, dim=-1)
                values, ids = logprobs.topk(int(request["top"]))
                top.append([[int(i), float(v)] for i, v in zip(ids, values)])
                nxt = int(ids[0])
                tokens.append(nxt)
                seq.append(nxt)
                if nxt in stops:
                    break
            out.append({"tokens": tokens, "top": top})
    json.dump({"dtype": "bfloat16", "torch": torch.__version__, "transformers": transformers.__version__,
               "prompts": out}, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
