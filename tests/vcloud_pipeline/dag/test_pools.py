"""The pool of each cluster connection, and the cluster policy that puts a run's job tasks in it.

The policy is checked on the DAG as the scheduler holds it (serialized and read back), with task
instances made by Airflow's own ``TaskInstance``; the deployment test (tests/dags/test_concurrent_runs.py)
shows the pool bounding the jobs of two runs in a running scheduler.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from vcloud_pipeline.dag.pools import (
    cluster_pools,
    create_missing_pools,
    pool_name,
    pool_set_argv,
    profile_of_run,
    route_to_cluster_pool,
)
from vcloud_pipeline.profile.site_facts import LOCAL_SITE_FACTS

REPO = Path(__file__).resolve().parents[3]
JOB_TASKS = ["prepare_data", "preflight_imports", "stage0", "stage1", "stage2", "stage3", "export"]


def test_a_pool_per_connection_named_after_it() -> None:
    assert pool_name("lumi") == "slurm_lumi"
    assert pool_name("vcloud_local_cluster_openssh") == "slurm_vcloud_local_cluster_openssh"
    assert pool_name("my conn/1") == "slurm_my_conn_1"
    with pytest.raises(ValueError, match="needs a connection id"):
        pool_name("")
    assert pool_set_argv("slurm_lumi", 4, "d") == ["airflow", "pools", "set", "slurm_lumi", "4", "d",
                                                    "--include-deferred"]


def test_the_pools_follow_the_profiles_connections_with_site_facts_and_overrides() -> None:
    plain = cluster_pools(environ={})
    assert plain == {"slurm_cosmos": ("cosmos", ["cosmos"]), "slurm_levante": ("levante", ["levante"]),
                     "slurm_lumi": ("lumi", ["lumi"]),
                     "slurm_vcloud_local_cluster": ("vcloud_local_cluster", ["local"])}
    # The sites' profiles run on the local cluster: one cluster, one connection, one pool.
    local = cluster_pools(environ={"VCLOUD_SITE_FACTS": str(LOCAL_SITE_FACTS)})
    assert local == {"slurm_vcloud_local_cluster": ("vcloud_local_cluster", ["cosmos", "levante", "local", "lumi"])}
    moved = cluster_pools(["local"], environ={"VCLOUD_PROFILE_OVERRIDES": json.dumps(
        {"local": {"connection.conn_id": "vcloud_local_cluster_openssh"}})})
    assert list(moved) == ["slurm_vcloud_local_cluster_openssh"]


def test_the_runs_profile_is_its_conf_else_the_dags_default() -> None:
    assert profile_of_run({"profile": "lumi"}, {"profile": "local"}) == "lumi"
    assert profile_of_run({}, {"profile": "local"}) == "local"  # a scheduled run has no conf
    assert profile_of_run(None, {}) is None


@pytest.fixture(scope="module")
def scheduler_dag():
    """``vcloud_training`` as the scheduler holds it: serialized and read back."""
    from airflow.dag_processing.dagbag import DagBag
    from airflow.serialization.serialized_objects import DagSerialization

    dag = DagBag(dag_folder=str(REPO / "dags")).dags["vcloud_training"]
    return DagSerialization.from_dict(DagSerialization.to_dict(dag))


def _instance(dag, task_id: str):
    from airflow.models.taskinstance import TaskInstance

    return TaskInstance(dag.get_task(task_id), dag_version_id=None, run_id="manual__1")


def test_the_policy_moves_a_runs_job_tasks_to_its_connections_pool(scheduler_dag,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VCLOUD_PROFILE_OVERRIDES", json.dumps(
        {"local": {"connection.conn_id": "vcloud_local_cluster_openssh"}}))
    monkeypatch.delenv("VCLOUD_SITE_FACTS", raising=False)
    runs = {"lumi": SimpleNamespace(conf={"profile": "lumi"}, run_id="manual__1"),
            "scheduled": SimpleNamespace(conf={}, run_id="scheduled__1")}
    for task_id in JOB_TASKS:
        ti = _instance(scheduler_dag, task_id)
        assert ti.pool == "default_pool" and ti.operator == "PipelineJobOperator"
        route_to_cluster_pool(ti, runs["lumi"])
        assert ti.pool == "slurm_lumi", task_id
        route_to_cluster_pool(ti, runs["scheduled"])  # the DAG's default profile: local, moved by the override
        assert ti.pool == "slurm_vcloud_local_cluster_openssh", task_id
    for task_id in ("plan", "sync_code", "preflight_checks", "provision_env", "summary", "verdict"):
        ti = _instance(scheduler_dag, task_id)
        route_to_cluster_pool(ti, runs["lumi"])
        assert ti.pool == "default_pool", task_id
    # Not yet bound to a run, or a profile that does not exist: the pool stays (plan fails such a run).
    ti = _instance(scheduler_dag, "stage0")
    route_to_cluster_pool(ti, None)
    route_to_cluster_pool(ti, SimpleNamespace(conf={"profile": "lumi2"}, run_id="manual__2"))
    assert ti.pool == "default_pool"


def test_the_deployments_local_settings_install_the_policy(tmp_path: Path) -> None:
    """Airflow itself loads ``include/airflow/airflow_local_settings.py`` and its hook routes the task."""
    script = """
import json, sys
from types import SimpleNamespace
from airflow import settings
assert not getattr(settings.task_instance_mutation_hook, "is_noop", False), "no policy loaded"
ti = SimpleNamespace(operator="PipelineJobOperator", task=SimpleNamespace(params={"profile": "local"}),
                     pool="default_pool", task_id="stage0")
settings.task_instance_mutation_hook(ti, dag_run=SimpleNamespace(conf={"profile": "lumi"}, run_id="r"))
print(json.dumps({"pool": ti.pool}))
"""
    env = {**os.environ,
           "PYTHONPATH": ":".join([str(REPO / "include" / "airflow"), str(REPO / "plugins"),
                                   str(REPO / "providers" / "slurm" / "src"), str(REPO / "trainer" / "src")])}
    env.pop("VCLOUD_SITE_FACTS", None)
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == {"pool": "slurm_lumi"}
    spec = importlib.util.spec_from_file_location("settings_file", REPO / "include/airflow/airflow_local_settings.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.__all__ == ["task_instance_mutation_hook"]


def test_create_makes_the_missing_pools_counting_deferred_tasks_and_leaves_existing_ones(
        airflow_home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``--create`` against a migrated metadata database, in one process: a new pool gets the slots
    and counts deferred tasks; a pool that exists keeps what an operator set."""
    from airflow.models.pool import Pool

    pools = {"slurm_pools_test_a": ("pools_test_a", ["a"]), "slurm_pools_test_b": ("pools_test_b", ["b", "c"])}
    Pool.create_or_update_pool(name="slurm_pools_test_b", slots=9, description="set by hand", include_deferred=False)
    assert create_missing_pools(pools, 3) == 0
    made, kept = Pool.get_pool("slurm_pools_test_a"), Pool.get_pool("slurm_pools_test_b")
    assert (made.slots, made.include_deferred) == (3, True)
    assert made.description == "Slurm jobs in flight (queued or running) through connection pools_test_a " \
                               "(vcloud profiles a); counts deferred tasks"
    assert (kept.slots, kept.include_deferred, kept.description) == (9, False, "set by hand")
    assert capsys.readouterr().out.splitlines() == [
        "pool slurm_pools_test_a created: 3 slots, deferred tasks included",
        "pool slurm_pools_test_b exists: left as it is"]
