"""``PipelineJobOperator``: one job of a training run, submitted by the Slurm provider's operator.

What the job is (profile, connection, script, log directory, progress file) is only known once
the run's ``plan`` and ``sync_code`` tasks have run, so the operator binds itself from their XComs
at the start of ``execute`` and again in ``execute_complete`` (a resumed deferral builds a fresh
operator). Before submitting it decides, from what is on the cluster, whether the job is needed
at all (:mod:`vcloud_pipeline.stage_decisions`) and whether the allocation can pay for its worst case.
Submission, deferral, adoption and resubmission are the provider's, and so is waiting for a login
node that does not answer: these steps run inside ``waiting_out_outages``, so an outage during the
decision's file reads, the budget check or the report defers the task until the node answers and
the step starts over, instead of failing it.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException

from slurm_provider.operators import SlurmSubmitOperator
from slurm_provider.resubmission import DEFAULT_BUDGETS
from slurm_provider.job_status import JobStatus
from slurm_provider.transport import TransportError
from vcloud.contract import (
    BEST_CHECKPOINT,
    COMPLETE_FILE,
    STAGES,
    best_checkpoint_metrics,
    completed_epochs,
    final_metrics,
    gain_metric,
    recorded_code_hash,
    stop_detail,
    stop_reason,
    validation_gain,
)

from vcloud_pipeline import job_exits
from vcloud_pipeline.assets import asset_for
from vcloud_pipeline.budget import Allocation, BudgetExceeded, billed_hours, check_budget
from vcloud_pipeline.code_retention import touch_run
from vcloud_pipeline.layout import run_key
from vcloud_pipeline.preflight import PROJECT_TAG, read_allocation, read_ledger, usage_of
from vcloud_pipeline.profiles import ClusterProfile
from vcloud_pipeline.remote import RemoteCommandError
from vcloud_pipeline.stage_decisions import (
    DATA,
    EXPORT,
    PREFLIGHT,
    Decision,
    StageDecisionError,
    StageFiles,
    completion_record,
    decide,
    decide_data,
    decide_export,
)
from vcloud_pipeline.tasks import PLAN_TASK, SYNC_TASK, RunContext

if TYPE_CHECKING:
    import jinja2
    from airflow.sdk import Context

POLL_ENV = {
    "poll_interval": ("VCLOUD_POLL_INTERVAL", 15.0),
    "max_poll_interval": ("VCLOUD_MAX_POLL_INTERVAL", 300.0),
    "first_poll_delay": ("VCLOUD_FIRST_POLL_DELAY", 10.0),
}
"""Status polling of the trigger, overridable per deployment (keep the first poll >= 10 s there;
``airflow dags test`` on the local cluster can poll every few seconds)."""

_PLACEHOLDER_SCRIPT = "#!/bin/bash\n# bound from the sync_code XCom at run time\n"

GPUS_NOT_VISIBLE = "gpus_not_visible"
"""The hint (``slurm_provider.hints``) whose advice is the profile's ``accelerator.missing_gpu_hint``."""


class PipelineJobOperator(SlurmSubmitOperator):
    """Submit the run's job ``job`` (``data``, ``preflight``, ``stage0``..``stage3``, ``export``).

    :param job: the job's label in the run's rendered scripts.
    :param plan_task: task id whose XCom holds the validated run.
    :param sync_task: task id whose XCom holds the rendered scripts and the code hash.
    """

    template_fields: Sequence[str] = ("script", "log_dir", "progress_path", "code_version", "exclusive_dir")
    """Shown in Airflow's Rendered Template view: the outer script exactly as it is submitted (sent to
    ``sbatch`` on stdin), where the job logs, and which code it runs. None of them is a Jinja template:
    :meth:`render_template_fields` binds them from the run's XComs instead."""
    template_fields_renderers = {"script": "bash"}
    ui_color = "#e3ecd9"

    def __init__(self, *, job: str, plan_task: str = PLAN_TASK, sync_task: str = SYNC_TASK, **kwargs: Any) -> None:
        kwargs.setdefault("conn_id", "vcloud_unbound")
        kwargs.setdefault("script", _PLACEHOLDER_SCRIPT)
        kwargs.setdefault("log_dir", "/unbound")
        kwargs.setdefault("exit_code_meanings", job_exits.MEANINGS)
        kwargs.setdefault("project_tag", PROJECT_TAG)
        super().__init__(stage=job, **kwargs)
        self.job = job
        self.plan_task = plan_task
        self.sync_task = sync_task
        self.cluster_profile: ClusterProfile | None = None
        """The run's profile, bound from the plan's XCom at run time."""

    # --- binding ---------------------------------------------------------------------------------

    def render_template_fields(self, context: Context, jinja_env: jinja2.Environment | None = None) -> None:
        """Bind the job from the run's XComs where Airflow would render Jinja templates.

        Airflow records the template fields right after this call and before ``execute``, so the
        Rendered Template view shows the very script ``execute`` submits. The script is a bash script
        rendered by :mod:`vcloud_pipeline.render`; Airflow's Jinja never sees it (``${#x}`` or a
        ``{{`` in it stays as it is).
        """
        self._bind(context)

    def _bind(self, context: Any) -> tuple[RunContext, dict[str, Any]]:
        ti = context["ti"]
        planned = ti.xcom_pull(task_ids=self.plan_task)
        synced = ti.xcom_pull(task_ids=self.sync_task)
        if not planned or not synced:
            raise AirflowFailException(f"{self.job}: no XCom from {self.plan_task}/{self.sync_task}; those tasks "
                                       "must run first in the same DAG run")
        ctx = RunContext.from_xcom(planned)
        scripts = synced["scripts"]
        if self.job not in scripts:
            raise AirflowFailException(f"{self.job}: no rendered script (rendered: {', '.join(sorted(scripts))})")
        self.conn_id = ctx.profile.connection.conn_id
        self.script = scripts[self.job]
        self.code_version = synced["code_hash"]  # in the job comment: the cleanup keeps this code
        self.log_dir = str(ctx.paths.logs_dir)
        if self.job.startswith("stage"):
            self.progress_path = str(ctx.paths.progress_path(int(self.job[5:])))
        self.exclusive_dir = self._writes(ctx)
        self.done_markers = self._done_when(ctx)
        budget = ctx.request.max_resubmits
        self.resubmit_budgets = {cause: budget for cause in DEFAULT_BUDGETS}
        self.gpu_billing_factor = ctx.profile.billing.factor
        self.cluster_profile = ctx.profile
        if ctx.profile.accelerator.missing_gpu_hint:
            self.hint_overrides = {GPUS_NOT_VISIBLE: ctx.profile.accelerator.missing_gpu_hint}
        for attr, (env, default) in POLL_ENV.items():
            setattr(self, attr, float(os.environ.get(env, default)))
        return ctx, synced

    def _writes(self, ctx: RunContext) -> str | None:
        """The directory this job writes, which at most one live job may write at a time."""
        if self.job.startswith("stage"):
            return str(ctx.paths.stage_dir(int(self.job[5:])))
        if self.job == DATA:
            return str(ctx.paths.data_dir.parent)
        if self.job == EXPORT:
            return str(ctx.paths.viewer_dir)
        return None  # the preflight import check writes nothing but its log

    def _done_when(self, ctx: RunContext) -> tuple[str, ...]:
        """Files inside :meth:`_writes` whose presence means the job's work is done, looked at under
        the submit lock: a stage is complete with ``COMPLETE`` and ``best.pt``, the synthetic dataset
        with its index. A job that finished a moment before this one's submit is not repeated."""
        if self.job.startswith("stage"):
            return (COMPLETE_FILE, BEST_CHECKPOINT)
        if self.job == DATA:
            return (str(ctx.paths.data_index.relative_to(ctx.paths.data_dir.parent)),)
        return ()

    # --- deciding ----------------------------------------------------------------------------------

    def _decide(self, ctx: RunContext, hook: Any) -> Decision | None:
        """None: always submit (preflight import check)."""
        if self.job == PREFLIGHT:
            return None
        if self.job == DATA:
            sizes = hook.file_sizes([str(ctx.paths.data_index)])
            return decide_data(ctx.plan, sizes.get(str(ctx.paths.data_index)))
        if self.job == EXPORT:
            return decide_export(ctx.plan)
        stage = int(self.job[5:])
        wanted = [ctx.paths.complete_path(stage), ctx.paths.best_checkpoint(stage)]
        if stage > 0:
            wanted.append(ctx.paths.best_checkpoint(stage - 1))
        sizes = hook.file_sizes([str(p) for p in wanted])
        files = StageFiles(complete=sizes.get(str(wanted[0])), best=sizes.get(str(wanted[1])),
                           predecessor_best=sizes.get(str(wanted[2])) if stage > 0 else None)
        try:
            return decide(ctx.plan, stage, files, ctx.paths)
        except StageDecisionError as exc:
            raise AirflowFailException(str(exc)) from None

    def _allocation(self, ctx: RunContext, hook: Any) -> Allocation:
        return read_allocation(hook, ctx.profile, read_ledger(hook, ctx.profile))

    def _allocation_after(self, ctx: RunContext, hook: Any) -> dict[str, Any] | None:
        """The allocation once the job ended, for the record (the HPC view's burn-down); a cluster that
        cannot be asked now costs the record this figure, never the finished job its success."""
        try:
            return self._allocation(ctx, hook).to_json()
        except Exception as exc:  # transport errors, unreadable sacct/sshare output
            self.log.warning("Could not read the allocation after %s finished: %s", self.job, exc)
            return None

    def _check_budget(self, ctx: RunContext, hook: Any) -> None:
        allocation = self._allocation(ctx, hook)
        try:
            worst = check_budget(ctx.profile, ctx.specs()[self.job], allocation)
        except BudgetExceeded as exc:
            raise AirflowFailException(str(exc)) from None
        self.log.info("Budget: %s worst case %.2f %s (%s) fits; allocation %s%s", self.job, worst.amount,
                      worst.billing_unit, worst.describe(), allocation.describe(), allocation.wait_note(worst.amount))

    # --- the operator's two entry points ---------------------------------------------------------------

    def execute(self, context: Any) -> Any:
        ctx, _ = self._bind(context)
        with self.waiting_out_outages(context):
            # A try that already submitted (since the run was last cleared) goes straight to its job.
            submitted_before = bool(self.history_since_clear(context).submissions)
            if not submitted_before:
                with self._hook() as hook:
                    self._before_submitting(ctx, hook)
                    self._keep_run_code(context, ctx, hook)
            summary = super().execute(context)  # defers; returns only when the job had already completed
            return self._report(context, summary)

    def _before_submitting(self, ctx: RunContext, hook: Any) -> None:
        """Skip a job that is not needed, ask a restarted stage to start afresh, check the budget."""
        decision = self._decide(ctx, hook)
        if decision is not None:
            self.log.info("%s: %s", self.job, decision.reason)
            if not decision.submit:
                raise AirflowSkipException(decision.reason)
            if decision.restart:
                self._start_afresh(ctx)
        self._check_budget(ctx, hook)

    def _start_afresh(self, ctx: RunContext) -> None:
        """mode restart: the submit moves the stage's outputs aside under the stage's lock, after the
        budget check, and with them every later stage's (trained on the outputs being replaced), so
        that none of those counts as complete any more. A live job writing any of them stops it."""
        stage = int(self.job[5:])
        self.replace_outputs = True
        self.supersede_dirs = tuple(str(ctx.paths.stage_dir(later)) for later in STAGES if later > stage)

    def billed_gpu_hours(self, run: JobStatus) -> float:
        """One run of the job as the ledger and the budget bill it (whole nodes on full-node partitions),
        so that the HPC view, which charts this figure, and the preflight count the same GPU-hours."""
        if self.cluster_profile is None:
            return super().billed_gpu_hours(run)
        return billed_hours(self.cluster_profile, usage_of(self.cluster_profile, run))

    def check_before_resubmit(self, context: Any, hook: Any) -> None:
        """A resubmission spends the allocation again: its worst case must still fit."""
        ctx, _ = self._bind(context)
        self._check_budget(ctx, hook)
        self._keep_run_code(context, ctx, hook)

    def _keep_run_code(self, context: Any, ctx: RunContext, hook: Any) -> None:
        """Refresh the DAG run's code marker before a job is submitted: the run is alive and its code must
        stay (:mod:`vcloud_pipeline.code_retention`). A failure is a warning: the job carries its code
        in its comment, which keeps the code while Slurm lists the job."""
        ti = context["ti"]
        try:
            touch_run(hook.runner, ctx.paths, run_key(ti.dag_id, ti.run_id), self.code_version)
        except (RemoteCommandError, TransportError, ValueError) as exc:
            self.log.warning("Could not refresh the code marker of this DAG run: %s", exc)

    def execute_complete(self, context: Any, event: dict[str, Any]) -> Any:
        self._bind(context)
        with self.waiting_out_outages(context):
            return self._report(context, super().execute_complete(context, event))

    def _report(self, context: Any, summary: dict[str, Any]) -> dict[str, Any]:
        """Add every job's state, the code, the metrics of the stage's ``best.pt`` (and of its last
        epoch), what its training gained on validation over its start and why it stopped, and the
        asset event to the summary.

        ``code_hash`` is the code the jobs ran; ``trained_code_hash`` the code that finished the
        stage, as the trainer recorded it in ``COMPLETE`` (and in every checkpoint).
        """
        ctx, synced = self._bind(context)
        hook = self._hook()
        states = {job_id: status.state.value for job_id, status in hook.statuses(summary["job_ids"]).items()}
        record = None
        if self.job.startswith("stage"):
            record = completion_record(hook.read_file(str(ctx.paths.complete_path(int(self.job[5:])))))
        best_epoch, best_metrics = best_checkpoint_metrics(record)
        summary.update({"job": self.job, "run": ctx.request.run_name, "profile": ctx.profile.name,
                        "code_hash": synced["code_hash"], "trained_code_hash": recorded_code_hash(record),
                        "states": states,
                        "allocation": self._allocation_after(ctx, hook),
                        "metrics": best_metrics, "best_epoch": best_epoch,
                        "final_metrics": final_metrics(record), "epochs": completed_epochs(record),
                        "validation_gain": validation_gain(record),
                        "gain_metric": gain_metric(record),
                        "stop_reason": stop_reason(record), "stop_detail": stop_detail(record)})
        asset = asset_for(self.job)
        if asset is not None and "outlet_events" in context:
            where = (str(ctx.paths.best_checkpoint(int(self.job[5:]))) if self.job.startswith("stage")
                     else str(ctx.paths.viewer_dir))
            context["outlet_events"][asset].extra.update({
                "profile": ctx.profile.name, "run": ctx.request.run_name, "path": where,
                "code_hash": synced["code_hash"], "job_ids": summary["job_ids"],
                "metrics": summary["metrics"],
            })
        self.log.info("%s done: jobs %s, %s GPU-hours, best.pt from epoch %s: metrics %s", self.job, states,
                      summary["gpu_hours"], best_epoch, summary["metrics"])
        return summary
