"""One Airflow pool per cluster connection: how many jobs this deployment has in flight on a cluster.

Runs with different run names run at the same time (a multi-week LUMI run no longer holds back a
Levante run or the scheduled retraining); what bounds the jobs on one cluster is the pool of the
run's connection, ``slurm_<conn_id>`` (:func:`pool_name`), that every job task of the run
(``PipelineJobOperator``: data, preflight imports, stages, export) takes a slot of.

Why ``include_deferred``: a job task runs only for seconds (it decides, submits and defers); for the
days its job waits in Slurm's queue and trains it is *deferred*. A pool counts deferred tasks only
when created with ``include_deferred``; without it the pool would bound how many tasks submit at the
same instant, not how many jobs are on the cluster. With it, a job task holds its slot from submit
to the end of its job (pending or running), so ``slots`` is the number of this deployment's jobs that
may be queued or running on that cluster at once; a task that finds no free slot waits in Airflow
(``scheduled``) and submits nothing. A task whose job ended gives its slot up while it collects the
result, so the next job of the run competes for a slot like any other.

The run's profile, and so its connection, is a run parameter: Airflow's pool of a task is fixed
when the DAG is parsed, so a cluster policy (:func:`route_to_cluster_pool`, installed with
``include/airflow/airflow_local_settings.py``) moves each job task instance of a run to its
connection's pool when the scheduler creates it. Airflow never schedules a task of a pool that does
not exist: create the pools first, ``python -m vcloud_pipeline.dag.pools --create`` (or the commands it
prints without ``--create``).
"""

from __future__ import annotations

import argparse
import functools
import logging
import os
import re
import shlex
import sys
from collections.abc import Mapping, Sequence
from typing import Any

log = logging.getLogger(__name__)

POOL_PREFIX = "slurm_"
DEFAULT_SLOTS = 4
"""Jobs one deployment may have queued or running on one cluster when the pool is created here."""

JOB_OPERATOR = "PipelineJobOperator"
"""The task type whose task instances go to their run's cluster pool."""


def pool_name(conn_id: str) -> str:
    """``slurm_<conn_id>``: the pool of every job this deployment runs through connection ``conn_id``."""
    if not isinstance(conn_id, str) or not conn_id.strip():
        raise ValueError(f"a pool needs a connection id, got {conn_id!r}")
    return POOL_PREFIX + re.sub(r"[^A-Za-z0-9_.-]", "_", conn_id.strip())


def pool_description(conn_id: str, profiles: Sequence[str]) -> str:
    return (f"Slurm jobs in flight (queued or running) through connection {conn_id} "
            f"(vcloud profiles {', '.join(profiles)}); counts deferred tasks")


def connection_of(profile: str, environ: Mapping[str, str] | None = None) -> str:
    """The profile's connection id as the run's tasks load it: with the deployment's overrides and site
    facts (``VCLOUD_PROFILE_OVERRIDES``, ``VCLOUD_SITE_FACTS``) of ``environ`` (default: this process's)."""
    from vcloud_pipeline.profile import OVERRIDES_ENV
    from vcloud_pipeline.profile.site_facts import SITE_FACTS_ENV

    env = os.environ if environ is None else environ
    return _connection_of(profile, env.get(OVERRIDES_ENV), env.get(SITE_FACTS_ENV))


@functools.lru_cache(maxsize=64)
def _connection_of(profile: str, overrides: str | None, site_facts: str | None) -> str:
    """Cached per profile and environment: the scheduler asks for every job task instance it creates."""
    from vcloud_pipeline.profile import OVERRIDES_ENV, load_profile, overrides_from_environ
    from vcloud_pipeline.profile.site_facts import SITE_FACTS_ENV

    env = {key: value for key, value in ((OVERRIDES_ENV, overrides), (SITE_FACTS_ENV, site_facts)) if value}
    return load_profile(profile, overrides=overrides_from_environ(profile, env) or None).connection.conn_id


def profile_of_run(conf: Mapping[str, Any] | None, params: Any) -> str | None:
    """The run's profile: its conf's ``profile``, else the DAG's default (scheduled runs have no conf)."""
    chosen = (conf or {}).get("profile")
    if isinstance(chosen, str) and chosen:
        return chosen
    try:
        default = params["profile"]
    except Exception:
        return None
    default = getattr(default, "value", default)
    return default if isinstance(default, str) and default else None


def profile_of_task_run(task_instance: Any, dag_run: Any) -> str | None:
    """The profile of the run a task instance belongs to, as the cluster policies see it."""
    task = getattr(task_instance, "task", None)
    return profile_of_run(getattr(dag_run, "conf", None), getattr(task, "params", None))


def route_to_cluster_pool(task_instance: Any, dag_run: Any) -> None:
    """Cluster policy (``task_instance_mutation_hook``): a job task instance of a run goes to the pool of
    its run's connection. Anything else, or a run Airflow has not bound yet, is left as it is; so is a
    task whose profile cannot be loaded (its ``plan`` task fails the run with the reason). Never raises:
    it runs inside the scheduler."""
    if getattr(task_instance, "operator", None) != JOB_OPERATOR or dag_run is None:
        return
    try:
        if (profile := profile_of_task_run(task_instance, dag_run)) is None:
            return
        task_instance.pool = pool_name(connection_of(profile))
    except Exception as exc:  # a bad profile name in conf, an unreadable profile: plan reports it
        log.warning("Job task %s of run %s stays in pool %s: %s", getattr(task_instance, "task_id", "?"),
                    getattr(dag_run, "run_id", "?"), getattr(task_instance, "pool", "?"), exc)


# --------------------------------------------------------------------------- creating the pools


def cluster_pools(profiles: Sequence[str] | None = None,
                  environ: Mapping[str, str] | None = None) -> dict[str, tuple[str, list[str]]]:
    """Pool name -> (connection id, profiles using it) for every installed profile."""
    from vcloud_pipeline.profile import available_profiles

    pools: dict[str, tuple[str, list[str]]] = {}
    for profile in profiles if profiles is not None else available_profiles():
        conn_id = connection_of(profile, environ)
        pools.setdefault(pool_name(conn_id), (conn_id, []))[1].append(profile)
    return pools


def pool_set_argv(name: str, slots: int, description: str) -> list[str]:
    """``airflow pools set NAME SLOTS DESCRIPTION --include-deferred``."""
    return ["airflow", "pools", "set", name, str(slots), description, "--include-deferred"]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m vcloud_pipeline.dag.pools", description=(
        "The Airflow pools that bound this deployment's Slurm jobs per cluster connection: print the "
        "`airflow pools set` commands, or create the missing pools."))
    parser.add_argument("--slots", type=int, default=DEFAULT_SLOTS,
                        help=f"jobs in flight per connection for pools created now (default {DEFAULT_SLOTS})")
    parser.add_argument("--create", action="store_true",
                        help="create the pools that do not exist yet (existing pools keep their slots)")
    args = parser.parse_args(argv)
    if args.slots < 1:
        parser.error("--slots must be at least 1")
    pools = cluster_pools()
    if not args.create:
        for name, (conn_id, profiles) in sorted(pools.items()):
            print(shlex.join(pool_set_argv(name, args.slots, pool_description(conn_id, profiles))))
        return 0
    return create_missing_pools(pools, args.slots)


def create_missing_pools(pools: Mapping[str, tuple[str, list[str]]], slots: int) -> int:
    """Create each pool of ``pools`` that does not exist yet, in this process (what ``airflow pools
    set`` does, without an Airflow start per pool); existing pools keep their slots. Exit status."""
    try:
        from airflow.models.pool import Pool

        for name, (conn_id, profiles) in sorted(pools.items()):
            if Pool.get_pool(name) is not None:
                print(f"pool {name} exists: left as it is")
                continue
            Pool.create_or_update_pool(name=name, slots=slots, description=pool_description(conn_id, profiles),
                                       include_deferred=True)
            print(f"pool {name} created: {slots} slots, deferred tasks included")
    except Exception as exc:  # an unmigrated or unreachable metadata database: say so, no traceback
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        print(f"creating the cluster pools failed (is the metadata database migrated?): {reason}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
