"""What a hook verb is written as: a *plan*, a generator that yields the :class:`RemoteCommand` it
needs, receives each :class:`~slurm_provider.transport.CommandResult` and returns the verb's value.
The sync hook drives plans with a blocking runner, the async hook with an asyncio runner, so both
issue exactly the same commands (:mod:`slurm_provider.hooks`)."""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass
from typing import TypeVar

from slurm_provider.transport import CommandResult

T = TypeVar("T")


@dataclass(frozen=True)
class RemoteCommand:
    """One command line a plan needs run, what it is (for counting), and its stdin."""

    line: str
    verb: str
    """The Slurm program or file operation: ``squeue``, ``sacct``, ``sbatch``, ``read_log``, ``mkdir`` ..."""
    stdin: str | None = None
    timeout: float | None = None


Plan = Generator[RemoteCommand, CommandResult, T]
