"""Retraining on the schedule, then a per-stage backfill, run by a real scheduler and triggerer.

A local deployment (API server, scheduler with the LocalExecutor, DAG processor and triggerer, each
a process of its own: ``support.deployment.LocalDeployment``) on a fresh home with
``VCLOUD_TRAINING_SCHEDULE=@daily`` and the local profile moved to a fresh project directory; its
scheduler runs the scheduled run and the backfills ``airflow backfill create`` records. Unpausing
the DAG must start exactly one scheduled run (catchup is off: not one per day since the start date)
that trains stages 0-2 of the tiny config (stage 3, without an unlabeled domain in the config, is
not submitted) and exports, with its own run name ``tiny-<YYYYMMDD>``. Then the per-stage backfill
of docs/training-dag.md (``airflow backfill create ... --reprocess-behavior completed
--dag-run-conf '{"stages": [2], "mode": "restart"}'``) over that day must retrain stage 2 alone,
from stage 1's ``best.pt``, in the same run directory. The same backfill made while the scheduled
run still trains finds its day's run in flight: no run, no job.
"""

from __future__ import annotations

import datetime as dt
import json
import shlex
from collections.abc import Iterator
from typing import Any

import pytest

from support.localcluster import LocalCluster, poll_until
from support.ports import free_port
from support.deployment import LocalDeployment, RestClient, airflow, airflow_env, dag_run_records, migrate

DAG_ID = "vcloud_training"
STAGES = ["stage0", "stage1", "stage2", "stage3"]
TERMINAL = {"success", "failed"}

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]


@pytest.fixture(scope="module")
def deployment(local_cluster: LocalCluster, cluster_connection: str,
               tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    home = tmp_path_factory.mktemp("scheduler-home")
    project_dir = local_cluster.test_dir()
    # A real triggerer runs the triggers here: keep the first status poll >= 10 s after deferral.
    env = airflow_env(home, free_port(), project_dir, schedule="@daily", first_poll_delay=10)
    migrate(env)
    with LocalDeployment(env, home) as airflow_deployment:
        yield {"env": airflow_deployment.env, "deployment": airflow_deployment,
               "api": airflow_deployment.api(), "project_dir": project_dir}


def _logs(deployment: dict[str, Any]) -> str:
    """The end of the scheduler's and the triggerer's logs, for a failure message."""
    components: LocalDeployment = deployment["deployment"]
    return f"{components.log_tail('scheduler')}\n{components.log_tail('triggerer')}"


def _runs(api: RestClient) -> list[dict[str, Any]]:
    return api.get(f"/api/v2/dags/{DAG_ID}/dagRuns?order_by=-run_after&limit=50")["dag_runs"]


def _wait_for_run(deployment: dict[str, Any], done: Any, *, what: str, timeout: float = 900) -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        return next((run for run in _runs(deployment["api"]) if done(run)), None)
    try:
        return poll_until(check, timeout=timeout, what=what, interval=5)
    except AssertionError as exc:
        raise AssertionError(f"{exc}; runs: {_runs(deployment['api'])}\n{_logs(deployment)}") from None


def _task_states(api: RestClient, run_id: str) -> dict[str, str]:
    tis = api.get(f"/api/v2/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances?limit=100")["task_instances"]
    return {ti["task_id"]: ti["state"] for ti in tis}


def _stat(cluster: LocalCluster, path: str) -> str:
    return cluster.ssh(f"stat -c '%s %Y' {shlex.quote(path)}").stdout.strip()


def test_schedule_retrains_once_and_a_backfill_retrains_one_stage(deployment: dict[str, Any],
                                                                 local_cluster: LocalCluster) -> None:
    api, env = deployment["api"], deployment["env"]
    poll_until(lambda: api.call("GET", f"/api/v2/dags/{DAG_ID}")[0] == 200, timeout=300, interval=2,
               what="the DAG processor to parse vcloud_training")
    details = api.get(f"/api/v2/dags/{DAG_ID}/details")
    assert details["is_paused"] is True and details["catchup"] is False, details
    assert details["timetable_summary"] == "0 0 * * *", details["timetable_summary"]  # @daily
    assert _runs(api) == []

    # Unpausing starts the retraining schedule: one scheduled run, for the latest day only.
    status, body = api.call("PATCH", f"/api/v2/dags/{DAG_ID}", {"is_paused": False})
    assert status == 200, body
    active = _wait_for_run(deployment, lambda r: r["run_type"] == "scheduled", what="the scheduled run to start")
    in_flight = _backfill_while_active(deployment, active["dag_run_id"])
    scheduled = _wait_for_run(deployment, lambda r: r["run_type"] == "scheduled" and r["state"] in TERMINAL,
                              what="the scheduled run to finish")
    assert scheduled["state"] == "success", (_task_states(api, scheduled["dag_run_id"]), _logs(deployment))
    assert len(_runs(api)) == 1, "catchup is off: one run, not one per day since the start date"
    run_id = scheduled["dag_run_id"]
    logical = dt.datetime.fromisoformat(scheduled["logical_date"].replace("Z", "+00:00"))
    states = _task_states(api, run_id)
    assert all(states[task] == "success" for task in ["stage0", "stage1", "stage2", "prepare_data", "export",
                                                      "summary"]), states
    assert states["stage3"] == "skipped", "the tiny config names no unlabeled domain for stage 3"

    [first] = dag_run_records(DAG_ID, env)
    plan = first["values"]["plan"]
    assert plan["request"]["run_name"] == f"tiny-{logical:%Y%m%d}", plan["request"]
    outputs = plan["outputs_dir"]
    assert outputs.endswith(f"/tiny-{logical:%Y%m%d}")
    stage1_best = _stat(local_cluster, f"{outputs}/stage1/best.pt")
    first_jobs = {task: (first["values"].get(task) or {}).get("job_ids", []) for task in STAGES}
    assert first_jobs["stage3"] == [] and "stage3" in first["values"]["summary"]["not_submitted"]

    # The per-stage backfill of docs/training-dag.md over that day: the completed run is processed again.
    day = logical.isoformat()
    _create_backfill(deployment, day)
    backfilled = _wait_for_run(deployment, lambda r: r["run_type"] == "backfill" and r["state"] in TERMINAL,
                               what="the backfill run to finish")
    assert backfilled["dag_run_id"] == run_id and backfilled["conf"] == {"stages": [2], "mode": "restart"}
    assert backfilled["state"] == "success", (_task_states(api, run_id), _logs(deployment))
    assert len(_runs(api)) == 1

    states = _task_states(api, run_id)
    assert {task: states[task] for task in STAGES} == {
        "stage0": "skipped", "stage1": "skipped", "stage2": "success", "stage3": "skipped"}, states
    assert states["prepare_data"] == "skipped" and states["export"] == "success", states

    [second] = dag_run_records(DAG_ID, env)
    assert second["values"]["plan"]["request"]["run_name"] == f"tiny-{logical:%Y%m%d}"
    assert second["values"]["plan"]["request"]["stages"] == [2]
    new_jobs = second["values"]["stage2"]["job_ids"]
    assert new_jobs and not set(new_jobs) & set(first_jobs["stage2"]), (new_jobs, first_jobs["stage2"])
    for job in new_jobs:
        assert local_cluster.wait_for_state(int(job), {"COMPLETED"}, timeout=120) == "COMPLETED"
    # Stage 2 trained again from stage 1's best.pt, which stayed as the scheduled run left it.
    assert _stat(local_cluster, f"{outputs}/stage1/best.pt") == stage1_best
    moved = local_cluster.ssh(f"ls -d {shlex.quote(outputs)}/stage2.replaced-* 2>/dev/null || true").stdout.split()
    assert len(moved) == 1, f"mode restart moves the old stage 2 aside once: {moved}"
    local_cluster.ssh(f"test -s {shlex.quote(outputs)}/stage2/best.pt && test -f {shlex.quote(outputs)}/stage2/COMPLETE")
    # Stage 3 was never trained: nothing of it to move aside (test_dag_on_cluster moves a trained one).
    assert local_cluster.ssh(f"ls -d {shlex.quote(outputs)}/stage3*", check=False).stdout.split() == []

    backfills = api.get(f"/api/v2/backfills?dag_id={DAG_ID}")["backfills"]
    assert [b["id"] for b in backfills] == [in_flight, backfills[1]["id"]], backfills
    assert backfills[1]["dag_run_conf"] == {"stages": [2], "mode": "restart"}, backfills
    # The backfill made while the scheduled run trained added no job: each stage has the scheduled
    # run's job(s) and the second backfill's stage 2 job(s), no more.
    for task in STAGES:
        jobs = local_cluster.jobs_writing(f"{outputs}/{task}")
        expected = first_jobs[task] + (new_jobs if task == "stage2" else [])
        assert sorted(jobs, key=int) == sorted(expected, key=int), (task, jobs, expected)


def _backfill_ids(api: RestClient) -> list[int]:
    return [b["id"] for b in api.get(f"/api/v2/backfills?dag_id={DAG_ID}")["backfills"]]


def _create_backfill(deployment: dict[str, Any], day: str, tries: int = 3) -> None:
    """``airflow backfill create`` of stage 2 over ``day``, as docs/training-dag.md gives it.

    The test deployment's SQLite refuses a write transaction at once ("database is locked"), busy wait
    or not, when the transaction read first and another connection wrote meanwhile (SQLite's deadlock
    avoidance); ``backfill create`` reads the day's runs, then clears them. Its transaction is rolled
    back whole, so where no backfill was created the command is run again, as a person would.
    PostgreSQL deployments do not refuse it."""
    api, env = deployment["api"], deployment["env"]
    argv = ("backfill", "create", "--dag-id", DAG_ID, "--from-date", day, "--to-date", day,
            "--reprocess-behavior", "completed", "--dag-run-conf", json.dumps({"stages": [2], "mode": "restart"}))
    before = _backfill_ids(api)
    for attempt in range(1, tries + 1):
        try:
            airflow(*argv, env=env, timeout=180)
            return
        except AssertionError as exc:
            if attempt == tries or "database is locked" not in str(exc) or _backfill_ids(api) != before:
                raise


def _backfill_while_active(deployment: dict[str, Any], run_id: str) -> int:
    """The per-stage backfill of docs/training-dag.md over the day of the scheduled run while that run still trains:
    Airflow leaves a run in flight alone, so the backfill creates no run and no job. Returns its id."""
    api, env = deployment["api"], deployment["env"]
    poll_until(lambda: any(state in ("deferred", "running") for task, state in _task_states(api, run_id).items()
                           if task in STAGES), timeout=900, interval=2, what="a stage of the scheduled run to train")
    day = _runs(api)[0]["logical_date"]
    _create_backfill(deployment, day)
    [backfill] = api.get(f"/api/v2/backfills?dag_id={DAG_ID}")["backfills"]
    done = poll_until(lambda: (b := api.get(f"/api/v2/backfills/{backfill['id']}"))["completed_at"] and b,
                      timeout=300, interval=2, what="Airflow to end the backfill that found its day in flight")
    runs = _runs(api)
    assert [r["dag_run_id"] for r in runs] == [run_id] and runs[0]["run_type"] == "scheduled", runs
    assert runs[0]["conf"] == {} and runs[0]["state"] == "running", runs[0]
    print(f"backfill while the scheduled run is active: backfill {done['id']} created no run "
          f"(the day's run {run_id} was in flight)")
    return int(done["id"])
