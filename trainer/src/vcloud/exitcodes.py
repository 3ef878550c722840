"""Process exit codes of ``python -m vcloud.train`` and ``vcloud.export``, named for the trainer.

The numbers are :mod:`vcloud.contract`'s (the job scripts and the DAG read the same ones). None
collides with what Python or Slurm use on their own (1 for an uncaught exception, 2 for argparse
errors, 128+N for death by signal N).
"""

from __future__ import annotations

from vcloud.contract import EXIT_BAD_CONFIG as BAD_CONFIG
from vcloud.contract import EXIT_ERROR as ERROR
from vcloud.contract import EXIT_GPUS_MISSING as GPUS_MISSING
from vcloud.contract import EXIT_OK as STAGE_COMPLETE
from vcloud.contract import EXIT_REQUEUE as REQUEUE
from vcloud.contract import EXIT_RESUME_REFUSED as RESUME_REFUSED

__all__ = ["BAD_CONFIG", "ERROR", "GPUS_MISSING", "REQUEUE", "RESUME_REFUSED", "STAGE_COMPLETE", "describe"]


def describe(code: int) -> str:
    """One phrase per exit code, for log lines written by whoever collects the exit status."""
    return {
        STAGE_COMPLETE: "stage complete",
        ERROR: "training error",
        BAD_CONFIG: "bad arguments or configuration",
        REQUEUE: "stopped on a signal after checkpointing (requeue)",
        GPUS_MISSING: "GPUs required but not visible to PyTorch; not training on the CPU",
        RESUME_REFUSED: "latest.pt was written by other code and cannot be resumed as asked; nothing trained",
    }.get(code, f"unexpected exit code {code}")
