"""Cluster policies of a vcloud Airflow deployment.

Airflow imports ``airflow_local_settings`` from ``$AIRFLOW_HOME/config`` or ``PYTHONPATH`` in every
component (docker-compose.yaml mounts this file at ``/opt/airflow/config/``). The one policy here
moves each job task of a training run to the pool of its run's cluster connection
(:mod:`vcloud_pipeline.dag.pools`, from the plugins folder, imported only when the scheduler calls it),
and each task of a run that runs cluster commands to the queue of its run's profile
(:mod:`vcloud_pipeline.dag.queues`: the host that holds the connection's ControlMaster socket).
Every name this module defines becomes a setting of ``airflow.settings``: keep ``__all__`` to the
policies.
"""

from __future__ import annotations

__all__ = ["task_instance_mutation_hook"]


def task_instance_mutation_hook(task_instance, dag_run=None):  # noqa: ANN001, ANN201 (Airflow's hook spec)
    """Job tasks of a training run take a slot of their cluster connection's pool; cluster tasks go to
    their profile's queue."""
    try:
        from vcloud_pipeline.dag.pools import route_to_cluster_pool
        from vcloud_pipeline.dag.queues import route_to_cluster_queue
    except ImportError:  # a component without the plugins: nothing to route
        return
    route_to_cluster_pool(task_instance, dag_run)
    route_to_cluster_queue(task_instance, dag_run)
