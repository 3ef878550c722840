"""vcloud pipeline domain code: cluster profiles, the remote layout, job scripts, code sync, budget.

Everything that differs between clusters (LUMI, Levante, Cosmos, the local Slurm) is data in a
profile under ``include/profiles/``; the modules here are pure functions of a profile, so the DAG
that wires them together never names a cluster. What the jobs and the trainer must agree on (stage
file names, ``index.json``, exit codes, the job environment, the ``COMPLETE`` fields) comes from the
trainer's torch-free :mod:`vcloud.contract`.

- :mod:`vcloud_pipeline.profile`         typed, validated cluster profiles (``load_profile``)
- :mod:`vcloud_pipeline.schema`           pydantic validation in our words (unknown keys, choices, durations)
- :mod:`vcloud_pipeline.jobspec`          what one job asks for, checked against a profile's partitions
- :mod:`vcloud_pipeline.layout`           ``RunPaths``: every remote path of a run, computed once
- :mod:`vcloud_pipeline.render`           ``render_job``: the outer sbatch + inner job scripts (Jinja2 templates)
- :mod:`vcloud_pipeline.code_tree`        code-sync argv, anchored excludes, content hash and manifest
- :mod:`vcloud_pipeline.budget`           worst-case GPU-hours, the ledger, and the budget check

The training DAG (``dags/vcloud_training.py``) is built from:

- :mod:`vcloud_pipeline.params`           the trigger form and ``parse_request`` (validated ``TrainingRequest``)
- :mod:`vcloud_pipeline.stage_decisions`  ``StagePlan`` and the submit-or-skip decision per job
- :mod:`vcloud_pipeline.code_upload`      render a run's jobs, mirror code and scripts (rsync over the
  profile's Airflow connection), upload the manifest
- :mod:`vcloud_pipeline.code_retention`   which code directories no live job uses, and removing them
- :mod:`vcloud_pipeline.remote`           small file operations on the login node
- :mod:`vcloud_pipeline.preflight`        ``sbatch --test-only``, the image, the ledger and the budget check
- :mod:`vcloud_pipeline.tasks`            what each Python task of the DAG does
- :mod:`vcloud_pipeline.job_operator`     ``PipelineJobOperator``: the Slurm operator bound to a run
- :mod:`vcloud_pipeline.assets`           stage checkpoints and the viewer export as Airflow Assets
- :mod:`vcloud_pipeline.report`           a run's outputs and the ledger (``python -m vcloud_pipeline.report``)
- :mod:`vcloud_pipeline.hints`            the pipeline's and its sites' failure signatures, registered with the
  Slurm provider's hints on import
"""

from __future__ import annotations

from vcloud_pipeline import hints as _hints

_hints.register()  # the pipeline's failure signatures, wherever its operators run
