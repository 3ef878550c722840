"""The hooks' file verbs: the login-node file operations of :mod:`slurm_provider.cli.files`, each a
plan like the Slurm verbs of :mod:`slurm_provider.hooks` (validate, yield the command, read the
result), so that a workflow built on the provider never composes shell itself.

A command that runs and fails raises :class:`RemoteCommandError` with the command's own stderr (a
full quota, a directory that is a file): not retryable, nothing passes by waiting. A login node that
cannot be reached raises the transport's error as every verb does.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar

from slurm_provider.cli import files
from slurm_provider.cli.files import DirInventory, Path
from slurm_provider.cli.values import SlurmOutputError
from slurm_provider.plans import Plan, RemoteCommand
from slurm_provider.transport import CommandResult

T = TypeVar("T")

FILE_TIMEOUT = 120.0
REMOVE_TIMEOUT = 600.0
"""Removing a whole code tree on a busy parallel file system takes a while."""


def FileCommand(line: str, verb: str, stdin: str | None = None, timeout: float = FILE_TIMEOUT) -> RemoteCommand:
    """A file verb's command: file operations get :data:`FILE_TIMEOUT` unless they say otherwise."""
    return RemoteCommand(line, verb, stdin=stdin, timeout=timeout)




class RemoteCommandError(RuntimeError):
    """A file operation on the login node ran and exited non-zero; the message has its stderr."""

    def __init__(self, message: str, result: CommandResult | None = None) -> None:
        super().__init__(message)
        self.result = result


def _checked(what: str, result: CommandResult) -> str:
    if result.exit_status != 0:
        detail = (result.stderr or result.stdout or "no output").strip()[-2000:]
        raise RemoteCommandError(f"{what} failed on the login node (exit {result.exit_status}): {detail}", result)
    return result.stdout


def make_dirs_plan(directories: Sequence[Path], what: str) -> Plan[None]:
    _checked(what, (yield FileCommand(files.build_make_dirs(directories), "mkdir")))


def write_file_plan(path: Path, text: str) -> Plan[None]:
    _checked(f"writing {path}", (yield FileCommand(files.build_write_file(path), "write_file", stdin=text)))


def make_read_only_plan(paths: Sequence[Path]) -> Plan[None]:
    _checked(f"making {', '.join(map(str, paths))} read-only",
             (yield FileCommand(files.build_make_read_only(paths), "chmod", timeout=REMOVE_TIMEOUT)))


def make_owner_writable_plan(paths: Sequence[Path]) -> Plan[None]:
    _checked(f"making {', '.join(map(str, paths))} writable again",
             (yield FileCommand(files.build_make_owner_writable(paths), "chmod", timeout=REMOVE_TIMEOUT)))


def path_exists_plan(path: Path) -> Plan[bool]:
    return (yield FileCommand(files.build_path_exists(path), "test")).exit_status == 0


def readable_plan(path: Path, directory: bool) -> Plan[bool]:
    return (yield FileCommand(files.build_readable(path, directory=directory), "test")).exit_status == 0


def command_exists_plan(program: str) -> Plan[bool]:
    return (yield FileCommand(files.build_command_exists(program), "command")).exit_status == 0


def list_files_plan(root: Path, depth: int) -> Plan[list[tuple[str, int]]]:
    out = _checked(f"listing {root}", (yield FileCommand(files.build_list_files(root, depth), "find")))
    return files.parse_list_files(out)


def read_if_unchanged_plan(file: Path, tree: Path, needle: str) -> Plan[tuple[str, bool] | None]:
    result = yield FileCommand(files.build_read_if_unchanged(file, tree, needle), "read_file", timeout=60.0)
    return files.parse_read_if_unchanged(result.stdout) if result.exit_status == 0 else None


def dir_inventory_plan(root: Path, marker: str, records: Path) -> Plan[DirInventory]:
    out = _checked(f"listing the directories in {root}",
                   (yield FileCommand(files.build_dir_inventory(root, marker, records), "find")))
    try:
        return files.parse_dir_inventory(out)
    except SlurmOutputError as exc:
        raise RemoteCommandError(str(exc)) from exc


def remove_dirs_plan(renames: Sequence[tuple[Path, Path]], leftovers: Sequence[Path], record_files: Sequence[Path],
                     what: str) -> Plan[bool]:
    line = files.build_remove_dirs(renames, leftovers, record_files)
    if line is None:
        return False
    _checked(what, (yield FileCommand(line, "rm", timeout=REMOVE_TIMEOUT)))
    return True


def replace_record_plan(directory: Path, name: str, text: str, prefix: str) -> Plan[None]:
    _checked(f"recording {name} in {directory}",
             (yield FileCommand(files.build_replace_record(directory, name, text, prefix), "write_file")))


def touch_record_plan(directory: Path, name: str) -> Plan[None]:
    _checked(f"refreshing {directory}/{name}", (yield FileCommand(files.build_touch_record(directory, name), "touch")))


def remove_records_plan(directory: Path, prefix: str) -> Plan[None]:
    _checked(f"removing {directory}/{prefix}*", (yield FileCommand(files.build_remove_records(directory, prefix), "rm")))


def run_script_plan(script: str, verb: str, timeout: float) -> Plan[CommandResult]:
    return (yield RemoteCommand("bash -s", verb, stdin=script, timeout=timeout))


class FileVerbs:
    """The file verbs of the blocking :class:`~slurm_provider.hooks.SlurmHook`."""

    def _drive(self, plan: Any) -> Any:  # provided by the hook
        raise NotImplementedError

    def make_dirs(self, directories: Sequence[Path], what: str = "creating directories") -> None:
        """``mkdir -p`` of every directory (group-writable); ``what`` names them in an error."""
        self._drive(make_dirs_plan(directories, what))

    def run_script(self, script: str, *, verb: str, timeout: float = FILE_TIMEOUT) -> CommandResult:
        """Run a ``bash`` script built by a workflow's own pure function (its text on stdin) as one
        command, counted as ``verb``; the result is the caller's to read (no exit status is an error here)."""
        return self._drive(run_script_plan(script, verb, timeout))

    def write_file(self, path: Path, text: str) -> None:
        """Write ``text`` to ``path`` atomically (a temp file of this writer's own, then a rename)."""
        self._drive(write_file_plan(path, text))

    def make_read_only(self, paths: Sequence[Path]) -> None:
        """Take write permission from everyone on everything under ``paths`` (finished, never changed)."""
        self._drive(make_read_only_plan(paths))

    def make_owner_writable(self, paths: Sequence[Path]) -> None:
        """Give the owner back write permission under those of ``paths`` that exist and are the caller's."""
        self._drive(make_owner_writable_plan(paths))

    def path_exists(self, path: Path) -> bool:
        return bool(self._drive(path_exists_plan(path)))

    def readable(self, path: Path, *, directory: bool = False) -> bool:
        return bool(self._drive(readable_plan(path, directory)))

    def command_exists(self, program: str) -> bool:
        """Is ``program`` on the login node's PATH?"""
        return bool(self._drive(command_exists_plan(program)))

    def list_files(self, root: Path, depth: int = 3) -> list[tuple[str, int]]:
        """(relative path, size) of the files under ``root``, sorted; [] when it does not exist."""
        return list(self._drive(list_files_plan(root, depth)))

    def read_if_unchanged(self, file: Path, tree: Path, needle: str) -> tuple[str, bool] | None:
        """``file``'s text and whether nothing under ``tree`` is newer (then, if it holds ``needle``,
        it is touched); None when it is missing or could not be read."""
        result: tuple[str, bool] | None = self._drive(read_if_unchanged_plan(file, tree, needle))
        return result

    def dir_inventory(self, root: Path, marker: str, records: Path) -> DirInventory:
        """The directories under ``root`` with their times, on the login node's clock."""
        inventory: DirInventory = self._drive(dir_inventory_plan(root, marker, records))
        return inventory

    def remove_dirs(self, renames: Sequence[tuple[Path, Path]], leftovers: Sequence[Path] = (),
                    record_files: Sequence[Path] = (), what: str = "removing directories") -> bool:
        """Rename each directory aside, then delete it; delete ``leftovers`` and ``record_files``.
        False when there was nothing to remove."""
        return bool(self._drive(remove_dirs_plan(renames, leftovers, record_files, what)))

    def replace_record(self, directory: Path, name: str, text: str, prefix: str) -> None:
        """Write the record ``name``, replacing the records of ``directory`` that start with ``prefix``."""
        self._drive(replace_record_plan(directory, name, text, prefix))

    def touch_record(self, directory: Path, name: str) -> None:
        self._drive(touch_record_plan(directory, name))

    def remove_records(self, directory: Path, prefix: str) -> None:
        self._drive(remove_records_plan(directory, prefix))
