"""``scancel``: cancel or signal jobs, by id, validated before anything is sent."""

from __future__ import annotations

from collections.abc import Iterable

from slurm_provider.cli.values import join_argv
from slurm_provider.validation import ValidationError, validate_job_ids, validate_signal


def build_scancel(
    job_ids: Iterable[str | int],
    *,
    signal: str | int | None = None,
    batch_only: bool = False,
    full: bool = False,
) -> str:
    """``scancel``; with ``signal`` it only signals (e.g. ``USR1`` asks the trainer to checkpoint).

    ``batch_only`` (``--batch``) signals just the batch shell, ``full`` (``--full``) every step
    and the batch shell; they are mutually exclusive.
    """
    if batch_only and full:
        raise ValidationError("batch_only", "batch_only and full cannot both be set")
    argv = ["scancel"]
    if signal is not None:
        argv.append(f"--signal={validate_signal(signal)}")
    if batch_only:
        argv.append("--batch")
    if full:
        argv.append("--full")
    argv.extend(validate_job_ids(job_ids))
    return join_argv(argv)
