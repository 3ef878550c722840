"""The queue of a profile's connection: every task that runs cluster commands runs there.

Checked on the DAG as the DAG processor parses it and the scheduler holds it (serialized and read
back), with task instances made by Airflow's own ``TaskInstance``. The deployment test
(tests/deploy/test_celery_hosts.py) shows the tasks and triggers of such a connection running only on
the worker and triggerer hosts of that queue.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from vcloud_pipeline.dag.queues import cluster_task_args, queue_of, route_to_cluster_queue
from vcloud_pipeline.profile import ProfileError, load_profile

REPO = Path(__file__).resolve().parents[3]
CLUSTER_TASKS = ["sync_code", "preflight_checks", "provision_env", "prepare_data", "preflight_imports",
                 "stage0", "stage1", "stage2", "stage3", "export", "summary"]
OFF_CLUSTER = ["plan", "verdict"]
OPENSSH_HOST = json.dumps({"local": {"connection.queue": "otp_login"}})


def _parsed_dag(monkeypatch: pytest.MonkeyPatch, overrides: str | None):
    from airflow.dag_processing.dagbag import DagBag
    from airflow.serialization.serialized_objects import DagSerialization

    monkeypatch.setenv("VCLOUD_DEFAULT_PROFILE", "local")
    monkeypatch.delenv("VCLOUD_SITE_FACTS", raising=False)
    if overrides is None:
        monkeypatch.delenv("VCLOUD_PROFILE_OVERRIDES", raising=False)
    else:
        monkeypatch.setenv("VCLOUD_PROFILE_OVERRIDES", overrides)
    bag = DagBag(dag_folder=str(REPO / "dags"))
    assert not bag.import_errors, bag.import_errors
    return DagSerialization.from_dict(DagSerialization.to_dict(bag.dags["vcloud_training"]))


def test_the_profile_names_a_queue_or_none() -> None:
    assert load_profile("local").connection.queue is None
    assert load_profile("lumi", overrides={"connection.queue": "lumi_login"}).connection.queue == "lumi_login"
    with pytest.raises(ProfileError):
        load_profile("lumi", overrides={"connection.queue": 3})
    assert queue_of("local", {"VCLOUD_PROFILE_OVERRIDES": OPENSSH_HOST}) == "otp_login"
    assert cluster_task_args("local", {}) == {}
    assert cluster_task_args("local", {"VCLOUD_PROFILE_OVERRIDES": OPENSSH_HOST}) == {"queue": "otp_login"}
    assert cluster_task_args("no_such_profile", {}) == {}  # the DAG parses; its plan task says why


def test_every_cluster_task_of_the_parsed_dag_is_on_the_default_profiles_queue(
        monkeypatch: pytest.MonkeyPatch) -> None:
    dag = _parsed_dag(monkeypatch, OPENSSH_HOST)
    assert {t: dag.get_task(t).queue for t in CLUSTER_TASKS} == dict.fromkeys(CLUSTER_TASKS, "otp_login")
    assert {t: dag.get_task(t).queue for t in OFF_CLUSTER} == dict.fromkeys(OFF_CLUSTER, "default")
    assert set(CLUSTER_TASKS) | set(OFF_CLUSTER) == set(dag.task_ids)


def test_without_a_queue_every_task_is_on_the_default_queue(monkeypatch: pytest.MonkeyPatch) -> None:
    dag = _parsed_dag(monkeypatch, None)
    assert {task.queue for task in dag.tasks} == {"default"}


def test_the_policy_moves_a_runs_cluster_tasks_to_its_profiles_queue(monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow.models.taskinstance import TaskInstance

    dag = _parsed_dag(monkeypatch, OPENSSH_HOST)
    monkeypatch.setenv("VCLOUD_PROFILE_OVERRIDES", json.dumps(
        {"local": {"connection.queue": "otp_login"}, "lumi": {"connection.queue": "lumi_login"}}))
    runs = {"lumi": SimpleNamespace(conf={"profile": "lumi"}, run_id="manual__1"),
            "levante": SimpleNamespace(conf={"profile": "levante"}, run_id="manual__2"),
            "scheduled": SimpleNamespace(conf={}, run_id="scheduled__1")}
    for task_id in CLUSTER_TASKS:
        ti = TaskInstance(dag.get_task(task_id), dag_version_id=None, run_id="manual__1")
        assert ti.queue == "otp_login", task_id
        route_to_cluster_queue(ti, runs["lumi"])
        assert ti.queue == "lumi_login", task_id
        route_to_cluster_queue(ti, runs["levante"])  # a key login: any worker
        assert ti.queue == "default", task_id
        route_to_cluster_queue(ti, runs["scheduled"])
        assert ti.queue == "otp_login", task_id
    for task_id in OFF_CLUSTER:
        ti = TaskInstance(dag.get_task(task_id), dag_version_id=None, run_id="manual__1")
        route_to_cluster_queue(ti, runs["lumi"])
        assert ti.queue == "default", task_id
    ti = TaskInstance(dag.get_task("stage0"), dag_version_id=None, run_id="manual__3")
    route_to_cluster_queue(ti, SimpleNamespace(conf={"profile": "lumi2"}, run_id="manual__3"))
    assert ti.queue == "otp_login"  # a profile that does not exist: plan fails that run
