"""Messages of start.sh and scripts/*.sh, and the exit codes users rely on.

Messages go to stderr as `[prog] ...`; what a command produces (the compose
file of --dry-run, status) goes to stdout. A Stop carries what is wrong, how
to fix it and the exit code; the command prints it once and exits.
"""

from __future__ import annotations

from typing import Sequence

from qualify.core.errors import EXIT_CODES, QualifyError, printable, shell_code
from qualify.core.report import emit

# The codes users rely on, from the one table in qualify/core/errors.py.
EX_USAGE, EX_PREFLIGHT, EX_TRUST, EX_DEPLOY, EX_CHECK, EX_HOST, EX_INCOMPLETE, EX_INTERRUPTED = (
    shell_code(n) for n in ("EX_USAGE", "EX_PREFLIGHT", "EX_TRUST", "EX_DEPLOY", "EX_CHECK", "EX_HOST",
                            "EX_INCOMPLETE", "EX_INTERRUPTED"))
RULE = "#" * 80


_SHELL_CODES = frozenset(e.code for e in EXIT_CODES if e.start_sh)


class Stop(QualifyError):
    """A refusal of start.sh or scripts/*.sh: what is wrong, each fix on its own line, and the exit code,
    one of the table's start.sh column (core/errors.py)."""

    def __init__(self, code: int, what: str, *fixes: str) -> None:
        if code not in _SHELL_CODES:
            raise ValueError(f"exit code {code} is not one start.sh documents ({sorted(_SHELL_CODES)})")
        super().__init__(what, hint="; ".join(fixes))
        self.exit_code = self.code = code
        self.what, self.fixes = what, fixes

    @classmethod
    def because(cls, code: int, what: str, exc: QualifyError, *fixes: str) -> Stop:
        """`what: <the error's message>`, the error's own hint first among the fixes."""
        return cls(code, f"{what}: {exc.message}" if what else exc.message, *([exc.hint] if exc.hint else []), *fixes)


class Ui:
    def __init__(self, prog: str) -> None:
        self.prog = prog

    # Every line goes through printable(): names from settings, folders and images reach these messages,
    # and a newline or an escape code in one must not forge a line or reach the terminal as a command.
    def say(self, text: str) -> None:
        emit(f"[{self.prog}] {printable(text)}")

    def warn(self, text: str) -> None:
        emit(f"[{self.prog}] WARNING: {printable(text)}")

    def error(self, stop: Stop) -> int:
        lines = [f"[{self.prog}] ERROR: {printable(stop.what)}"] + [f"  fix: {printable(fix)}" for fix in stop.fixes]
        emit("\n".join(lines))
        return stop.code

    def raw(self, text: str) -> None:
        """A line of another program's output, or a check result, with control characters escaped."""
        emit(printable(text))

    def banner(self, lines: Sequence[str]) -> None:
        """A box on stderr that nobody can miss."""
        body = "\n".join(f"## {printable(line)}" for line in lines)
        emit(f"\n{RULE}\n{body}\n{RULE}\n")
