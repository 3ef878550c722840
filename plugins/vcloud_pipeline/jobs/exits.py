"""What the exit codes of the pipeline's jobs mean, for the task's failure message.

The numbers are :mod:`vcloud.contract`'s, which the job scripts (include/sbatch/, filled in by
:mod:`vcloud_pipeline.jobs.render`) and the trainer use.
"""

from __future__ import annotations

from vcloud.contract import (
    EXIT_BAD_CONFIG,
    EXIT_CODE_MISMATCH,
    EXIT_ERROR,
    EXIT_GPUS_MISSING,
    EXIT_REQUEUE,
    EXIT_RESUME_REFUSED,
    EXIT_RUNTIME_FAILED,
)

MEANINGS: dict[int, str] = {
    EXIT_ERROR: "the program raised an error; its traceback is in the job's error output (below).",
    EXIT_BAD_CONFIG: "the trainer refused its arguments or configuration; running the same job again cannot "
                     "help: fix the config or the run's params.",
    EXIT_REQUEUE: "the trainer stopped on a signal after writing a checkpoint, and the job did not requeue "
                  "itself (it does so only after Slurm's pre-timeout USR2, and not after 3 starts in a row "
                  "that ended before training: then raise time_limit). Run the task again to resume from "
                  "latest.pt.",
    EXIT_CODE_MISMATCH: "the job refused to start because the code directory of its hash on the cluster is "
                        "missing or holds other code (removed by a cleanup, or edited there). Clear the run's "
                        "sync_code task and this one to sync the code again and submit the job.",
    EXIT_GPUS_MISSING: "the job was given GPUs, but PyTorch in the job saw fewer, so it stopped instead of "
                       "running on the CPU and billing GPU-hours for it; nothing was trained. On one node that "
                       "is the node's fault (the profile's jobs.bad_node_hours leaves it out and resubmits); "
                       "where every node shows it, the job's environment does not show PyTorch its GPUs (see "
                       "the hint).",
    EXIT_RUNTIME_FAILED: "the container runtime did not start on the job's node (the job's output says what it "
                         "said), so the job did nothing. That is the node's fault: the profile's "
                         "jobs.bad_node_hours leaves such nodes out and resubmits; where it happens on every "
                         "node, check the profile's container image and runtime.",
    EXIT_RESUME_REFUSED: "the trainer refused to resume the stage's latest.pt, written by other code: its weights "
                         "no longer fit the model this code builds, or its optimizer layout differs and the run "
                         "asked on_code_change: refuse. Nothing was trained; the job's output (below) names both "
                         "code hashes and what differs. Train the stage again with mode: restart, resume with "
                         "on_code_change: keep_weights where only the optimizer differs, or finish the stage with "
                         "the code that wrote the checkpoint.",
}
