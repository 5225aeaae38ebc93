"""`nox -s tiny-model-remake`: train the tiny model again and say whether it is the committed one.

    python -m qualify.devtools.tiny_model_remake [--write]

Trains with tinymodel/remake.py's pins (set here, before torch is imported), then prints each file's sha256
beside the committed one. Exit 0 when every file is the same; 1 when any differs (the table says which, and
which CPU and versions made each), unless `--write`, which makes the new files the committed ones (then
`nox -s sums` and the digest in docs/deploy.md follow: the pre-commit hook does the first, tests/test_tiny_model.py
checks the second). Float32 training differs across CPUs (tinymodel/files.py): a difference on another host
is expected; a difference on the host that made the committed files is a change of recipe.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import List, Optional

from qualify.core.errors import QualifyError
from qualify.core.report import emit
from qualify.host import tables
from qualify.tinymodel import files, remake, write


def _pin() -> None:
    if "torch" in sys.modules:
        raise QualifyError("torch was imported before the remake could pin its arithmetic",
                           hint="run `python -m qualify.devtools.tiny_model_remake` in a fresh interpreter")
    os.environ.update(remake.PINS)


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="nox -s tiny-model-remake --", description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="make the new files the committed ones")
    args = parser.parse_args(argv)
    try:
        _pin()
        first = not (files.MODEL_DIR / files.STAMP).exists()  # the very first remake has nothing to compare with
        want = files.Stamp((), b"{}") if first else files.committed()
        with tempfile.TemporaryDirectory(prefix="tiny-remake-") as tmp:
            made_dir = Path(tmp) / "model"
            made_dir.mkdir()
            stamp = remake.train_into(made_dir, say=lambda line: print(line, flush=True))
            made = files.read_stamp(made_dir)
            diff = files.differences(made.digests, want.digests)
            rows = [[name, want.digests.get(name, "-")[:16], made.digests.get(name, "-")[:16],
                     diff.get(name, "same")] for name in sorted(set(made.digests) | set(want.digests))]
            print(tables.table(rows, ["file", "committed", "made now", ""]))
            old = json.loads(want.raw).get("made_with", {})
            print(f"committed files made with {old or 'unrecorded versions'}; now {stamp['made_with']}")
            if args.write:
                write.make(files.MODEL_DIR, say=print, source=made_dir)
                print(f"wrote the new files into {files.MODEL_DIR}: commit them (the hook updates SHA256SUMS) and "
                      f"put model.safetensors' sha256 {made.digests['model.safetensors']} in docs/deploy.md")
                return 0
            if diff:
                print(f"{len(diff)} file(s) differ from the committed ones (expected on another CPU than the one "
                      "that made them; on that one, the recipe changed): --write replaces them")
                return 1
            print("the remake is byte for byte the committed tiny model")
            return 0
    except QualifyError as exc:
        emit(f"error: {exc}")
        return exc.exit_code


if __name__ == "__main__":
    sys.exit(main())
