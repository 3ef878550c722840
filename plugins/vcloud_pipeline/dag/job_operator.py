"""``PipelineJobOperator``: one job of a training run, submitted by the Slurm provider's operator.

What the job is (profile, connection, script, log directory, progress file) is only known once
the run's ``plan`` and ``sync_code`` tasks have run, so the operator binds itself from their XComs
(the frozen run plan and the synced code, :mod:`vcloud_pipeline.plan.run_plan`) at the start of
``execute`` and again in ``execute_complete`` (a resumed deferral builds a fresh operator); it
submits the script only if its digest is the one recorded when it was rendered. Before submitting it decides, from what is on the cluster, whether the job is needed
at all (:mod:`vcloud_pipeline.plan.stages`) and whether the allocation can pay for its worst case.
Submission, deferral, adoption and resubmission are the provider's, and so is waiting for a login
node that does not answer: these steps run inside ``waiting_out_outages``, so an outage during the
decision's file reads, the budget check or the report defers the task until the node answers and
the step starts over, instead of failing it.
"""

from __future__ import annotations

import datetime as dt
import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException

from slurm_provider import (
    DEFAULT_BUDGETS,
    FOLLOW_INTERVAL,
    JobStatus,
    JobSummary,
    RemoteCommandError,
    SlurmCommandFailed,
    SlurmSubmitOperator,
    SlurmVerbs,
    timing,
    TransportError,
)
from vcloud.contract import (
    BEST_CHECKPOINT,
    COMPLETE_FILE,
    NODE_FAULT_EXITS,
    STAGES,
    export_inputs_digest,
    exported_done_name,
)
from vcloud.stage_records import CompleteRecord

from vcloud_pipeline.jobs import exits as job_exits
from vcloud_pipeline.dag.assets import asset_for
from vcloud_pipeline.dag.curves import METRICS_FOLD, recorded_curve
from vcloud_pipeline.dag.job_summary import RunJobSummary
from vcloud_pipeline.budget.billing import Allocation, BudgetExceeded, billed_hours, check_budget
from vcloud_pipeline.code.retention import touch_run
from vcloud_pipeline.plan.layout import run_key
from vcloud_pipeline.budget.preflight import PROJECT_TAG, read_allocation, read_ledger, usage_of
from vcloud_pipeline.profile import ClusterProfile
from vcloud_pipeline.plan.stages import (
    Decision,
    ExportFiles,
    StageDecisionError,
    StageFiles,
    decide,
    decide_data,
    decide_export,
)
from vcloud_pipeline.plan.labels import JobLabel
from vcloud_pipeline.plan.preflight_proof import PreflightProof, decide_preflight
from vcloud_pipeline.plan.run_plan import RunPlan, ScriptRefused, SyncedCode
from vcloud_pipeline.dag.left_running import settle_left_jobs
from vcloud_pipeline.dag.queues import default_queue
from vcloud_pipeline.dag.tasks import PLAN_TASK, SYNC_TASK

if TYPE_CHECKING:
    import jinja2
    from airflow.sdk import Context

POLL_ENV = {
    "poll_interval": ("VCLOUD_POLL_INTERVAL", timing.POLL_INTERVAL),
    "max_poll_interval": ("VCLOUD_MAX_POLL_INTERVAL", timing.MAX_POLL_INTERVAL),
    "first_poll_delay": ("VCLOUD_FIRST_POLL_DELAY", timing.FIRST_POLL_DELAY),
    "follow_interval": ("VCLOUD_FOLLOW_INTERVAL", FOLLOW_INTERVAL),
    "short_job_wait": ("VCLOUD_SHORT_JOB_WAIT", 20.0),
}
"""Status polling of the trigger, overridable per deployment (keep the first poll >= 10 s there;
``airflow dags test`` on the local cluster can poll every few seconds). A setting left empty keeps the
default (``docker-compose.yaml`` passes the polling ones through empty: their defaults are
:mod:`slurm_provider.timing`'s).

Every job task first watches its job itself for ``short_job_wait`` seconds, reading its exit record
every second, before it defers: a job that ends within seconds (the import check, the data check
when the data are prepared, a stage that finds its work done or stops early, a smoke run's stages)
is seen to end at once instead of at the trigger's first poll, which comes 10 s after the deferral
at the earliest (Airflow 3.3 loses an event fired sooner). A job that runs on costs its task's worker
slot those seconds once, and is watched by the trigger from its exit record afterwards; one that ends
in the 10 s after the deferral (20-30 s after its submit) waits for that first poll, up to 10 s
longer than a trigger deferred at once would have taken. 0 (a deployment's
``VCLOUD_SHORT_JOB_WAIT``) defers at once."""

def poll_settings(environ: Mapping[str, str]) -> dict[str, float]:
    """The watch's timing of a job task (``POLL_ENV``) from the deployment's ``environ``; an unset or
    empty setting keeps its default."""
    return {attr: float(environ.get(env) or default) for attr, (env, default) in POLL_ENV.items()}


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

    def __init__(self, *, job: JobLabel | str, plan_task: str = PLAN_TASK, sync_task: str = SYNC_TASK,
                 **kwargs: Any) -> None:
        job = JobLabel(job)
        kwargs.setdefault("conn_id", "vcloud_unbound")
        kwargs.setdefault("script", _PLACEHOLDER_SCRIPT)
        kwargs.setdefault("log_dir", "/unbound")
        kwargs.setdefault("exit_code_meanings", job_exits.MEANINGS)
        kwargs.setdefault("project_tag", PROJECT_TAG)
        kwargs.setdefault("writes_end_record", True)  # every outer script writes one (jobs/render.py)
        super().__init__(stage=job, **kwargs)
        self.job = job
        self.plan_task = plan_task
        self.sync_task = sync_task
        self.cluster_profile: ClusterProfile | None = None
        """The run's profile as planned, bound from the plan's XCom at run time."""
        self.preflight_key: str | None = None
        """What the run's preflight check asks (:class:`SyncedCode`), bound from the sync's XCom."""

    # --- binding ---------------------------------------------------------------------------------

    def render_template_fields(self, context: Context, jinja_env: jinja2.Environment | None = None) -> None:
        """Bind the job from the run's XComs where Airflow would render Jinja templates.

        Airflow records the template fields right after this call and before ``execute``, so the
        Rendered Template view shows the very script ``execute`` submits. The script is a bash script
        rendered by :mod:`vcloud_pipeline.jobs.render`; Airflow's Jinja never sees it (``${#x}`` or a
        ``{{`` in it stays as it is).
        """
        self._bind(context)

    def _bind(self, context: Context) -> tuple[RunPlan, SyncedCode]:
        """The run's plan and synced code from XCom, validated; the job's script only if its digest is
        the one recorded when it was rendered."""
        ti = context["ti"]
        planned = ti.xcom_pull(task_ids=self.plan_task)
        synced_xcom = ti.xcom_pull(task_ids=self.sync_task)
        if not planned or not synced_xcom:
            raise AirflowFailException(f"{self.job}: no XCom from {self.plan_task}/{self.sync_task}; those tasks "
                                       "must run first in the same DAG run")
        try:
            plan = RunPlan.from_xcom(planned)
            synced = SyncedCode.model_validate(synced_xcom)
            self.script = synced.script_for(self.job)
        except (ValueError, ScriptRefused) as exc:  # pydantic's ValidationError is a ValueError
            raise AirflowFailException(f"{self.job}: {exc}") from None
        paths = plan.paths
        self.conn_id = plan.conn_id
        self.code_version = synced.code_hash  # in the job comment: the cleanup keeps this code
        self.log_dir = str(paths.logs_dir)
        if self.job.stage is not None:
            self.progress_path = str(paths.progress_path(self.job.stage))
            # The watch follows the stage's metrics.jsonl: the HPC view draws its curve while it trains.
            self.follow = [{"path": str(paths.metrics_path(self.job.stage)), "fold": METRICS_FOLD}]
        self.exclusive_dir = self._writes(plan)
        self.done_markers = self._done_when(plan)
        budget = plan.request.max_resubmits
        self.resubmit_budgets = {cause: budget for cause in DEFAULT_BUDGETS}
        self.gpu_billing_factor = plan.profile.billing.factor
        self.release_held = plan.profile.jobs.release_held
        self.leave_out_bad_nodes_for = plan.profile.jobs.bad_node_hours * 3600
        self.node_fault_exit_codes = NODE_FAULT_EXITS
        self.node_fault_first_retry = plan.profile.jobs.node_fault_first_retry_seconds
        self.cluster_profile = plan.profile
        self.preflight_key = synced.preflight_key
        # The trigger goes to this task's queue ([triggerer] queues_enabled): the run's profile's, the
        # host holding its connection's ControlMaster socket (vcloud_pipeline.dag.queues).
        self.queue = plan.profile.connection.queue or default_queue()
        if plan.profile.accelerator.missing_gpu_hint:
            self.hint_overrides = {GPUS_NOT_VISIBLE: plan.profile.accelerator.missing_gpu_hint}
        for attr, value in poll_settings(os.environ).items():
            setattr(self, attr, value)
        return plan, synced

    def _writes(self, plan: RunPlan) -> str | None:
        """The directory this job writes, which at most one live job may write at a time."""
        paths = plan.paths
        if self.job.stage is not None:
            return str(paths.stage_dir(self.job.stage))
        if self.job is JobLabel.DATA:
            return str(paths.data_dir.parent)
        if self.job is JobLabel.EXPORT:
            return str(paths.viewer_dir)
        return None  # the preflight import check writes nothing but its log

    def _done_when(self, plan: RunPlan) -> tuple[str, ...]:
        """Files inside :meth:`_writes` whose presence means the job's work is done, looked at under
        the submit lock: a stage is complete with ``COMPLETE`` and ``best.pt``, the synthetic dataset
        with its index. A job that finished a moment before this one's submit is not repeated. The
        export's (``EXPORTED.<digest>`` of the stage outputs there are now) is named by :meth:`_decide`,
        which reads those outputs' stamps."""
        if self.job.trains:
            return (COMPLETE_FILE, BEST_CHECKPOINT)
        if self.job is JobLabel.DATA:
            paths = plan.paths
            return (str(paths.data_index.relative_to(paths.data_dir.parent)),)
        return ()

    # --- deciding ----------------------------------------------------------------------------------

    def _decide(self, plan: RunPlan, hook: SlurmVerbs) -> Decision | None:
        """Whether the job is needed, from what is on the cluster (None: submit without a reason)."""
        paths = plan.paths
        if self.job is JobLabel.PREFLIGHT:
            return self._decide_preflight(plan, hook)
        if self.job is JobLabel.DATA:
            sizes = hook.file_sizes([str(paths.data_index)])
            return decide_data(plan.stage_plan, sizes.get(str(paths.data_index)))
        if self.job is JobLabel.EXPORT:
            export = self._export_files(plan, hook)
            if export is not None:  # the submit looks for this export's done marker under the lock
                self.done_markers = (exported_done_name(export_inputs_digest(export.stamps)),)
            return decide_export(plan.stage_plan, export, paths)
        stage = self.job.stage
        assert stage is not None
        wanted = [paths.complete_path(stage), paths.best_checkpoint(stage)]
        if stage > 0:
            wanted.append(paths.best_checkpoint(plan.stage_plan.predecessor(stage)))
        sizes = hook.file_sizes([str(p) for p in wanted])
        files = StageFiles(complete=sizes.get(str(wanted[0])), best=sizes.get(str(wanted[1])),
                           predecessor_best=sizes.get(str(wanted[2])) if stage > 0 else None)
        try:
            return decide(plan.stage_plan, stage, files, paths)
        except StageDecisionError as exc:
            raise AirflowFailException(str(exc)) from None

    def _decide_preflight(self, plan: RunPlan, hook: SlurmVerbs) -> Decision:
        """Skip the import check where a passed one answered the same question lately (one read)."""
        reuse_hours = plan.profile.jobs.preflight_reuse_hours
        key, code = self.preflight_key, self.code_version
        proof = hook.read_file(str(plan.paths.preflight_proof(code, key))) if key and code and reuse_hours else None
        return decide_preflight(key, proof, dt.datetime.now(dt.timezone.utc), reuse_hours)

    def _record_preflight_proof(self, plan: RunPlan, synced: SyncedCode, hook: SlurmVerbs, job: JobSummary) -> None:
        """Leave the proof of a passed import check for later runs that ask the same; a proof that
        cannot be written costs them a check of their own, never this task its success."""
        key = synced.preflight_key
        if key is None or not plan.profile.jobs.preflight_reuse_hours:
            return
        proof = PreflightProof(
            key=key, job_id=job.job_id, code_hash=synced.code_hash,
            environment=synced.environment.describe_image() if synced.environment else "its environment",
            partition=plan.jobs[JobLabel.PREFLIGHT].partition, run=plan.run_name,
            proven_at=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"))
        path = plan.paths.preflight_proof(synced.code_hash, key)
        try:
            hook.make_dirs([path.parent], what="creating the preflight proofs' directory")
            hook.write_file(path, proof.to_json())
        except (RemoteCommandError, SlurmCommandFailed) as exc:
            self.log.warning("Could not record that job %s passed the preflight check (%s): later runs check again",
                             job.job_id, exc)
            return
        self.log.info("preflight: passed; recorded in %s: runs asking the same within %d h skip their check", path,
                      plan.profile.jobs.preflight_reuse_hours)

    def _export_files(self, plan: RunPlan, hook: SlurmVerbs) -> ExportFiles | None:
        """The export's marker and its inputs' stamps now (two commands); None where the run exports
        nothing or is a dry run, which reads no file."""
        if not plan.request.export or plan.request.dry_run:
            return None
        inputs = plan.paths.export_inputs()
        stamps = hook.file_stamps([str(p) for p in inputs.values()])
        return ExportFiles(marker=hook.read_file(str(plan.paths.exported_marker)),
                           stamps={name: stamps[str(path)] for name, path in inputs.items() if str(path) in stamps})

    def _allocation(self, plan: RunPlan, hook: SlurmVerbs) -> Allocation:
        return read_allocation(hook, plan.profile, read_ledger(hook, plan.profile))

    def _allocation_after(self, plan: RunPlan, hook: SlurmVerbs) -> dict[str, Any] | None:
        """The allocation once the job ended, for the record (the HPC view's burn-down); a cluster that
        cannot be asked now costs the record this figure, never the finished job its success."""
        try:
            return self._allocation(plan, hook).to_json()
        except Exception as exc:  # transport errors, unreadable sacct/sshare output
            self.log.warning("Could not read the allocation after %s finished: %s", self.job, exc)
            return None

    def _check_budget(self, plan: RunPlan, hook: SlurmVerbs) -> None:
        allocation = self._allocation(plan, hook)
        try:
            worst = check_budget(plan.profile, plan.jobs[self.job].spec, allocation)
        except BudgetExceeded as exc:
            raise AirflowFailException(str(exc)) from None
        self.log.info("Budget: %s worst case %.2f %s (%s) fits; allocation %s%s", self.job, worst.amount,
                      worst.billing_unit, worst.describe(), allocation.describe(), allocation.wait_note(worst.amount))

    # --- the operator's two entry points ---------------------------------------------------------------

    def execute(self, context: Context) -> Any:
        plan, _ = self._bind(context)
        with self.waiting_out_outages(context):
            # A try that already submitted (since the run was last cleared) goes straight to its job.
            submitted_before = bool(self.history_since_clear(context).submissions)
            if not submitted_before:
                with self._hook() as hook:
                    ti = context["ti"]
                    settle_left_jobs(hook, ti, ti.dag_id, ti.run_id, task_ids=self._earlier_job_tasks())
                    self._before_submitting(plan, hook)
                    self._keep_run_code(context, plan, hook)
            summary = super().execute(context)  # defers; returns only when the job had already completed
            return self._report(context, summary)

    def _earlier_job_tasks(self) -> list[str]:
        """The job tasks before this one in the run (the DAG chains them in :class:`JobLabel` order)."""
        labels = list(JobLabel)
        return [label.task_id for label in labels[:labels.index(self.job)]]

    def _before_submitting(self, plan: RunPlan, hook: SlurmVerbs) -> None:
        """Skip a job that is not needed, ask a restarted stage to start afresh, check the budget."""
        decision = self._decide(plan, hook)
        if decision is not None:
            self.log.info("%s: %s", self.job, decision.reason)
            if not decision.submit:
                raise AirflowSkipException(decision.reason)
            if decision.restart:
                self._start_afresh(plan)
        self._check_budget(plan, hook)

    def _start_afresh(self, plan: RunPlan) -> None:
        """mode restart: the submit moves the stage's outputs aside under the stage's lock, after the
        budget check, and with them every later stage's (trained on the outputs being replaced), so
        that none of those counts as complete any more. A live job writing any of them stops it."""
        stage = self.job.stage
        assert stage is not None
        self.replace_outputs = True
        self.supersede_dirs = tuple(str(plan.paths.stage_dir(later)) for later in STAGES if later > stage)

    def billed_gpu_hours(self, run: JobStatus) -> float:
        """One run of the job as the ledger and the budget bill it (whole nodes on full-node partitions),
        so that the HPC view, which charts this figure, and the preflight count the same GPU-hours."""
        if self.cluster_profile is None:
            return super().billed_gpu_hours(run)
        return billed_hours(self.cluster_profile, usage_of(self.cluster_profile, run))

    def check_before_resubmit(self, context: Context, hook: SlurmVerbs) -> None:
        """A resubmission spends the allocation again: its worst case must still fit."""
        plan, _ = self._bind(context)
        self._check_budget(plan, hook)
        self._keep_run_code(context, plan, hook)

    def _keep_run_code(self, context: Context, plan: RunPlan, hook: SlurmVerbs) -> None:
        """Refresh the DAG run's code marker before a job is submitted: the run is alive and its code must
        stay (:mod:`vcloud_pipeline.code.retention`). A failure is a warning: the job carries its code
        in its comment, which keeps the code while Slurm lists the job."""
        ti = context["ti"]
        try:
            touch_run(hook, plan.paths, run_key(ti.dag_id, ti.run_id), str(self.code_version))
        except (RemoteCommandError, TransportError, ValueError) as exc:
            self.log.warning("Could not refresh the code marker of this DAG run: %s", exc)

    def execute_complete(self, context: Context, event: dict[str, Any]) -> Any:
        self._bind(context)
        with self.waiting_out_outages(context):
            return self._report(context, super().execute_complete(context, event))

    def _report(self, context: Context, summary: dict[str, Any]) -> dict[str, Any]:
        """The provider's job summary with every job's state, the code, the metrics of the stage's
        ``best.pt`` (and of its last epoch), what its training gained on validation over its start and
        why it stopped (:class:`~vcloud_pipeline.dag.job_summary.RunJobSummary`, as JSON), and the
        asset event.

        ``code_hash`` is the code the jobs ran; ``trained_code_hash`` the code that finished the
        stage, as the trainer recorded it in ``COMPLETE`` (and in every checkpoint).
        """
        plan, synced = self._bind(context)
        paths = plan.paths
        hook = self._hook()
        job = JobSummary.from_json(summary)
        states = {job_id: status.state.value for job_id, status in hook.statuses(list(job.job_ids)).items()}
        record = curve = None
        if self.job.stage is not None:
            record = CompleteRecord.parse(hook.read_file(str(paths.complete_path(self.job.stage))))
            curve = self._curve(hook, str(paths.metrics_path(self.job.stage)))
        best_epoch, best_metrics = record.best_epoch_and_metrics() if record is not None else (None, None)
        report = RunJobSummary(
            job=job, label=str(self.job), run=plan.run_name, profile=plan.profile.name, code_hash=synced.code_hash,
            states=states, allocation=self._allocation_after(plan, hook), metrics=best_metrics, best_epoch=best_epoch,
            curve=curve)
        if record is not None:
            report = report.with_stage(record)
        if self.job is JobLabel.PREFLIGHT:
            self._record_preflight_proof(plan, synced, hook, job)
        asset = asset_for(self.job)
        if asset is not None and "outlet_events" in context:
            where = (str(paths.best_checkpoint(self.job.stage)) if self.job.stage is not None
                     else str(paths.viewer_dir))
            context["outlet_events"][asset].extra.update({
                "profile": plan.profile.name, "run": plan.run_name, "path": where,
                "code_hash": synced.code_hash, "job_ids": list(job.job_ids),
                "metrics": report.to_json()["metrics"],
            })
        self.log.info("%s done: jobs %s, %s GPU-hours, best.pt from epoch %s: metrics %s", self.job, states,
                      job.gpu_hours, best_epoch, best_metrics)
        if record is not None:
            self.log.info("%s's best.pt: %s", self.job, record.describe_lineage())
        return report.to_json()

    def _curve(self, hook: SlurmVerbs, path: str) -> dict[str, Any] | None:
        """The stage's training curve from its ``metrics.jsonl``, thinned to ``CURVE_POINTS`` a series, for
        the HPC view (whose API server does not read the cluster); None when the file cannot be read."""
        try:
            text = hook.read_file(path)
        except (RemoteCommandError, SlurmCommandFailed) as exc:  # it ran and failed; an outage is waited out
            self.log.warning("Could not read %s for the HPC view's training curve: %s", path, exc)
            return None
        return recorded_curve(text or "")
