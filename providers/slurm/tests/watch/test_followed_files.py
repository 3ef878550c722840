"""Followed files, pure parts: specs, splitting what was read into lines, folding, refusing."""

from __future__ import annotations

from typing import Any

import pytest

from slurm_provider.watch.followed_files import (
    MAX_REST_BYTES,
    MAX_STATE_BYTES,
    FollowedFile,
    advance,
    followed_files,
    load_fold,
    split_lines,
)


def count_lines(state: Any, lines: list[str]) -> dict[str, Any]:
    """A fold: how many lines, and the last one."""
    return {"lines": (state or {}).get("lines", 0) + len(lines), "last": lines[-1]}


def test_specs_become_files_one_per_path_and_a_bad_spec_says_what_it_needs() -> None:
    files = followed_files([{"path": "/p/m.jsonl", "fold": "pkg.mod.fold"}, {"path": "/p/m.jsonl", "fold": "a.b"}])
    assert files == (FollowedFile("/p/m.jsonl", "a.b"),)
    assert followed_files(None) == ()
    with pytest.raises(ValueError, match=r"needs a 'path' and a 'fold' \(package.module.function\)"):
        followed_files([{"path": "/p/m.jsonl"}])
    kept = FollowedFile("/p/x y", "a.b", 12, {"n": 1}, "par", 5.0)
    assert FollowedFile.from_json(kept.to_json()) == kept


def test_only_complete_lines_are_handed_on_and_the_rest_waits_for_its_end() -> None:
    assert split_lines("", "a\nb\nc") == (["a", "b"], "c")
    assert split_lines("c", "d\n") == (["cd"], "")
    assert split_lines("x", "y") == ([], "xy")
    assert split_lines("", "z" * (MAX_REST_BYTES + 1)) == ([], "")  # not a line-by-line file


def test_advancing_folds_the_complete_lines_and_keeps_the_offset() -> None:
    file = FollowedFile("/p/m", f"{__name__}.count_lines")
    file = advance(file, "one\ntw", 6, 100.0, count_lines)
    assert (file.state, file.rest, file.offset, file.read_at) == ({"lines": 1, "last": "one"}, "tw", 6, 100.0)
    file = advance(file, "o\nthree\n", 14, 160.0, count_lines)
    assert (file.state, file.rest, file.offset) == ({"lines": 3, "last": "three"}, "", 14)
    restarted = advance(file, "new\n", 4, 200.0, count_lines)  # the file was written again from its start
    assert restarted.state == {"lines": 1, "last": "new"}


def test_a_fold_that_fails_or_keeps_too_much_stops_following_the_file_only() -> None:
    def fails(state: Any, lines: list[str]) -> Any:
        raise KeyError("boom")

    stopped = advance(FollowedFile("/p/m", "x.fails"), "a\n", 2, 1.0, fails)
    assert stopped.problem is not None and "x.fails failed on /p/m" in stopped.problem and stopped.offset == 2
    assert advance(stopped, "b\n", 4, 2.0, count_lines) == stopped
    big = advance(FollowedFile("/p/m", "x.big"), "a\n", 2, 1.0, lambda s, lines: "x" * MAX_STATE_BYTES)
    assert big.problem is not None and "it must thin what it keeps" in big.problem


def test_a_fold_is_imported_by_its_path_or_refused_saying_where_it_must_be() -> None:
    assert load_fold(f"{__name__}.count_lines") is count_lines
    with pytest.raises(ValueError, match="must be importable where the triggerer runs"):
        load_fold("no_such_module.fold")
    with pytest.raises(ValueError, match="is not a function"):
        load_fold(f"{__name__}.MAX_REST_BYTES")
