"""A code sync that meets another writer of the same hash's directory syncs again (pure: rsync and the
login node stood in for; the transfer itself is tested on the local cluster)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import PurePosixPath
from types import SimpleNamespace
from typing import Any

import pytest

from vcloud_pipeline.code import upload
from slurm_provider.file_verbs import RemoteCommandError
from vcloud_pipeline.code.tree import CodeManifest
from vcloud_pipeline.code.upload import SyncError, sync_code_tree


class Login:
    """The login node as the sync sees it: no code there yet, no other code directory."""

    def __init__(self) -> None:
        self.written: list[str] = []

    def read_if_unchanged(self, *args: Any) -> None:
        return None

    def dir_inventory(self, *args: Any) -> str:
        return "now 1700000000\n"

    @contextlib.contextmanager
    def ssh_command(self) -> Iterator[Any]:
        yield SimpleNamespace(destination="127.0.0.1", argv=["ssh"])

    def write_file(self, path: Any, text: str) -> None:
        self.written.append(str(path))

    def make_owner_writable(self, paths: Any) -> None:
        self.written.append(f"writable {' '.join(map(str, paths))}")

    def make_read_only(self, paths: Any) -> None:
        self.written.append(f"read-only {' '.join(map(str, paths))}")


def _sync(monkeypatch: pytest.MonkeyPatch, exits: list[int], login: Login, ran: list[int]) -> None:
    """Sync once; rsync exits with ``exits`` in turn (each run's code appended to ``ran``)."""

    def rsync(argv: Any, *, what: str, ssh: Any = None) -> str:
        code = exits[len(ran)]
        ran.append(code)
        if code:
            raise SyncError(f"{what}: rsync exited {code}", code)
        return ""

    monkeypatch.setattr(upload, "run_rsync", rsync)
    monkeypatch.setattr(upload, "code_sync_argv", lambda *args, **kwargs: ["rsync"])
    monkeypatch.setattr(upload, "refuse_unanchored_excludes", lambda tree: None)
    monkeypatch.setattr(upload, "list_code_dirs", lambda hook, paths: SimpleNamespace(dirs=[]))
    monkeypatch.setattr(upload.time, "sleep", lambda seconds: None)
    code = SimpleNamespace(dir=PurePosixPath("/p/code/abc"), manifest=PurePosixPath("/p/code/abc/.vcloud_manifest.json"))
    paths = SimpleNamespace(code=lambda digest: code, code_sync_lock=lambda digest: PurePosixPath("/p/code/.abc.sync-lock"))
    manifest = SimpleNamespace(hash="abc", to_json=lambda: "{}")
    sync_code_tree(paths, SimpleNamespace(root="/repo"), manifest, login)  # type: ignore[arg-type]


@pytest.mark.parametrize("exit_code", [23, 24])
def test_a_sync_whose_files_another_writer_removed_syncs_again_then_writes_the_manifest(
        monkeypatch: pytest.MonkeyPatch, exit_code: int) -> None:
    login, ran = Login(), []
    _sync(monkeypatch, [exit_code, 0], login, ran)
    assert ran == [exit_code, 0]
    assert login.written == ["writable /p/code/abc", "/p/code/abc/.vcloud_manifest.json", "read-only /p/code/abc"]


def test_other_rsync_failures_and_a_writer_that_never_finishes_fail_without_a_manifest(
        monkeypatch: pytest.MonkeyPatch) -> None:
    for exits in ([12], [23, 23, 23]):  # a protocol error; another writer in every one of the 3 tries
        login, ran = Login(), []
        with pytest.raises(SyncError, match=f"rsync exited {exits[-1]}"):
            _sync(monkeypatch, exits, login, ran)
        assert ran == exits and login.written == ["writable /p/code/abc"], "no manifest, not made read-only"


class FinishedByAnotherMember(Login):
    """The same code synced at the same moment by another member, whose sync wrote the manifest and
    made the directory read-only first: from ``finished_after`` reads on the manifest is there, and
    writing one into the directory is refused."""

    def __init__(self, finished_after: int) -> None:
        super().__init__()
        self.reads, self.finished_after = 0, finished_after

    def read_if_unchanged(self, *args: Any) -> tuple[str, bool] | None:
        self.reads += 1
        return (CodeManifest("abc", 3, "2026-11-27T00:00:00+00:00").to_json(), True) \
            if self.reads > self.finished_after else None

    def write_file(self, path: Any, text: str) -> None:
        if self.reads > self.finished_after:
            raise RemoteCommandError(f"writing {path} failed on the login node (exit 1): mktemp: Permission denied",
                                     SimpleNamespace(exit_status=1))
        super().write_file(path, text)


@pytest.mark.parametrize(("finished_after", "exits"), [
    (1, [0]),        # finished while this sync's rsync ran: its manifest stands, none is written
    (1, [23]),       # this sync's rsync met the other's read-only files: the finished code stands
])
def test_code_another_member_finished_meanwhile_is_taken_as_it_is(
        monkeypatch: pytest.MonkeyPatch, finished_after: int, exits: list[int]) -> None:
    login, ran = FinishedByAnotherMember(finished_after), []
    _sync(monkeypatch, exits, login, ran)
    assert ran == exits
    # No manifest written; what this sync's rsync may have created meanwhile is frozen like the rest.
    assert login.written == ["writable /p/code/abc", "read-only /p/code/abc"]


def test_a_manifest_write_refused_after_the_check_is_taken_when_the_other_writers_manifest_is_there(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The other member finished between this sync's last check and its write."""

    class Racing(FinishedByAnotherMember):
        def write_file(self, path: Any, text: str) -> None:
            self.finished_after = 0  # finishes now
            super().write_file(path, text)

    login, ran = Racing(finished_after=99), []
    _sync(monkeypatch, [0], login, ran)
    assert login.written == ["writable /p/code/abc", "read-only /p/code/abc"]  # its manifest stands, ours frozen
