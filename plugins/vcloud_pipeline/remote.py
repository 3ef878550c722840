"""Small file operations on the cluster's login node, over the Slurm hook's SSH transport.

The training DAG needs a handful of them besides Slurm verbs: create the run's directories,
upload the code manifest, move a stage's outputs aside for a restart, list the run's outputs.
Each is one shell command with every path quoted; a command that fails raises
:class:`RemoteCommandError` with the command's own stderr.
"""

from __future__ import annotations

import shlex
import uuid
from collections.abc import Iterable, Sequence
from pathlib import PurePosixPath
from typing import Protocol

DEFAULT_TIMEOUT = 120.0


class RemoteCommandError(RuntimeError):
    """A command on the login node exited non-zero."""


class CommandRunner(Protocol):
    """What :mod:`slurm_provider.transport` runners offer (``SlurmHook.runner``)."""

    def run(self, command: str, *, stdin: bytes | str | None = None, timeout: float): ...


def _quote(paths: Iterable[PurePosixPath | str]) -> str:
    return " ".join(shlex.quote(str(p)) for p in paths)


SHARED_UMASK = "umask 002"
"""A project's members share its directories: what the pipeline creates there is group-writable
(and, inside a setgid project directory, keeps the project's group)."""


def run_checked(runner: CommandRunner, line: str, *, what: str, stdin: str | None = None,
                timeout: float = DEFAULT_TIMEOUT) -> str:
    """Run ``line`` with the project's shared umask (:data:`SHARED_UMASK`); return its stdout, or
    raise naming ``what`` failed and why."""
    result = runner.run(f"{SHARED_UMASK}; {line}", stdin=stdin, timeout=timeout)
    if result.exit_status != 0:
        detail = (result.stderr or result.stdout or "no output").strip()[-2000:]
        raise RemoteCommandError(f"{what} failed on the login node (exit {result.exit_status}): {detail}")
    return result.stdout


def make_dirs(runner: CommandRunner, directories: Sequence[PurePosixPath | str]) -> None:
    run_checked(runner, f"mkdir -p -- {_quote(directories)}", what="creating the run's directories")


def write_file(runner: CommandRunner, path: PurePosixPath | str, text: str) -> None:
    """Write ``text`` to ``path`` atomically (temp file in the same directory, then rename).

    The file's mtime is set after the rename, so it is not older than its directory's: the code
    manifest relies on being the newest entry of the synced tree. The temp name is the writer's own:
    two deployments syncing one run write the same manifest at once, and with a shared temp name
    one writer's rename took the other's file away ("mv: cannot stat").
    """
    target = shlex.quote(str(path))
    tmp = shlex.quote(f"{path}.tmp.{uuid.uuid4().hex}")
    run_checked(runner, f"cat > {tmp} && mv -f -- {tmp} {target} && touch -c -- {target}", stdin=text,
                what=f"writing {path}")


def exists(runner: CommandRunner, path: PurePosixPath | str) -> bool:
    result = runner.run(f"test -e {shlex.quote(str(path))}", timeout=DEFAULT_TIMEOUT)
    return result.exit_status == 0


def move_aside(runner: CommandRunner, path: PurePosixPath | str, stamp: str) -> str | None:
    """Rename ``path`` to ``<path>.replaced-<stamp>`` (as ``vcloud.train --restart`` does); None if absent."""
    target = f"{path}.replaced-{stamp}"
    line = (f"if [ -e {shlex.quote(str(path))} ]; then mv -n -- {shlex.quote(str(path))} "
            f"{shlex.quote(target)} && echo moved; fi")
    out = run_checked(runner, line, what=f"moving {path} aside")
    return target if "moved" in out else None


def listing(runner: CommandRunner, root: PurePosixPath | str, *, depth: int = 3) -> list[tuple[str, int]]:
    """(relative path, size in bytes) of the files under ``root``, sorted; [] when it does not exist."""
    line = (f"if [ -d {shlex.quote(str(root))} ]; then cd {shlex.quote(str(root))} && "
            f"find . -maxdepth {int(depth)} -type f -printf '%s %P\\n' | LC_ALL=C sort -k2; fi")
    out = run_checked(runner, line, what=f"listing {root}")
    rows = []
    for text in out.splitlines():
        size, _, rel = text.partition(" ")
        if size.isdigit() and rel:
            rows.append((rel, int(size)))
    return rows
