"""The one virtual environment the toolkit runs in: the repository's `.venv`.

`scripts/setup-host.sh` makes it; every host-side nox session runs there
(nox would make one venv per session: five build sessions, five qualify
sessions...); `python3 -m qualify ...` from the repository moves into it when
the interpreter it was started with lacks the toolkit's dependencies
(qualify/cli); `./start.sh` finds it. Reinstalled only when pyproject.toml
changes, which keeps a no-change rebuild fast. Standard library only: it runs
before the toolkit's dependencies exist.
"""

from __future__ import annotations

import hashlib
import subprocess
import venv
from pathlib import Path

from qualify.core.report import Reporter

REPORT = Reporter("toolkit")

REPO = Path(__file__).resolve().parent.parent
VENV = REPO / ".venv"

# setuptools' default editable install imports a path finder (pathlib,
# urllib, ...) at every interpreter start: 8 ms of a 0.35 s `qualify
# inspect`. "compat" puts the checkout on sys.path through a plain .pth
# instead (site: 1.9 ms instead of 9.8 ms).
EDITABLE_MODE = "compat"


def python() -> Path:
    return VENV / "bin" / "python"


def ensure(extras: str = "") -> Path:
    """Create or refresh the shared venv; returns its python."""
    spec = f".[{extras}]" if extras else "."
    stamp = VENV / ".installed"
    want = hashlib.sha256((REPO / "pyproject.toml").read_bytes() + spec.encode() + EDITABLE_MODE.encode()).hexdigest()
    if stamp.exists() and stamp.read_text() == want and python().exists():
        return python()
    if not python().exists():
        REPORT.say(f"creating {VENV}")
        venv.EnvBuilder(with_pip=True, clear=True).create(VENV)
    REPORT.say(f"installing {spec} into {VENV}")
    subprocess.run(
        [str(python()), "-m", "pip", "install", "-q", "-e", spec, "--config-settings", f"editable_mode={EDITABLE_MODE}"],
        cwd=REPO, check=True,
    )
    stamp.write_text(want)
    return python()
