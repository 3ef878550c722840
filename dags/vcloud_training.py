"""vcloud training on a Slurm cluster: sync -> checks -> (data) -> preflight job -> stages 0-3 -> export.

Wiring only; what each task does lives in ``plugins/vcloud_pipeline`` (``tasks``, ``stages``,
``preflight``, ``sync``, ``job_operator``). Trigger from the UI form, on the retraining schedule,
or for one stage: ``airflow dags trigger vcloud_training --conf '{"stages": [2]}'``.

The job tasks wait out a login node that does not answer (up to the provider's
``watch_deadline``, 24 hours) and retry a lost watch (worker or triggerer lost, a longer outage)
with the Slurm provider's defaults, adopting the job they find; a job that failed fails its task for
good. The Python tasks that talk to the cluster (sync, checks, summary) retry with the same defaults
when it could not be reached, and only then. To change that, pass e.g.
``default_args={"retries": 0}`` to the DAG below, or ``retries=`` to one task.

Runs go at the same time (Airflow's ``max_active_runs_per_dag``); two runs with one run name share
each stage's job through the provider's one-writer-per-directory lock. The jobs one deployment has
on a cluster are bounded by the pool of the run's connection (``vcloud_pipeline.pools``).

Deployment settings (read when the file is parsed, no I/O): ``VCLOUD_TRAINING_SCHEDULE``
(cron or preset, default ``@monthly``; ``none`` for manual runs only) and
``VCLOUD_DEFAULT_PROFILE`` (default ``local``).
"""

from __future__ import annotations

import os

import pendulum
from airflow.sdk import DAG, TriggerRule, chain, get_current_context, task

from vcloud_pipeline.assets import STAGE_CHECKPOINTS, VIEWER_EXPORT
from vcloud_pipeline.job_operator import PipelineJobOperator
from vcloud_pipeline.params import dag_params
from vcloud_pipeline.tasks import CLUSTER_STEP_RETRIES

_schedule = os.environ.get("VCLOUD_TRAINING_SCHEDULE", "@monthly")

with DAG(
    dag_id="vcloud_training",
    description="Train the vcloud cloud-removal model stage by stage on a Slurm cluster",
    schedule=None if _schedule.strip().lower() in ("", "none") else _schedule,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    params=dag_params(os.environ.get("VCLOUD_DEFAULT_PROFILE", "local")),
    tags=["vcloud", "slurm", "training"],
    doc_md=__doc__,
) as dag:

    @task(task_id="plan")
    def plan() -> dict:
        """Validate params and profile; render every job once. Fails before anything is submitted."""
        from vcloud_pipeline.tasks import plan_run

        context = get_current_context()
        dag_run = context["dag_run"]
        return plan_run(context["params"], run_type=getattr(dag_run, "run_type", None),
                        logical_date=context.get("logical_date"))

    @task(task_id="sync_code", **CLUSTER_STEP_RETRIES)
    def sync_code(planned: dict) -> dict:
        """rsync trainer/ (anchored excludes) and the rendered job scripts; record the code hash."""
        from slurm_provider.hooks import SlurmHook
        from vcloud_pipeline.tasks import RunContext, final_unless_unreachable
        from vcloud_pipeline.tasks import sync_code as sync

        ctx = RunContext.from_xcom(planned)
        context = get_current_context()
        with final_unless_unreachable(), SlurmHook(ctx.profile.connection.conn_id) as hook:
            return sync(ctx, hook.runner, dag_run=(context["dag"].dag_id, context["run_id"]))

    @task(task_id="preflight_checks", trigger_rule=TriggerRule.NONE_FAILED, **CLUSTER_STEP_RETRIES)
    def preflight_checks(planned: dict, synced: dict) -> dict:
        """sbatch --test-only of each job to run, the container image, and the GPU-hour budget."""
        from slurm_provider.hooks import SlurmHook
        from vcloud_pipeline.tasks import RunContext, final_unless_unreachable
        from vcloud_pipeline.tasks import preflight_checks as checks

        ctx = RunContext.from_xcom(planned)
        with final_unless_unreachable(), SlurmHook(ctx.profile.connection.conn_id) as hook:
            return checks(ctx, hook, synced["code_hash"])

    @task(task_id="summary", trigger_rule=TriggerRule.ALL_DONE, **CLUSTER_STEP_RETRIES)
    def summary(planned: dict) -> dict:
        """Per job: ids, states, GPU-hours, metrics; per stage: COMPLETE; the project's ledger. The run
        submits nothing more: its code is no longer kept for it."""
        from slurm_provider.hooks import SlurmHook
        from vcloud_pipeline.tasks import RunContext, final_unless_unreachable, release_run_code, summarize

        ctx = RunContext.from_xcom(planned)
        context = get_current_context()
        ti = context["ti"]
        labels = ["prepare_data", "preflight_imports", "stage0", "stage1", "stage2", "stage3", "export"]
        jobs = {label: ti.xcom_pull(task_ids=label) for label in labels}
        with final_unless_unreachable(), SlurmHook(ctx.profile.connection.conn_id) as hook:
            release_run_code(ctx, hook.runner, (context["dag"].dag_id, context["run_id"]))
            return summarize(ctx, hook, {k: v for k, v in jobs.items() if v})

    @task(task_id="verdict", trigger_rule=TriggerRule.NONE_FAILED)
    def verdict() -> None:
        """Fails the DAG run when any job or check failed (the summary above runs regardless)."""

    planned = plan()
    synced = sync_code(planned)
    checks = preflight_checks(planned, synced)
    data = PipelineJobOperator(task_id="prepare_data", job="data", trigger_rule=TriggerRule.NONE_FAILED)
    imports = PipelineJobOperator(task_id="preflight_imports", job="preflight", trigger_rule=TriggerRule.NONE_FAILED)
    stages = [
        PipelineJobOperator(task_id=f"stage{stage}", job=f"stage{stage}", outlets=[STAGE_CHECKPOINTS[stage]],
                            trigger_rule=TriggerRule.NONE_FAILED)
        for stage in (0, 1, 2, 3)
    ]
    export = PipelineJobOperator(task_id="export", job="export", outlets=[VIEWER_EXPORT],
                                 trigger_rule=TriggerRule.NONE_FAILED)
    summarized = summary(planned)
    chain(synced, checks, data, imports, *stages, export, summarized)
    [synced, checks, data, imports, *stages, export, summarized] >> verdict()
