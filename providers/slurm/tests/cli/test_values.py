"""The small values several commands print: durations, exit codes, TRES, job ids."""

from __future__ import annotations

import pytest

from slurm_provider.cli.sacct import parse_sacct
from slurm_provider.cli.squeue import parse_squeue
from slurm_provider.cli.values import (
    SlurmOutputError,
    format_duration,
    gpus_from_tres,
    parse_duration,
    parse_exit_code,
    parse_job_id,
    parse_tres,
)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("1-02:03:04", 93784),
        ("02:03:04", 7384),
        ("03:04", 184),
        ("0:00", 0),
        ("5:00", 300),
        ("1:00:00", 3600),
        ("3-00:00:00", 259200),
        ("2-12", 216000),
        ("87", 87),
        ("UNLIMITED", None),
        ("INVALID", None),
        ("Partition_Limit", None),
        ("", None),
        (None, None),
    ],
)
def test_parse_duration(text: str | None, seconds: int | None) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize(("seconds", "text"), [
    (0, "00:00:00"), (184, "00:03:04"), (7384, "02:03:04"), (86399, "23:59:59"), (86400, "1-00:00:00"),
    (93784, "1-02:03:04"), (259200.7, "3-00:00:00"),
])
def test_format_duration_prints_what_parse_duration_reads(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text
    assert parse_duration(text) == int(seconds)


def test_format_duration_of_an_unknown_duration() -> None:
    assert format_duration(None) == ""
    assert format_duration(None, unknown="?") == "?"


@pytest.mark.parametrize(
    ("text", "expected"),
    [("3:0", (3, 0)), ("0:9", (0, 9)), ("0:15", (0, 15)), ("768", (3, 0)), ("9", (0, 9)), ("0", (0, 0)), ("", (None, None)), ("x:y", (None, None))],
)
def test_parse_exit_code(text: str, expected: tuple[int | None, int | None]) -> None:
    assert parse_exit_code(text) == expected


def test_tres_and_gpus() -> None:
    assert parse_tres("billing=4,cpu=1,gres/gpu=1,mem=1G,node=1")["mem"] == "1G"
    assert gpus_from_tres("billing=4,cpu=1,gres/gpu=1,mem=1G,node=1") == 1
    assert gpus_from_tres("cpu=56,gres/gpu=8,gres/gpu:mi250=8,mem=480G,node=1") == 8
    assert gpus_from_tres("cpu=16,gres/gpu:a100_80=1,mem=64G") == 1
    assert gpus_from_tres("cpu=1,mem=256M,node=1") == 0
    assert gpus_from_tres(None) == 0


@pytest.mark.parametrize(
    ("text", "job", "task", "step"),
    [
        ("123", "123", None, None),
        ("123_4", "123_4", "4", None),
        ("123_[5-7]", "123_[5-7]", "[5-7]", None),
        ("123_[1-3%1]", "123_[1-3%1]", "[1-3%1]", None),
        ("123.batch", "123", None, "batch"),
        ("123.extern", "123", None, "extern"),
        ("123.0", "123", None, "0"),
        ("123_4.batch", "123_4", "4", "batch"),
        ("123+1.0", "123+1", None, "0"),
    ],
)
def test_job_id_parts(text: str, job: str, task: str | None, step: str | None) -> None:
    parts = parse_job_id(text)
    assert (parts.job, parts.array_task, parts.step) == (job, task, step)
    assert parts.is_step is (step is not None)


def test_bad_job_id_and_short_lines() -> None:
    with pytest.raises(SlurmOutputError):
        parse_job_id("JobID")
    with pytest.raises(SlurmOutputError, match="fields"):
        parse_sacct("123|123|name|COMPLETED\n")
    with pytest.raises(SlurmOutputError):
        parse_squeue("sbatch: warning: something|" + "x|" * 30 + "\n")
