"""The exit codes of the pipeline's jobs and what each one means to the person reading a failure.

A fact both sides must agree on: the job scripts (``render``) and the trainer set these codes, the
operator explains them. The trainer's own copy is ``vcloud.exitcodes`` (the trainer package is
synced to the cluster and not importable in Airflow); a test keeps the two equal.
"""

from __future__ import annotations

EXIT_REQUEUE = 85
"""The trainer's "stopped on a signal after writing a checkpoint" (``vcloud.exitcodes.REQUEUE``)."""

EXIT_CODE_MISMATCH = 86
"""The outer script refused to start: the synced code is not the code the job was rendered for."""

EXIT_GPUS_MISSING = 87
"""The job was given GPUs (the profile requires them) but PyTorch saw fewer: the trainer or the
preflight import check stopped instead of running on the CPU (``vcloud.exitcodes.GPUS_MISSING``)."""

MEANINGS: dict[int, str] = {
    EXIT_REQUEUE: "the trainer stopped on a signal after writing a checkpoint; the next start resumes from it",
    EXIT_CODE_MISMATCH: ("the job refused to start because the code on the cluster is not the code it was "
                         "rendered for (synced again since); run the task again so that it renders and "
                         "submits the job from the current code"),
    EXIT_GPUS_MISSING: ("the job was given GPUs, but PyTorch in the job saw fewer, so it stopped instead of "
                        "running on the CPU and billing GPU-hours for it; nothing was trained, and running "
                        "it again cannot help until the job's environment shows PyTorch its GPUs"),
}
"""One plain sentence per exit code, for the task's failure message."""
