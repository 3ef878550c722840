"""The HPC view: the Slurm jobs our operators launched and the GPU-hours they cost, in the Airflow UI.

- :mod:`hpc_view.records`  the operators' XCom records and watch notes as ``JobRecord``, the per-profile budget (pure)
- :mod:`hpc_view.charts`   burn-down, per-stage/per-run bars and training curves as inline SVG (pure)
- :mod:`hpc_view.view`     the page's JSON per cluster profile, allocations from the profiles
- :mod:`hpc_view.store`    the one query on Airflow's metadata database
- :mod:`hpc_view.curves`   the stages' training curves, as their operators recorded them (no cluster command)
- :mod:`hpc_view.app`      the FastAPI app (Airflow authentication on every data route; no cluster command)
- :mod:`hpc_view.plugin`   the ``AirflowPlugin`` (registered in ``plugins/airflow_plugins.py``)
"""
