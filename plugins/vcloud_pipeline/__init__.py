"""vcloud pipeline domain code: cluster profiles, the run plan, job scripts, code sync, budget.

Everything that differs between clusters (LUMI, Levante, Cosmos, the local Slurm) is data in a
profile under ``include/profiles/``; the modules here are pure functions of a profile and a run's
plan, so the DAG that wires them together never names a cluster. What the jobs and the trainer must
agree on (stage file names, ``index.json``, exit codes, the job environment, the ``COMPLETE``
fields) comes from the trainer's torch-free :mod:`vcloud.contract`. Every command on the cluster is
a verb of the Slurm provider's hook.

- :mod:`vcloud_pipeline.profile`   a cluster profile: frozen pydantic models, loading, the rules
- :mod:`vcloud_pipeline.plan`      the run request, the job labels, what each job asks for, the
  remote layout, the stage decisions, and the frozen :class:`~vcloud_pipeline.plan.run_plan.RunPlan`
- :mod:`vcloud_pipeline.jobs`      the job scripts (Jinja2 templates), exit codes, failure hints
- :mod:`vcloud_pipeline.code`      the code tree and its hash, the sync, which code directories stay
- :mod:`vcloud_pipeline.budget`    worst-case GPU-hours, the allocation, the ledger, the preflight checks
- :mod:`vcloud_pipeline.dag`       the DAG's tasks, ``PipelineJobOperator``, pools, assets, the report
- :mod:`vcloud_pipeline.schema`    pydantic validation in our words (unknown keys, choices, durations)
- :mod:`vcloud_pipeline.checkout`  where the project checkout is on the Airflow worker
"""

from __future__ import annotations

from vcloud_pipeline.jobs import hints as _hints

_hints.register()  # the pipeline's failure signatures, wherever its operators run
