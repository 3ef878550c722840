"""vcloud training on a Slurm cluster: sync -> checks -> provision -> (data) -> preflight job -> stages 0-3 -> export.

Wiring only; what each task does lives in ``plugins/vcloud_pipeline`` (``dag.tasks``,
``dag.job_operator``; the run's frozen plan in ``plan.run_plan``). Trigger from the UI form, on the retraining schedule,
or for one stage: ``airflow dags trigger vcloud_training --conf '{"stages": [2]}'``.

The job tasks wait out a login node that does not answer (up to the provider's
``watch_deadline``, 24 hours) and retry a lost watch (worker or triggerer lost, a longer outage)
with the Slurm provider's defaults, adopting the job they find; a job that failed fails its task for
good. The Python tasks that talk to the cluster (sync, checks, summary) retry with the same defaults
when it could not be reached, and only then. To change that, pass e.g.
``default_args={"retries": 0}`` to the DAG below, or ``retries=`` to one task.

Runs go at the same time (Airflow's ``max_active_runs_per_dag``); two runs with one run name share
each stage's job through the provider's one-writer-per-directory lock. The jobs one deployment has
on a cluster are bounded by the pool of the run's connection (``vcloud_pipeline.dag.pools``).

Deployment settings (read when the file is parsed): ``VCLOUD_TRAINING_SCHEDULE``
(cron or preset, default ``@monthly``; ``none`` for manual runs only),
``VCLOUD_DEFAULT_PROFILE`` (default ``local``), whose ``connection.queue`` (read from the profile
file, no connection) is the Airflow queue of every task that runs cluster commands, and
``VCLOUD_RETRY_DELAY`` (seconds before a first retry, default the provider's 2 minutes).
"""

from __future__ import annotations

import os
from typing import cast

import pendulum
from airflow.sdk import DAG, TriggerRule, XComArg, chain, get_current_context, task

from vcloud_pipeline.dag.assets import outlets_of
from vcloud_pipeline.dag.job_operator import PipelineJobOperator
from vcloud_pipeline.dag.queues import cluster_task_args
from vcloud_pipeline.plan.request import dag_params
from vcloud_pipeline.plan.labels import JobLabel
from vcloud_pipeline.dag.tasks import cluster_step_retries

_schedule = os.environ.get("VCLOUD_TRAINING_SCHEDULE", "@monthly")
_profile = os.environ.get("VCLOUD_DEFAULT_PROFILE", "local")
# The tasks that run cluster commands run on the queue of the default profile's connection (the host
# with its ControlMaster socket); a run of another profile is moved to its own by the cluster policy.
_retries = cluster_step_retries(os.environ)
_on_cluster = {**_retries, **cluster_task_args(_profile)}


def _resolved(arg: XComArg) -> dict:
    """``arg`` as the task it is passed to receives it: TaskFlow resolves an XComArg to the upstream
    task's return value (a dict here) when the task runs, while the decorator types the call with the
    function's own parameters."""
    return cast(dict, arg)


with DAG(
    dag_id="vcloud_training",
    description="Train the vcloud cloud-removal model stage by stage on a Slurm cluster",
    schedule=None if _schedule.strip().lower() in ("", "none") else _schedule,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    params=dag_params(_profile),
    tags=["vcloud", "slurm", "training"],
    doc_md=__doc__,
) as dag:

    @task(task_id="plan")
    def plan() -> dict:
        """Validate params and profile; plan every job. Fails before anything is submitted."""
        from vcloud_pipeline.dag.tasks import plan_run

        context = get_current_context()
        dag_run = context["dag_run"]
        return plan_run(context["params"], run_type=getattr(dag_run, "run_type", None),
                        logical_date=context.get("logical_date"))

    @task(task_id="sync_code", show_return_value_in_logs=False, **_on_cluster)
    def sync_code(planned: dict) -> dict:
        """Render every job once with the code's hash; rsync trainer/ (anchored excludes) and the scripts."""
        from slurm_provider import SlurmHook
        from vcloud_pipeline.plan.run_plan import RunPlan
        from vcloud_pipeline.dag.tasks import final_unless_unreachable
        from vcloud_pipeline.dag.tasks import sync_code as sync

        run_plan = RunPlan.from_xcom(planned)
        context = get_current_context()
        with final_unless_unreachable(), SlurmHook(run_plan.conn_id) as hook:
            return sync(run_plan, hook, dag_run=(context["dag"].dag_id, context["run_id"]))

    @task(task_id="preflight_checks", trigger_rule=TriggerRule.NONE_FAILED, **_on_cluster)
    def preflight_checks(planned: dict, synced: dict) -> dict:
        """sbatch --test-only of each job to run, the container image, and the GPU-hour budget."""
        from slurm_provider import SlurmHook
        from vcloud_pipeline.plan.run_plan import RunPlan, SyncedCode
        from vcloud_pipeline.dag.tasks import final_unless_unreachable
        from vcloud_pipeline.dag.tasks import preflight_checks as checks

        run_plan = RunPlan.from_xcom(planned)
        with final_unless_unreachable(), SlurmHook(run_plan.conn_id) as hook:
            return checks(run_plan, hook, SyncedCode.model_validate(synced))

    @task(task_id="provision_env", trigger_rule=TriggerRule.NONE_FAILED, **_on_cluster)
    def provision_env(planned: dict, synced: dict) -> dict:
        """Install what the container lacks of the runtime requirements into paths.pylibs/<hash>, once."""
        from slurm_provider import SlurmHook
        from vcloud_pipeline.plan.run_plan import RunPlan, SyncedCode
        from vcloud_pipeline.dag.tasks import final_unless_unreachable
        from vcloud_pipeline.dag.tasks import provision as install

        run_plan = RunPlan.from_xcom(planned)
        with final_unless_unreachable(), SlurmHook(run_plan.conn_id) as hook:
            return install(run_plan, hook, SyncedCode.model_validate(synced))

    @task(task_id="summary", trigger_rule=TriggerRule.ALL_DONE, **_on_cluster)
    def summary(planned: dict) -> dict:
        """Per job: ids, states, GPU-hours, metrics; per stage: COMPLETE; the project's ledger. The run
        submits nothing more: its code is no longer kept for it, and no job of it runs on unwatched."""
        from slurm_provider import SlurmHook
        from vcloud_pipeline.plan.run_plan import RunPlan
        from vcloud_pipeline.dag.left_running import settle_left_jobs
        from vcloud_pipeline.dag.tasks import final_unless_unreachable, job_summaries, release_run_code, summarize

        run_plan = RunPlan.from_xcom(planned)
        context = get_current_context()
        with final_unless_unreachable(), SlurmHook(run_plan.conn_id) as hook:
            settle_left_jobs(hook, context["ti"], context["dag"].dag_id, context["run_id"])
            release_run_code(run_plan, hook, (context["dag"].dag_id, context["run_id"]))
            return summarize(run_plan, hook, job_summaries(context["ti"]))

    @task(task_id="verdict", trigger_rule=TriggerRule.NONE_FAILED)
    def verdict() -> None:
        """Fails the DAG run when any job or check failed (the summary above runs regardless)."""

    planned = plan()
    synced = sync_code(_resolved(planned))
    checks = preflight_checks(_resolved(planned), _resolved(synced))
    provisioned = provision_env(_resolved(planned), _resolved(synced))
    data, imports, *stages, export = [
        PipelineJobOperator(task_id=label.task_id, job=label, outlets=outlets_of(label),
                            trigger_rule=TriggerRule.NONE_FAILED, **_on_cluster)
        for label in JobLabel
    ]
    summarized = summary(_resolved(planned))
    chain(synced, checks, provisioned, data, imports, *stages, export, summarized)
    [synced, checks, provisioned, data, imports, *stages, export, summarized] >> verdict()
