"""vcloud pipeline domain code: cluster profiles, the remote layout, job scripts, code sync, budget.

Everything that differs between clusters (LUMI, Levante, Cosmos, the local Slurm) is data in a
profile under ``include/profiles/``; the modules here are pure functions of a profile, so the DAG
that wires them together never names a cluster.

- :mod:`vcloud_pipeline.profiles`  typed, validated cluster profiles (``load_profile``)
- :mod:`vcloud_pipeline.jobspec`   what one job asks for, checked against a profile's partitions
- :mod:`vcloud_pipeline.layout`    ``RunPaths``: every remote path of a run, computed once
- :mod:`vcloud_pipeline.render`    ``render_job``: the outer sbatch + inner job scripts
- :mod:`vcloud_pipeline.rsync`     code-sync argv, anchored excludes, content hash and manifest
- :mod:`vcloud_pipeline.budget`    worst-case GPU-hours, the ledger, and the budget check
"""

from __future__ import annotations
