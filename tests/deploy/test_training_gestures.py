"""What a person does to a stage of the training DAG in a running deployment, checked in ``sacct``.

One deployment for the module (``airflow api-server``, ``scheduler`` with the LocalExecutor,
``dag-processor``, ``triggerer``, as separate processes) runs ``vcloud_training`` with the tiny config
and stage 0 only, the local profile moved to a fresh project directory. Each test triggers a run
through the REST API (what the UI's trigger form does), makes one of the gestures of docs/training-dag.md on its
``stage0`` task (clear it while its job runs, clear it after its job failed, mark it success while its
job runs, trigger the same run name again while it trains) and then counts the jobs that wrote the
stage's directory (``sacct``, by the directory the job comment names), with their final states.

Training a tiny stage takes seconds on a fast CPU. Where a gesture needs the job still alive when
Airflow acts on it, the test suspends the job with ``scontrol suspend`` as soon as its first
checkpoint is seen, makes the gesture while the job is held (a suspended job is as live to Slurm and
to the provider as a running one) and resumes it afterwards: the stage then needs only a few epochs
(:data:`EPOCHS`), however long Airflow takes to act.
"""

from __future__ import annotations

import contextlib
import json
import shlex
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from support.deployment import RestClient, airflow_env, deployment_with_dag
from support.localcluster import LocalCluster, poll_until
from support.ports import free_port

DAG_ID = "vcloud_training"
STAGE = "stage0"
TERMINAL = {"success", "failed"}
EPOCHS = 5
"""Epochs of a stage whose job a gesture needs alive: the job is suspended within a tenth of a second of
its first checkpoint (:meth:`LocalCluster.job_at_first_epoch`), epochs before it could end, and holds
still however long Airflow takes to act."""

pytestmark = [pytest.mark.slow, pytest.mark.timeout(2400), pytest.mark.xdist_group("training-gestures")]


@pytest.fixture(scope="module")
def deployment(local_cluster: LocalCluster, cluster_connection: str,
               tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    home = tmp_path_factory.mktemp("training-gestures-home")
    project_dir = local_cluster.test_dir()
    # The gestures act on a stage's trigger: the tiny config's stages, seconds long, are deferred at once.
    env = airflow_env(home, free_port(), project_dir, first_poll_delay=10, short_job_wait=0)
    try:
        with deployment_with_dag(env, home, DAG_ID) as (components, api):
            yield {"components": components, "api": api, "project_dir": project_dir}
    finally:
        local_cluster.cancel_jobs_under(project_dir)



# --- the UI's actions, through the REST API it calls ----------------------------------------------------


def _trigger(api: RestClient, run_name: str, **conf: Any) -> str:
    run_id = f"gesture-{run_name}-{uuid.uuid4().hex[:6]}"
    conf = {"profile": "local", "config": "tiny", "stages": [0], "export": False, "run_name": run_name, **conf}
    status, body = api.call("POST", f"/api/v2/dags/{DAG_ID}/dagRuns",
                            {"dag_run_id": run_id, "logical_date": None, "conf": conf})
    assert status == 200, body
    return run_id


def _clear(api: RestClient, run_id: str, task_id: str) -> None:
    """The UI's "Clear" on one task instance, with its downstream tasks (the dialog's default)."""
    status, body = api.call("POST", f"/api/v2/dags/{DAG_ID}/clearTaskInstances",
                            {"dry_run": False, "dag_run_id": run_id, "task_ids": [task_id],
                             "include_downstream": True, "only_failed": False, "reset_dag_runs": True})
    assert status == 200, body
    assert task_id in {ti["task_id"] for ti in body["task_instances"]}, body


def _mark(api: RestClient, run_id: str, task_id: str, state: str) -> None:
    """The UI's "Mark as success/failed" on one task instance."""
    status, body = api.call("PATCH", f"/api/v2/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances/{task_id}",
                            {"new_state": state})
    assert status == 200, body


def _run(api: RestClient, run_id: str) -> dict[str, Any]:
    return api.get(f"/api/v2/dags/{DAG_ID}/dagRuns/{run_id}")


def _ti(api: RestClient, run_id: str, task_id: str = STAGE) -> dict[str, Any]:
    return api.get(f"/api/v2/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances/{task_id}")


def _states(api: RestClient, run_id: str) -> dict[str, str]:
    tis = api.get(f"/api/v2/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances?limit=100")["task_instances"]
    return {ti["task_id"]: ti["state"] for ti in tis}


def _task_log(api: RestClient, run_id: str, try_number: int, task_id: str = STAGE) -> str:
    body = api.get(f"/api/v2/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances/{task_id}/logs/{try_number}"
                   "?full_content=true")
    lines = []
    for entry in body["content"]:
        if isinstance(entry, dict):
            errors = [str(e.get("exc_value", "")) for e in entry.get("error_detail") or [] if isinstance(e, dict)]
            lines.append(" ".join([str(entry.get("event", "")), *errors]))
        else:
            lines.append(str(entry))
    return "\n".join(lines)


def _return_value(api: RestClient, run_id: str, task_id: str) -> Any:
    status, body = api.call("GET", f"/api/v2/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances/{task_id}"
                                   "/xcomEntries/return_value?deserialize=true")
    return body.get("value") if status == 200 else None


def _explain(deployment: dict[str, Any], run_id: str) -> str:
    api, components = deployment["api"], deployment["components"]
    tries = int(_ti(api, run_id).get("try_number") or 1)
    logs = "\n".join(f"--- {STAGE} try {n} ---\n{_task_log(api, run_id, n)[-3000:]}" for n in range(1, tries + 1))
    return (f"run {run_id}: {_states(api, run_id)}\n{logs}\n{components.log_tail('scheduler', 2000)}\n"
            f"{components.log_tail('triggerer', 2000)}")


def _wait(deployment: dict[str, Any], run_id: str, done: Any, what: str, timeout: float = 900) -> Any:
    try:
        return poll_until(done, timeout=timeout, interval=2, what=what)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{_explain(deployment, run_id)}") from None


def _wait_run_end(deployment: dict[str, Any], run_id: str) -> dict[str, Any]:
    api = deployment["api"]
    return _wait(deployment, run_id, lambda: (run := _run(api, run_id))["state"] in TERMINAL and run,
                 f"run {run_id} to end")


# --- the cluster side ---------------------------------------------------------------------------------


def _stage_dir(deployment: dict[str, Any], run_name: str) -> str:
    return f"{deployment['project_dir']}/outputs/{run_name}/{STAGE}"


def _stage_jobs(cluster: LocalCluster, stage_dir: str) -> list[tuple[str, str]]:
    """(job id, final state) of every job that wrote the stage's directory, oldest first."""
    ids = cluster.jobs_writing(stage_dir)
    if not ids:
        return []
    out = cluster.root("sacct", "-X", "-n", "-P", "-j", ",".join(ids), "--format=JobIDRaw,State").stdout
    states = dict(line.split("|", 1) for line in out.splitlines() if line)
    return sorted(((job, states[job].split()[0]) for job in ids), key=lambda row: int(row[0]))


def _settled_stage_jobs(cluster: LocalCluster, stage_dir: str, expect: int) -> list[tuple[str, str]]:
    """The stage's jobs once ``expect`` of them have ended in accounting (which lags slurmctld)."""
    def ended() -> list[tuple[str, str]] | None:
        jobs = _stage_jobs(cluster, stage_dir)
        live = {"PENDING", "RUNNING", "SUSPENDED", "REQUEUED", "COMPLETING", "CONFIGURING"}
        return jobs if len(jobs) >= expect and not any(state in live for _, state in jobs) else None

    poll_until(ended, timeout=120, what=f"{expect} ended job(s) writing {stage_dir} in sacct")
    cluster.accounting_caught_up()  # a second job submitted a moment later is in accounting by now too
    return _stage_jobs(cluster, stage_dir)


def _live_writer(cluster: LocalCluster, stage_dir: str) -> str | None:
    """The id of the live job whose comment names ``stage_dir`` as the directory it writes (squeue)."""
    from slurm_provider.cli.exclusive_submit import exclusive_dir_marker

    marker = f'"xdir":"{exclusive_dir_marker(stage_dir)}"'
    out = cluster.root("squeue", "-h", "-O", "JobID:20,Comment:2000", check=False).stdout
    return next((line.split()[0] for line in out.splitlines() if marker in line), None)


def _live_stage_job(deployment: dict[str, Any], cluster: LocalCluster, run_id: str, run_name: str) -> str:
    """The stage job of the run once it trains (its first checkpoint is written) while the task waits."""
    api, stage_dir = deployment["api"], _stage_dir(deployment, run_name)
    _wait(deployment, run_id, lambda: _ti(api, run_id)["state"] == "deferred", f"{STAGE} to defer")
    job = _wait(deployment, run_id, lambda: _live_writer(cluster, stage_dir), f"the {STAGE} job in squeue")

    def first_checkpoint() -> bool:
        state = cluster.current_state(int(job))
        assert state in {"PENDING", "CONFIGURING", "RUNNING"}, f"job {job} is {state} before its first checkpoint"
        text = cluster.ssh(f"cat {shlex.quote(stage_dir)}/progress.json 2>/dev/null", check=False).stdout
        return bool(text) and json.loads(text).get("epoch", 0) >= 1

    _wait(deployment, run_id, first_checkpoint, f"job {job}'s first checkpoint")
    return job


def _held_stage_job(deployment: dict[str, Any], cluster: LocalCluster, run_id: str, run_name: str) -> str:
    """The stage job of the run, suspended the moment its first checkpoint is written, once the task
    waits for it (deferred). The caller resumes it (``scontrol resume``) after the gesture."""
    api, stage_dir = deployment["api"], _stage_dir(deployment, run_name)
    try:
        job = cluster.job_at_first_epoch(stage_dir, lambda: _live_writer(cluster, stage_dir), timeout=900,
                                         what=f"the {STAGE} job's first checkpoint")
        cluster.suspend_training(job, stage_dir)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{_explain(deployment, run_id)}") from None
    try:
        # Held, the job is still live when the task, which may not have looked at it yet, defers on it.
        _wait(deployment, run_id, lambda: _ti(api, run_id)["state"] == "deferred", f"{STAGE} to defer")
        assert cluster.current_state(int(job)) == "SUSPENDED", f"job {job} is not held"
    except BaseException:
        cluster.root("scontrol", "resume", job, check=False)
        raise
    return job


def _kill_trainer(cluster: LocalCluster, job: str) -> None:
    """SIGKILL the processes of the job's training step, as the kernel's OOM killer would."""
    # scontrol listpids asks the slurmstepd of the node it runs on: run it on the job's node.
    out = cluster.on_node(cluster.node_of(job), "scontrol", "listpids", job).stdout
    pids = [fields[0] for fields in (line.split() for line in out.splitlines()[1:])
            if len(fields) >= 3 and fields[2] != "batch"]
    assert pids, f"job {job} has no step processes:\n{out}"
    cluster.root("kill", "-KILL", *pids, check=False)


# --- the gestures -------------------------------------------------------------------------------------


def test_clearing_a_running_stage_watches_its_job_again(deployment: dict[str, Any],
                                                        local_cluster: LocalCluster) -> None:
    api, run_name = deployment["api"], "clear-running"
    run_id = _trigger(api, run_name, max_epochs=EPOCHS)
    # Suspended, the job stays live (to Slurm and the provider) until the cleared task has looked.
    job = _held_stage_job(deployment, local_cluster, run_id, run_name)
    try:
        _clear(api, run_id, STAGE)
        _wait(deployment, run_id, lambda: _ti(api, run_id)["try_number"] == 2
              and _ti(api, run_id)["state"] == "deferred", "the cleared task to watch again")
        assert local_cluster.current_state(int(job)) == "SUSPENDED", "clearing the task ended its job"
    finally:
        local_cluster.root("scontrol", "resume", job)

    final = _wait_run_end(deployment, run_id)
    assert final["state"] == "success", _explain(deployment, run_id)
    second_try = _task_log(api, run_id, 2)
    assert f"Job {job} (DAG {DAG_ID}, run {run_id}, task {STAGE}" in second_try, second_try
    assert "watching it instead of submitting a second job" in second_try, second_try
    assert "Submitted job" not in second_try, second_try
    assert _return_value(api, run_id, STAGE)["job_ids"] == [job]
    assert _settled_stage_jobs(local_cluster, _stage_dir(deployment, run_name), 1) == [(job, "COMPLETED")]
    print(f"clear a running stage: 1 job ({job} COMPLETED), watched by try 2")


def test_clearing_a_failed_stage_submits_one_job_that_resumes(deployment: dict[str, Any],
                                                              local_cluster: LocalCluster) -> None:
    api, run_name = deployment["api"], "clear-failed"
    run_id = _trigger(api, run_name, max_epochs=EPOCHS)
    first = _held_stage_job(deployment, local_cluster, run_id, run_name)
    try:
        _kill_trainer(local_cluster, first)  # SIGKILL ends a stopped process too
    finally:
        local_cluster.root("scontrol", "resume", first)

    failed = _wait_run_end(deployment, run_id)
    assert failed["state"] == "failed", _explain(deployment, run_id)
    ti = _ti(api, run_id)
    assert ti["state"] == "failed" and ti["try_number"] == 1, ti  # a failed job is never retried
    assert f"Slurm job {first} ended FAILED" in _task_log(api, run_id, 1)

    _clear(api, run_id, STAGE)
    final = _wait_run_end(deployment, run_id)
    assert final["state"] == "success", _explain(deployment, run_id)
    summary = _return_value(api, run_id, STAGE)
    [second] = summary["job_ids"]
    assert second != first and summary["state"] == "COMPLETED", summary
    stage_dir = _stage_dir(deployment, run_name)
    out = local_cluster.ssh(f"cat {shlex.quote(deployment['project_dir'])}/logs/{run_name}/*{STAGE}*.{second}.out").stdout
    assert f"resumed from {stage_dir}/latest.pt" in out, out[-2000:]
    assert _settled_stage_jobs(local_cluster, stage_dir, 2) == [(first, "FAILED"), (second, "COMPLETED")]
    print(f"clear a failed stage: 2 jobs ({first} FAILED, {second} COMPLETED, resumed)")


def test_marking_a_running_stage_success_cancels_its_job(deployment: dict[str, Any],
                                                         local_cluster: LocalCluster) -> None:
    api, run_name = deployment["api"], "mark-success"
    run_id = _trigger(api, run_name, max_epochs=5000)
    job = _live_stage_job(deployment, local_cluster, run_id, run_name)

    _mark(api, run_id, STAGE, "success")
    marked = time.monotonic()
    state = local_cluster.wait_for_state(int(job), {"CANCELLED", "COMPLETED", "FAILED"}, timeout=60)
    print(f"mark a running stage success: job {job} {state} {time.monotonic() - marked:.1f} s later")
    assert state == "CANCELLED"

    final = _wait_run_end(deployment, run_id)
    states = _states(api, run_id)
    assert states[STAGE] == "success", states
    assert final["state"] == "success", _explain(deployment, run_id)
    assert _settled_stage_jobs(local_cluster, _stage_dir(deployment, run_name), 1) == [(job, "CANCELLED")]
    # What the stage left is not complete: the next run with this run name trains it on.
    local_cluster.ssh(f"test ! -e {shlex.quote(_stage_dir(deployment, run_name))}/COMPLETE")


def test_triggering_a_run_name_again_while_it_trains_watches_its_job(deployment: dict[str, Any],
                                                                     local_cluster: LocalCluster) -> None:
    api, run_name = deployment["api"], "again"
    first = _trigger(api, run_name, max_epochs=EPOCHS)
    # Suspended, the job stays live (to Slurm and the provider) until the second run has found it.
    job = _held_stage_job(deployment, local_cluster, first, run_name)
    stage_dir = _stage_dir(deployment, run_name)
    try:
        second = _trigger(api, run_name, max_epochs=EPOCHS)  # while the first one trains
        # Runs go at the same time: the second does not wait for the first; its stage finds the job.
        _wait(deployment, second, lambda: _ti(api, second)["state"] == "deferred", f"the second run's {STAGE} "
              "to watch")
        assert _run(api, first)["state"] == "running" and _ti(api, first)["state"] == "deferred"
        log = _task_log(api, second, 1)
        assert (f"Job {job} (DAG {DAG_ID}, run {first}, task {STAGE}, SUSPENDED) already writes {stage_dir}: "
                "watching it instead of submitting a second job") in log, log[-3000:]
    finally:
        local_cluster.root("scontrol", "resume", job)
    assert _wait_run_end(deployment, first)["state"] == "success", _explain(deployment, first)
    assert _wait_run_end(deployment, second)["state"] == "success", _explain(deployment, second)
    assert _return_value(api, second, STAGE)["job_ids"] == [job]

    jobs = _settled_stage_jobs(local_cluster, stage_dir, 1)
    assert jobs == [(job, "COMPLETED")], jobs
    # A third run of the name finds the stage complete and skips it.
    third = _trigger(api, run_name, max_epochs=EPOCHS)
    assert _wait_run_end(deployment, third)["state"] == "success", _explain(deployment, third)
    assert _states(api, third)[STAGE] == "skipped", _states(api, third)
    assert "stage0: stage 0 is complete" in _task_log(api, third, 1)
    assert _settled_stage_jobs(local_cluster, stage_dir, 1) == jobs
    print(f"trigger the same run name again: 1 job in all ({jobs}); the second run watched it, the third skipped")


@contextlib.contextmanager
def _no_triggerer_once_the_stage_submits(deployment: dict[str, Any], cluster: LocalCluster, run_id: str,
                                         run_name: str) -> Iterator[str]:
    """The stage's live job (yielded) once its task deferred with no triggerer running, so that no watch
    of it starts; the triggerer runs again after the block. The data and preflight jobs before it need
    the triggerer: it stops once the stage task is at work."""
    api, components = deployment["api"], deployment["components"]
    try:
        _wait(deployment, run_id, lambda: _ti(api, run_id)["state"] in ("queued", "running", "deferred"),
              f"{STAGE} to start")
        components.stop("triggerer")
        _wait(deployment, run_id, lambda: _ti(api, run_id)["state"] == "deferred", f"{STAGE} to defer")
        yield _wait(deployment, run_id, lambda: _live_writer(cluster, _stage_dir(deployment, run_name)),
                    f"the {STAGE} job in squeue")
    finally:
        if components.procs["triggerer"].poll() is not None:
            components.start("triggerer")


def test_marking_a_stage_failed_before_any_triggerer_watches_its_job_still_cancels_the_job(
        deployment: dict[str, Any], local_cluster: LocalCluster) -> None:
    """The gesture in the seconds between the task's deferral and a triggerer starting its watch: here
    the triggerer is stopped while the stage submits, so no watch starts at all. A triggerer drops the
    trigger of a task marked failed (``Trigger.clean_unused``) when it gets to it before loading it;
    the run's summary, which runs once every job task has ended, finds the job still running and
    cancels it, with no triggerer running at all."""
    api, run_name = deployment["api"], "mark-failed-unwatched"
    run_id = _trigger(api, run_name, max_epochs=5000)
    stage_dir = _stage_dir(deployment, run_name)
    with _no_triggerer_once_the_stage_submits(deployment, local_cluster, run_id, run_name) as job:
        _mark(api, run_id, STAGE, "failed")
        marked = time.monotonic()
        final = _wait_run_end(deployment, run_id)
        # Still no triggerer: a triggerer that loads the dropped watch later would cancel the job from it.
        state = local_cluster.wait_for_state(int(job), {"CANCELLED", "COMPLETED", "FAILED"}, timeout=60)
    print(f"mark a stage failed before its watch started: job {job} {state}, the run {final['state']} "
          f"{time.monotonic() - marked:.1f} s after the gesture")
    assert state == "CANCELLED"
    states = _states(api, run_id)
    assert (states[STAGE], states["summary"], final["state"]) == ("failed", "success", "failed"), states
    assert _settled_stage_jobs(local_cluster, stage_dir, 1) == [(job, "CANCELLED")]
    log = _task_log(api, run_id, 1, "summary")
    assert f"Job {job} of {STAGE} was still" in log and "so that no job of this run runs unwatched" in log, log[-3000:]


def test_marking_a_stage_success_before_any_triggerer_watches_its_job_has_the_next_stage_cancel_it(
        deployment: dict[str, Any], local_cluster: LocalCluster) -> None:
    """The same gesture with "success": the run goes on at once, and the next stage's task, before it
    submits, finds the marked stage's job still running with no watch and cancels it, long before the
    run's summary would."""
    api, run_name = deployment["api"], "mark-success-unwatched"
    run_id = _trigger(api, run_name, stages=[0, 1], max_epochs=5000)
    stage_dir = _stage_dir(deployment, run_name)
    with _no_triggerer_once_the_stage_submits(deployment, local_cluster, run_id, run_name) as job:
        _mark(api, run_id, STAGE, "success")
        marked = time.monotonic()
        state = local_cluster.wait_for_state(int(job), {"CANCELLED", "COMPLETED", "FAILED"}, timeout=120)
        cancelled_after = time.monotonic() - marked
        assert _ti(api, run_id, "summary")["state"] not in TERMINAL  # not the summary: the run goes on
    print(f"mark a stage success before its watch started: job {job} {state} {cancelled_after:.1f} s later")
    assert state == "CANCELLED"
    # Stage 1 refuses without stage 0's best.pt, or trains on from the one stage 0 left (5000 epochs):
    # then a person stops it, as its watch now runs.
    stage1 = _wait(deployment, run_id, lambda: (st := _ti(api, run_id, "stage1")["state"]) in ("failed", "deferred")
                   and st, "stage1 to refuse or to defer")
    if stage1 == "deferred":
        _mark(api, run_id, "stage1", "failed")
    _wait_run_end(deployment, run_id)
    log = _task_log(api, run_id, 1, "stage1")
    assert f"Job {job} of {STAGE} was still" in log and "so that no job of this run runs unwatched" in log, log[-3000:]
    assert _settled_stage_jobs(local_cluster, stage_dir, 1) == [(job, "CANCELLED")]
