"""Exit records: what a rank leaves for the torchrun launch, and what the launch reads back."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from vcloud import contract
from vcloud.exit_record import read_exit_records, records_dir, write_exit_record


def env_for(directory: Path, rank: int | None = None) -> dict[str, str]:
    env = {contract.RANK_EXITS_DIR_ENV: str(directory)}
    if rank is not None:
        env["RANK"] = str(rank)
    return env


def test_each_rank_records_an_outcome_code_in_a_file_of_its_own(tmp_path: Path) -> None:
    records = tmp_path / "logs dir's" / ".job.4242.exits"  # created by the first rank that records
    for rank in (0, 1, 5):
        written = write_exit_record(contract.EXIT_RESUME_REFUSED, env_for(records, rank))
        assert written == records / contract.exit_record_name(rank)
    write_exit_record(contract.EXIT_REQUEUE, env_for(records, 3))
    assert read_exit_records(records) == {0: 88, 1: 88, 3: 85, 5: 88}
    assert (records / "rank5.exit").read_text() == "88\n"
    assert sorted(p.name for p in records.iterdir()) == [f"rank{r}.exit" for r in (0, 1, 3, 5)]


def test_a_single_process_records_as_rank_0(tmp_path: Path) -> None:
    assert write_exit_record(contract.EXIT_GPUS_MISSING, env_for(tmp_path)) == tmp_path / "rank0.exit"
    assert read_exit_records(tmp_path) == {0: contract.EXIT_GPUS_MISSING}


@pytest.mark.parametrize("code", [contract.EXIT_OK, contract.EXIT_ERROR, contract.EXIT_BAD_CONFIG, 3])
def test_codes_that_say_only_that_the_job_failed_leave_no_record(tmp_path: Path, code: int) -> None:
    assert write_exit_record(code, env_for(tmp_path, 0)) is None
    assert list(tmp_path.iterdir()) == []


def test_nothing_is_recorded_where_the_job_script_asked_for_no_records(tmp_path: Path) -> None:
    assert records_dir({}) is None and records_dir({contract.RANK_EXITS_DIR_ENV: " "}) is None
    assert write_exit_record(contract.EXIT_RESUME_REFUSED, {"RANK": "0"}) is None
    assert read_exit_records(None) == {} and read_exit_records(tmp_path / "missing") == {}


def test_a_record_that_cannot_be_written_is_a_warning_not_an_error(tmp_path: Path,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    blocked = tmp_path / "a file, not a directory"
    blocked.write_text("")
    with caplog.at_level(logging.WARNING, logger="vcloud.train"):
        assert write_exit_record(contract.EXIT_RESUME_REFUSED, env_for(blocked / "records", 2)) is None
    assert "could not record exit 88 in " in caplog.text and "rank2.exit" in caplog.text


def test_reading_skips_temporaries_torn_and_foreign_files(tmp_path: Path) -> None:
    (tmp_path / "rank0.exit").write_text("88\n")
    (tmp_path / ".rank1.exit.4711.tmp").write_text("85\n")  # a rank still writing
    (tmp_path / "rank2.exit").write_text("")  # torn
    (tmp_path / "rank3.exit").write_text("1\n")  # not an outcome code
    (tmp_path / "rank4.exit").write_text("eighty-five")
    (tmp_path / "notes.txt").write_text("87\n")
    (tmp_path / "rank5.exit").mkdir()
    assert read_exit_records(tmp_path) == {0: 88}


def test_record_names_and_contents_round_trip() -> None:
    for rank in (0, 7, 1023):
        assert contract.exit_record_rank(contract.exit_record_name(rank)) == rank
    for name in ("rank.exit", "rank-1.exit", "rank1.exit.tmp", ".rank1.exit.12.tmp", "rank1"):
        assert contract.exit_record_rank(name) is None
    for code in contract.RECORDED_EXITS:
        assert contract.parse_exit_record(contract.exit_record_text(code)) == code
    assert contract.RECORDED_EXITS == (contract.EXIT_REQUEUE, contract.EXIT_GPUS_MISSING,
                                       contract.EXIT_RESUME_REFUSED)
    assert contract.parse_exit_record("86\n") is None  # the job script's own refusal, never a rank's


def test_a_link_planted_at_the_temp_name_of_old_is_not_followed(tmp_path: Path) -> None:
    """Records go to shared storage that the project's members can write: a link at a name one could
    foresee (``.rank0.exit.<pid>.tmp`` before) is not written through; the temp file is mkstemp's."""
    import os

    victim = tmp_path / "victim"
    victim.write_text("untouched\n")
    records = tmp_path / "records"
    records.mkdir()
    (records / f".rank0.exit.{os.getpid()}.tmp").symlink_to(victim)
    assert write_exit_record(contract.EXIT_REQUEUE, env_for(records, 0)) == records / "rank0.exit"
    assert victim.read_text() == "untouched\n"
    assert read_exit_records(records) == {0: contract.EXIT_REQUEUE}
    assert [p.name for p in records.iterdir() if not p.is_symlink()] == ["rank0.exit"]
