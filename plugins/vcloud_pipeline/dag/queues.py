"""Where a cluster's commands run: the Airflow queue of its profile's connection (``connection.queue``).

An OpenSSH connection with a one-time-password login rides a ControlMaster socket, a file on one
machine. With several Celery workers and triggerers, every task that runs the cluster's commands and
every trigger that watches its jobs must run on the host holding that socket. Airflow routes both by
queue: a Celery worker consumes the queues it was started with (``airflow celery worker --queues``),
and with ``[triggerer] queues_enabled`` a deferred task's trigger carries its task's queue, run only
by a triggerer started with that queue (``airflow triggerer --queues``).

Airflow reads a task's queue from the DAG as parsed, and the trigger's from the task as it runs, so:

- :func:`cluster_task_args` gives the queue of the DAG's default profile, set on every cluster task
  when the DAG file is parsed (the DAG processor reads the profile file, never a connection);
- :func:`route_to_cluster_queue` (cluster policy, ``include/airflow/airflow_local_settings.py``)
  moves a run's cluster task instances to its own profile's queue when the scheduler creates them,
  for runs that choose another profile;
- the job operator sets its queue from the run's plan before it defers, so its trigger follows.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Mapping
from typing import Any

from vcloud_pipeline.dag.pools import JOB_OPERATOR, profile_of_task_run

log = logging.getLogger(__name__)

TRAINING_DAG = "vcloud_training"
CLUSTER_TASKS = frozenset({"sync_code", "preflight_checks", "provision_env", "summary"})
"""The training DAG's Python tasks that run cluster commands (besides every job task)."""


def default_queue() -> str:
    """Airflow's default queue (``[operators] default_queue``): where tasks without a queue go."""
    from airflow.configuration import conf

    return conf.get("operators", "default_queue", fallback="default")


def queue_of(profile: str, environ: Mapping[str, str] | None = None) -> str | None:
    """The profile's ``connection.queue`` as the run's tasks load it (with the deployment's overrides
    and site facts of ``environ``, default this process's); None: the default queue."""
    from vcloud_pipeline.profile import OVERRIDES_ENV
    from vcloud_pipeline.profile.site_facts import SITE_FACTS_ENV

    env = os.environ if environ is None else environ
    return _queue_of(profile, env.get(OVERRIDES_ENV), env.get(SITE_FACTS_ENV))


@functools.lru_cache(maxsize=64)
def _queue_of(profile: str, overrides: str | None, site_facts: str | None) -> str | None:
    from vcloud_pipeline.profile import OVERRIDES_ENV, load_profile, overrides_from_environ
    from vcloud_pipeline.profile.site_facts import SITE_FACTS_ENV

    env = {key: value for key, value in ((OVERRIDES_ENV, overrides), (SITE_FACTS_ENV, site_facts)) if value}
    return load_profile(profile, overrides=overrides_from_environ(profile, env) or None).connection.queue


def cluster_task_args(profile: str, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """``{"queue": ...}`` for the DAG's cluster tasks when ``profile`` names one, else ``{}``.

    A profile that cannot be loaded gives ``{}`` (the DAG still parses; its ``plan`` task fails the run
    with the reason before any cluster task runs).
    """
    try:
        queue = queue_of(profile, environ)
    except Exception as exc:  # a broken profile must not hide the DAG: plan reports it
        log.warning("Profile %s cannot be loaded; cluster tasks stay on the default queue: %s", profile, exc)
        return {}
    return {"queue": queue} if queue else {}


def is_cluster_task(task_instance: Any) -> bool:
    if getattr(task_instance, "operator", None) == JOB_OPERATOR:
        return True
    return (getattr(task_instance, "dag_id", None) == TRAINING_DAG
            and getattr(task_instance, "task_id", None) in CLUSTER_TASKS)


def route_to_cluster_queue(task_instance: Any, dag_run: Any) -> None:
    """Cluster policy (``task_instance_mutation_hook``): a cluster task instance of a training run goes
    to its run's profile's queue. Never raises (it runs inside the scheduler); what cannot be decided
    keeps the queue the DAG file gave."""
    if dag_run is None or not is_cluster_task(task_instance):
        return
    try:
        if (profile := profile_of_task_run(task_instance, dag_run)) is None:
            return
        task_instance.queue = queue_of(profile) or default_queue()
    except Exception as exc:
        log.warning("Task %s of run %s stays on queue %s: %s", getattr(task_instance, "task_id", "?"),
                    getattr(dag_run, "run_id", "?"), getattr(task_instance, "queue", "?"), exc)
