"""The test harness: what tests use to reach the local Slurm cluster and to run Airflow, not tests themselves.

- ``localcluster``: the local cluster as the tests see it (its files, SSH login, root-side verbs);
  ``private_login``: a login node of its own that a test may take down; ``ports``: a free port.
- ``deployment``: a test deployment of Airflow (the ``Deployment`` protocol every kind satisfies):
  its configuration on its own home, port and SQLite file (``sqlite_settings``: its database's busy
  wait; ``migrated_db``: a copy of a database migrated once per test process), its CLI and REST API, and ``LocalDeployment``: the API server, scheduler, DAG processor and
  triggerer as separate processes the test can stop and restart;
  ``concurrent_deployments``: several deployments running the training DAG at once, each in a
  ``dag_runner`` process that keeps its parsed DAG between runs;
  ``celery_hosts``: docker-compose.yaml's Celery topology as processes on hosts of their own.
- ``lifecycle``: the ``slurm_lifecycle`` test DAG run with ``dag.test()``, faults injected beside it
  (``background``); ``task_context``: what Airflow hands ``execute()``.
- ``fake_slurm``: a Slurm login node in memory (a job table answering the provider's command lines)
  under the real hooks (``install``, or the ``fake_slurm`` fixture of conftest.py); ``local_shell``:
  a hook whose commands run in ``bash -c`` here.
- ``seed``: HPC view rows written straight into the metadata database; ``cdp``: headless Chromium.

``tests/`` is on pytest's ``pythonpath`` (pyproject.toml), so tests import ``support.localcluster``;
scripts outside pytest (benchmarks/) put ``tests/`` on ``sys.path`` themselves. The DAG files tests
run live in ``tests/dag_fixtures`` (an Airflow DAG bundle), not here.
"""
