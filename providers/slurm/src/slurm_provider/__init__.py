"""Slurm integration for Airflow 3 over SSH: hook, operator, deferrable sensor and trigger.

Modules, one responsibility each:

- ``cli``: one module per Slurm command (``sbatch``, ``squeue``, ``sacct``, ``scontrol``,
  ``scancel``, ``sinfo``, ``sshare``) with its pure command lines and output parsers, plus
  ``job_files`` (log and progress reads on the login node) and ``values`` (what they share);
- ``state_vocabulary``: what every Slurm state and pending reason means;
- ``job_status``: ``JobStatus``, one job's status resolved from squeue and sacct;
- ``validation``: every value that reaches a shell;
- ``transport``: paramiko/asyncssh or the system OpenSSH client, and the ``ssh`` command line for
  rsync that logs in the same way;
- ``hooks``: one method per Slurm verb, plus ``ssh_command()`` for file transfers;
- ``poller``: one batched status query per cluster;
- ``watch``: what a watch decides (``job_watch``: a sans-IO state machine the trigger and the
  login-node wait drive; ``events``: the typed events they fire; ``end_confirmation``);
- ``job_task``: the steps of a task that runs one job (``submission``, ``ending``, ``naming``,
  ``settings``), which ``operators`` calls;
- ``triggers``, ``operators``, ``sensors``; ``resubmission`` (budgets and progress); ``hints``
  (known errors); ``watch_state`` (how far a trigger's watch got); ``exit_codes``; ``links``.
"""
