"""Login-node file operations, run by a real local shell, with paths that need quoting."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from slurm_provider.transport import CommandResult
from vcloud_pipeline.remote import RemoteCommandError, exists, listing, make_dirs, move_aside, write_file


class LocalShell:
    """Runs each command with ``bash -c``, as the login node's shell would."""

    def run(self, command: str, *, stdin: str | None = None, timeout: float) -> CommandResult:
        proc = subprocess.run(["bash", "-c", command], input=stdin, capture_output=True, text=True, timeout=timeout)
        return CommandResult(command=command, exit_status=proc.returncode, stdout=proc.stdout, stderr=proc.stderr)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path / "run's dir $HOME; x"


def test_files_are_created_written_listed_and_moved_aside(root: Path) -> None:
    shell = LocalShell()
    make_dirs(shell, [root / "stage1", root / "logs"])
    write_file(shell, root / "stage1" / "COMPLETE", '{"epochs": 3}\n')
    assert (root / "stage1" / "COMPLETE").read_text() == '{"epochs": 3}\n'
    assert not list((root / "stage1").glob("*.tmp*"))
    assert exists(shell, root / "stage1" / "COMPLETE") and not exists(shell, root / "nope")
    assert listing(shell, root) == [("stage1/COMPLETE", 14)]
    assert listing(shell, root / "missing") == []

    moved = move_aside(shell, root / "stage1", "20260301T000000Z")
    assert moved == f"{root}/stage1.replaced-20260301T000000Z"
    assert (Path(moved) / "COMPLETE").exists() and not (root / "stage1").exists()
    assert move_aside(shell, root / "stage1", "20260301T000001Z") is None


def test_a_failing_command_raises_with_its_stderr(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(RemoteCommandError, match=r"creating the run's directories failed .*exit 1.*Not a directory"):
        make_dirs(LocalShell(), [blocker / "sub"])
