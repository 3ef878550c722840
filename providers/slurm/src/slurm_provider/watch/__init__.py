"""Watching a Slurm job until it ends: the decisions, without I/O.

:mod:`slurm_provider.watch.job_watch` holds what a watch decides from what it learns (a poll's answer,
an exit record read between polls, a login node that does not answer, the clock): what the task log
says and says once, what the watch keeps in the task try's notes, when it releases a held job, and
when it ends with which event. The trigger drives it (subscribe to the connection's poller, feed each
update, carry out what it answers); so does the wait for a login node that does not answer
(:class:`~slurm_provider.watch.job_watch.LoginWatch`). Both are tested without asyncio and without a
cluster, over the sequences of states a real cluster goes through.
"""
