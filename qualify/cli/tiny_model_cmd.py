"""`python -m qualify tiny-model --out DIR`: a small Llama that answers the deploy's checks (qualify/tinymodel).

It writes the committed files (the same bytes on every machine: tinymodel/files.py says why) and checks each
against its recorded sha256; nothing is trained or downloaded. `nox -s tiny-model-remake` makes them again.
"""

from __future__ import annotations

from pathlib import Path


def configure_parser(parser) -> None:
    parser.add_argument("--out", type=Path, required=True,
                        help="the model folder to write (new, empty, or an earlier tiny model, which is replaced)")


def execute(args) -> int:
    from qualify.tinymodel import write

    done = write.make(args.out, say=lambda line: print(line, flush=True))
    weights = done.stamp.digests.get("model.safetensors", "")
    print(f"model.safetensors sha256 {weights}")
    print(f"serve it: MODEL_PATH={done.folder} in .env, then ./start.sh")
    return 0
