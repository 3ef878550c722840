"""A job task's settings checked before any SSH connection: every value that reaches a remote
command (paths, partition, account, time limit, ``sbatch`` flags, the code version in the job comment)
and every duration. A bad one fails the task at once, naming the setting and what it must be."""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import timedelta
from typing import TYPE_CHECKING

from slurm_provider.watch.followed_files import followed_files, load_fold
from slurm_provider.job_task.submission import seconds
from slurm_provider.validation import (
    ValidationError,
    validate_account,
    validate_extra_sbatch_options,
    validate_partition,
    validate_remote_path,
    validate_time_limit,
)

if TYPE_CHECKING:
    from slurm_provider.operators import SlurmSubmitOperator

CODE_VERSION = re.compile(r"^[A-Za-z0-9._:+-]{1,128}$")
"""A code version as the job comment carries it."""


def validate(op: SlurmSubmitOperator) -> None:
    """Every value that reaches a remote command is checked before any SSH connection."""
    op._deadline_seconds()
    if not isinstance(op.script, str) or not op.script.startswith("#!"):
        raise ValidationError("script", "must be a complete batch script starting with '#!'")
    validate_remote_path(op.log_dir, "log_dir", absolute=True)
    try:
        for file in followed_files(op.follow):
            validate_remote_path(file.path, "follow", absolute=True)
            load_fold(file.fold)
    except ValueError as exc:
        raise ValidationError("follow", str(exc), op.follow) from None
    if not isinstance(op.project_tag, str) or not op.project_tag.strip():
        raise ValidationError("project_tag", "must be a non-empty name such as 'airflow' or your project's")
    if op.partition is not None:
        validate_partition(op.partition)
    if op.account is not None:
        validate_account(op.account)
    if op.time_limit is not None:
        validate_time_limit(op.time_limit)
    if isinstance(op.sbatch_options, str):
        raise ValidationError("sbatch_options", "must be a list of flags such as ['--requeue'], not a string")
    op.sbatch_options = list(validate_extra_sbatch_options(list(op.sbatch_options or ()), "sbatch_options"))
    if op.export is not None and not isinstance(op.export, Mapping):
        raise ValidationError("export", "must be a mapping of environment variable names to values")
    if op.progress_path is not None:
        validate_remote_path(op.progress_path, "progress_path", absolute=True)
    if op.exclusive_dir is not None:
        validate_remote_path(op.exclusive_dir, "exclusive_dir", absolute=True)
    elif op.done_markers or op.replace_outputs or op.supersede_dirs:
        raise ValidationError("exclusive_dir", "done_markers, replace_outputs and supersede_dirs guard an "
                              "exclusive_dir: give the directory the job writes")
    if isinstance(op.done_markers, str) or isinstance(op.supersede_dirs, str):
        raise ValidationError("done_markers", "done_markers and supersede_dirs are lists of paths, not a string")
    for directory in op.supersede_dirs:
        validate_remote_path(directory, "supersede_dirs", absolute=True)
    for field, value in (("leave_out_bad_nodes_for", op.leave_out_bad_nodes_for),
                         ("node_fault_first_retry", op.node_fault_first_retry)):
        if isinstance(value, bool) or not isinstance(value, (int, float, timedelta)) or seconds(value) < 0:
            raise ValidationError(field, "must be a number of seconds (or a timedelta) of at least 0", value)
    if op.code_version is not None and not CODE_VERSION.match(str(op.code_version)):
        raise ValidationError("code_version", "must be 1-128 letters, digits or '._:+-' (it goes into the "
                              "job comment), e.g. a content hash", op.code_version)
