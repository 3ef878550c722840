"""``sacct``: the accounting record, the source of truth once a job has finished (exit code,
elapsed time, every run of a requeued job and its steps).

Fields are ``SACCT_FIELDS``; ``Comment`` needs ``AccountingStoreFlags=job_comment``.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from dataclasses import dataclass

from slurm_provider.cli.values import (
    FIELD_SEPARATOR,
    TIME_FORMAT_ENV,
    JobIdParts,
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
from slurm_provider.validation import validate_job_ids, validate_job_name, validate_since, validate_user

SACCT_FIELDS: tuple[str, ...] = (
    "JobID",
    "JobIDRaw",
    "JobName",
    "State",
    "ExitCode",
    "DerivedExitCode",
    "Reason",
    "Elapsed",
    "ElapsedRaw",
    "Start",
    "End",
    "Submit",
    "NodeList",
    "AllocTRES",
    "Partition",
    "Account",
    "User",
    "Timelimit",
    "WorkDir",
    "Comment",
)
"""Fields of ``sacct --format``. ``Comment`` needs ``AccountingStoreFlags=job_comment`` (empty otherwise)."""


def _sacct_argv(*, allocations_only: bool, duplicates: bool) -> list[str]:
    argv = [
        "sacct",
        "--parsable2",
        "--noheader",
        f"--delimiter={FIELD_SEPARATOR}",
        f"--format={','.join(SACCT_FIELDS)}",
    ]
    if allocations_only:
        argv.append("--allocations")
    if duplicates:
        argv.append("--duplicates")
    return argv


def build_sacct(
    job_ids: Iterable[str | int],
    *,
    allocations_only: bool = True,
    duplicates: bool = True,
    since: str | None = None,
) -> str:
    """``sacct`` for many jobs at once: the source of truth once squeue has forgotten a job.

    ``allocations_only`` (``-X``) drops step rows (``.batch``, ``.extern``, ``.0``).
    ``duplicates`` (``-D``) returns one row per run of a requeued job; the newest decides
    (``slurm_provider.cli.sacct.latest_job_rows``). With ``--jobs`` sacct searches from the epoch, so ``since``
    is optional here (unlike :func:`build_sacct_by_name`).
    """
    ids = validate_job_ids(job_ids)
    argv = _sacct_argv(allocations_only=allocations_only, duplicates=duplicates)
    if since is not None:
        argv.append(f"--starttime={validate_since(since)}")
    argv.append(f"--jobs={','.join(ids)}")
    return f"{TIME_FORMAT_ENV} " + join_argv(argv)


def build_sacct_own_jobs(since: str) -> str:
    """``sacct`` of the login user's jobs since ``since`` (``now-7days``, ``2026-01-31``), every run."""
    argv = _sacct_argv(allocations_only=True, duplicates=True)
    argv.append(f"--starttime={validate_since(since)}")
    return f"{TIME_FORMAT_ENV} " + join_argv(argv)


def build_sacct_by_name(
    job_name: str,
    *,
    since: str,
    user: str | None = None,
    allocations_only: bool = True,
    duplicates: bool = True,
) -> str:
    """``sacct`` for jobs with this exact name. ``since`` is required: without ``--jobs`` sacct
    only looks back to midnight, and a job submitted yesterday would be missed."""
    argv = _sacct_argv(allocations_only=allocations_only, duplicates=duplicates)
    argv.append(f"--starttime={validate_since(since)}")
    argv.append(f"--name={validate_job_name(job_name)}")
    if user is not None:
        argv.append(f"--user={validate_user(user)}")
    return f"{TIME_FORMAT_ENV} " + join_argv(argv)


@dataclass(frozen=True)
class SacctRow:
    """One row of ``slurm_provider.cli.sacct.build_sacct``: a job, an array element, or a step of one."""

    job_id: str
    job_id_raw: str
    name: str
    state: str
    exit_code: int | None
    signal: int | None
    derived_exit_code: int | None
    reason: str | None
    elapsed_s: int | None
    start: str | None
    end: str | None
    submit: str | None
    node_list: str | None
    alloc_tres: str | None
    partition: str | None
    account: str | None
    user: str | None
    time_limit_s: int | None
    work_dir: str | None
    comment: str | None
    row_index: int
    """Position in sacct's output (sacct prints the runs of a requeued job oldest first)."""

    @functools.cached_property
    def id_parts(self) -> JobIdParts:
        """Parsed once per row: a year of a project's accounting is thousands of rows, each asked often."""
        return parse_job_id(self.job_id)

    @property
    def is_step(self) -> bool:
        return self.id_parts.is_step

    @property
    def step(self) -> str | None:
        return self.id_parts.step

    @property
    def job(self) -> str:
        """The job (or array element) this row belongs to: ``123_4.batch`` -> ``123_4``."""
        return self.id_parts.job


def parse_sacct(stdout: str | None) -> list[SacctRow]:
    """Rows of ``sacct --parsable2 --noheader --format=<SACCT_FIELDS>``; empty output gives []."""
    rows = []
    for index, line in enumerate(output_lines(stdout)):
        f = split_fields(line, SACCT_FIELDS, "sacct")
        parse_job_id(f["JobID"])
        exit_code, signal = parse_exit_code(f["ExitCode"])
        derived, _ = parse_exit_code(f["DerivedExitCode"])
        elapsed = parse_int(f["ElapsedRaw"])
        rows.append(
            SacctRow(
                job_id=f["JobID"].strip(),
                job_id_raw=f["JobIDRaw"].strip(),
                name=f["JobName"],
                state=f["State"].strip(),
                exit_code=exit_code,
                signal=signal,
                derived_exit_code=derived,
                reason=empty_to_none(f["Reason"]),
                elapsed_s=elapsed if elapsed is not None else parse_duration(f["Elapsed"]),
                start=parse_slurm_time(f["Start"]),
                end=parse_slurm_time(f["End"]),
                submit=parse_slurm_time(f["Submit"]),
                node_list=empty_to_none(f["NodeList"]),
                alloc_tres=empty_to_none(f["AllocTRES"]),
                partition=empty_to_none(f["Partition"]),
                account=empty_to_none(f["Account"]),
                user=empty_to_none(f["User"]),
                time_limit_s=parse_duration(f["Timelimit"]),
                work_dir=empty_to_none(f["WorkDir"]),
                comment=empty_to_none(f["Comment"]),
                row_index=index,
            )
        )
    return rows


def _run_order(row: SacctRow) -> tuple[str, int]:
    return (row.submit or "", row.row_index)


def latest_job_rows(rows: Iterable[SacctRow]) -> dict[str, SacctRow]:
    """The newest run of each job (step rows ignored), keyed by its JobID (``123``, ``123_4``).

    ``sacct -D`` prints one row per run of a requeued job. Slurm stamps a new Submit time on
    every requeue, so the row with the latest Submit wins; equal Submit times (same second)
    go to the later row, because sacct prints runs oldest first (:func:`rows_by_job`'s order).
    """
    return {job_id: job.latest for job_id, job in rows_by_job(rows).items()}


def runs_of(rows: Iterable[SacctRow], job_id: str) -> list[SacctRow]:
    """Every run of one job, oldest first (step rows ignored)."""
    return sorted((r for r in rows if not r.is_step and r.job_id == job_id), key=_run_order)


def steps_of(rows: Iterable[SacctRow], job_id: str) -> list[SacctRow]:
    """The step rows (``.batch``, ``.extern``, ``.0`` ...) of one job or array element."""
    return [r for r in rows if r.is_step and r.job == job_id]


@dataclass(frozen=True)
class JobRows:
    """One job's (or array element's) rows of an sacct answer: its runs oldest first, its steps."""

    runs: list[SacctRow]
    steps: list[SacctRow]

    @property
    def latest(self) -> SacctRow:
        return self.runs[-1]


def rows_by_job(rows: Iterable[SacctRow]) -> dict[str, JobRows]:
    """:func:`runs_of` and :func:`steps_of` of every job in one pass, keyed by JobID (``123``,
    ``123_4``); jobs with step rows only (their allocation row outside the time window) are left
    out. One pass, because a ledger reads a year of a project's jobs: asking each job's rows of the
    whole answer grows with the square of the jobs."""
    runs: dict[str, list[SacctRow]] = {}
    steps: dict[str, list[SacctRow]] = {}
    for row in rows:
        if row.is_step:
            steps.setdefault(row.job, []).append(row)
        else:
            runs.setdefault(row.job_id, []).append(row)
    return {job_id: JobRows(sorted(job_runs, key=_run_order), steps.get(job_id, []))
            for job_id, job_runs in runs.items()}
