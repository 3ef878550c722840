"""squeue: the command lines and the queue's rows."""

from __future__ import annotations

import pytest

from slurm_provider.cli.sacct import parse_sacct
from slurm_provider.cli.squeue import (
    SQUEUE_FIELDS,
    build_squeue,
    build_squeue_account_jobs,
    build_squeue_by_name,
    parse_squeue,
)
from slurm_provider.cli.values import gpus_from_tres, is_invalid_job_id_error
from slurm_provider.validation import ValidationError
from providers.slurm.tests.cli.captured_output import JOBS, raw
from providers.slurm.tests.cli.command_words import argv_of


def test_squeue_many_ids_with_fixed_unambiguous_format() -> None:
    command = build_squeue([16082076, "16082077", "123_4", "16082076"])
    assert command.startswith("SLURM_TIME_FORMAT=standard squeue ")
    argv = argv_of(command)
    assert argv[:6] == ["squeue", "-h", "-r", "-t", "all", "--jobs=16082076,16082077,123_4"]
    fmt = argv[6].removeprefix("--Format=").split(",")
    assert [f.split(":")[0] for f in fmt] == list(SQUEUE_FIELDS)
    assert all(f.endswith(":|") for f in fmt[:-1]) and fmt[-1] == "Comment:"
    assert {"JobID", "State", "Reason", "RestartCnt", "Name", "Comment", "NodeList", "TimeUsed"} <= set(
        SQUEUE_FIELDS
    )
    with pytest.raises(ValidationError):
        build_squeue(["1;rm -rf /"])


def test_squeue_of_the_account_and_of_the_login_user() -> None:
    command = build_squeue_account_jobs("project_465002500")
    by_account, own = command.split(" && ")
    assert argv_of(by_account)[:6] == ["squeue", "-h", "-r", "-t", "all", "--account=project_465002500"]
    assert argv_of(own)[:6] == ["squeue", "-h", "-r", "-t", "all", "--me"]
    assert argv_of(by_account)[-1] == argv_of(own)[-1] == argv_of(build_squeue([1]))[-1]  # the same fields
    with pytest.raises(ValidationError):
        build_squeue_account_jobs("p; rm -rf /")


def test_squeue_by_name() -> None:
    argv = argv_of(build_squeue_by_name("vcloud-stage1", user="digifarm"))
    assert "--name=vcloud-stage1" in argv and "--user=digifarm" in argv and "-t" in argv


def test_squeue_rows() -> None:
    rows = {r.job_id: r for r in parse_squeue(raw("squeue_live.txt"))}
    throttled = JOBS["THROTTLED_ID"]
    elements = sorted(k for k in rows if k.startswith(f"{throttled}_"))
    assert elements == [f"{throttled}_{i}" for i in range(4)]
    assert rows[f"{throttled}_1"].job_id_raw == throttled and rows[f"{throttled}_1"].reason == "JobArrayTaskLimit"
    failed = rows[JOBS["FAILED_ID"]]
    assert (failed.state, failed.exit_code, failed.signal, failed.reason) == ("FAILED", 3, 0, "NonZeroExitCode")
    assert rows[JOBS["PARTLIMIT_ID"]].reason == "PartitionTimeLimit"
    assert rows[JOBS["PARTLIMIT_ID"]].time_limit_s == 3600
    assert rows[JOBS["TIMEOUT_ID"]].time_limit_s == 60
    assert "999999" not in rows
    requeued = parse_squeue(raw("squeue_requeued.txt"))[0]
    assert (requeued.state, requeued.restarts, requeued.reason) == ("PENDING", 1, "BeginTime")


def test_squeue_forgets_finished_jobs_and_unknown_ids() -> None:
    assert parse_squeue(raw("squeue_finished.txt")) == []
    assert parse_squeue(raw("squeue_unknown.txt")) == []
    assert is_invalid_job_id_error(raw("squeue_unknown.stderr.txt"))
    assert not is_invalid_job_id_error("")
    recent = {r.job_id: r for r in parse_squeue(raw("squeue_recent.txt"))}
    assert recent[JOBS["COMPLETED_ID"]].state == "COMPLETED"
    assert gpus_from_tres(recent[JOBS["COMPLETED_ID"]].tres) == 1


def test_comment_with_separators_is_joined_back() -> None:
    line = raw("sacct_by_name.txt").splitlines()[0]
    head, _, _ = line.rpartition("|")
    row = parse_sacct(f"{head}|note|with|pipes\n")[0]
    assert row.comment == "note|with|pipes"
