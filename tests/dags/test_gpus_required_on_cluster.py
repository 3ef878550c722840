"""GPUs required but invisible to PyTorch, on the local Slurm cluster, through dag.test().

The local cluster hands out emulated GPUs (``--gpus=1`` sets ``SLURM_GPUS_ON_NODE`` and
``CUDA_VISIBLE_DEVICES``) to a CPU-only PyTorch, which is exactly a LUMI job without its container
bindings. With ``VCLOUD_PROFILE_OVERRIDES='{"local": {"accelerator.kind": "cuda"}}'`` the local
profile claims real GPUs, so:

- a run stops at the preflight import job (exit 87, the profile's hint), and ``sacct`` has no job
  of any stage or of the export for that run;
- a stage job that gets past the preflight (here the preflight tasks are marked successful instead
  of run) stops at once with exit 87, trains nothing, and its task's failure explains the code.

Jobs run for real, as the cluster user, in the local profile's Charliecloud image.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import pytest

from support.localcluster import LocalCluster, poll_until
from slurm_provider.operators import job_name_for
from vcloud_pipeline.jobs.exits import EXIT_GPUS_MISSING
from vcloud_pipeline.profile import load_profile

pytestmark = [pytest.mark.usefixtures("cluster_connection", "airflow_home"), pytest.mark.timeout(1500)]
REPO = Path(__file__).resolve().parents[2]
DAG_ID = "vcloud_training"
LATER_TASKS = ["stage0", "stage1", "stage2", "stage3", "export"]
HINT = load_profile("local").accelerator.missing_gpu_hint
REFUSAL = "GPUs required: this node of the job was given 1 GPU, but PyTorch sees 0 (torch "
EXPLAINED = ("Exit code 87: the job was given GPUs, but PyTorch in the job saw fewer, so it stopped instead of "
             "running on the CPU and billing GPU-hours for it")


@pytest.fixture
def gpu_project(local_cluster: LocalCluster, monkeypatch: pytest.MonkeyPatch) -> str:
    """A project directory of its own, and the local profile claiming real (CUDA) GPUs."""
    base = local_cluster.test_dir()
    monkeypatch.setenv("VCLOUD_PROFILE_OVERRIDES",
                       json.dumps({"local": {"paths.base": base, "accelerator.kind": "cuda"}}))
    monkeypatch.setenv("VCLOUD_POLL_INTERVAL", "2")
    monkeypatch.setenv("VCLOUD_MAX_POLL_INTERVAL", "5")
    monkeypatch.setenv("VCLOUD_FIRST_POLL_DELAY", "1")
    return base


def run_dag(capfd: pytest.CaptureFixture, mark_success_pattern: str | None = None,
            **conf: Any) -> tuple[str, dict[str, str], str]:
    """(run id, task states with the run's own under ``"<run>"``, everything the run printed)."""
    from airflow.dag_processing.dagbag import DagBag

    dag = DagBag(dag_folder=str(REPO / "dags")).dags[DAG_ID]
    dag_run = dag.test(run_conf=conf, mark_success_pattern=mark_success_pattern)
    states = {ti.task_id: str(ti.state) for ti in dag_run.get_task_instances()}
    states["<run>"] = str(dag_run.state)
    return dag_run.run_id, states, "".join(capfd.readouterr())


def accounted(cluster: LocalCluster, run_id: str, task_id: str) -> list[dict[str, str]]:
    """Every start of every job ``sacct`` knows under the task's deterministic name in this run
    (allocations only; ``--duplicates`` lists each start of a requeued job)."""
    name = job_name_for(DAG_ID, task_id, run_id)
    out = cluster.root("sacct", "-X", "-D", "-n", "-P", "-S", "now-1days", f"--name={name}",
                       "--format=JobIDRaw,State,ExitCode,Elapsed").stdout
    keys = ("JobIDRaw", "State", "ExitCode", "Elapsed")
    return [dict(zip(keys, line.split("|"))) for line in out.splitlines() if line]


def finished_in_sacct(cluster: LocalCluster, run_id: str, task_id: str) -> dict[str, str]:
    """The task's one job, started once, once accounting has its final row."""
    poll_until(lambda: [r for r in accounted(cluster, run_id, task_id) if r["ExitCode"] != "0:0"],
               timeout=60, what=f"{task_id}'s job ended in sacct")
    rows = accounted(cluster, run_id, task_id)
    assert len(rows) == 1, rows  # one job, never requeued
    return rows[0]


def job_out(cluster: LocalCluster, project: str, run: str, run_id: str, task_id: str, job_id: str) -> str:
    """The job's stdout as the operator names it (``<job name>.<id>.out`` in the run's log directory)."""
    path = f"{project}/logs/{run}/{job_name_for(DAG_ID, task_id, run_id)}.{job_id}.out"
    return cluster.ssh(f"cat {shlex.quote(path)}").stdout


def test_a_run_stops_at_the_preflight_import_job_and_submits_no_stage(local_cluster: LocalCluster,
                                                                     gpu_project: str,
                                                                     capfd: pytest.CaptureFixture) -> None:
    run_id, states, output = run_dag(capfd, profile="local", config="tiny", run_name="nogpu", max_epochs=1)

    assert states["preflight_imports"] == "failed", states
    assert [states[task] for task in LATER_TASKS] == ["upstream_failed"] * len(LATER_TASKS), states
    assert states["<run>"] == "failed"
    # the task's failure: the code explained, the profile's hint, the job's own line
    assert EXPLAINED in output, output[-5000:]
    assert f"Hint: The job's GPUs are not visible to PyTorch: {HINT}" in output
    assert f"preflight: FAILED: {REFUSAL}" in output

    job = finished_in_sacct(local_cluster, run_id, "preflight_imports")
    assert (job["State"], job["ExitCode"]) == ("FAILED", f"{EXIT_GPUS_MISSING}:0"), job
    log = job_out(local_cluster, gpu_project, "nogpu", run_id, "preflight_imports", job["JobIDRaw"])
    assert "preflight: vcloud.data " in log and f"preflight: what to do: {HINT}" in log
    assert "preflight: OK" not in log
    # sacct knows the data and preflight jobs of this run, and no job of any stage or of the export
    assert accounted(local_cluster, run_id, "prepare_data"), "sacct lists this run's jobs by name"
    assert {task: accounted(local_cluster, run_id, task) for task in LATER_TASKS} == \
        {task: [] for task in LATER_TASKS}


def test_a_stage_job_on_a_node_without_gpus_stops_at_once_with_exit_87(local_cluster: LocalCluster,
                                                                       gpu_project: str,
                                                                       capfd: pytest.CaptureFixture) -> None:
    run_id, states, output = run_dag(capfd, mark_success_pattern=r"^preflight_(checks|imports)$",
                                     profile="local", config="tiny", run_name="nogpu-stage", stages=[0],
                                     max_epochs=1, export=False)

    assert states["preflight_imports"] == "success" and states["prepare_data"] == "success", states
    assert states["stage0"] == "failed" and states["<run>"] == "failed", states
    assert EXPLAINED in output, output[-5000:]
    assert f"Hint: The job's GPUs are not visible to PyTorch: {HINT}" in output
    assert f"ERROR: {REFUSAL}" in output and "refusing to train on the CPU" in output

    job = finished_in_sacct(local_cluster, run_id, "stage0")
    assert (job["State"], job["ExitCode"]) == ("FAILED", f"{EXIT_GPUS_MISSING}:0"), job
    log = job_out(local_cluster, gpu_project, "nogpu-stage", run_id, "stage0", job["JobIDRaw"])
    assert f"what to do: {HINT}" in log
    assert log.rstrip().endswith("exit 87: GPUs required but not visible to PyTorch; not training on the CPU")
    assert " | epoch " not in log and "no GPU visible" not in log, log  # nothing trained, not even set up
    stage0 = shlex.quote(f"{gpu_project}/outputs/nogpu-stage/stage0")
    assert local_cluster.ssh(f"ls -A {stage0} 2>/dev/null", check=False).stdout.strip() == ""
    print(f"stage job {job['JobIDRaw']}: {job['State']} exit {job['ExitCode']} after {job['Elapsed']}")
