"""Process exit codes of ``python -m vcloud.train``: the contract with the sbatch script and the DAG.

The orchestrator decides what to do next from these numbers alone, so each one means exactly one
thing and none collides with what Python or Slurm use on their own (1 for an uncaught exception,
2 for argparse errors, 128+N for death by signal N).
"""

from __future__ import annotations

STAGE_COMPLETE = 0
"""The stage reached its epoch count; ``COMPLETE`` and the final checkpoint are on disk."""

ERROR = 1
"""Training failed (exception, diverged loss, missing predecessor checkpoint)."""

BAD_CONFIG = 2
"""Invalid command line or configuration; resubmitting the same job cannot help."""

REQUEUE = 85
"""Stopped on a signal (pre-timeout USR2 or TERM) after writing a checkpoint; resume by rerunning."""

GPUS_MISSING = 87
"""The job script says GPUs are required, but PyTorch sees fewer than the job was given: refused to
train on the CPU (which would bill GPU-hours for nothing). Rerunning the same job cannot help until
the job's environment shows PyTorch its GPUs. (86 is the job script's own refusal: changed code.)"""


def describe(code: int) -> str:
    """One phrase per exit code, for log lines written by whoever collects the exit status."""
    return {
        STAGE_COMPLETE: "stage complete",
        ERROR: "training error",
        BAD_CONFIG: "bad arguments or configuration",
        REQUEUE: "stopped on a signal after checkpointing (requeue)",
        GPUS_MISSING: "GPUs required but not visible to PyTorch; not training on the CPU",
    }.get(code, f"unexpected exit code {code}")
