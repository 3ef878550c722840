"""Slurm integration for Airflow 3 over SSH: hook, operator, deferrable sensor and trigger.

Modules, one responsibility each:

- ``cli``: one module per Slurm command (``sbatch``, ``squeue``, ``sacct``, ``scontrol``,
  ``scancel``, ``sinfo``, ``sshare``) with its pure command lines and output parsers, plus
  ``job_files`` (log and progress reads on the login node) and ``values`` (what they share);
- ``state_vocabulary``, ``pending_reasons``: what every Slurm state and pending reason means;
- ``job_status``: ``JobStatus``, one job's status resolved from squeue and sacct;
- ``validation``: every value that reaches a shell;
- ``transport``: paramiko/asyncssh or the system OpenSSH client, and the ``ssh`` command line for
  rsync that logs in the same way;
- ``hooks``: one method per Slurm verb, plus ``ssh_command()`` for file transfers;
- ``watch``: watching a job until it ends: ``job_watch`` (a sans-IO state machine the trigger and
  the login-node wait drive), ``events`` (the typed events they fire), ``poller`` (one batched
  status query per cluster for every watched job; ``poll_schedule`` decides its waits, ``side_reads``
  are the logs, allocations and windows a cycle reads beside the statuses), ``subscription`` (what
  each of its cycles tells a watch), ``watch_request`` (what a trigger is asked to watch: the job,
  the schedule, the files it follows, as records), ``notes`` (how far a trigger's watch got, kept with its task), ``end_records`` and
  ``end_confirmation`` (a job's end, noticed within seconds), ``outage`` (a login node that does
  not answer), ``allocation``, ``maintenance``, ``pending_words``, ``followed_files``;
- ``job_task``: the steps of a task that runs one job (``submission``, ``ending``, ``naming``,
  ``settings``), which ``operators`` calls, and what it returns (``summary``);
- ``triggers``, ``login_wait``, ``operators``, ``sensors``; ``resubmission`` (budgets and progress);
  ``hints`` (known errors); ``bad_nodes``; ``exit_codes``; ``links``.

Public surface: the names below, imported from ``slurm_provider`` (``from slurm_provider import
SlurmSubmitOperator``), and the command lines and parsers of :mod:`slurm_provider.cli`. Everything
else is the provider's own and may change. The names load on first use, so importing the package
(as Airflow's provider discovery does) loads nothing of Airflow's task machinery.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from slurm_provider import timing
    from slurm_provider.bad_nodes import LEFT_OUT_XCOM_KEY
    from slurm_provider.watch.end_records import end_record_shell
    from slurm_provider.file_verbs import RemoteCommandError
    from slurm_provider.watch.followed_files import FOLLOW_INTERVAL, FOLLOW_XCOM_KEY
    from slurm_provider.hints import Hint, HintRule, format_hints, register_hints
    from slurm_provider.hooks import SlurmAsyncHook, SlurmCommandFailed, SlurmHook
    from slurm_provider.job_handles import JOB_HANDLES_XCOM_KEY, JobHandles
    from slurm_provider.job_status import JobStatus
    from slurm_provider.job_task.summary import JobSummary
    from slurm_provider.links import JOB_ID_XCOM_KEY, register_job_view, task_log_url
    from slurm_provider.login_wait import SlurmLoginTrigger
    from slurm_provider.operators import (
        DEFAULT_MAX_RETRY_DELAY,
        DEFAULT_RETRIES,
        DEFAULT_RETRY_DELAY,
        DEFAULT_RETRY_EXPONENTIAL_BACKOFF,
        SlurmSubmitOperator,
        job_name_for,
    )
    from slurm_provider.watch.outage import clock, span
    from slurm_provider.watch.pending_words import waiting_line
    from slurm_provider.protocols import SlurmVerbs
    from slurm_provider.resubmission import DEFAULT_BUDGETS
    from slurm_provider.sensors import SlurmJobSensor
    from slurm_provider.state_vocabulary import SlurmState, parse_state
    from slurm_provider.pending_reasons import classify_pending_reason
    from slurm_provider.transport import SSHCommand, TransportError
    from slurm_provider.triggers import SlurmJobTrigger
    from slurm_provider.validation import ValidationError, format_time_limit, parse_time_limit, validate_partition
    from slurm_provider.watch.notes import WATCH_XCOM_KEY
    from slurm_provider.watch.watch_request import FollowedFiles, WatchedJob, WatchSchedule

_PUBLIC: dict[str, tuple[str, ...]] = {
    # the Airflow parts
    "hooks": ("SlurmHook", "SlurmAsyncHook", "SlurmCommandFailed"),
    "operators": ("SlurmSubmitOperator", "job_name_for", "DEFAULT_RETRIES", "DEFAULT_RETRY_DELAY",
                  "DEFAULT_RETRY_EXPONENTIAL_BACKOFF", "DEFAULT_MAX_RETRY_DELAY"),
    "sensors": ("SlurmJobSensor",),
    "triggers": ("SlurmJobTrigger",),
    "watch.watch_request": ("WatchedJob", "WatchSchedule", "FollowedFiles"),
    "login_wait": ("SlurmLoginTrigger",),
    "protocols": ("SlurmVerbs",),
    "transport": ("TransportError", "SSHCommand"),
    "file_verbs": ("RemoteCommandError",),
    # what a job is, and the words for it
    "job_status": ("JobStatus",),
    "job_task.summary": ("JobSummary",),
    "job_handles": ("JobHandles", "JOB_HANDLES_XCOM_KEY"),
    "state_vocabulary": ("SlurmState", "parse_state"),
    "pending_reasons": ("classify_pending_reason",),
    "watch.pending_words": ("waiting_line",),
    "watch.outage": ("clock", "span"),
    "hints": ("Hint", "HintRule", "format_hints", "register_hints"),
    "validation": ("ValidationError", "format_time_limit", "parse_time_limit", "validate_partition"),
    # what a pipeline's job script writes, and what a resubmission may spend
    "watch.end_records": ("end_record_shell",),
    "resubmission": ("DEFAULT_BUDGETS",),
    # what a UI plugin reads of a task's watch
    "links": ("JOB_ID_XCOM_KEY", "register_job_view", "task_log_url"),
    "watch.notes": ("WATCH_XCOM_KEY",),
    "watch.followed_files": ("FOLLOW_INTERVAL", "FOLLOW_XCOM_KEY"),
    "bad_nodes": ("LEFT_OUT_XCOM_KEY",),
}
_MODULE_OF = {name: module for module, names in _PUBLIC.items() for name in names}
__all__ = sorted([*_MODULE_OF, "timing"])


def __getattr__(name: str) -> Any:
    """A public name, imported from its module on first use."""
    if name == "timing":
        return import_module("slurm_provider.timing")
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module 'slurm_provider' has no attribute {name!r}")
    value = getattr(import_module(f"slurm_provider.{module}"), name)
    globals()[name] = value
    return value
