"""Make the tiny model again: train it (train.py) and write its folder with the stamp.

Only `nox -s tiny-model-remake` (devtools/tiny_model_remake.py) runs this; users get the committed files
(write.py). The remake pins what it can of torch's arithmetic (PINS, set before torch is imported) so that
another machine has the best chance of the same bytes, and the stamp records the versions and the CPU that
made them: where the bytes still differ, the session says so and which of those differ.
"""

from __future__ import annotations

import platform
import time
from pathlib import Path
from typing import Callable, Dict

from qualify.core.fsutil import canonical_json, sha256_file
from qualify.tinymodel.files import STAMP

RECIPE = 2  # raise when the examples, tokenizer, shape or training change (2: the serving matrix, issue 39)
# torch's own kernels, MKL's and oneDNN's, each held to AVX2 code paths (every x86 host of ours has AVX2):
# without these, an AVX-512 host and an AVX2 host train different models from one seed.
PINS = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2,STRICT", "ONEDNN_MAX_CPU_ISA": "AVX2"}


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def train_into(folder: Path, say: Callable[[str], None]) -> Dict[str, object]:
    """Train and write the model's files into `folder` (new, empty); the stamp written there too."""
    import tokenizers
    import torch
    import transformers
    from transformers import PreTrainedTokenizerFast

    from qualify.probe import servematrix
    from qualify.tinymodel import needle, tasks, train, vocab

    started = time.monotonic()
    matrix = servematrix.load()
    examples = tasks.examples()
    needles = needle.NeedleTask(matrix.niah, train.MAX_POSITIONS)
    tok = vocab.build(examples, needles.corpus(), needles.words)
    say(f"tokenizer: byte-level BPE, {tok.get_vocab_size()} tokens; training on {len(examples)} examples and "
        f"haystacks of up to {needle.TRAIN_TOKENS} tokens (checked at up to {needles.longest()})")
    trained = train.train(tok, examples, progress=lambda line: say(f"  {line}"), needles=needles)
    trained.model.save_pretrained(str(folder), safe_serialization=True)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=vocab.BOS, eos_token=vocab.EOS,
                                   pad_token=vocab.PAD, chat_template=vocab.CHAT_TEMPLATE,
                                   model_max_length=train.MAX_POSITIONS, clean_up_tokenization_spaces=False)
    fast.save_pretrained(str(folder))
    made = {p.name: sha256_file(p) for p in sorted(folder.iterdir()) if p.is_file() and p.name != STAMP}
    stamp = {"recipe": RECIPE, "examples": [e.name for e in examples], "skills": [*tasks.SKILLS, "niah"],
             "matrix": {"version": matrix.version, "sha256": matrix.sha256}, "steps": trained.steps,
             "smallest_margin": round(trained.margin, 3),
             "needle_margin": round(trained.needle_margin or 0.0, 3), "files": made,
             "made_with": {"torch": torch.__version__, "transformers": transformers.__version__,
                           "tokenizers": tokenizers.__version__, "cpu": _cpu_model(),
                           "cpu_capability": torch.backends.cpu.get_cpu_capability(), "pins": dict(PINS)}}
    (folder / STAMP).write_bytes(canonical_json(stamp))
    say(f"trained: {trained.steps} steps in {trained.seconds:.1f} s, smallest margin {trained.margin:.2f}, "
        f"needles {trained.needle_margin or 0:.2f}; {time.monotonic() - started:.1f} s in all")
    return stamp
