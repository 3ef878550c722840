"""Jobs a DAG run would leave running when it ends: its summary cancels them.

A job task's watch cancels the task's job when a person ends the task (marks it failed or success)
while the watch runs (``SlurmJobTrigger.on_kill``). A gesture in the seconds between the task's
deferral and a triggerer picking its watch up stops a watch that never started: Airflow drops the
trigger, and the job would run on with nobody watching it, billing its hours. Each job task, before
it submits, looks at the jobs of the job tasks before it (they have ended, or it would not run: a
stage marked success lets the next one start at once), and the summary task, which runs once every
job task of the run has ended whatever their states (``all_done``: a stage marked failed ends the
run), at all of them: a job of an ended task still queued or running has no watch left and never
will. The jobs the run's tasks submitted are cancelled; a job a task only adopted (another run's, by
its comment), which the run that submitted it watches, is left running and said so. Pure except
:func:`settle_left_jobs`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from slurm_provider.cli.sbatch import parse_job_comment
from slurm_provider import JOB_ID_XCOM_KEY, JobStatus, SlurmHook

from vcloud_pipeline.plan.labels import JobLabel

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LeftJob:
    """A live job of an ended job task."""

    task_id: str
    status: JobStatus
    adopted: bool
    """Submitted by another run's task (its comment names it); this run's task only watched it."""


def left_running(job_ids: Mapping[str, str], statuses: Mapping[str, JobStatus], dag_id: str,
                 run_id: str) -> list[LeftJob]:
    """The jobs of the run's ended job tasks (``job_ids``: task id -> the last job it submitted or
    adopted) that Slurm still queues or runs."""
    left = []
    for task_id, job_id in job_ids.items():
        status = statuses.get(job_id)
        if status is None or status.is_terminal:
            continue
        comment = parse_job_comment(status.comment)
        ours = comment is not None and (comment.dag, comment.run, comment.task) == (dag_id, run_id, task_id)
        left.append(LeftJob(task_id, status, adopted=not ours))
    return left


def settle_left_jobs(hook: SlurmHook, ti: Any, dag_id: str, run_id: str,
                     task_ids: Iterable[str] | None = None) -> list[str]:
    """Cancel what :func:`left_running` finds among the jobs of the run's job tasks (``task_ids``, all
    of them by default: they must have ended), saying each in the log; the lines said."""
    wanted = [label.task_id for label in JobLabel] if task_ids is None else list(task_ids)
    job_ids = {task_id: str(job_id) for task_id in wanted
               if (job_id := ti.xcom_pull(task_ids=task_id, key=JOB_ID_XCOM_KEY))}
    if not job_ids:
        return []
    lines = []
    for left in left_running(job_ids, hook.statuses(list(job_ids.values())), dag_id, run_id):
        job = left.status
        if left.adopted:
            line = (f"Job {job.job_id} ({job.state.value}), watched by {left.task_id} until that task ended, was "
                    "submitted by another run, which watches it: left running")
        else:
            hook.cancel(job.job_id)
            line = (f"Job {job.job_id} of {left.task_id} was still {job.state.value} though its task had ended (a "
                    "person ended the task before its watch started): cancelled, so that no job of this run "
                    f"runs unwatched. Its checkpoints stay: clear {left.task_id} to go on from them")
        log.warning("%s", line)
        lines.append(line)
    return lines
