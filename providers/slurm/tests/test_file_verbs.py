"""The hook's file verbs, run by a real local shell, with paths that need quoting."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from slurm_provider.cli.files import (
    build_make_dirs,
    build_make_read_only,
    build_remove_records,
    build_replace_record,
    build_write_file,
    parse_dir_inventory,
)
from slurm_provider.hooks import RemoteCommandError, SlurmHook
from support.local_shell import LocalShell


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path / "run's dir $HOME; x"


@pytest.fixture
def hook() -> SlurmHook:
    return SlurmHook("unused", runner=LocalShell())


def test_files_are_created_written_and_listed(root: Path, hook: SlurmHook) -> None:
    hook.make_dirs([root / "stage1", root / "logs"])
    hook.write_file(root / "stage1" / "COMPLETE", '{"epochs": 3}\n')
    assert (root / "stage1" / "COMPLETE").read_text() == '{"epochs": 3}\n'
    assert not list((root / "stage1").glob("*.tmp*"))
    assert hook.path_exists(root / "stage1" / "COMPLETE") and not hook.path_exists(root / "nope")
    assert hook.list_files(root) == [("stage1/COMPLETE", 14)]
    assert hook.list_files(root / "missing") == []
    assert hook.readable(root / "stage1", directory=True) and not hook.readable(root / "stage1" / "COMPLETE",
                                                                                 directory=True)
    assert hook.command_exists("bash") and not hook.command_exists("no-such-program-here")
    assert hook.command_counts["mkdir"] == 1 and hook.command_counts["write_file"] == 1


def test_a_failing_command_raises_with_its_stderr(tmp_path: Path, hook: SlurmHook) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(RemoteCommandError, match=r"creating the run's directories failed .*exit 1.*Not a directory"):
        hook.make_dirs([blocker / "sub"], what="creating the run's directories")


def test_builders_quote_every_path_and_refuse_relative_ones() -> None:
    assert build_make_dirs(["/a b", "/c"]) == "umask 002; mkdir -p -- '/a b' /c"
    assert build_write_file("/x y/f") == (
        "umask 002; tmp=\"$(mktemp '/x y/f.XXXXXX')\" || exit 1; "
        "if cat > \"$tmp\" && chmod 0644 \"$tmp\" && mv -f -- \"$tmp\" '/x y/f'; "
        "then touch -c -- '/x y/f'; else rm -f -- \"$tmp\"; exit 1; fi")
    assert build_make_read_only(["/a b"]) == (
        "find '/a b' \\( -type f -o -type d \\) -user \"$(id -u)\" -perm /222 -exec chmod a-w -- {} +")
    with pytest.raises(ValueError, match="absolute"):
        build_make_dirs(["relative"])
    with pytest.raises(ValueError, match="plain file name prefix"):
        build_remove_records("/r", "*")
    assert build_remove_records("/r s", "abc-") == "rm -f -- '/r s'/abc-*"
    assert "for old in /r/k-*;" in build_replace_record("/r", "k-1", "text", "k-")


def test_a_link_planted_where_a_temp_file_could_go_is_not_followed(root: Path, hook: SlurmHook,
                                                                   tmp_path: Path) -> None:
    """Another member of a group-writable directory can plant links at every name it can foresee (the
    old ``<file>.tmp.<pid>``, ``.<record>.tmp``): the temp files are mktemp's, the links stay as they were."""
    victim = tmp_path / "victim"
    victim.write_text("untouched\n")
    root.mkdir(parents=True)
    records = root / ".runs"
    records.mkdir()
    for planted in (root / "f.tmp.1234", root / "f.tmp", records / ".k1-a.tmp", records / ".k1-a.tmp.1"):
        planted.symlink_to(victim)
    hook.write_file(root / "f", "written\n")
    hook.replace_record(records, "k1-a", "marker", prefix="k1-")
    assert victim.read_text() == "untouched\n"
    assert (root / "f").read_text() == "written\n" and not (root / "f").is_symlink()
    assert (records / "k1-a").read_text() == "marker\n" and not (records / "k1-a").is_symlink()
    assert oct((root / "f").stat().st_mode & 0o777) == oct(0o644)
    left = sorted(p.name for p in root.iterdir() if not p.is_symlink())
    assert left == [".runs", "f"], "no temp file is left behind"


def test_a_finished_tree_is_read_only_and_its_owner_removes_it(tmp_path: Path, hook: SlurmHook) -> None:
    code = tmp_path / "code"
    tree = code / "abc"
    (tree / "trainer" / "src").mkdir(parents=True)
    (tree / "trainer" / "src" / "m.py").write_text("x = 1\n")
    os.chmod(code, 0o2775)
    hook.make_read_only([tree])
    for path in (tree, tree / "trainer", tree / "trainer" / "src" / "m.py"):
        assert path.stat().st_mode & 0o222 == 0, path
    assert code.stat().st_mode & 0o020, "the code root stays group-writable: new hashes are added next to it"
    (code / "other").mkdir()
    hook.make_owner_writable([tree, tmp_path / "missing"])
    assert (tree / "trainer").stat().st_mode & 0o200
    hook.make_read_only([tree])
    assert hook.remove_dirs([(tree, code / ".abc.removing")])
    assert sorted(p.name for p in code.iterdir()) == ["other"]


def test_a_file_is_read_only_while_nothing_in_its_tree_changed(tmp_path: Path, hook: SlurmHook) -> None:
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "a.py").write_text("x")
    manifest = tree / "manifest.json"
    assert hook.read_if_unchanged(manifest, tree, "h1") is None
    manifest.write_text('{"hash": "h1"}')
    assert hook.read_if_unchanged(manifest, tree, "h1") == ('{"hash": "h1"}\n', True)
    (tree / "b.py").write_text("y")
    assert hook.read_if_unchanged(manifest, tree, "h1") == ('{"hash": "h1"}\n', False)


def test_records_replace_refresh_and_go(tmp_path: Path, hook: SlurmHook) -> None:
    records = tmp_path / "records dir"
    hook.replace_record(records, "k1-a", "first", prefix="k1-")
    hook.replace_record(records, "k2-b", "other", prefix="k2-")
    hook.replace_record(records, "k1-c", "second", prefix="k1-")
    assert sorted(p.name for p in records.iterdir()) == ["k1-c", "k2-b"]
    assert (records / "k1-c").read_text() == "second\n"
    hook.touch_record(records, "k1-c")
    hook.remove_records(records, "k1-")
    assert [p.name for p in records.iterdir()] == ["k2-b"]


def test_directories_are_listed_on_the_login_nodes_clock_and_removed_renamed_first(tmp_path: Path,
                                                                                     hook: SlurmHook) -> None:
    root = tmp_path / "code dir's"
    for name in ("one", "two"):
        (root / name).mkdir(parents=True)
    (root / "one" / "MANIFEST").write_text("{}")
    (root / ".records").mkdir()
    (root / ".records" / "r1").write_text("")
    inventory = hook.dir_inventory(root, "MANIFEST", root / ".records")
    assert set(inventory.dirs) == {"one", "two", ".records"} and set(inventory.marked) == {"one"}
    assert set(inventory.records) == {"r1"} and abs(inventory.now - inventory.dirs["two"]) < 60
    assert hook.dir_inventory(tmp_path / "none", "MANIFEST", tmp_path / "none" / ".r").dirs == {}
    with pytest.raises(ValueError, match="clock"):
        parse_dir_inventory("")

    assert hook.remove_dirs([(root / "two", root / ".two.removing")], record_files=[root / ".records" / "r1"])
    assert sorted(p.name for p in root.iterdir()) == [".records", "one"] and not (root / ".records" / "r1").exists()
    assert hook.remove_dirs([]) is False
