"""One error hierarchy with exit codes; the CLI entry point catches them once.

Every message says what is wrong and what to do. Standard library only (the
probe imports this module inside images).
"""

from __future__ import annotations

from qualify.core.record import record

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: typing is not imported at run time (the census's start-up)
    from typing import Dict, Optional, Tuple


class QualifyError(Exception):
    """Base class: a failure the user can act on."""

    exit_code = 1

    def __init__(self, message: str, *, hint: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        message, hint = printable(self.message, newlines=True), printable(self.hint)
        return f"{message}\n  hint: {hint}" if hint else message


def printable(text: str, newlines: bool = False) -> str:
    """`text` with control characters escaped (\\x1b, \\r, and \\n unless `newlines`): a name cannot send
    escape codes to a terminal or, in a one-line message, start a forged log line. Tabs stay."""
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() or ch == "\t" or (newlines and ch == "\n")
                   else ch.encode("unicode_escape").decode("ascii") for ch in text)


class ConfigError(QualifyError):
    """Bad targets file, lock file or option."""

    exit_code = 2


class EngineError(QualifyError):
    """No container engine, or the engine failed."""

    exit_code = 3


class BaseImageError(EngineError):
    """The pinned base cannot be pulled or resolved."""

    exit_code = 4


class BuildError(EngineError):
    """A build step failed."""

    exit_code = 5


class LockError(ConfigError):
    """A dependency lock is missing or its hashes do not match."""

    exit_code = 6


class ExternalCommandError(QualifyError):
    """An external program failed; the message names the command."""

    exit_code = 7


class RegistryError(QualifyError):
    """The registry cannot be reached."""

    exit_code = 8


class VerificationError(QualifyError):
    """A signature, digest or verdict does not match."""

    exit_code = 9


class ReleaseError(QualifyError):
    """The release policy or the repository state refuses a release."""

    exit_code = 10


class ParseError(QualifyError):
    """A binary file that cannot be parsed (truncated, corrupt, hostile)."""

    exit_code = 11


class HostError(QualifyError):
    """The host refused: a full disk, a permission, a read-only file system (the message names the path)."""

    exit_code = 12


def internal_error(exc: BaseException) -> str:
    """A file's error row for a bug in the code reading it (the census goes on)."""
    return f"internal error while reading ({type(exc).__name__}: {exc})"


# --- the one exit-code table (docs/deploy.md's "Exit codes" section is generated from it) ------

@record(frozen=True)
class ExitCode:
    code: int
    cli: str  # what `python -m qualify ...` means by it (a nox session exits 1 for any failure)
    start_sh: str  # what ./start.sh and scripts/*.sh mean by it ("" when they never use it)
    error: Optional[str] = None  # the error class that exits with it
    shell_name: str = ""  # the readonly name in scripts/lib.sh


EXIT_CODES: Tuple[ExitCode, ...] = (
    ExitCode(0, "success; for `diff`: no differences", "deployed (or --dry-run: would deploy)"),
    ExitCode(1, "a failing verdict; for `diff`: the manifests differ; `deploy` helpers: cannot go on",
             "an unexpected failure (setup-host.sh: a step failed)"),
    ExitCode(2, "configuration: targets file, options, keys", "usage: an unknown option or bad setting",
             "ConfigError", "EX_USAGE"),
    ExitCode(3, "container engine", "preflight: driver, GPU, memory, engine, runtime, disk or port; a serving path "
             "of the model the verified manifest refuses on this GPU",
             "EngineError", "EX_PREFLIGHT"),
    ExitCode(4, "base image not pullable", "trust gate: signature, digest or verdict refused",
             "BaseImageError", "EX_TRUST"),
    ExitCode(5, "a build step failed", "deploy: pull, compose, health or canary failed; on unified memory (GB10) "
             "the host ran short while the server started, and it was stopped", "BuildError", "EX_DEPLOY"),
    ExitCode(6, "lock or wheel hash", "a check of a running deployment failed (scripts/verify.sh)",
             "LockError", "EX_CHECK"),
    ExitCode(7, "an external command failed", "", "ExternalCommandError"),
    ExitCode(8, "registry", "", "RegistryError"),
    ExitCode(9, "verification: signature, image digest or verdict", "", "VerificationError"),
    ExitCode(10, "release policy or repository state", "", "ReleaseError"),
    ExitCode(11, "unparseable binary", "", "ParseError"),
    ExitCode(12, "the host refused: a full disk, a permission, a read-only file system",
             "the host refused: a full disk, a permission, a read-only file system (the message names the path)",
             "HostError", "EX_HOST"),
    ExitCode(13, "`serve-check`: a check the release's signed policy requires for the target's intended level did "
             "not run (never a pass)", "a check the deployment's release requires did not run (scripts/verify.sh "
             "--full, --matrix): never a pass", shell_name="EX_INCOMPLETE"),
    ExitCode(20, "`deploy` helpers: no released manifest for the target", ""),
    ExitCode(130, "interrupted (Ctrl-C)", "interrupted", shell_name="EX_INTERRUPTED"),
)


def exit_code_table() -> Dict[int, ExitCode]:
    return {e.code: e for e in EXIT_CODES}


def shell_code(name: str) -> int:
    """The code start.sh and scripts/*.sh exit with under `name` (EX_USAGE, EX_TRUST, ...)."""
    for e in EXIT_CODES:
        if e.shell_name == name:
            return e.code
    raise KeyError(name)


def exit_codes_markdown() -> str:
    rows = ["| code | `python -m qualify` | `./start.sh`, `scripts/*.sh` |", "|---|---|---|"]
    rows += [f"| {e.code} | {e.cli} | {e.start_sh or '—'} |" for e in EXIT_CODES]
    return "\n".join(rows)
