"""One error hierarchy with exit codes; the CLI entry point catches them once.

Every message says what is wrong and what to do. Standard library only (the
probe imports this module inside images).
"""

from __future__ import annotations


class QualifyError(Exception):
    """Base class: a failure the user can act on."""

    exit_code = 1

    def __init__(self, message: str, *, hint: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return f"{self.message}\n  hint: {self.hint}" if self.hint else self.message


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
