"""Deploy errors: each says what to change."""

from __future__ import annotations

from qualify.core.errors import QualifyError


class DeployError(QualifyError):
    """start.sh cannot go on; the message says what to change."""

    exit_code = 1


class NoReleaseError(DeployError):
    """No released manifest for this target: --allow-unqualified with IMAGE may still deploy."""

    exit_code = 20
