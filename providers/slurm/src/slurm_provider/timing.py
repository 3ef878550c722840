"""How often a watched job is polled and how every wait grows: the one set of timing numbers the
operator, sensor, triggers, poller and the login wait share. Each schedule is a
:class:`~slurm_provider.backoff.Backoff`; next to it, what overrides its numbers (a deployment may pass
its own, e.g. a few seconds on a local test cluster)."""

from __future__ import annotations

from slurm_provider.backoff import Backoff, spread

POLL_INTERVAL = 15.0
"""Seconds between the first status polls; the interval grows after every poll with no change.
Overridden by the ``poll_interval`` of the operator, sensor and triggers (a workflow may expose it as
a deployment setting)."""
MAX_POLL_INTERVAL = 300.0
"""The longest interval between two polls. Overridden by ``max_poll_interval`` (as ``poll_interval``)."""
FIRST_POLL_DELAY = 10.0
"""Seconds before the first poll of a job just submitted (Slurm needs a moment to list it)."""
SHORT_JOB_WAIT = 0.0
"""Seconds a task watches the job it just submitted itself, from the job's exit record, before it
defers (0: it defers at once). A job that ends within them completes the task without the trigger,
whose first poll comes ``FIRST_POLL_DELAY`` after the deferral at the earliest; the task holds its
worker slot meanwhile."""
SHORT_JOB_READ_INTERVAL = 1.0
"""Seconds between two reads of the exit record while a task watches its job itself."""

POLL_GROWTH = 1.5
"""Growth of the poll interval per poll in which no watched job changed (``JobPoller(growth=...)``)."""
POLL_JITTER = 0.1
"""Each poll interval is drawn this fraction either side of the schedule (``JobPoller(jitter=...)``),
so that triggerers started together do not poll together."""
POLLS = Backoff(base=POLL_INTERVAL, factor=POLL_GROWTH, cap=MAX_POLL_INTERVAL, jitter=spread(POLL_JITTER))
"""The status polls of a connection: from the subscribers' shortest ``poll_interval``, growing while
nothing changes, up to their shortest ``max_poll_interval``; any change starts again from the base."""

LOGIN_PROBES = Backoff(base=POLL_INTERVAL, factor=2.0, cap=MAX_POLL_INTERVAL, jitter=(0.8, 1.0))
"""The ``scontrol ping`` probes of a task waiting for its login node: base and cap are the task's
``poll_interval`` and ``max_poll_interval``; up to a fifth shorter at random, so that the many tasks
of one outage do not knock at the same moment."""

MAX_RETRY_DELAY = 300.0
"""The longest wait before a poll retried (the subscribers' ``max_poll_interval`` may cut it)."""
TRANSPORT_RETRY = Backoff(base=1.0, factor=2.0, cap=MAX_RETRY_DELAY, jitter=(0.5, 1.0))
"""A poll the cluster did not answer (or whose login waits for a person), retried on a fresh
connection: try ``n`` (from 1) waits up to ``2 ** n`` seconds, at least half of it."""
SLURM_ERROR_RETRY = Backoff(base=POLL_INTERVAL, factor=2.0, cap=MAX_POLL_INTERVAL, jitter=(0.8, 1.0))
"""A poll Slurm answered with an error (not "away", not "not now"), asked again on a fresh connection
a few times (``outage.STEP_FAILURES_WHILE_REACHABLE``) before the watches stop: base and cap are the
subscribers' shortest ``poll_interval`` and longest ``max_poll_interval``; a passing hiccup gets a
poll interval and then twice that to go away."""
SLURM_THROTTLE = Backoff(base=0.0, factor=2.0, cap=MAX_RETRY_DELAY)
"""Slurm's "not now" (its rate limit, a busy controller): each refusal doubles the longer of the last
slow-down and the poll interval of the moment; answered polls ease it back by ``POLL_GROWTH``."""

FIRST_CONFIRM_RETRY = 1.0
"""Seconds before Slurm is asked again about a job whose record says it ended but which Slurm still
lists (completing: its epilog runs, its end is being recorded). The record is written in the last
instant of the batch script, so a read that lands there finds Slurm a second behind: waiting out a
whole ``record_interval`` for that would double the delay."""
CONFIRM_RETRY = Backoff(base=FIRST_CONFIRM_RETRY, factor=2.0, cap=MAX_POLL_INTERVAL)
"""Asking Slurm again about an end it does not confirm yet: doubling, up to the watch's
``max_poll_interval`` (the poller's first wait is at most its ``record_interval``)."""

LOOKUP_RETRY = Backoff(base=1.0, factor=2.0, cap=30.0)
"""A task looking up its own job after a submit whose answer was lost, when the lookup itself fails."""
MAINTENANCE_READ_INTERVAL = 300.0
"""Seconds between two reads of the site's maintenance reservations (``scontrol show reservation``)
while a watched job pends for one; sites announce them days ahead."""

NODE_FAULT_RETRY = Backoff(base=60.0, factor=2.0, cap=1800.0)
"""How long a resubmission after a node's fault (``NODE_FAIL``, ``BOOT_FAIL``, a node-fault exit code)
waits in the queue before it may start (``sbatch --begin``): one minute, doubling, at most 30 minutes.
A node failing under many jobs at once is usually the site's trouble; the jobs should not all return
to the queue at once."""

