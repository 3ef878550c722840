"""SlurmJobSensor waits for a job submitted elsewhere: deferrable (default) and poke mode."""

from __future__ import annotations

import asyncio

import pytest
from airflow.exceptions import AirflowException, TaskDeferred

from support.localcluster import LocalCluster
from slurm_provider.hooks import SlurmHook
from slurm_provider.sensors import SlurmJobSensor


def _submit(cluster: LocalCluster, conn_id: str, body: str) -> str:
    out_dir = cluster.test_dir()
    return str(SlurmHook(conn_id).submit(f"#!/bin/bash\n{body}\n", job_name="sensed", output=f"{out_dir}/%j.out",
                                         time_limit="1").job_id)


def test_deferrable_sensor_defers_then_succeeds_on_completion(local_cluster: LocalCluster,
                                                              cluster_connection: str) -> None:
    job_id = _submit(local_cluster, cluster_connection, "sleep 4")
    sensor = SlurmJobSensor(task_id="wait", conn_id=cluster_connection, job_id=job_id, poll_interval=1,
                            first_poll_delay=0)
    with pytest.raises(TaskDeferred) as deferred:
        sensor.execute({})
    trigger = deferred.value.trigger
    assert trigger.job_id == job_id

    async def first_event():
        async for event in trigger.run():
            return event.payload

    payload = asyncio.run(asyncio.wait_for(first_event(), 90))
    result = sensor.execute_complete({}, payload)
    assert result["state"] == "COMPLETED" and result["job_id"] == job_id


def test_poke_mode_waits_then_fails_on_a_failed_job(local_cluster: LocalCluster, cluster_connection: str) -> None:
    job_id = _submit(local_cluster, cluster_connection, "sleep 3; exit 2")
    sensor = SlurmJobSensor(task_id="wait", conn_id=cluster_connection, job_id=job_id, deferrable=False)
    local_cluster.wait_for_state(int(job_id), {"RUNNING"}, timeout=60)
    assert sensor.poke({}) is False
    local_cluster.wait_for_state(int(job_id), {"FAILED"}, timeout=60)
    with pytest.raises(AirflowException, match=f"job {job_id} ended FAILED"):
        sensor.poke({})


def test_unknown_job_is_never_success(cluster_connection: str, local_cluster: LocalCluster) -> None:
    sensor = SlurmJobSensor(task_id="wait", conn_id=cluster_connection, job_id="999999", deferrable=False)
    with pytest.raises(AirflowException, match="not known to the cluster"):
        sensor.poke({})
