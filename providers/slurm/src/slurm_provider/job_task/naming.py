"""What a task's jobs are called, the comment they carry, where they write their output, and the
task's submission history.

Every job of a task carries a deterministic name (:func:`job_name_for`: the key adoption searches
by) and a JSON comment (DAG, task, run, submission number, the task's own token); the history of its
submissions lives in the task state store, which every try and clear of the task shares.
"""

from __future__ import annotations

import hashlib
import re
import uuid
from typing import TYPE_CHECKING

from slurm_provider.cli.job_files import job_log_name
from slurm_provider.cli.sbatch import JobComment
from slurm_provider.cli.exclusive_submit import exclusive_dir_marker
from slurm_provider.resubmission import Submission, SubmissionHistory

if TYPE_CHECKING:
    from airflow.sdk import Context

    from slurm_provider.operators import SlurmSubmitOperator

HISTORY_KEY = "slurm_submissions"
"""Task state store key of the task's submission history."""
SUBMITTER_KEY = "slurm_submitter"
"""Task state store key of the task's submitter token (``JobComment.by``)."""


def job_name_for(dag_id: str, task_id: str, run_id: str, map_index: int = -1) -> str:
    """Deterministic, Slurm-safe job name of one task in one DAG run (the key adoption searches by)."""
    base = re.sub(r"[^A-Za-z0-9_.-]+", "-", f"{dag_id}.{task_id}")[:80]
    digest = hashlib.sha1(f"{dag_id}\0{task_id}\0{run_id}\0{map_index}".encode()).hexdigest()[:10]
    return f"{base}.{digest}"


def try_number(context: Context) -> int:
    return int(getattr(context["ti"], "try_number", 1) or 1)


def clear_number(context: Context) -> int:
    """How often the DAG run was cleared: Airflow counts up on every clear of its tasks."""
    return int(getattr(context.get("dag_run"), "clear_number", 0) or 0)


def job_name(context: Context) -> str:
    ti = context["ti"]
    return job_name_for(ti.dag_id, ti.task_id, ti.run_id, getattr(ti, "map_index", -1) or -1)


def comment(op: SlurmSubmitOperator, context: Context, number: int) -> JobComment:
    ti = context["ti"]
    return JobComment(dag=ti.dag_id, task=ti.task_id, run=ti.run_id, attempt=number, stage=op.stage,
                      project=op.project_tag,
                      clear=clear_number(context), place=place(op), code=op.code_version or None,
                      xdir=exclusive_dir_marker(op.exclusive_dir) if op.exclusive_dir else None,
                      by=submitter_token(context))


def submitter_token(context: Context) -> str | None:
    """This task's own token (``JobComment.by``), made on first use and kept in its task state
    store, which every try and clear of the task in this deployment shares; None without a store."""
    store = context.get("task_state_store")
    if store is None:
        return None
    token = store.get(SUBMITTER_KEY)
    if not token:
        from airflow.sdk import NEVER_EXPIRE  # type: ignore[attr-defined]

        token = uuid.uuid4().hex[:12]
        store.set(SUBMITTER_KEY, token, retention=NEVER_EXPIRE)
    return str(token)


def place(op: SlurmSubmitOperator) -> str:
    """Short digest of the connection and log directory the jobs write to."""
    return hashlib.sha1(f"{op.conn_id}\0{op.log_dir.rstrip('/')}".encode()).hexdigest()[:10]


def output_pattern(op: SlurmSubmitOperator, context: Context) -> str:
    return f"{op.log_dir.rstrip('/')}/{job_log_name(job_name(context), '%j', 'out')}"


def error_pattern(op: SlurmSubmitOperator, context: Context) -> str:
    return f"{op.log_dir.rstrip('/')}/{job_log_name(job_name(context), '%j', 'err')}"


def log_path(op: SlurmSubmitOperator, context: Context, job_id: str, stream: str = "out") -> str:
    """The file job ``job_id`` writes its output (``out``) or error output (``err``) to."""
    return f"{op.log_dir.rstrip('/')}/{job_log_name(name_of_job(context, job_id), job_id, stream)}"


def adopted_submission(context: Context, job_id: str,
                        history: SubmissionHistory | None = None) -> Submission | None:
    """The record of ``job_id`` when this task adopted it instead of submitting it."""
    known = [*(history.submissions if history is not None else ()), *stored_history(context).submissions]
    return next((s for s in known if s.job_id == job_id and s.adopted), None)


def name_of_job(context: Context, job_id: str) -> str:
    """This task's job name, or the name of a job it adopted from another submitter."""
    adopted = next((s.name for s in stored_history(context).submissions
                    if s.job_id == job_id and s.name), None)
    return adopted or job_name(context)


def stored_history(context: Context) -> SubmissionHistory:
    store = context.get("task_state_store")
    return SubmissionHistory() if store is None else SubmissionHistory.from_json(store.get(HISTORY_KEY))


def store_history(context: Context, history: SubmissionHistory) -> None:
    store = context.get("task_state_store")
    if store is not None:
        from airflow.sdk import NEVER_EXPIRE  # type: ignore[attr-defined]

        store.set(HISTORY_KEY, history.to_json(), retention=NEVER_EXPIRE)  # type: ignore[arg-type]
