"""The model folder: written into a temporary folder beside DIR, checked, then renamed into place.

A run killed midway leaves DIR as it was (and a `.DIR.tiny-*` folder the next run removes). A folder
that is not a tiny model (no `tiny-model.json`) is never replaced. Every file is world-readable: the
server runs as uid 1000 and mounts the folder read-only.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Callable, Dict, Optional

from qualify.core.errors import ConfigError
from qualify.core.fsutil import canonical_json, sha256_file

STAMP = "tiny-model.json"
RECIPE = 2  # raise when the examples, tokenizer, shape or training change (2: the serving matrix, issue 39)


def _stale_temps(out: Path) -> None:
    for old in out.parent.glob(f".{out.name}.tiny-*"):
        shutil.rmtree(old, ignore_errors=True)


def _world_readable(root: Path) -> None:
    os.chmod(root, 0o755)
    for path in root.rglob("*"):
        os.chmod(path, 0o755 if path.is_dir() else 0o644)


def _check_replaceable(out: Path) -> None:
    if out.is_symlink() or (out.exists() and not out.is_dir()):
        raise ConfigError(f"{out}: exists and is not a folder; not replaced", hint="choose another --out")
    if out.is_dir() and any(out.iterdir()) and not (out / STAMP).is_file():
        raise ConfigError(f"{out}: a folder that is not a tiny model (no {STAMP}); not replaced",
                          hint="choose an empty or new folder for --out")


def make(out: Path, say: Callable[[str], None] = print) -> Dict[str, object]:
    """Write the tiny model to `out`; its stamp (what `tiny-model.json` holds)."""
    from transformers import PreTrainedTokenizerFast

    from qualify.probe import servematrix
    from qualify.tinymodel import needle, tasks, train, vocab

    out = out.absolute()
    _check_replaceable(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    _stale_temps(out)
    started = time.monotonic()
    matrix = servematrix.load()
    examples = tasks.examples()
    needles = needle.NeedleTask(matrix.niah, train.MAX_POSITIONS)
    tok = vocab.build(examples, needles.corpus(), needles.words)
    say(f"tokenizer: byte-level BPE, {tok.get_vocab_size()} tokens; training on {len(examples)} examples and "
        f"haystacks of up to {needle.TRAIN_TOKENS} tokens (checked at up to {needles.longest()})")
    trained = train.train(tok, examples, progress=lambda line: say(f"  {line}"), needles=needles)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tiny-", dir=str(out.parent)))
    try:
        trained.model.save_pretrained(str(tmp), safe_serialization=True)
        fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=vocab.BOS, eos_token=vocab.EOS,
                                       pad_token=vocab.PAD, chat_template=vocab.CHAT_TEMPLATE,
                                       model_max_length=train.MAX_POSITIONS, clean_up_tokenization_spaces=False)
        fast.save_pretrained(str(tmp))
        files = {p.name: sha256_file(p) for p in sorted(tmp.iterdir()) if p.is_file()}
        stamp = {"recipe": RECIPE, "examples": [e.name for e in examples], "skills": [*tasks.SKILLS, "niah"],
                 "matrix": {"version": matrix.version, "sha256": matrix.sha256}, "steps": trained.steps,
                 "smallest_margin": round(trained.margin, 3),
                 "needle_margin": round(trained.needle_margin or 0.0, 3), "files": files}
        (tmp / STAMP).write_bytes(canonical_json(stamp))
        _world_readable(tmp)
        _swap_in(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    say(f"wrote {out}: {trained.steps} training steps in {trained.seconds:.1f} s, smallest margin "
        f"{trained.margin:.2f}; {time.monotonic() - started:.1f} s in all")
    return stamp


def _swap_in(tmp: Path, out: Path) -> None:
    """Rename the finished folder into place; an older tiny model there goes only after the new one is in."""
    if not out.exists():
        os.rename(tmp, out)
        return
    old = out.with_name(f".{out.name}.tiny-old-{os.getpid()}")
    os.rename(out, old)
    os.rename(tmp, out)
    shutil.rmtree(old, ignore_errors=True)


def read_stamp(folder: Path) -> Optional[Dict[str, object]]:
    path = folder / STAMP
    if not path.is_file() or path.stat().st_size > 1 << 16:
        return None
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None
