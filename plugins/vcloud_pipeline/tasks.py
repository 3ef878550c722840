"""What the training DAG's Python tasks do, as functions of a validated run and a Slurm hook.

The DAG file only wires these together. Every task after ``plan`` rebuilds its
:class:`RunContext` from the plan's XCom (profile name, validated request), reloading the profile
from disk: cheap, and it keeps XComs small and free of derived state that could drift.
"""

from __future__ import annotations

import contextlib
import logging
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from airflow.sdk.exceptions import AirflowException, AirflowFailException
from slurm_provider.operators import (
    DEFAULT_MAX_RETRY_DELAY,
    DEFAULT_RETRIES,
    DEFAULT_RETRY_DELAY,
    DEFAULT_RETRY_EXPONENTIAL_BACKOFF,
)
from slurm_provider.transport.base import TransportError
from vcloud.config import ConfigError, VCloudConfig, load_config
from vcloud.contract import (
    STAGES,
    completed_epochs,
    gain_metric,
    gain_per_gpu_hour,
    gain_unit,
    stop_detail,
    stop_reason,
    validation_gain,
)

from vcloud_pipeline.code_retention import RetentionPlan, mark_run, release_run, remove_unused_code_dirs
from vcloud_pipeline.jobspec import JobSpec
from vcloud_pipeline.layout import RunPaths, run_key, run_paths
from vcloud_pipeline.params import RequestError, TrainingRequest, parse_request
from vcloud_pipeline.preflight import (
    Ledger,
    check_image,
    check_jobs_budget,
    read_allocation,
    read_ledger,
    test_only,
)
from vcloud_pipeline.profiles import ClusterProfile, ProfileError, load_profile, overrides_from_environ
from vcloud_pipeline.remote import RemoteCommandError, listing
from vcloud_pipeline.render import RenderedJob
from vcloud_pipeline.code_tree import CodeTree
from vcloud_pipeline.stage_decisions import (
    DATA,
    PREFLIGHT,
    StageDecisionError,
    StagePlan,
    completion_record,
    decide_data,
    stages_without_work,
)
from vcloud_pipeline.code_upload import PROJECT_ROOT, local_manifest, render_run_jobs, sync_run

log = logging.getLogger(__name__)

PLAN_TASK = "plan"
SYNC_TASK = "sync_code"

CLUSTER_STEP_RETRIES: dict[str, Any] = {
    "retries": DEFAULT_RETRIES, "retry_delay": DEFAULT_RETRY_DELAY,
    "retry_exponential_backoff": DEFAULT_RETRY_EXPONENTIAL_BACKOFF, "max_retry_delay": DEFAULT_MAX_RETRY_DELAY,
}
"""Task retries of the Python tasks that talk to the cluster (sync, checks, summary): the job tasks'
defaults, so that a login node down for minutes does not fail a run; inside
:func:`final_unless_unreachable` only a failure to reach it is retried. (The job tasks wait out
longer outages in the triggerer; these steps run before anything is submitted or after it all ended.)"""


@contextlib.contextmanager
def final_unless_unreachable() -> Iterator[None]:
    """A failure inside fails the task for good (a refused check, a failed sync stay so on a retry),
    unless the cluster could not be reached (a ``TransportError``), which the task's retries ride out."""
    try:
        yield
    except (TransportError, AirflowException):
        raise
    except Exception as exc:
        raise AirflowFailException(f"{type(exc).__name__}: {exc}") from exc


@dataclass(frozen=True)
class RunContext:
    """A validated request with its profile, layout and stage plan."""

    request: TrainingRequest
    profile: ClusterProfile
    paths: RunPaths
    plan: StagePlan

    @classmethod
    def build(cls, request: TrainingRequest, without_work: Mapping[int, str] | None = None) -> "RunContext":
        """``without_work``: the stages the plan decided not to submit (:func:`plan_run`)."""
        try:
            overrides = overrides_from_environ(request.profile) or None
            profile = load_profile(request.profile, overrides=overrides)
            if profile.login_fields:  # paths such as /scratch/{user}: the user is the connection's login
                profile = load_profile(request.profile, overrides=overrides,
                                       login=connection_login(profile.connection.conn_id))
            profile.require_complete()
        except ProfileError as exc:
            raise RequestError(str(exc)) from None
        plan = StagePlan.build(request, profile, without_work)
        paths = run_paths(profile, request.run_name, synthetic_preset=plan.data_preset)
        return cls(request=request, profile=profile, paths=paths, plan=plan)

    @classmethod
    def from_xcom(cls, planned: Mapping[str, Any]) -> "RunContext":
        """The plan as ``plan`` decided it (the stages it found without work included, never decided
        again from a config file that may have changed since)."""
        without_work = {int(stage): reason for stage, reason in (planned.get("without_work") or {}).items()}
        return cls.build(TrainingRequest.from_dict(planned["request"]), without_work)

    def specs(self) -> dict[str, JobSpec]:
        return self.plan.job_specs()

    def render(self, code_hash: str) -> dict[str, RenderedJob]:
        return render_run_jobs(self.profile, self.specs(), self.paths, code_hash)


def connection_login(conn_id: str) -> str:
    """The user the profile's Airflow connection logs in as (reads the connection, no network)."""
    from slurm_provider.hooks import SlurmHook

    return SlurmHook(conn_id).remote_user()


def run_type_name(run_type: Any) -> str | None:
    """``scheduled``, ``backfill``, ``manual``... from the DAG run's ``run_type``.

    The task SDK hands over an enum whose ``str()`` is ``DagRunType.SCHEDULED``, not its value.
    """
    if run_type is None:
        return None
    return str(getattr(run_type, "value", run_type))


def run_config(request: TrainingRequest, project_root: Path = PROJECT_ROOT) -> VCloudConfig:
    """The trainer configuration the run's jobs will load (the file ``sync_code`` sends)."""
    try:
        return load_config(project_root / request.config_path)
    except ConfigError as exc:
        raise RequestError(str(exc)) from None


def plan_run(params: Mapping[str, Any], *, run_type: Any = None, logical_date: Any = None,
             project_root: Path = PROJECT_ROOT) -> dict[str, Any]:
    """Validate the run's params, profile and trainer config, and decide which selected stages the
    run's inputs give nothing to do; everything later builds on this. Fails before any I/O on the
    cluster."""
    conf = {k: v for k, v in params.items() if v is not None}
    request = parse_request(conf, run_type=run_type_name(run_type), logical_date=logical_date)
    without_work = stages_without_work(request, run_config(request, project_root))
    try:
        ctx = RunContext.build(request, without_work)
    except StageDecisionError as exc:
        raise RequestError(str(exc)) from None
    ctx.render("0" * 64)  # every job must render (resources within the partitions' limits)
    log.info("run %s on profile %s: config %s, stages %s, mode %s%s", request.run_name, request.profile,
             request.config, list(ctx.plan.stages), request.mode, " (dry run)" if request.dry_run else "")
    for reason in without_work.values():
        log.info("%s", reason)
    return {
        "request": request.to_dict(),
        "without_work": {str(stage): reason for stage, reason in without_work.items()},
        "conn_id": ctx.profile.connection.conn_id,
        "outputs_dir": str(ctx.paths.outputs_dir),
        "viewer_dir": str(ctx.paths.viewer_dir),
        "logs_dir": str(ctx.paths.logs_dir),
    }


def sync_code(ctx: RunContext, runner: Any, *, project_root: Path = PROJECT_ROOT,
              dag_run: tuple[str, str] | None = None) -> dict[str, Any]:
    """Hash the code tree, render every job with that hash, mirror code and scripts to the cluster,
    record that the DAG run ``dag_run`` (DAG id, run id) uses that code until it ends, then remove
    code directories that no live job and no unfinished DAG run uses beyond the newest few.
    ``dag_run`` None: a sync outside a DAG run, which records nothing."""
    tree = CodeTree(project_root)
    manifest = local_manifest(tree)
    code = ctx.paths.code(manifest.hash)
    jobs = ctx.render(manifest.hash)
    with tempfile.TemporaryDirectory(prefix="vcloud-jobs-") as staging:
        result = sync_run(ctx.profile, ctx.paths, tree, jobs, manifest, runner, Path(staging))
    if result.code_sent:
        log.info("synced %d files (code %s) to %s in %.1f s; job scripts to %s", manifest.files, manifest.hash,
                 code.dir, result.code_seconds, ctx.paths.jobs_dir)
    else:
        log.info("code %s already on the cluster in %s, unchanged since it was synced; job scripts to %s",
                 manifest.hash, code.dir, ctx.paths.jobs_dir)
    if dag_run is not None:
        key = run_key(*dag_run)
        mark_run(runner, ctx.paths, key, manifest.hash,
                 f"DAG {dag_run[0]}, run {dag_run[1]}, run name {ctx.request.run_name}, profile {ctx.profile.name}")
        log.info("DAG run %s (marker %s) uses code %s until it ends", dag_run[1], key, manifest.hash)
    cleanup = clean_code_dirs(ctx, runner, manifest.hash)
    return {
        "code_hash": manifest.hash,
        "files": manifest.files,
        "code_dir": str(code.dir),
        "manifest_path": str(code.manifest),
        "code_seconds": round(result.code_seconds, 3),
        "code_sent": result.code_sent,
        "code_dirs_removed": list(cleanup.remove) if cleanup else None,
        "scripts": {label: job.outer for label, job in jobs.items()},
    }


def release_run_code(ctx: RunContext, runner: Any, dag_run: tuple[str, str]) -> None:
    """The DAG run has ended: its code is no longer kept for it (a failure is a warning: the marker
    then expires on its own)."""
    key = run_key(*dag_run)
    try:
        release_run(runner, ctx.paths, key)
    except (RemoteCommandError, TransportError) as exc:
        log.warning("the marker of DAG run %s (%s) stays until it expires: %s", dag_run[1], key, exc)
        return
    log.info("DAG run %s ended: its code is no longer kept for it (marker %s removed)", dag_run[1], key)


def clean_code_dirs(ctx: RunContext, runner: Any, current: str) -> RetentionPlan | None:
    """Remove unused code directories; a failure is a warning (the run needs none of them), None."""
    try:
        plan = remove_unused_code_dirs(ctx.profile, ctx.paths, runner, current)
    except (RemoteCommandError, TransportError, ValueError) as exc:
        log.warning("code directories in %s left as they are: %s", ctx.paths.code_root, exc)
        return None
    for line in plan.lines():
        log.info("%s", line)
    log.info("code directories in %s: %d kept (newest %d), %d removed", ctx.paths.code_root,
             len(plan.newest) + len(plan.in_use) + len(plan.in_runs) + len(plan.incomplete),
             ctx.profile.paths.code_keep, len(plan.remove))
    return plan


def preflight_checks(ctx: RunContext, hook: Any, code_hash: str) -> dict[str, Any]:
    """``sbatch --test-only`` of every training job still to run, the container image, and the budget
    of every job the run will submit (the preflight import job and the data job included): nothing
    has been submitted yet when this runs."""
    jobs = ctx.render(code_hash)
    to_run = []
    for label in ctx.plan.training_labels():
        if label.startswith("stage") and ctx.request.mode == "resume":
            stage = int(label[5:])
            sizes = hook.file_sizes([str(ctx.paths.complete_path(stage)), str(ctx.paths.best_checkpoint(stage))])
            if len(sizes) == 2:
                log.info("%s is complete: not checked", label)
                continue
        to_run.append(label)
    verdicts = {label: test_only(hook, jobs[label]) for label in to_run}
    for line in verdicts.values():
        log.info("test-only: %s", line)
    image = check_image(hook.runner, ctx.profile)
    ledger = read_ledger(hook, ctx.profile)
    allocation = read_allocation(hook, ctx.profile, ledger)
    log.info("allocation (%s): %s", allocation.source, allocation.describe())
    log.info("ledger of this project's jobs: %s", "; ".join(
        ledger.lines()[-1:] + [f"held by queued/running jobs {ledger.reserved:.2f}"]))
    budgeted = {label: ctx.specs()[label] for label in _budgeted(ctx, hook, to_run)}
    worst = check_jobs_budget(ctx.profile, budgeted, allocation)
    for label, case in worst.items():
        log.info("worst case %s: %.2f %s (%s)%s", label, case.amount, case.billing_unit, case.describe(),
                 allocation.wait_note(case.amount))
    return {
        "test_only": verdicts,
        "image": image,
        "ledger_used": round(ledger.used, 4),
        "ledger_reserved": round(ledger.reserved, 4),
        "allocation": allocation.to_json(),
        "worst_case": {label: round(case.amount, 4) for label, case in worst.items()},
    }


def _budgeted(ctx: RunContext, hook: Any, to_run: list[str]) -> list[str]:
    """The jobs the run will submit, in order: the preflight import job, the data job if the dataset
    is missing, then ``to_run``."""
    labels = [PREFLIGHT]
    if DATA in ctx.specs():
        index = str(ctx.paths.data_index)
        if decide_data(ctx.plan, hook.file_sizes([index]).get(index)).submit:
            labels.append(DATA)
    return labels + to_run


def stage_records(ctx: RunContext, hook: Any) -> dict[str, Any]:
    """Every stage's ``COMPLETE`` record (epochs, final metrics) as the cluster has it now."""
    out: dict[str, Any] = {}
    for stage in (0, 1, 2, 3):
        out[f"stage{stage}"] = completion_record(hook.read_file(str(ctx.paths.complete_path(stage))))
    return out


def curve_pngs(ctx: RunContext, hook: Any) -> dict[str, str]:
    """The export's training-curve plot of each stage that has one, by stage label: where the run
    summary points for the curves (``<paths.viewer>/<run>/curves/stage{N}.png``, plotted from the
    stage's ``metrics.jsonl``). One command on the login node."""
    wanted = {f"stage{stage}": str(ctx.paths.curve_png(stage)) for stage in STAGES}
    present = hook.file_sizes(wanted.values())
    return {label: path for label, path in wanted.items() if present.get(path)}


def stage_yields(records: Mapping[str, Mapping[str, Any] | None],
                 gpu_hours: Mapping[str, float | None]) -> dict[str, dict[str, Any]]:
    """Per stage: the GPU-hours it cost (``gpu_hours``, by stage label), the validation gain its
    ``best.pt`` has over the model it started from (its ``COMPLETE`` record, ``records``), the gain
    per GPU-hour, and why it stopped. Stages with neither hours nor a record are left out."""
    out: dict[str, dict[str, Any]] = {}
    for stage in STAGES:
        label = f"stage{stage}"
        record, hours = records.get(label), gpu_hours.get(label)
        if record is None and hours is None:
            continue
        gain = validation_gain(record)
        per_hour = gain_per_gpu_hour(gain, hours)
        out[label] = {
            "gpu_hours": None if hours is None else round(hours, 4),
            "metric": gain_metric(record),
            "gain": None if gain is None else round(gain, 4),
            "gain_per_gpu_hour": None if per_hour is None else round(per_hour, 4),
            "epochs": completed_epochs(record),
            "stop_reason": stop_reason(record),
            "stop_detail": stop_detail(record),
        }
    return out


def yield_line(label: str, entry: Mapping[str, Any]) -> str:
    """One stage's yield for a person: ``stage1: 0.0123 GPU-hours, validation psnr +0.52 dB over its
    start, 42.28 dB per GPU-hour; trained its 3 epochs``."""
    hours = entry.get("gpu_hours")
    parts = [f"{label}: " + ("GPU-hours not recorded in this run" if hours is None else f"{hours:.4f} GPU-hours")]
    unit = gain_unit(entry.get("metric"))
    if entry.get("gain") is None:
        parts.append("no start scored, no gain measured" if entry.get("stop_reason") else "not complete")
    else:
        parts.append(f"validation {entry['metric']} {entry['gain']:+.3f} {unit} over its start")
        if entry.get("gain_per_gpu_hour") is not None:
            parts.append(f"{entry['gain_per_gpu_hour']:.3f} {unit} per GPU-hour")
    line = ", ".join(parts)
    if entry.get("stop_detail"):
        line += f"; {entry['stop_detail']}"
    return line


def summarize(ctx: RunContext, hook: Any, job_summaries: Mapping[str, Any]) -> dict[str, Any]:
    """The run at a glance: per job what ran, per stage the final metrics, what its GPU-hours bought
    on validation and its training-curve PNG, the stages not submitted and why, the files, the ledger."""
    ledger = read_ledger(hook, ctx.profile)
    allocation = read_allocation(hook, ctx.profile, ledger)
    log.info("allocation (%s): %s", allocation.source, allocation.describe())
    records = stage_records(ctx, hook)
    files = listing(hook.runner, ctx.paths.outputs_dir) + [
        (f"viewer/{rel}", size) for rel, size in listing(hook.runner, ctx.paths.viewer_dir)]
    curves = curve_pngs(ctx, hook)
    log.info("training curves: %s", "; ".join(f"{label} {path}" for label, path in curves.items())
             or "none plotted (the export job plots them)")
    hours = {label: job.get("gpu_hours") for label, job in job_summaries.items() if label.startswith("stage")}
    yields = stage_yields({label: records.get(label) for label in hours}, hours)
    for label, entry in yields.items():
        log.info("%s", yield_line(label, entry))
    not_submitted = {f"stage{stage}": reason for stage, reason in ctx.plan.without_work.items()}
    for reason in not_submitted.values():
        log.info("%s", reason)
    return {
        "run": ctx.request.run_name,
        "profile": ctx.profile.name,
        "jobs": dict(job_summaries),
        "stages": records,
        "stage_yields": yields,
        "not_submitted": not_submitted,
        "files": len(files),
        "curves": curves,
        "ledger": ledger_report(ledger),
        "allocation": allocation.to_json(),
    }


def ledger_report(ledger: Ledger) -> dict[str, Any]:
    """This project's jobs as sacct bills them (per run and stage); the allocation is reported apart."""
    return {
        "used": round(ledger.used, 4),
        "reserved": round(ledger.reserved, 4),
        "by_stage": {f"{run} {label}": round(hours, 4) for (run, label), hours in ledger.summary.by_stage.items()},
        "lines": ledger.lines(),
    }
