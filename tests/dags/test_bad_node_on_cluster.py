"""A compute node whose container runtime is broken, on the local Slurm cluster, through dag.test().

The node where this test's first stage job starts cannot start the container: a ``ch-run`` that
fails there is bound over the node's own in its mount namespace (each node of the local cluster has
one), for this test's image and stage jobs only; every other job passes through to the real one.
With the profile's ``jobs.bad_node_hours`` on, the stage job

- stops at once with exit 89 (the outer script's runtime probe), its log naming the node;
- is resubmitted (``NODE_FAULT``) with that node left out (``sbatch --exclude``, said in the task
  log and recorded for the HPC view), eligible to start only after the back-off (sacct's
  ``Eligible`` against its ``Submit``);
- trains on another node, and the stage completes.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from support.localcluster import LocalCluster, poll_until
from slurm_provider.operators import job_name_for
from vcloud.contract import EXIT_RUNTIME_FAILED
from vcloud_pipeline.profile import load_profile

pytestmark = [pytest.mark.usefixtures("cluster_connection", "airflow_home"), pytest.mark.timeout(1500)]
REPO = Path(__file__).resolve().parents[2]
DAG_ID = "vcloud_training"
FIRST_RETRY_S = 15
STAGE_JOBS = f"{DAG_ID}.stage0."
"""What this DAG's stage 0 job names start with (``job_name_for``)."""

BROKEN_CH_RUN = """#!/bin/bash
# ch-run of one test: the node where the test's first stage job starts cannot start the test's image.
case "${{SLURM_JOB_NAME:-}} $*" in
    {jobs}*" {image} "*)
        if [ ! -s {broken} ]; then hostname > {broken}; fi
        if [ "$(cat {broken})" = "$(hostname)" ]; then
            echo "ch-run[$$]: error: can't mount proc at {image}/proc: Permission denied (broken on this node)" >&2
            exit 1
        fi ;;
esac
exec {real} "$@"
"""


@pytest.fixture
def profile_overrides() -> dict[str, Any]:
    return {"jobs.bad_node_hours": 1, "jobs.node_fault_first_retry_seconds": FIRST_RETRY_S}


@contextlib.contextmanager
def runtime_broken_on_first_node(cluster: LocalCluster, project: str) -> Iterator[tuple[str, str]]:
    """(the test's image path, the file naming the broken node once a stage job met it), with a ch-run
    bound over every compute node's own while the block runs."""
    image, broken = f"{project}/image", f"{project}/broken-node"
    profile = load_profile("local")
    assert profile.container is not None
    cluster.ssh(f"ln -s {shlex.quote(profile.container.image)} {image}")
    # The wrapper and the real ch-run where every user's jobs may run them (the second project member's
    # jobs on these nodes pass through too); the node's name goes to the test's own directory.
    tools = Path(tempfile.mkdtemp(prefix="vcloud-broken-runtime-", dir="/var/tmp"))
    tools.chmod(0o755)
    real, wrapper = tools / "ch-run.real", tools / "ch-run"
    shutil.copy2("/usr/bin/ch-run", real)
    wrapper.write_text(BROKEN_CH_RUN.format(jobs=STAGE_JOBS, image=image, broken=broken, real=real))
    wrapper.chmod(0o755)
    pids = [p.read_text().strip() for p in sorted((cluster.state_dir / "run").glob("slurmd-*.pid"))]
    assert pids, "no compute node's slurmd is running"
    bound = []
    try:
        for pid in pids:
            subprocess.run(["nsenter", "-t", pid, "-m", "mount", "--bind", str(wrapper), "/usr/bin/ch-run"],
                           check=True, capture_output=True, text=True)
            bound.append(pid)
        yield image, broken
    finally:
        for pid in bound:
            subprocess.run(["nsenter", "-t", pid, "-m", "umount", "/usr/bin/ch-run"], check=False)
        shutil.rmtree(tools, ignore_errors=True)


def stage_jobs(cluster: LocalCluster, run_id: str) -> list[dict[str, str]]:
    """The stage 0 jobs of the run that ran, oldest first (a submission sbatch refused, leaving out more
    nodes than the partition can spare, is in accounting too, with no node)."""
    fields = ("JobIDRaw", "State", "ExitCode", "NodeList", "Submit", "Eligible")
    out = cluster.root("sacct", "-X", "-n", "-P", "-S", "now-1days", f"--name={job_name_for(DAG_ID, 'stage0', run_id)}",
                       f"--format={','.join(fields)}").stdout
    rows = [dict(zip(fields, line.split("|"))) for line in out.splitlines() if line]
    return [row for row in rows if row["NodeList"] != "None assigned"]


def test_a_node_whose_container_runtime_is_broken_is_left_out_and_the_stage_trains_elsewhere(
        local_cluster: LocalCluster, project_dir: str, monkeypatch: pytest.MonkeyPatch,
        capfd: pytest.CaptureFixture) -> None:
    from airflow.dag_processing.dagbag import DagBag
    from airflow.utils.session import create_session

    from hpc_view.records import records_from_xcoms
    from hpc_view.store import load_xcom_rows

    with runtime_broken_on_first_node(local_cluster, project_dir) as (image, broken):
        overrides = json.loads(os.environ["VCLOUD_PROFILE_OVERRIDES"])
        overrides["local"]["container.image"] = image
        monkeypatch.setenv("VCLOUD_PROFILE_OVERRIDES", json.dumps(overrides))
        dag = DagBag(dag_folder=str(REPO / "dags")).dags[DAG_ID]
        dag_run = dag.test(run_conf={"profile": "local", "config": "tiny", "run_name": "badnode", "stages": [0],
                                     "max_epochs": 1, "export": False},
                           mark_success_pattern=r"^preflight_(checks|imports)$")
        bad_node = local_cluster.ssh(f"cat {broken}").stdout.strip()
    output = "".join(capfd.readouterr())
    states = {ti.task_id: str(ti.state) for ti in dag_run.get_task_instances()}
    assert states["stage0"] == "success" and str(dag_run.state) == "success", (states, output[-8000:])

    poll_until(lambda: len(stage_jobs(local_cluster, dag_run.run_id)) == 2
               and stage_jobs(local_cluster, dag_run.run_id)[1]["State"] == "COMPLETED",
               timeout=60, what="both stage jobs in sacct")
    first, second = stage_jobs(local_cluster, dag_run.run_id)
    print(f"bad node {bad_node}: job {first['JobIDRaw']} {first['State']} {first['ExitCode']} on "
          f"{first['NodeList']}; job {second['JobIDRaw']} {second['State']} on {second['NodeList']}, submitted "
          f"{second['Submit']}, eligible {second['Eligible']}")
    assert (first["State"], first["ExitCode"], first["NodeList"]) == ("FAILED", f"{EXIT_RUNTIME_FAILED}:0", bad_node)
    assert second["State"] == "COMPLETED" and second["NodeList"] != bad_node
    waited = datetime.fromisoformat(second["Eligible"]) - datetime.fromisoformat(second["Submit"])
    assert waited.total_seconds() >= FIRST_RETRY_S - 1, second  # --begin=now+15: the back-off in the queue

    log = local_cluster.ssh(f"cat {project_dir}/logs/badnode/{job_name_for(DAG_ID, 'stage0', dag_run.run_id)}"
                            f".{first['JobIDRaw']}.out {project_dir}/logs/badnode/"
                            f"{job_name_for(DAG_ID, 'stage0', dag_run.run_id)}.{first['JobIDRaw']}.err",
                            check=False).stdout
    assert f"the container runtime does not start on {bad_node}: ch-run[" in log, log
    assert " | epoch " not in log  # nothing trained there
    assert (f"Job {first['JobIDRaw']} failed with exit code {EXIT_RUNTIME_FAILED} on {bad_node}, which says its "
            "node is at fault") in output
    assert "resubmitting after NODE_FAULT (1 of " in output
    # the newest fault first; other tests' jobs on this shared cluster may have left other nodes out too
    assert f"Leaving out {bad_node}" in output and "(sbatch --exclude): this project's jobs failed there" in output
    assert f"{bad_node} (job {first['JobIDRaw']} ended exit {EXIT_RUNTIME_FAILED} at " in output
    assert f"Job {second['JobIDRaw']} may start {FIRST_RETRY_S} s from now at the earliest (sbatch --begin)" in output

    with create_session() as session:  # what the HPC view shows of the task
        rows = load_xcom_rows(session, None, dag_id=DAG_ID, run_id=dag_run.run_id)
    record = next(r for r in records_from_xcoms(rows) if r.task_id == "stage0")
    assert record.job_ids == (first["JobIDRaw"], second["JobIDRaw"])
    assert record.to_json()["left_out_words"].startswith(f"{bad_node} (job {first['JobIDRaw']}: exit {EXIT_RUNTIME_FAILED})")
