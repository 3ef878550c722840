"""sacct: the command lines and the accounting rows (finished states, requeued runs, arrays and steps)."""

from __future__ import annotations

import json

import pytest

from slurm_provider.cli.sacct import (
    SACCT_FIELDS,
    build_sacct,
    build_sacct_by_name,
    latest_job_rows,
    parse_sacct,
    rows_by_job,
    runs_of,
    steps_of,
)
from slurm_provider.cli.values import gpus_from_tres
from slurm_provider.validation import ValidationError
from providers.slurm.tests.cli.captured_output import JOBS, raw
from providers.slurm.tests.cli.command_words import argv_of


def test_sacct_commands() -> None:
    argv = argv_of(build_sacct([1, 2]))
    assert argv[:4] == ["sacct", "--parsable2", "--noheader", "--delimiter=|"]
    assert argv[4] == "--format=" + ",".join(SACCT_FIELDS)
    assert "--allocations" in argv and "--duplicates" in argv and argv[-1] == "--jobs=1,2"
    steps = argv_of(build_sacct([1], allocations_only=False, duplicates=False, since="now-7days"))
    assert "--allocations" not in steps and "--duplicates" not in steps and "--starttime=now-7days" in steps
    for needed in ("JobIDRaw", "State", "ExitCode", "Reason", "ElapsedRaw", "Start", "End", "Submit", "AllocTRES"):
        assert needed in SACCT_FIELDS
    assert SACCT_FIELDS[-1] == "Comment"


def test_sacct_by_name_always_has_a_start_time() -> None:
    argv = argv_of(build_sacct_by_name("vcloud-stage1", since="now-14days", user="vcloud"))
    assert "--starttime=now-14days" in argv and "--name=vcloud-stage1" in argv
    with pytest.raises(TypeError):
        build_sacct_by_name("vcloud-stage1")  # type: ignore[call-arg]
    with pytest.raises(ValidationError, match="since"):
        build_sacct_by_name("vcloud-stage1", since="last week")


def test_sacct_finished_states_exit_codes_and_signals() -> None:
    rows = {r.job_id: r for r in parse_sacct(raw("sacct_finished.txt"))}
    failed = rows[JOBS["FAILED_ID"]]
    assert (failed.state, failed.exit_code, failed.signal) == ("FAILED", 3, 0)
    killed = rows[JOBS["OOM_ID"]]
    assert (killed.state, killed.exit_code, killed.signal) == ("FAILED", 0, 9)
    assert rows[JOBS["TIMEOUT_ID"]].state == "TIMEOUT"
    assert rows[JOBS["TIMEOUT_ID"]].time_limit_s == 60
    assert rows[JOBS["CANCEL_ID"]].state == "CANCELLED by 1001"
    completed = rows[JOBS["COMPLETED_ID"]]
    assert completed.state == "COMPLETED" and gpus_from_tres(completed.alloc_tres) == 1
    assert completed.comment is not None and json.loads(completed.comment)["task"] == "completed"
    assert completed.elapsed_s == 3 and completed.partition == "small-g" and completed.account == "vcloud_local"


def test_requeued_job_newest_run_decides() -> None:
    rows = parse_sacct(raw("sacct_requeue.txt"))
    job = JOBS["REQUEUE_ID"]
    runs = runs_of(rows, job)
    assert [r.state for r in runs] == ["REQUEUED", "REQUEUED", "COMPLETED"]
    assert latest_job_rows(rows)[job].state == "COMPLETED"
    # Rows out of order still resolve to the newest Submit time.
    assert latest_job_rows(list(reversed(rows)))[job].state == "COMPLETED"
    single = parse_sacct(raw("sacct_requeue_nodup.txt"))
    assert len(single) == 1 and single[0].state == "COMPLETED"


def test_equal_submit_times_go_to_the_later_row() -> None:
    line = raw("sacct_requeue.txt").splitlines()[0]
    parts = line.split("|")
    first = "|".join([*parts[:3], "PREEMPTED", *parts[4:]])
    second = "|".join([*parts[:3], "PENDING", *parts[4:]])
    assert latest_job_rows(parse_sacct(f"{first}\n{second}\n"))[parts[0]].state == "PENDING"


def test_array_elements_and_steps_are_not_confused() -> None:
    rows = parse_sacct(raw("sacct_array_steps.txt"))
    array = JOBS["ARRAY_ID"]
    jobs = latest_job_rows(rows)
    assert sorted(jobs) == [f"{array}_0", f"{array}_1", f"{array}_2"]
    assert all(r.name == "gc-array" for r in jobs.values())
    steps = steps_of(rows, f"{array}_1")
    assert sorted(s.step for s in steps) == ["0", "batch"]
    assert all(s.is_step and s.job == f"{array}_1" for s in steps)
    # The raw id of one element equals the array id: it must not be mistaken for the array itself.
    assert any(r.job_id_raw == array and r.job_id != array for r in jobs.values())


def test_pending_array_range_row() -> None:
    rows = parse_sacct(raw("sacct_pending.txt"))
    ranges = [r for r in rows if r.id_parts.is_array_range]
    assert len(ranges) == 1 and ranges[0].reason == "JobArrayTaskLimit" and ranges[0].node_list is None


@pytest.mark.parametrize("name", ["sacct_requeue.txt", "sacct_array_steps.txt", "sacct_finished.txt",
                                  "sacct_pending.txt", "sacct_by_name.txt"])
def test_rows_by_job_groups_what_runs_of_and_steps_of_find(name: str) -> None:
    rows = parse_sacct(raw(name))
    grouped = rows_by_job(rows)
    assert grouped and sorted(grouped) == sorted(latest_job_rows(rows))
    for job_id, job in grouped.items():
        assert job.runs == runs_of(rows, job_id)
        assert job.steps == steps_of(rows, job_id)
        assert job.latest == latest_job_rows(rows)[job_id]
    # In any order sacct may print them, the newest run is the latest.
    reordered = rows_by_job(list(reversed(rows)))
    assert {k: v.latest.row_index for k, v in reordered.items()} == {k: v.latest.row_index for k, v in grouped.items()}
