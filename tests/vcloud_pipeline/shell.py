"""The login node's shell for unit tests: a Slurm hook whose commands run in ``bash -c`` here."""

from __future__ import annotations

import subprocess

from slurm_provider.hooks import SlurmHook
from slurm_provider.transport import CommandResult


class LocalShell:
    """Runs each command with ``bash -c``, as the login node's shell would."""

    def run(self, command: str, *, stdin: str | None = None, timeout: float) -> CommandResult:
        proc = subprocess.run(["bash", "-c", command], input=stdin, capture_output=True, text=True, timeout=timeout)
        return CommandResult(command=command, exit_status=proc.returncode, stdout=proc.stdout, stderr=proc.stderr)

    def close(self) -> None:
        pass


def local_hook(runner: object | None = None) -> SlurmHook:
    """A Slurm hook over ``runner`` (a :class:`LocalShell` by default)."""
    return SlurmHook("local_shell", runner=runner or LocalShell())  # type: ignore[arg-type]
