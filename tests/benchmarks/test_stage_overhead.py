"""The stage-overhead benchmark's figures from captured ``sacct`` rows and task instances (no cluster)."""

from __future__ import annotations

import time

from benchmarks.stage_overhead import (aggregate, compare, log_events, parse_sacct, percentile, run_figures,
                                       watch_timeline)

SACCT = """\
101|vcloud_training.prepare_data.aaaa|2026-11-27T04:50:01|2026-11-27T04:50:02|2026-11-27T04:50:20|COMPLETED
102|vcloud_training.preflight_imports.bbbb|2026-11-27T04:50:31|2026-11-27T04:50:31|2026-11-27T04:50:40|COMPLETED
103|vcloud_training.stage0.cccc|2026-11-27T04:50:55|Unknown|Unknown|PENDING
"""


def _local(text: str) -> float:
    return time.mktime(time.strptime(text, "%Y-%m-%dT%H:%M:%S"))


def _utc(text: str) -> str:
    """The REST form of a local sacct time (the API answers in UTC)."""
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(_local(text))) + ".000000Z"


def test_sacct_rows_parse_with_unknown_times() -> None:
    jobs = parse_sacct(SACCT + "garbage\n")
    assert [j.job_id for j in jobs] == ["101", "102", "103"]
    assert jobs[0].submit == _local("2026-11-27T04:50:01") and jobs[0].end == _local("2026-11-27T04:50:20")
    assert jobs[2].start is None and jobs[2].end is None and jobs[2].state == "PENDING"


def test_a_run_splits_its_gaps_by_the_task_instances_times() -> None:
    jobs = parse_sacct(SACCT)
    by_task = {"prepare_data": [jobs[0]], "preflight_imports": [jobs[1]], "stage0": [jobs[2]]}
    tis = {
        "plan": {"start_date": _utc("2026-11-27T04:49:45"), "end_date": _utc("2026-11-27T04:49:48")},
        "prepare_data": {"start_date": _utc("2026-11-27T04:49:58"), "end_date": _utc("2026-11-27T04:50:25")},
        "preflight_imports": {"start_date": _utc("2026-11-27T04:50:28"),
                              "end_date": _utc("2026-11-27T04:50:50")},
        "stage0": {"start_date": _utc("2026-11-27T04:50:52"), "end_date": None},
    }
    figures = run_figures(_local("2026-11-27T04:49:40"), by_task, tis)

    first = figures["first_job"]
    assert first["task"] == "prepare_data" and first["seconds"] == 21.0
    assert first["to_plan_start"] == 5.0 and first["submitting"] == 3.0
    assert first["tasks"]["plan"] == {"queued_after_previous": 5.0, "ran": 3.0}
    assert [g["gap"] for g in figures["gaps"]] == ["prepare_data->preflight_imports",
                                                   "preflight_imports->stage0"]
    gap = figures["gaps"][0]
    assert (gap["seconds"], gap["noticed"], gap["scheduled"], gap["submitting"]) == (11.0, 5.0, 3.0, 3.0)
    assert figures["gaps"][1]["seconds"] == 15.0 and figures["gaps"][1]["noticed"] == 10.0


def test_percentiles_are_measured_values_and_targets_are_judged_on_p95() -> None:
    assert percentile([], 95) is None
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0
    assert percentile([float(n) for n in range(1, 21)], 95) == 19.0
    runs = [{"run_id": "r", "first_job": {"seconds": 40.0},
             "gaps": [{"gap": "a->b", "seconds": s, "noticed": s - 2, "scheduled": 1.0, "submitting": 1.0}
                      for s in (5.0, 8.0, 30.0)]}]
    result = aggregate(runs, first_target=60, gap_target=10)
    assert result["first_job"]["holds"] is True and result["first_job"]["p95"] == 40.0
    assert result["stage_gap"]["holds"] is False and result["stage_gap"]["p50"] == 8.0
    assert result["stage_gap"]["parts"]["noticed"]["p95"] == 28.0
    assert [g["run"] for g in result["gaps"]] == ["r", "r", "r"]


def test_the_baseline_is_compared_as_how_many_times_longer_it_took() -> None:
    def side(first: list[float], gaps: list[float]) -> dict:
        runs = [{"run_id": "r", "first_job": {"seconds": f},
                 "gaps": [{"gap": "a->b", "seconds": g, "noticed": None, "scheduled": None, "submitting": None}
                          for g in gaps]} for f in first]
        return aggregate(runs[:1], 60, 10) | {"first_job": aggregate(runs, 60, 10)["first_job"]}

    shipped, baseline = side([10.0, 12.0], [4.0, 6.0]), side([10.0, 11.0], [11.0, 18.0])
    assert compare(shipped, baseline) == {"first_job_p50": 1.0, "first_job_p95": 0.92,
                                          "stage_gap_p50": 2.75, "stage_gap_p95": 3.0}
    assert compare(shipped, side([], []))["stage_gap_p95"] is None


TASK_LOG = """\
{"timestamp":"2026-11-27T04:43:58.149133Z","level":"info","event":"::group::Pre Execute"}
{"timestamp":"2026-11-27T04:43:59.666460Z","level":"info","event":"Submitted job 5350 (vcloud_training.prepare_data.c54ae3a7e5) on vcloud_local_cluster"}
{"timestamp":"2026-11-27T04:43:59.736918Z","level":"info","event":"Pausing task as DEFERRED. "}
not json
{"timestamp":"2026-11-27T04:44:20.780957Z","level":"info","event":"::group::Pre Execute"}
{"timestamp":"2026-11-27T04:44:23.090227Z","level":"info","event":"::endgroup::"}
""".splitlines()
TRIGGER_LOG = """\
{"timestamp":"2026-11-27T04:44:01.593203Z","level":"info","event":"trigger vcloud_training/r/prepare_data/-1/1 (ID 1) starting"}
{"timestamp":"2026-11-27T04:44:19.255377Z","level":"info","event":"Connected to vcloud@127.0.0.1:2222 (connection 'c')"}
{"timestamp":"2026-11-27T04:44:19.645391Z","level":"info","event":"Job 5350 COMPLETED on nid005001 exit code 0"}
{"timestamp":"2026-11-27T04:44:19.664667Z","level":"info","event":"Trigger fired event"}
""".splitlines()


def test_the_watch_timeline_comes_from_the_task_and_trigger_logs() -> None:
    timeline = watch_timeline(log_events(TASK_LOG), log_events(TRIGGER_LOG))
    start = _iso_utc("2026-11-27T04:43:59.736918")
    assert timeline["deferred"] == start
    assert round(timeline["first_poll"] - timeline["trigger_started"], 3) == 17.662
    assert round(timeline["resumed"] - timeline["fired"], 3) == 1.116
    assert round(timeline["ended"] - timeline["resumed"], 3) == 2.309
    jobs = parse_sacct("1|n|2026-11-27T04:43:59|2026-11-27T04:44:00|2026-11-27T04:44:10|COMPLETED\n"
                       "2|m|2026-11-27T04:44:25|2026-11-27T04:44:25|2026-11-27T04:44:30|COMPLETED")
    end = _local("2026-11-27T04:44:10")
    [gap] = run_figures(start - 5, {"prepare_data": [jobs[0]], "preflight_imports": [jobs[1]]}, {},
                        {"prepare_data": timeline})["gaps"]
    assert gap["watch"]["end_to_event"] == round(timeline["fired"] - end, 1)
    assert gap["watch"]["deferral_to_first_poll"] == 19.5 and gap["watch"]["event_to_resume"] == 1.1
    assert gap["noticed"] is None  # no task instance times given


def _iso_utc(text: str) -> float:
    from datetime import datetime, timezone

    return datetime.fromisoformat(text).replace(tzinfo=timezone.utc).timestamp()
