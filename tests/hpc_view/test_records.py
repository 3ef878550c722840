"""Pure parts of the HPC view: records from XComs, the watch notes' states and their age, charts."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from hpc_view.charts import bars_svg, burndown_svg
from hpc_view.records import XComRow, profile_budget, records_from_xcoms

T = datetime(2026, 11, 21, 12, tzinfo=timezone.utc)


def _rows() -> list[XComRow]:
    done = {"job_id": "7", "job_ids": ["6", "7"], "state": "COMPLETED", "gpu_hours": 2.0, "elapsed_s": 90061,
            "job": "stage1", "run": "full", "profile": "lumi",
            "submissions": [{"job_id": "6", "number": 1, "cause": "initial"},
                            {"job_id": "7", "number": 2, "cause": "PREEMPTED"}]}
    return [
        XComRow("vcloud_training", "r1", "stage1", -1, "slurm_job_id", "7", "success", end_date=T),
        XComRow("vcloud_training", "r1", "stage1", -1, "return_value", done, "success", end_date=T),
        XComRow("vcloud_training", "r1", "stage2", -1, "slurm_job_id", "8", "deferred", run_conf={"profile": "lumi"}),
        XComRow("vcloud_training", "r1", "plan", -1, "return_value", {"job_id": "x"}, "success"),
    ]


def test_records_keep_resubmissions_and_take_the_profile_from_the_run() -> None:
    records = {r.task_id: r for r in records_from_xcoms(_rows())}
    assert set(records) == {"stage1", "stage2"}
    assert records["stage1"].job_ids == ("6", "7") and records["stage1"].resubmissions == 1
    assert records["stage1"].to_json()["elapsed"] == "1-01:01:01"
    assert records["stage2"].profile == "lumi" and records["stage2"].state is None
    budget = profile_budget("lumi", records.values(), allocation=100_000,
                            allocation_from="profile lumi billing.allocation")
    assert budget.total == 2.0 and budget.left == 99_998.0 and budget.by_stage == {"stage1": 2.0}
    assert budget.source == "profile" and budget.to_json()["allocation_from"] == "profile lumi billing.allocation"
    assert budget.account_used is None


def _slurm_allocation(limit: float, used: float) -> dict:
    """An ``Allocation.to_json()`` read from Slurm (1 GPU-hour = 60 billing-minutes)."""
    return {"source": "slurm", "unit": "GPU-hours", "limit": limit, "used": used, "held": 0.0,
            "left": limit - used, "remaining": limit - used, "note": "",
            "limit_from": f"Slurm association limit GrpTRESMins billing={limit * 60:.0f} on account project_465002500",
            "used_from": f"Slurm GrpTRESRaw billing={used * 60:.0f} of account project_465002500, every job of the account",
            "held_from": "Slurm TRESRunMins billing=0 of the account's running jobs",
            "slurm": {"account": "project_465002500", "tres": "billing", "limit": limit * 60, "used": used * 60,
                      "running": 0}}


def test_the_budget_is_slurms_limit_and_account_usage_where_the_jobs_recorded_them() -> None:
    # stage0 ran before the records carried the allocation; stage1 and stage2 read Slurm's figures.
    def done(task: str, job: str, hours: float, at: datetime, allocation: dict | None) -> list[XComRow]:
        value = {"job_id": job, "job_ids": [job], "state": "COMPLETED", "gpu_hours": hours, "job": task,
                 "run": "full", "profile": "lumi", "allocation": allocation}
        return [XComRow("vcloud_training", "r1", task, -1, "slurm_job_id", job, "success", end_date=at),
                XComRow("vcloud_training", "r1", task, -1, "return_value", value, "success", end_date=at)]

    rows = (done("stage0", "1", 10.0, T, None)
            + done("stage1", "2", 20.0, T.replace(hour=13), _slurm_allocation(90_000, 50_000))
            + done("stage2", "3", 30.0, T.replace(hour=14), _slurm_allocation(90_000, 50_100)))
    budget = profile_budget("lumi", records_from_xcoms(rows), allocation=100_000,
                            allocation_from="profile lumi billing.allocation")
    assert budget.source == "slurm" and budget.allocation == 90_000
    assert budget.allocation_from == "Slurm association limit GrpTRESMins billing=5400000 on account project_465002500"
    assert budget.account_used == 50_100 and budget.left == 39_900  # every job of the account, not only ours
    assert budget.total == 60.0 and budget.as_of == T.replace(hour=14)
    assert [p.left for p in budget.burn] == [89_990.0, 40_000.0, 39_900.0]
    assert budget.to_json()["used_from"].startswith("Slurm GrpTRESRaw billing=3006000 of account")
    assert "GPU-hours left of 90,000.0 (Slurm limit): 39,900.0" in burndown_svg(budget)


def test_the_view_paces_the_allocation_by_the_jobs_of_the_last_week() -> None:
    from datetime import date, timedelta

    from hpc_view.view import ProfileInfo, build_view

    def done(task: str, job: str, hours: float, at: datetime) -> list[XComRow]:
        value = {"job_id": job, "job_ids": [job], "state": "COMPLETED", "gpu_hours": hours, "job": task,
                 "run": "full", "profile": "lumi", "elapsed_s": 3600}
        return [XComRow("vcloud_training", "r1", task, -1, "slurm_job_id", job, "success", end_date=at),
                XComRow("vcloud_training", "r1", task, -1, "return_value", value, "success", end_date=at)]

    rows = done("stage0", "1", 500.0, T - timedelta(days=20)) + done("stage1", "2", 140.0, T - timedelta(days=2))
    info = ProfileInfo("lumi", 10_000.0, "GPU-hours", "lumi", allocation_ends=date(2027, 1, 30),
                       pace_margin_percent=20)
    view = build_view(records_from_xcoms(rows), info=lambda _: info, now=T.timestamp())
    pace = view["profiles"][0]["budget"]["pace"]
    # 140 in the last week (the 500 of three weeks ago are not this week's); 9,360 left over 10 weeks
    assert (pace["per_week"], pace["left"], pace["ends_on"], pace["verdict"]) == (140.0, 9_360.0, "2027-01-30", "under")
    assert pace["planned_per_week"] == pytest.approx(9_360 / (70.5 / 7))
    assert pace["words"].startswith("under-spending: 140.0 GPU-hours/week over the last 7 day(s), while 929.4 GPU-hours/week")
    unpaced = build_view(records_from_xcoms(rows), info=lambda _: ProfileInfo("lumi", 10_000.0, "GPU-hours", "lumi"),
                         now=T.timestamp())
    assert unpaced["profiles"][0]["budget"]["pace"]["verdict"] is None


def test_a_waiting_tasks_row_says_why_its_job_pends_and_when_it_may_start_from_the_watch_note() -> None:
    note = {"job_id": "8", "log_path": None, "log_offset": 0, "state": "PENDING", "reason": "Priority",
            "expected_start": "2026-11-27T14:05:00"}
    rows = [*_rows(), XComRow("vcloud_training", "r1", "stage2", -1, "slurm_watch", note, "deferred")]
    waiting = {r.task_id: r for r in records_from_xcoms(rows)}["stage2"]
    assert waiting.pending is not None and waiting.pending.code == "Priority"
    assert waiting.pending.words == "waiting for higher-priority jobs (Priority); expected to start 2026-11-27 14:05"
    assert waiting.to_json()["pending"]["expected_start"] == "2026-11-27T14:05:00"
    running = {**note, "state": "RUNNING", "reason": None}
    rows = [*_rows(), XComRow("vcloud_training", "r1", "stage2", -1, "slurm_watch", running, "deferred")]
    assert {r.task_id: r for r in records_from_xcoms(rows)}["stage2"].pending is None


def test_a_task_whose_job_waits_out_a_maintenance_window_names_it_as_its_watch_did() -> None:
    window = ("waits out the maintenance window 'lumi-maint' from 2026-12-09 08:00 to 2026-12-09 20:00 on "
              "nid[005001-005003] (the cluster's local time)")
    note = {"job_id": "8", "log_path": None, "log_offset": 0, "state": "PENDING",
            "reason": "ReqNodeNotAvail, Reserved for maintenance", "expected_start": None, "maintenance": window}
    rows = [*_rows(), XComRow("vcloud_training", "r1", "stage2", -1, "slurm_watch", note, "deferred")]
    waiting = {r.task_id: r for r in records_from_xcoms(rows)}["stage2"]
    assert waiting.pending is not None and waiting.pending.code == "ReqNodeNotAvail"
    assert waiting.pending.words.endswith(f"(ReqNodeNotAvail, Reserved for maintenance); {window}")
    assert waiting.to_json()["pending"]["words"] == waiting.pending.words


def test_a_tasks_row_names_the_nodes_its_job_was_submitted_without_and_why() -> None:
    from slurm_provider.bad_nodes import NodeFault, left_out_xcom

    fault = NodeFault("nid005001", "5", "exit 89", "2026-11-21T11:58:00")
    rows = [*_rows(),
            XComRow("vcloud_training", "r1", "stage2", -1, "slurm_left_out", left_out_xcom("8", {"nid005001": fault}),
                    "deferred"),
            XComRow("vcloud_training", "r1", "stage1", -1, "slurm_left_out", left_out_xcom("6", {"nid005001": fault}),
                    "success")]
    records = {r.task_id: r for r in records_from_xcoms(rows)}
    assert records["stage2"].to_json()["left_out_words"] == "nid005001 (job 5: exit 89)"
    assert records["stage1"].left_out == {} and records["stage1"].to_json()["left_out_words"] == ""  # job 6's, not 7's


def test_a_waiting_tasks_row_gives_the_commands_to_reach_its_job_by_hand() -> None:
    from slurm_provider import JobHandles

    login = ("ssh", "-F", "/etc/ssh/cluster.conf", "lumi")
    now = JobHandles.of(login, "8", "/scratch/logs/r1/stage2.8.out").to_json()
    earlier = JobHandles.of(login, "6", "/scratch/logs/r1/stage1.6.out").to_json()
    rows = [*_rows(),
            XComRow("vcloud_training", "r1", "stage2", -1, "slurm_job_handles", now, "deferred"),
            XComRow("vcloud_training", "r1", "stage1", -1, "slurm_job_handles", earlier, "success")]
    records = {r.task_id: r for r in records_from_xcoms(rows)}
    shown = records["stage2"].to_json()["handles"]
    assert shown["shell"] == "ssh -t -F /etc/ssh/cluster.conf lumi 'srun --jobid=8 --overlap --pty bash -l'"
    assert shown["follow"] == "ssh -F /etc/ssh/cluster.conf lumi 'tail -n 50 -F /scratch/logs/r1/stage2.8.out'"
    assert shown["cancel"] == "ssh -F /etc/ssh/cluster.conf lumi 'scancel 8'"
    assert records["stage1"].to_json()["handles"] is None  # ended: nothing to reach
    stale = [*_rows(), XComRow("vcloud_training", "r1", "stage2", -1, "slurm_job_handles", earlier, "deferred")]
    assert {r.task_id: r for r in records_from_xcoms(stale)}["stage2"].handles is None  # another job's


def test_charts_escape_labels_and_show_the_numbers() -> None:
    budget = profile_budget("lumi", records_from_xcoms(_rows()), allocation=100_000)
    svg = burndown_svg(budget)
    assert svg.startswith("<svg") and "GPU-hours left of 100,000.0: 99,998.0000" in svg
    bars = bars_svg("per stage", [("<stage>", 1.5)], "GPU-hours")
    assert "&lt;stage&gt;" in bars and "<stage>" not in bars and "1.5000" in bars


def test_a_task_whose_login_node_is_down_says_since_when_and_what_its_job_was_doing() -> None:
    since = datetime(2026, 11, 21, 9, 2, tzinfo=timezone.utc)
    note = {"job_id": "8", "log_path": "/l/8.out", "log_offset": 10, "state": "RUNNING", "err_offset": 0,
            "unreachable_since": since.timestamp()}
    rows = [XComRow("vcloud_training", "r1", "stage2", -1, "slurm_job_id", "8", "deferred"),
            XComRow("vcloud_training", "r1", "stage2", -1, "slurm_watch", note, "deferred"),
            XComRow("vcloud_training", "r1", "stage3", -1, "slurm_job_id", "9", "deferred"),
            XComRow("vcloud_training", "r1", "stage3", -1, "slurm_watch", {**note, "job_id": "9",
                                                                            "unreachable_since": None}, "deferred")]
    records = {r.task_id: r for r in records_from_xcoms(rows)}
    down = records["stage2"].to_json()
    assert down["unreachable_since"] == since.isoformat()
    assert down["state_description"].startswith("Cluster unreachable since ")
    assert ("09:02 UTC: the task waits for its login node; the job runs on (last seen RUNNING)."
            in down["state_description"])
    assert records["stage3"].unreachable_since is None  # the node answers: the usual words
    assert records["stage3"].state_description == "RUNNING, as its watch last noted it."


def test_a_waiting_tasks_row_says_how_old_its_watchs_last_poll_is() -> None:
    polled = datetime(2026, 11, 27, 4, 50, tzinfo=timezone.utc)
    note = {"job_id": "8", "log_path": None, "log_offset": 0, "state": "RUNNING", "polled_at": polled.timestamp()}
    rows = [*_rows(), XComRow("vcloud_training", "r1", "stage2", -1, "slurm_watch", note, "deferred")]
    waiting = {r.task_id: r for r in records_from_xcoms(rows)}["stage2"]
    row = waiting.to_json(now=polled.timestamp() + 12)
    assert (row["last_seen"], row["as_of_s"], row["polled_at"]) == ("RUNNING", 12.0, polled.isoformat())
    assert row["state"] is None  # the final state is the operator's record, not the watch's
    assert row["state_description"] == "RUNNING as of 12 s ago (the watch's last poll)."

    outage = {**note, "unreachable_since": polled.timestamp() + 60}
    rows = [*_rows(), XComRow("vcloud_training", "r1", "stage2", -1, "slurm_watch", outage, "deferred")]
    down = {r.task_id: r for r in records_from_xcoms(rows)}["stage2"].to_json(now=polled.timestamp() + 300)
    assert down["state_description"] == ("Cluster unreachable since 04:51 UTC: the task waits for its login node; "
                                         "the job runs on (last seen RUNNING 5 min ago).")

    other_job = {**note, "job_id": "7"}  # a note of the try's earlier job says nothing about this one
    rows = [*_rows(), XComRow("vcloud_training", "r1", "stage2", -1, "slurm_watch", other_job, "deferred")]
    fresh = {r.task_id: r for r in records_from_xcoms(rows)}["stage2"].to_json(now=polled.timestamp())
    assert fresh["last_seen"] is None and fresh["as_of_s"] is None
    assert fresh["state_description"] == "Submitted; the task waits for the job (its watch has not noted a poll yet)."


def test_a_waiting_tasks_record_carries_the_files_its_watch_follows_and_its_row_names_them() -> None:
    state = {"loss": [[1, 0.5]], "val_psnr": []}
    files = [{"path": "/out/full/stage2/metrics.jsonl", "fold": "f.fold", "offset": 90, "state": state,
              "rest": "", "read_at": T.timestamp(), "problem": None}]
    followed = {"job_id": "8", "files": files}
    rows = [*_rows(), XComRow("vcloud_training", "r1", "stage2", -1, "slurm_followed", followed, "deferred")]
    waiting = {r.task_id: r for r in records_from_xcoms(rows)}["stage2"]
    assert waiting.followed == {"/out/full/stage2/metrics.jsonl": files[0]}
    assert waiting.to_json()["followed"] == ["/out/full/stage2/metrics.jsonl"]  # the states go to the curves

    for stale in ({**followed, "job_id": "7"},  # of the try's earlier job
                  {"job_id": "8", "files": "not a list"}):
        rows[-1] = XComRow("vcloud_training", "r1", "stage2", -1, "slurm_followed", stale, "deferred")
        assert {r.task_id: r for r in records_from_xcoms(rows)}["stage2"].followed == {}
    rows[-1] = XComRow("vcloud_training", "r1", "stage2", -1, "slurm_followed", followed, "success")
    assert {r.task_id: r for r in records_from_xcoms(rows)}["stage2"].followed == {}  # no longer waiting


def test_each_run_and_stage_shows_what_its_gpu_hours_bought_on_validation() -> None:
    def done(task: str, job: str, hours: float, at: datetime, **trained: object) -> list[XComRow]:
        value = {"job_id": job, "job_ids": [job], "state": "COMPLETED", "gpu_hours": hours, "job": task,
                 "run": "full", "profile": "lumi", **trained}
        return [XComRow("vcloud_training", "r1", task, -1, "slurm_job_id", job, "success", end_date=at),
                XComRow("vcloud_training", "r1", task, -1, "return_value", value, "success", end_date=at)]

    rows = (done("stage0", "1", 4.0, T, stop_reason="epochs")
            + done("stage1", "2", 20.0, T.replace(hour=13), validation_gain=1.25, gain_metric="psnr",
                   stop_reason="epochs")
            + done("stage2", "3", 8.0, T.replace(hour=14), validation_gain=0.0, gain_metric="psnr",
                   stop_reason="patience"))
    records = {r.task_id: r for r in records_from_xcoms(rows)}
    assert records["stage1"].to_json()["gain_per_gpu_hour"] == 0.0625
    rows_by_stage = {row["stage"]: row for row in
                     profile_budget("lumi", records.values(), allocation=100.0).to_json()["by_run_stage"]}
    assert rows_by_stage["stage1"] == {"run_id": "r1", "stage": "stage1", "gpu_hours": 20.0, "validation_gain": 1.25,
                                       "gain_metric": "psnr", "gain_per_gpu_hour": 0.0625, "stop_reason": "epochs"}
    assert rows_by_stage["stage2"]["gain_per_gpu_hour"] == 0.0 and rows_by_stage["stage2"]["stop_reason"] == "patience"
    assert rows_by_stage["stage0"]["validation_gain"] is None, "stage 0 scores no start"


def test_the_budget_follows_the_site_commands_figures_where_the_jobs_recorded_them() -> None:
    run = "lumi-allocations -p project_465002500"
    site = {"source": "command", "unit": "GPU-hours", "limit": 100_000.0, "used": 8123.5, "held": 0.0,
            "left": 91_876.5, "remaining": 91_876.5, "note": "",
            "limit_from": f"site command `{run}`, data updated 2026-11-27 23:10:04.551093",
            "used_from": f"`{run}`: every job of the project, as the site bills it",
            "held_from": "this project's queued and running jobs", "slurm": None}
    value = {"job_id": "2", "job_ids": ["2"], "state": "COMPLETED", "gpu_hours": 4.0, "job": "stage1",
             "run": "full", "profile": "lumi", "allocation": site}
    rows = [XComRow("vcloud_training", "r1", "stage1", -1, "slurm_job_id", "2", "success", end_date=T),
            XComRow("vcloud_training", "r1", "stage1", -1, "return_value", value, "success", end_date=T)]
    budget = profile_budget("lumi", records_from_xcoms(rows), allocation=100_000,
                            allocation_from="profile lumi billing.allocation")
    assert budget.source == "command" and budget.allocation_from.startswith(f"site command `{run}`")
    assert budget.account_used == 8123.5 and budget.left == 91_876.5 and budget.total == 4.0
    assert "GPU-hours left of 100,000.0 (site command): 91,876.5" in burndown_svg(budget)
