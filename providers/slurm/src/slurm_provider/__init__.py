"""Slurm integration for Airflow 3 over SSH: hook, operator, deferrable sensor and trigger.

Modules, one responsibility each:
``states`` (what every Slurm state and pending reason means), ``status`` (``JobStatus``),
``commands`` and ``parsers`` (pure command lines and output parsing), ``validation`` (every value
that reaches a shell), ``transport`` (paramiko/asyncssh or the system OpenSSH client, and the
``ssh`` command line for rsync that logs in the same way), ``hooks`` (one method per Slurm verb,
plus ``ssh_command()`` for file transfers), ``poller`` (one batched status query per cluster), ``triggers``,
``operators``, ``sensors``, ``resubmission`` (budgets and progress), ``hints`` (known errors).
"""
