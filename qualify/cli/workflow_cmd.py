"""`python -m qualify workflow [--check]`: .github/workflows/release.yml from images/targets.toml."""

from __future__ import annotations

from qualify.config import targets
from qualify.core.errors import ConfigError
from qualify.core.fsutil import write_atomic
from qualify.core.report import Reporter
from qualify.scaleout import workflow

REPORT = Reporter("workflow")


def configure_parser(parser) -> None:
    parser.add_argument("--file", default=None, help="targets file (default images/targets.toml)")
    parser.add_argument("--check", action="store_true", help="exit 2 when a committed file is not the generated one")


def execute(args) -> int:
    tf = targets.load(args.file)
    for path, text in workflow.files(tf).items():
        if args.check:
            have = path.read_text(encoding="utf-8") if path.exists() else ""
            if have != text:
                raise ConfigError(f"{path} is not what {tf.path} gives now",
                                  hint="run `nox -s workflow` (python -m qualify workflow) and commit the result")
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, text)
        REPORT.say(f"wrote {path}")
    return 0
