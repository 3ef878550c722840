"""The parts of a task that runs one Slurm job, each in a module of its own; the operator
(:class:`~slurm_provider.operators.SlurmSubmitOperator`) keeps ``execute``, the deferral,
``execute_complete`` and ``on_kill``, and calls them.

- :mod:`~slurm_provider.job_task.naming`: what a task's jobs are called, the comment they carry,
  where they write their output, and the task's submission history in its task state store;
- :mod:`~slurm_provider.job_task.submission`: adopt or submit (the submit lock of an exclusive
  directory, the nodes left out, a lost ``sbatch`` answer);
- :mod:`~slurm_provider.job_task.ending`: how a job's end becomes the task's outcome (success and
  its billing, a resubmission, a give-up that leaves nothing in the queue, the failure's text).
"""
