"""``squeue``: the queue as slurmctld holds it (fresh, but forgets finished jobs after ``MinJobAge``).

Fields are ``SQUEUE_FIELDS``, separated by ``|`` with the free-text ``Comment`` last.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from slurm_provider.cli.values import (
    FIELD_SEPARATOR,
    TIME_FORMAT_ENV,
    empty_to_none,
    join_argv,
    output_lines,
    parse_duration,
    parse_exit_code,
    parse_int,
    parse_job_id,
    parse_slurm_time,
    split_fields,
)
from slurm_provider.validation import validate_account, validate_job_ids, validate_job_name, validate_user

SQUEUE_FIELDS: tuple[str, ...] = (
    "JobID",
    "ArrayJobID",
    "ArrayTaskID",
    "State",
    "Reason",
    "RestartCnt",
    "Name",
    "Partition",
    "Account",
    "UserName",
    "NodeList",
    "TimeUsed",
    "TimeLimit",
    "SubmitTime",
    "StartTime",
    "EndTime",
    "tres-alloc",
    "exit_code",
    "STDOUT",
    "STDERR",
    "WorkDir",
    "Comment",
)
"""Fields of ``squeue -O``. ``Comment`` stays last: it is the only free text, so extra separators
in it are joined back by the parser."""


LIVE_JOB_STATES: tuple[str, ...] = (
    "PENDING", "RUNNING", "SUSPENDED", "COMPLETING", "CONFIGURING", "REQUEUED", "REQUEUE_HOLD",
    "REQUEUE_FED", "RESIZING", "SIGNALING", "STAGE_OUT", "STOPPED", "SPECIAL_EXIT",
)
"""Every state in which a job may still (or again) write its outputs."""


def build_squeue_live_jobs(account: str | None = None) -> str:
    """``squeue`` of every user's live jobs (``LIVE_JOB_STATES``), every field; only ``account``'s
    when given.

    A directory of a project is shared by its members: whether a live job writes it must be asked of
    every job of the project's account, not only of the login user's (``--me``). ``--all`` includes
    hidden partitions, so no job escapes the question.
    """
    argv = ["squeue", "-h", "-r", "--all", f"--states={','.join(LIVE_JOB_STATES)}"]
    if account is not None:
        argv.append(f"--account={validate_account(account)}")
    argv.append(f"--Format={_squeue_format()}")
    return f"{TIME_FORMAT_ENV} " + join_argv(argv)


def _squeue_format() -> str:
    return ",".join(f"{field}:{FIELD_SEPARATOR}" for field in SQUEUE_FIELDS[:-1]) + f",{SQUEUE_FIELDS[-1]}:"


def build_squeue(job_ids: Iterable[str | int]) -> str:
    """``squeue`` for many jobs at once, every state (``-t all`` keeps just-finished jobs visible).

    One line per job and per array element (``-r``), no header, fixed ``-O`` fields (each
    ``Field:|`` means "no width limit, then a |"). With a single unknown id squeue exits 1 with
    ``Invalid job id specified`` (``slurm_provider.cli.values.is_invalid_job_id_error``); with several it lists the
    known ones and exits 0.
    """
    ids = validate_job_ids(job_ids)
    argv = ["squeue", "-h", "-r", "-t", "all", f"--jobs={','.join(ids)}", f"--Format={_squeue_format()}"]
    return f"{TIME_FORMAT_ENV} " + join_argv(argv)


def build_squeue_by_name(job_name: str, user: str | None = None, *, own: bool = False) -> str:
    """``squeue`` for jobs with this exact name (all states), optionally only one user's, or only
    the login user's (``own``: ``--me``, what adoption asks: a job of another user is never adopted)."""
    if own and user is not None:
        raise ValueError("give user or own, not both")
    argv = ["squeue", "-h", "-r", "-t", "all", f"--name={validate_job_name(job_name)}"]
    if user is not None:
        argv.append(f"--user={validate_user(user)}")
    if own:
        argv.append("--me")
    argv.append(f"--Format={_squeue_format()}")
    return f"{TIME_FORMAT_ENV} " + join_argv(argv)


def build_squeue_own_jobs() -> str:
    """``squeue --me``: every job of the login user, every state (adoption by comment without a name)."""
    argv = ["squeue", "-h", "-r", "-t", "all", "--me", f"--Format={_squeue_format()}"]
    return f"{TIME_FORMAT_ENV} " + join_argv(argv)


def build_squeue_account_jobs(account: str) -> str:
    """``squeue`` of every job of the account (all its users) and of the login user, every state.

    One command line, two queries (the user's own jobs may run under another account); a job in
    both is listed twice.
    """
    fields = f"--Format={_squeue_format()}"
    by_account = ["squeue", "-h", "-r", "-t", "all", f"--account={validate_account(account)}", fields]
    own = ["squeue", "-h", "-r", "-t", "all", "--me", fields]
    return f"{TIME_FORMAT_ENV} {join_argv(by_account)} && {TIME_FORMAT_ENV} {join_argv(own)}"


@dataclass(frozen=True)
class SqueueRow:
    """One job (or array element) from ``slurm_provider.cli.squeue.build_squeue``."""

    job_id: str
    """``123``, or ``123_4`` for an array element (squeue's own JobID field is the element's raw id)."""
    job_id_raw: str
    array_job_id: str | None
    array_task_id: str | None
    state: str
    reason: str | None
    restarts: int
    name: str
    partition: str | None
    account: str | None
    user: str | None
    node_list: str | None
    time_used_s: int | None
    time_limit_s: int | None
    submit: str | None
    start: str | None
    end: str | None
    tres: str | None
    exit_code: int | None
    signal: int | None
    std_out: str | None
    std_err: str | None
    work_dir: str | None
    comment: str | None


def parse_squeue(stdout: str | None) -> list[SqueueRow]:
    """Rows of ``squeue -h -O ...`` output in the fixed field order of ``SQUEUE_FIELDS``.

    Empty output (no such jobs) gives an empty list.
    """
    rows = []
    for line in output_lines(stdout):
        f = split_fields(line, SQUEUE_FIELDS, "squeue")
        parse_job_id(f["JobID"])  # refuse lines that are not job rows
        exit_code, signal = parse_exit_code(f["exit_code"])
        raw_id = f["JobID"].strip()
        array_job_id = empty_to_none(f["ArrayJobID"])
        array_task_id = empty_to_none(f["ArrayTaskID"])
        is_element = array_task_id is not None and array_job_id is not None
        rows.append(
            SqueueRow(
                job_id=f"{array_job_id}_{array_task_id}" if is_element else raw_id,
                job_id_raw=raw_id,
                array_job_id=array_job_id if is_element else None,
                array_task_id=array_task_id if is_element else None,
                state=f["State"].strip(),
                reason=empty_to_none(f["Reason"]),
                restarts=parse_int(f["RestartCnt"]) or 0,
                name=f["Name"],
                partition=empty_to_none(f["Partition"]),
                account=empty_to_none(f["Account"]),
                user=empty_to_none(f["UserName"]),
                node_list=empty_to_none(f["NodeList"]),
                time_used_s=parse_duration(f["TimeUsed"]),
                time_limit_s=parse_duration(f["TimeLimit"]),
                submit=parse_slurm_time(f["SubmitTime"]),
                start=parse_slurm_time(f["StartTime"]),
                end=parse_slurm_time(f["EndTime"]),
                tres=empty_to_none(f["tres-alloc"]),
                exit_code=exit_code,
                signal=signal,
                std_out=empty_to_none(f["STDOUT"]),
                std_err=empty_to_none(f["STDERR"]),
                work_dir=empty_to_none(f["WorkDir"]),
                comment=empty_to_none(f["Comment"]),
            )
        )
    return rows
