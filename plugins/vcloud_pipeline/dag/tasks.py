"""What the training DAG's Python tasks do, as functions of a validated run and a Slurm hook.

The DAG file only wires these together. The ``plan`` task reads the profile and validates the
request once (:func:`plan_run`); every later task reads the frozen :class:`RunPlan` from its XCom
and never the profile file, so a profile edited while a run trains changes nothing in that run.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import logging
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from airflow.sdk.exceptions import AirflowException, AirflowFailException
from slurm_provider.slurm_versions import note_site_version
from slurm_provider import (
    DEFAULT_MAX_RETRY_DELAY,
    DEFAULT_RETRIES,
    DEFAULT_RETRY_DELAY,
    DEFAULT_RETRY_EXPONENTIAL_BACKOFF,
    JobSummary,
    RemoteCommandError,
    SlurmCommandFailed,
    SlurmVerbs,
    TransportError,
)
from vcloud.config import ConfigError, VCloudConfig, load_config
from vcloud.contract import (
    STAGES,
    export_scores_words,
    gain_per_gpu_hour,
    gain_unit,
)

from vcloud.stage_records import CompleteRecord
from vcloud_pipeline.dag.job_summary import RunJobSummary
from vcloud_pipeline.code.retention import RetentionPlan, mark_run, release_run, remove_unused_code_dirs
from vcloud_pipeline.plan.layout import run_key
from vcloud_pipeline.plan.request import RequestError, TrainingRequest, parse_request
from vcloud_pipeline.plan.labels import STAGE_LABELS, JobLabel, training_label
from vcloud_pipeline.plan.run_plan import RunPlan, SyncedCode
from vcloud_pipeline.budget.billing import Allocation
from vcloud_pipeline.budget.site_settings import SiteSetting, site_settings
from vcloud_pipeline.budget.preflight import (
    Ledger,
    check_image,
    check_jobs_budget,
    read_allocation,
    read_budget,
    read_ledger,
    test_only,
)
from vcloud_pipeline.profile import ClusterProfile, ProfileError, load_profile, overrides_from_environ
from vcloud_pipeline.jobs.render import LOG_OUTPUT_PATTERN
from vcloud_pipeline.code.tree import CodeTree
from vcloud_pipeline.plan.stages import StageDecisionError, decide_data, stages_without_work
from vcloud_pipeline.checkout import PROJECT_ROOT
from vcloud_pipeline.code.upload import local_manifest, sync_run
from vcloud_pipeline.provision.environment import JobEnvironment, read_image_identity
from vcloud_pipeline.provision.requirements import parse_requirements, runtime_requirements
from vcloud_pipeline.provision.step import ProvisionBusy, provision_environment

log = logging.getLogger(__name__)

PLAN_TASK = "plan"
SYNC_TASK = "sync_code"

RETRY_DELAY_ENV = "VCLOUD_RETRY_DELAY"
"""Seconds before the first retry of a task that talks to the cluster (a job task whose worker or
watch was lost, a step that could not reach the login node), doubling with each further one; unset or
empty: the Slurm provider's default (2 minutes)."""


def cluster_step_retries(environ: Mapping[str, str]) -> dict[str, Any]:
    """Task retries of every task that talks to the cluster, read when the DAG file is parsed: the
    Slurm provider's defaults, the first delay from :data:`RETRY_DELAY_ENV` where the deployment sets
    it. The Python steps (sync, checks, summary) retry only a failure to reach the login node (inside
    :func:`final_unless_unreachable`), so that a node down for minutes does not fail a run; the job
    tasks retry a lost watch and adopt their job (longer outages are waited out in the triggerer)."""
    text = (environ.get(RETRY_DELAY_ENV) or "").strip()
    delay = DEFAULT_RETRY_DELAY
    if text:
        try:
            seconds = float(text)
        except ValueError:
            seconds = -1.0
        if not seconds > 0:
            raise ValueError(f"{RETRY_DELAY_ENV}={text!r}: give the seconds before a first retry (e.g. 120), or "
                             "leave it unset for the Slurm provider's 2 minutes")
        delay = dt.timedelta(seconds=seconds)
    return {"retries": DEFAULT_RETRIES, "retry_delay": delay,
            "retry_exponential_backoff": DEFAULT_RETRY_EXPONENTIAL_BACKOFF, "max_retry_delay": DEFAULT_MAX_RETRY_DELAY}


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


def load_run_profile(name: str) -> ClusterProfile:
    """The profile a run is planned with: the file, the deployment's overrides, and ``{user}`` as the
    login of the profile's Airflow connection. Read by the ``plan`` task only."""
    try:
        overrides = overrides_from_environ(name) or None
        profile = load_profile(name, overrides=overrides)
        if profile.login_fields:  # paths such as /scratch/{user}: the user is the connection's login
            profile = load_profile(name, overrides=overrides, login=connection_login(profile.connection.conn_id))
        profile.require_complete()
    except ProfileError as exc:
        raise RequestError(str(exc)) from None
    return profile


def run_config(request: TrainingRequest, project_root: Path = PROJECT_ROOT) -> VCloudConfig:
    """The trainer configuration the run's jobs will load (the file ``sync_code`` sends)."""
    try:
        return load_config(project_root / request.config_path)
    except ConfigError as exc:
        raise RequestError(str(exc)) from None


def build_plan(request: TrainingRequest, project_root: Path = PROJECT_ROOT) -> RunPlan:
    """The run's frozen plan: the request, its profile as loaded now, the selected stages the run's
    inputs give nothing to do (from the trainer config in ``project_root``), and every job it may
    submit."""
    profile = load_run_profile(request.profile)
    without_work = stages_without_work(request, run_config(request, project_root))
    try:
        return RunPlan.build(request, profile, without_work)
    except StageDecisionError as exc:
        raise RequestError(str(exc)) from None


def connection_login(conn_id: str) -> str:
    """The user the profile's Airflow connection logs in as (reads the connection, no network)."""
    from slurm_provider import SlurmHook

    return SlurmHook(conn_id).remote_user()


def run_type_name(run_type: Any) -> str | None:
    """``scheduled``, ``backfill``, ``manual``... from the DAG run's ``run_type``.

    The task SDK hands over an enum whose ``str()`` is ``DagRunType.SCHEDULED``, not its value.
    """
    if run_type is None:
        return None
    return str(getattr(run_type, "value", run_type))


def plan_run(params: Mapping[str, Any], *, run_type: Any = None, logical_date: Any = None,
             project_root: Path = PROJECT_ROOT) -> dict[str, Any]:
    """Validate the run's params, profile and trainer config, decide which selected stages the run's
    inputs give nothing to do, and plan every job; everything later reads this plan. Fails before
    any I/O on the cluster."""
    conf = {k: v for k, v in params.items() if v is not None}
    request = parse_request(conf, run_type=run_type_name(run_type), logical_date=logical_date)
    plan = build_plan(request, project_root)
    log.info("run %s on profile %s: config %s, stages %s, mode %s%s", plan.run_name, request.profile,
             request.config, list(plan.stage_plan.stages), request.mode, " (dry run)" if request.dry_run else "")
    for reason in plan.without_work.values():
        log.info("%s", reason)
    for job in plan.jobs.values():
        log.info("%s: partition %s, %d node(s) x %d, %d s", job.label, job.partition, job.nodes,
                 job.gpus_per_node, job.time_seconds)
    return plan.to_xcom()


def sync_code(plan: RunPlan, hook: SlurmVerbs, *, project_root: Path = PROJECT_ROOT,
              dag_run: tuple[str, str] | None = None) -> dict[str, Any]:
    """Hash the code tree, render every job once with that hash, mirror code and scripts to the
    cluster, record that the DAG run ``dag_run`` (DAG id, run id) uses that code until it ends, then
    remove code directories that no live job and no unfinished DAG run uses beyond the newest few.
    ``dag_run`` None: a sync outside a DAG run, which records nothing. Returns :class:`SyncedCode`
    as JSON: the scripts and the digest of each."""
    tree = CodeTree(project_root)
    manifest = local_manifest(tree)
    requirements = runtime_requirements(project_root)
    environment = JobEnvironment.of(plan.profile, requirements, read_image_identity(plan.profile, hook))
    paths = plan.paths
    code = paths.code(manifest.hash)
    jobs = plan.render(manifest.hash, environment, dag_run)
    with tempfile.TemporaryDirectory(prefix="vcloud-jobs-") as staging:
        result = sync_run(paths, tree, jobs, manifest, hook, Path(staging))
    if result.code_sent:
        log.info("synced %d files (code %s) to %s in %.1f s; job scripts to %s", manifest.files, manifest.hash,
                 code.dir, result.code_seconds, paths.jobs_dir)
    else:
        log.info("code %s already on the cluster in %s, unchanged since it was synced; job scripts to %s",
                 manifest.hash, code.dir, paths.jobs_dir)
    if dag_run is not None:
        key = run_key(*dag_run)
        mark_run(hook, paths, key, manifest.hash,
                 f"DAG {dag_run[0]}, run {dag_run[1]}, run name {plan.run_name}, profile {plan.profile.name}")
        log.info("DAG run %s (marker %s) uses code %s until it ends", dag_run[1], key, manifest.hash)
    cleanup = clean_code_dirs(plan, hook, manifest.hash)
    synced = SyncedCode.recording(
        manifest.hash, {label: job.outer for label, job in jobs.items()},
        job_names={label: job.job_name for label, job in jobs.items()}, files=manifest.files, code_dir=str(code.dir), manifest_path=str(code.manifest),
        code_seconds=round(result.code_seconds, 3), code_sent=result.code_sent,
        code_dirs_removed=list(cleanup.remove) if cleanup else None,
        requirements=requirements.pins, requirements_hash=requirements.hash, environment=environment,
        preflight_key=plan.preflight_key(manifest.hash, environment))
    if plan.profile.provision is not None:
        log.info("jobs rendered for requirement set %s: %d pins, %s", environment.key, len(requirements),
                 environment.describe_image())
    for label, digest in synced.script_sha256.items():
        log.info("%s: %s (sha256 %s)", label, jobs[label].outer_path, digest)
    return synced.model_dump(mode="json")


def provision(plan: RunPlan, hook: SlurmVerbs, synced: SyncedCode) -> dict[str, Any]:
    """Install what the profile's container lacks of the runtime requirements the jobs were rendered
    for, once per requirement set (see :mod:`vcloud_pipeline.provision`). Nothing is submitted before
    it succeeds; a package that cannot be installed fails the task for good with the site's hint."""
    environment = synced.environment
    if environment is None:
        # Synced before sets were keyed by their image: its jobs name the set of the pins alone.
        pins = parse_requirements("\n".join(synced.requirements)) if synced.requirements else runtime_requirements()
        environment = JobEnvironment(requirements=tuple(pins.pins))
        log.info("the jobs were synced without their image: requirement set %s of the pins alone", environment.key)
    if plan.request.dry_run:
        log.info("dry run: requirement set %s (%s) is not provisioned", environment.key,
                 environment.describe_image())
        return {"profile": plan.profile.name, "requirements_hash": environment.requirement_set.hash,
                "set": environment.key, "image": environment.image, "state": "dry-run"}
    try:
        return provision_environment(plan.profile, hook, environment).to_json()
    except ProvisionBusy as exc:
        raise AirflowException(str(exc)) from exc  # retried: the other installer finishes meanwhile


def release_run_code(plan: RunPlan, hook: SlurmVerbs, dag_run: tuple[str, str]) -> None:
    """The DAG run has ended: its code is no longer kept for it (a failure is a warning: the marker
    then expires on its own)."""
    key = run_key(*dag_run)
    try:
        release_run(hook, plan.paths, key)
    except (RemoteCommandError, TransportError) as exc:
        log.warning("the marker of DAG run %s (%s) stays until it expires: %s", dag_run[1], key, exc)
        return
    log.info("DAG run %s ended: its code is no longer kept for it (marker %s removed)", dag_run[1], key)


def clean_code_dirs(plan: RunPlan, hook: SlurmVerbs, current: str) -> RetentionPlan | None:
    """Remove unused code directories; a failure is a warning (the run needs none of them), None."""
    paths = plan.paths
    try:
        retention = remove_unused_code_dirs(plan.profile, paths, hook, current)
    except (RemoteCommandError, TransportError, ValueError) as exc:
        log.warning("code directories in %s left as they are: %s", paths.code_root, exc)
        return None
    for line in retention.lines():
        log.info("%s", line)
    log.info("code directories in %s: %d kept (newest %d), %d removed", paths.code_root,
             len(retention.newest) + len(retention.in_use) + len(retention.in_runs) + len(retention.incomplete),
             plan.profile.paths.code_keep, len(retention.remove))
    return retention


def preflight_checks(plan: RunPlan, hook: SlurmVerbs, synced: SyncedCode) -> dict[str, Any]:
    """``sbatch --test-only`` of every training job still to run, the container image, and the budget
    of every job the run will submit (the preflight import job and the data job included): nothing
    has been submitted yet when this runs."""
    paths = plan.paths
    to_run = []
    for label in plan.stage_plan.training_labels():
        if label.stage is not None and plan.request.mode == "resume":
            sizes = hook.file_sizes([str(paths.complete_path(label.stage)), str(paths.best_checkpoint(label.stage))])
            if len(sizes) == 2:
                log.info("%s is complete: not checked", label)
                continue
        to_run.append(label)
    verdicts = {label: test_only(hook, synced.job_name(label), synced.script_for(label),
                                 output=str(paths.logs_dir / LOG_OUTPUT_PATTERN)) for label in to_run}
    for line in verdicts.values():
        log.info("test-only: %s", line)
    image = check_image(hook, plan.profile)
    ledger = read_ledger(hook, plan.profile)
    allocation = read_allocation(hook, plan.profile, ledger)
    log.info("allocation (%s): %s", allocation.source, allocation.describe())
    log.info("ledger of this project's jobs: %s", "; ".join(
        ledger.lines()[-1:] + [f"held by queued/running jobs {ledger.reserved:.2f}"]))
    settings = read_site_settings(hook, allocation, plan.conn_id)
    specs = plan.specs()
    budgeted = {label: specs[label] for label in _budgeted(plan, hook, to_run)}
    worst = check_jobs_budget(plan.profile, budgeted, allocation)
    for worst_label, case in worst.items():
        log.info("worst case %s: %.2f %s (%s)%s", worst_label, case.amount, case.billing_unit, case.describe(),
                 allocation.wait_note(case.amount))
    return {
        "test_only": verdicts,
        "image": image,
        "ledger_used": round(ledger.used, 4),
        "ledger_reserved": round(ledger.reserved, 4),
        "allocation": allocation.to_json(),
        "worst_case": {label: round(case.amount, 4) for label, case in worst.items()},
        "site_settings": [setting.to_json() for setting in settings],
    }


def read_site_settings(hook: SlurmVerbs, allocation: Allocation, conn_id: str) -> tuple[SiteSetting, ...]:
    """The site settings the pipeline relies on (:mod:`vcloud_pipeline.budget.site_settings`), each logged:
    a warning for one that does not hold. A controller that cannot list its settings is said, not fatal.
    The site's Slurm version comes with them, said once per process (a warning for an untested release)."""
    try:
        config = hook.site_config()
    except SlurmCommandFailed as exc:
        log.warning("site settings: scontrol show config gave no answer (%s); the settings the pipeline relies "
                    "on are not checked", exc)
        config = None
    if config is not None:
        note_site_version(conn_id, config.get("SLURM_VERSION"), "scontrol show config's SLURM_VERSION", log)
    settings = site_settings(config, allocation)
    for setting in settings:
        (log.info if setting.holds else log.warning)("%s", setting.line())
    return settings


def _budgeted(plan: RunPlan, hook: SlurmVerbs, to_run: list[JobLabel]) -> list[JobLabel]:
    """The jobs the run will submit, in order: the preflight import job, the data job if the dataset
    is missing, then ``to_run``."""
    labels = [JobLabel.PREFLIGHT]
    if JobLabel.DATA in plan.jobs:
        index = str(plan.paths.data_index)
        if decide_data(plan.stage_plan, hook.file_sizes([index]).get(index)).submit:
            labels.append(JobLabel.DATA)
    return labels + to_run


def job_summaries(ti: Any) -> dict[str, RunJobSummary]:
    """What each job task of the run returned, by task id (the tasks whose job completed)."""
    jobs = {label.task_id: ti.xcom_pull(task_ids=label.task_id) for label in JobLabel}
    return {task_id: RunJobSummary.from_json(value) for task_id, value in jobs.items() if JobSummary.is_summary(value)}


def stage_records(plan: RunPlan, hook: SlurmVerbs) -> dict[JobLabel, CompleteRecord | None]:
    """Every stage's ``COMPLETE`` record (epochs, final metrics) as the cluster has it now."""
    return {label: CompleteRecord.parse(hook.read_file(str(plan.paths.complete_path(stage))))
            for stage, label in zip(STAGES, STAGE_LABELS)}


def curve_pngs(plan: RunPlan, hook: SlurmVerbs) -> dict[str, str]:
    """The export's training-curve plot of each stage that has one, by stage label: where the run
    summary points for the curves (``<paths.viewer>/<run>/curves/stage{N}.png``, plotted from the
    stage's ``metrics.jsonl``). One command on the login node."""
    wanted = {label: str(plan.paths.curve_png(stage)) for stage, label in zip(STAGES, STAGE_LABELS)}
    present = hook.file_sizes(wanted.values())
    return {label: path for label, path in wanted.items() if present.get(path)}


def stage_yields(records: Mapping[JobLabel, CompleteRecord | None],
                 gpu_hours: Mapping[str, float | None]) -> dict[str, dict[str, Any]]:
    """Per stage: the GPU-hours it cost (``gpu_hours``, by stage label), the validation gain its
    ``best.pt`` has over the model it started from (its ``COMPLETE`` record, ``records``), the gain
    per GPU-hour, and why it stopped. Stages with neither hours nor a record are left out."""
    out: dict[str, dict[str, Any]] = {}
    for label in STAGE_LABELS:
        record, hours = records.get(label), gpu_hours.get(label)
        if record is None and hours is None:
            continue
        gain = record.validation_gain if record is not None else None
        per_hour = gain_per_gpu_hour(gain, hours)
        out[label] = {
            "gpu_hours": None if hours is None else round(hours, 4),
            "metric": record.gain_metric if record is not None else None,
            "gain": None if gain is None else round(gain, 4),
            "gain_per_gpu_hour": None if per_hour is None else round(per_hour, 4),
            "epochs": record.epochs if record is not None else None,
            "stop_reason": record.stop_reason if record is not None else None,
            "stop_detail": record.stop_detail if record is not None else None,
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


def summarize(plan: RunPlan, hook: SlurmVerbs, job_summaries: Mapping[str, RunJobSummary]) -> dict[str, Any]:
    """The run at a glance: per job what ran, per stage the final metrics, what its GPU-hours bought
    on validation and its training-curve PNG, the stages not submitted and why, the files, the ledger."""
    budget = read_budget(hook, plan.profile)
    log.info("allocation (%s): %s", budget.allocation.source, budget.allocation.describe())
    log.info("pace: %s", budget.pace.words)
    records = stage_records(plan, hook)
    paths = plan.paths
    files = hook.list_files(paths.outputs_dir) + [
        (f"viewer/{rel}", size) for rel, size in hook.list_files(paths.viewer_dir)]
    curves = curve_pngs(plan, hook)
    log.info("training curves: %s", "; ".join(f"{label} {path}" for label, path in curves.items())
             or "none plotted (the export job plots them)")
    hours: dict[str, float | None] = {label: job.gpu_hours for label, job in job_summaries.items()
                                      if training_label(label) is not None}
    yields = stage_yields({JobLabel(label): records.get(JobLabel(label)) for label in hours}, hours)
    for label, entry in yields.items():
        log.info("%s", yield_line(label, entry))
    exported = export_scores_words(_json_or_none(hook.read_file(str(paths.export_metrics))))
    if exported:
        log.info("%s", exported)
    not_submitted = {str(JobLabel.of_stage(stage)): reason for stage, reason in plan.without_work.items()}
    for reason in not_submitted.values():
        log.info("%s", reason)
    return {
        "run": plan.run_name,
        "profile": plan.profile.name,
        "jobs": {task_id: job.to_json() for task_id, job in job_summaries.items()},
        "stages": {label: record.to_json() if record is not None else None for label, record in records.items()},
        "stage_yields": yields,
        "not_submitted": not_submitted,
        "files": len(files),
        "curves": curves,
        "export": exported,
        "ledger": ledger_report(budget.ledger),
        "allocation": budget.allocation.to_json(),
        "pace": budget.pace.to_json(),
    }


def _json_or_none(text: str | None) -> Any:
    try:
        return json.loads(text) if text else None
    except ValueError:
        return None


def ledger_report(ledger: Ledger) -> dict[str, Any]:
    """This project's jobs as sacct bills them (per run and stage); the allocation is reported apart."""
    return {
        "used": round(ledger.used, 4),
        "reserved": round(ledger.reserved, 4),
        "by_stage": {f"{run} {label}": round(hours, 4) for (run, label), hours in ledger.summary.by_stage.items()},
        "lines": ledger.lines(),
    }
