"""Slurm's command-line tools, one module per verb: the command lines the hook runs (pure
``build_*`` functions returning one POSIX ``sh`` command line, every word :func:`shlex.quote`-d after
validation) and the parsers for what each command prints (plain values exactly as Slurm meant
them; what a state means is decided in :mod:`slurm_provider.state_vocabulary`).

- :mod:`slurm_provider.cli.sbatch`     submit, test-only, the job comment
- :mod:`slurm_provider.cli.exclusive_submit` the submit under a lock in the directory the job writes
- :mod:`slurm_provider.cli.squeue`     the queue (live jobs)
- :mod:`slurm_provider.cli.sacct`      accounting records (finished jobs, requeued runs, steps)
- :mod:`slurm_provider.cli.scontrol`   one job's full record
- :mod:`slurm_provider.cli.scancel`    cancel and signal
- :mod:`slurm_provider.cli.sinfo`      unavailable nodes
- :mod:`slurm_provider.cli.sshare`     an account's TRES-minute limit and usage
- :mod:`slurm_provider.cli.job_files`  log names, log and progress reads on the login node
- :mod:`slurm_provider.cli.files`      file operations: directories, atomic writes, listings, records
- :mod:`slurm_provider.cli.values`     what they share: field separator, time format, small values
"""
