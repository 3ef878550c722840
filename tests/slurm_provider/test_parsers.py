"""Parsers, pinned to output captured from the real local Slurm 22.05 cluster (golden/capture.sh)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from slurm_provider import parsers
from slurm_provider.parsers import (
    SbatchRefused,
    SlurmOutputError,
    expand_hostlist,
    gpus_from_tres,
    is_invalid_job_id_error,
    latest_job_rows,
    parse_duration,
    parse_exit_code,
    parse_job_id,
    parse_log_chunk,
    parse_sacct,
    parse_sbatch_parsable,
    parse_sbatch_test_only,
    parse_scontrol_show_job,
    parse_sinfo_unavailable,
    parse_squeue,
    parse_tres,
    runs_of,
    steps_of,
)

GOLDEN = Path(__file__).parent / "golden"
_spec = importlib.util.spec_from_file_location("golden_make_expected", GOLDEN / "make_expected.py")
make_expected = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(make_expected)  # type: ignore[union-attr]

JOBS = dict(line.split("=", 1) for line in (GOLDEN / "jobs.env").read_text().split())


def raw(name: str) -> str:
    return (GOLDEN / name).read_text()


@pytest.mark.parametrize("name", make_expected.golden_names())
def test_golden(name: str) -> None:
    expected = json.loads((GOLDEN / f"{name}.json").read_text())
    assert json.loads(json.dumps(make_expected.expected_for(name))) == expected


def test_every_capture_has_an_expected_result() -> None:
    names = make_expected.golden_names()
    assert len(names) >= 30
    assert all((GOLDEN / f"{name}.json").exists() for name in names)


# --- the facts the golden files must show, spelled out ----------------------------------------------


def test_sbatch_parsable_plain_and_with_cluster() -> None:
    assert parse_sbatch_parsable(raw("sbatch_completed.txt")).job_id == JOBS["COMPLETED_ID"]
    with_cluster = parse_sbatch_parsable(raw("sbatch_cluster.txt"))
    assert (with_cluster.job_id, with_cluster.cluster) == (JOBS["CLUSTER_ID"], "vcloud-local")
    warned = parse_sbatch_parsable("sbatch: warning: can't honor --ntasks-per-node\n12345\n")
    assert warned.job_id == "12345" and warned.cluster is None


def test_sbatch_refusals_carry_slurms_message() -> None:
    with pytest.raises(SbatchRefused) as caught:
        parse_sbatch_parsable("", raw("sbatch_bad_account.stderr.txt"))
    assert caught.value.message == "Batch job submission failed: Invalid account or account/partition combination specified"
    with pytest.raises(SbatchRefused, match="invalid partition specified: nosuch-g"):
        parse_sbatch_test_only(raw("sbatch_test_only_bad_partition.stderr.txt"))


def test_sbatch_test_only_estimate() -> None:
    estimate = parse_sbatch_test_only(raw("sbatch_test_only.stderr.txt"))
    assert estimate.partition == "small-g" and estimate.nodes == "vcnode1" and estimate.processors == 1
    assert estimate.start is not None and estimate.start.startswith("20")


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


def test_scontrol_records() -> None:
    record = parse_scontrol_show_job(raw("scontrol_requeued.txt"))[0]
    assert record["JobId"] == JOBS["REQUEUE_ID"]
    assert (record["Restarts"], record["Requeue"], record["BatchFlag"]) == ("1", "1", "1")
    assert record["JobState"] == "PENDING" and record["Reason"] == "BeginTime"
    assert record["Command"] == "(null)", "the script came on stdin"
    assert record["StdOut"].endswith(f"/gc-requeue_{JOBS['REQUEUE_ID']}.out")
    assert record["AllocNode:Sid"].startswith("localhost")
    assert json.loads(record["Comment"])["task"] == "requeue"
    pending = parse_scontrol_show_job(raw("scontrol_pending.txt"))[0]
    assert pending["Reason"] == "PartitionTimeLimit" and pending["Partition"] == "dev-g"
    array = parse_scontrol_show_job(raw("scontrol_array.txt"))
    assert {r["ArrayTaskId"] for r in array} >= {"0"}
    assert parse_scontrol_show_job(raw("scontrol_unknown.txt")) == []
    assert is_invalid_job_id_error(raw("scontrol_unknown.stderr.txt"))


def test_scontrol_values_with_spaces() -> None:
    line = "JobId=7 JobName=probe one JobState=RUNNING Reason=None StdOut=/home/a b/probe 7.out TRES=cpu=1,mem=1G,gres/gpu=2 Power="
    record = parse_scontrol_show_job(line)[0]
    assert record["JobName"] == "probe one"
    assert record["StdOut"] == "/home/a b/probe 7.out"
    assert record["TRES"] == "cpu=1,mem=1G,gres/gpu=2"
    assert record["Power"] == ""
    with pytest.raises(SlurmOutputError):
        parse_scontrol_show_job("slurm_load_jobs error: Invalid job id specified")


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


# --- small values ---------------------------------------------------------------------------------


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


def test_comment_with_separators_is_joined_back() -> None:
    line = raw("sacct_by_name.txt").splitlines()[0]
    head, _, _ = line.rpartition("|")
    row = parse_sacct(f"{head}|note|with|pipes\n")[0]
    assert row.comment == "note|with|pipes"


def test_hostlists_and_sinfo() -> None:
    assert expand_hostlist("nid[005001-005003,005007]") == ["nid005001", "nid005002", "nid005003", "nid005007"]
    assert expand_hostlist("vcnode1,gpu[1-2]") == ["vcnode1", "gpu1", "gpu2"]
    assert expand_hostlist("rack[1-2]-node[01-02]") == ["rack1-node01", "rack1-node02", "rack2-node01", "rack2-node02"]
    assert expand_hostlist("") == []
    assert parse_sinfo_unavailable(raw("sinfo_unavailable.txt")) == {}
    assert parse_sinfo_unavailable("nid[005001-005002]|drained|bad GPU\nnid005010|down*|Not responding\n") == {
        "nid005001": "drained",
        "nid005002": "drained",
        "nid005010": "down*",
    }


def test_progress() -> None:
    assert parsers.parse_progress(raw("read_progress.txt")).startswith('{"epoch": 3')
    assert parsers.parse_progress(raw("read_progress_missing.txt")) is None


def test_sshare_gives_the_accounts_limit_usage_and_what_running_jobs_hold() -> None:
    # Captured with one --gpus=1 -t 5 job running after a 65-s --gpus=1 job: billing counts GPUs.
    rows = parsers.parse_sshare(raw("sshare_account.txt"))
    assert [(row.account, row.user) for row in rows] == [("vcloud_local", None), ("vcloud_local", "vcloud")]
    account = parsers.account_tres_minutes(rows, "vcloud_local")
    assert (account.limit, account.used, account.running) == (60000, 1, 5)
    assert account.left == 60000 - 1 - 5
    assert rows[1].limits == {}  # the limit is the account's, not the user's
    assert parsers.account_tres_minutes(rows, "other_account") is None
    assert parsers.parse_sshare(raw("sshare_unknown_account.txt")) == []


def test_sshare_without_a_limit_and_unreadable_lines() -> None:
    line = raw("sshare_account.txt").splitlines()[0].replace("|billing=60000|", "||")
    account = parsers.account_tres_minutes(parsers.parse_sshare(line), "vcloud_local")
    assert account.limit is None and account.left is None and account.used == 1
    assert parsers.parse_tres_minutes("cpu=N(5),billing=N,gres/gpu=120") == {"gres/gpu": 120}
    gres = parsers.account_tres_minutes(parsers.parse_sshare(raw("sshare_account.txt")), "vcloud_local", "gres/gpu")
    assert (gres.limit, gres.used, gres.running) == (None, 1, 5)
    with pytest.raises(SlurmOutputError, match="sshare line has 2 fields"):
        parsers.parse_sshare("vcloud_local|billing=1\n")
