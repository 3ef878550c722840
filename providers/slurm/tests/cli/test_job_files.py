"""A job's files on the login node: log reads from an offset, progress, file name patterns."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from slurm_provider.cli.job_files import (
    build_file_stamps,
    build_read_log,
    build_read_progress,
    expand_filename_pattern,
    parse_file_stamps,
    parse_log_chunk,
    parse_progress,
)
from slurm_provider.cli.values import SlurmOutputError
from slurm_provider.validation import ValidationError
from providers.slurm.tests.cli.captured_output import raw


def run_local(command: str) -> str:
    return subprocess.run(["sh", "-c", command], capture_output=True, text=True, check=True).stdout


@pytest.fixture
def log_file(tmp_path: Path) -> Path:
    directory = tmp_path / "run 1" / "it's \"logs\""
    directory.mkdir(parents=True)
    path = directory / "vcloud_16082076.out"
    path.write_bytes("epoch 1 loss=0.5\nPSNR 34.0 dB ✓ température\n".encode())
    return path


def test_read_log_from_offsets(log_file: Path) -> None:
    data = log_file.read_bytes()
    first = parse_log_chunk(run_local(build_read_log(str(log_file), 0)), 0)
    assert first.text == data.decode() and first.new_offset == len(data) == first.file_size
    assert not first.has_more and not first.truncated and not first.missing

    with log_file.open("ab") as handle:
        handle.write(b"epoch 2 loss=0.25\n")
    second = parse_log_chunk(run_local(build_read_log(str(log_file), first.new_offset)), first.new_offset)
    assert second.text == "epoch 2 loss=0.25\n" and second.offset == first.new_offset

    nothing = parse_log_chunk(run_local(build_read_log(str(log_file), second.new_offset)), second.new_offset)
    assert nothing.text == "" and nothing.new_offset == second.new_offset


def test_file_stamps_are_size_and_mtime_of_the_files_that_exist(log_file: Path, tmp_path: Path) -> None:
    import os

    os.utime(log_file, (1767225600, 1767225600))
    missing = str(tmp_path / "no such.pt")
    paths = [missing, str(log_file)]
    stamps = parse_file_stamps(run_local(build_file_stamps(paths)), paths)
    assert stamps == {str(log_file): (log_file.stat().st_size, 1767225600)}
    os.utime(log_file, (1767225601, 1767225601))  # rewritten, same size: another stamp
    assert parse_file_stamps(run_local(build_file_stamps(paths)), paths)[str(log_file)][1] == 1767225601
    with pytest.raises(SlurmOutputError, match="file stamps"):
        parse_file_stamps("0 12\n", paths)


def test_read_log_never_splits_a_character(log_file: Path) -> None:
    data = log_file.read_bytes()
    check_mark = data.index("✓".encode())
    text, offset = "", 0
    while offset < len(data):
        # chunk size chosen so that a chunk ends inside the 3-byte check mark
        chunk = parse_log_chunk(run_local(build_read_log(str(log_file), offset, max_bytes=check_mark + 1)), offset)
        assert chunk.new_offset > offset
        text, offset = text + chunk.text, chunk.new_offset
    assert text == data.decode()


def test_read_log_after_truncation_and_missing(log_file: Path, tmp_path: Path) -> None:
    log_file.write_text("requeued run\n")
    chunk = parse_log_chunk(run_local(build_read_log(str(log_file), 500)), 500)
    assert chunk.truncated and chunk.offset == 0 and chunk.text == "requeued run\n"
    missing = parse_log_chunk(run_local(build_read_log(str(tmp_path / "no such.out"), 7)), 7)
    assert missing.missing and missing.new_offset == 7 and missing.text == ""


def test_read_log_rejects_bad_offsets() -> None:
    with pytest.raises(ValidationError, match="offset"):
        build_read_log("/tmp/x", -1)
    with pytest.raises(ValidationError, match="max_bytes"):
        build_read_log("/tmp/x", 0, max_bytes=0)


def test_read_progress(tmp_path: Path) -> None:
    path = tmp_path / "progress it's.json"
    path.write_text('{"epoch": 3}\n')
    assert parse_progress(run_local(build_read_progress(str(path)))) == '{"epoch": 3}\n'
    assert parse_progress(run_local(build_read_progress(str(tmp_path / "none.json")))) is None


def test_expand_filename_pattern() -> None:
    kwargs = {"job_id": "40", "job_name": "gc-throttled", "user": "vcloud"}
    assert expand_filename_pattern("/logs/%x_%j.out", **kwargs) == "/logs/gc-throttled_40.out"
    assert (
        expand_filename_pattern("/logs/%A_%3a-%u-%N.out", array_job_id="37", array_task_id="1", first_node="nid005001.lumi", **kwargs)
        == "/logs/37_001-vcloud-nid005001.out"
    )
    assert expand_filename_pattern("/logs/100%%_%8j.out", **kwargs) == "/logs/100%_00000040.out"
    assert expand_filename_pattern("/logs/%a.out", **kwargs) == "/logs/%a.out", "unknown stays as written"
    assert expand_filename_pattern("/logs/\\%j.out", **kwargs) == "/logs/%j.out"


def test_log_chunks_captured_over_the_cluster() -> None:
    start = parse_log_chunk(raw("read_log_start.txt"), 0)
    assert start.text.startswith("epoch 1/2") and "température ✓" in start.text and start.new_offset == start.file_size
    middle = parse_log_chunk(raw("read_log_middle.txt"), 20)
    assert middle.offset == 20 and middle.new_offset == 50 and middle.text == start.text.encode()[20:50].decode()
    assert parse_log_chunk(raw("read_log_truncated.txt"), 10_000_000).truncated
    assert parse_log_chunk(raw("read_log_missing.txt"), 0).missing


def test_log_chunk_errors() -> None:
    with pytest.raises(SlurmOutputError, match="header"):
        parse_log_chunk("garbage\n", 0)
    with pytest.raises(SlurmOutputError, match="announced"):
        parse_log_chunk("__SLURM_PROVIDER_LOG__ size=10 offset=0 count=10 truncated=0\naGk=\n", 0)
    with pytest.raises(SlurmOutputError):
        parse_log_chunk("", 0)


def test_progress() -> None:
    assert parse_progress(raw("read_progress.txt")).startswith('{"epoch": 3')
    assert parse_progress(raw("read_progress_missing.txt")) is None
