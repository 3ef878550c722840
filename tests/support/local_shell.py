"""The login node's shell for unit tests: each command runs in ``bash -c`` here, and is recorded."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from slurm_provider.hooks import SlurmHook
from slurm_provider.transport import CommandResult


class LocalShell:
    """A ``RemoteCommandRunner`` that runs each command with ``bash -c``, as the login node's shell
    would, and records it in ``commands``. ``path_first``: a directory of stand-in programs (a
    scripted ``squeue``) put first on PATH."""

    def __init__(self, path_first: Path | None = None) -> None:
        self.env = {**os.environ, "PATH": f"{path_first}:{os.environ['PATH']}"} if path_first else None
        self.commands: list[str] = []

    def run(self, command: str, *, stdin: bytes | str | None = None, timeout: float) -> CommandResult:
        self.commands.append(command)
        text = stdin.decode() if isinstance(stdin, bytes) else stdin
        proc = subprocess.run(["bash", "-c", command], input=text, capture_output=True, text=True,
                              timeout=timeout, env=self.env)
        return CommandResult(command=command, exit_status=proc.returncode, stdout=proc.stdout,
                             stderr=proc.stderr)

    def close(self) -> None:
        pass


def local_hook(runner: LocalShell | None = None) -> SlurmHook:
    """A Slurm hook over ``runner`` (a fresh :class:`LocalShell` by default)."""
    return SlurmHook("local_shell", runner=runner or LocalShell())
