"""`python -m qualify tiny-model --out DIR`: a small Llama that answers the deploy's checks (qualify/tinymodel)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from qualify.core.errors import ConfigError

NEEDS = ("torch", "transformers", "tokenizers")


def configure_parser(parser) -> None:
    parser.add_argument("--out", type=Path, required=True,
                        help="the model folder to write (new, empty, or an earlier tiny model, which is replaced)")


def execute(args) -> int:
    missing = [name for name in NEEDS if importlib.util.find_spec(name) is None]
    if missing:
        raise ConfigError(f"tiny-model needs {', '.join(missing)}, which this Python ({sys.executable}) lacks",
                          hint="pip install -e '.[test]' (torch 2.13.0, transformers and tokenizers)")
    from qualify.tinymodel import write

    write.make(args.out, say=lambda line: print(line, flush=True))
    print(f"serve it: MODEL_PATH={args.out.absolute()} in .env, then ./start.sh")
    return 0
