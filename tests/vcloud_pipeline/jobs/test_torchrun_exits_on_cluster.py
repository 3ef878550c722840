"""A torchrun job whose trainer refuses to resume, on the local Slurm cluster, as the cluster user.

Two gloo ranks (``gpus_per_node: 2`` of the local profile) resume stage 0 of the tiny config from a
``latest.pt`` whose weights no longer fit the model. torchrun alone would end the job with exit 1
and a ``ChildFailedError`` traceback; the job ends with the trainer's exit 88 in ``sacct``, its
error output says so in the launch's one line, and holds no traceback. The project's code is synced
as the DAG syncs it; the scripts are the rendered ones, submitted with sbatch. The job runs in the
local profile's Charliecloud image, where torchrun's rendezvous at ``MASTER_ADDR`` (a node's name)
needs the node's ``/etc/hosts`` bound into the image.
"""

from __future__ import annotations

import hashlib
import shlex
from pathlib import Path

import pytest

from support.localcluster import LocalCluster, poll_until
from tests.vcloud.test_launch import RETIRED, stage_that_refuses_to_resume
from tests.vcloud_pipeline.jobs.test_on_local_cluster import FINAL, REPO, setup_run, submit
from vcloud.contract import EXIT_RESUME_REFUSED
from vcloud_pipeline.code.tree import CodeTree
from vcloud_pipeline.plan.jobspec import JobSpec
from vcloud_pipeline.jobs.render import render_job

pytestmark = pytest.mark.usefixtures("cluster_connection")  # rsync logs in with the profile's connection
TINY = "trainer/configs/model_tiny.yaml"


def cat(cluster: LocalCluster, path: object) -> str:
    return cluster.ssh(f"cat {shlex.quote(str(path))}", check=False).stdout


def test_a_refused_resume_under_torchrun_ends_the_job_with_exit_88_and_no_traceback(
        local_cluster: LocalCluster, tmp_path: Path) -> None:
    from vcloud.data.prepare import prepare_dataset
    from vcloud.data.synthetic import generate_raw

    profile, paths, manifest = setup_run(local_cluster, CodeTree(REPO), tmp_path)
    # The dataset and stage 0 after one epoch, made here on the project file system (which the
    # cluster's nodes share with this machine), then handed to the cluster user.
    prepare_dataset(generate_raw(tmp_path / "raw", preset="tiny", seed=0), Path(paths.data_dir))
    latest = stage_that_refuses_to_resume(Path(paths.data_dir), Path(paths.outputs_dir))
    before = hashlib.sha256(latest.read_bytes()).hexdigest()
    base = str(Path(paths.outputs_dir).parents[1])
    local_cluster.root("chown", "-R", f"{local_cluster.user}:{local_cluster.user}", base)

    job = render_job(profile, JobSpec.train(0, gpus_per_node=2, max_epochs=2, config=TINY, time_limit="00:10:00"),
                     paths, manifest.hash)
    assert "-m vcloud.launch" in job.inner and "--nproc_per_node=2" in job.inner
    job_id = submit(local_cluster, profile, job, tmp_path)
    try:
        state = local_cluster.wait_for_state(job_id, FINAL, timeout=900)
    finally:
        local_cluster.ssh(f"scancel {job_id}", check=False)
    out, err = cat(local_cluster, job.stdout_path(str(job_id))), cat(local_cluster, job.stderr_path(str(job_id)))
    runs = poll_until(lambda: [r for r in local_cluster.sacct_runs(job_id) if r["ExitCode"] != "0:0"],
                      timeout=60, what="the job's exit code in sacct")
    assert (state, runs[-1]["ExitCode"]) == ("FAILED", f"{EXIT_RESUME_REFUSED}:0"), out[-3000:] + err[-3000:]
    assert len(runs) == 1, runs  # not requeued

    # both ranks ran under torchrun and refused; the launch says what the job's exit code means
    assert "rank 0/2 (gloo)" in out, out[-3000:]
    assert f"its weights no longer fit the model: -{RETIRED} 2. Nothing was trained." in out, out[-3000:]
    launch = [line for line in err.splitlines() if line.startswith("vcloud launch:")]
    assert len(launch) == 1 and launch[0].startswith(
        "vcloud launch: exit 88 of rank"), err[-3000:]
    assert "latest.pt was written by other code and cannot be resumed as asked; nothing trained" in launch[0]
    assert "job step finished with exit code 88" in err
    assert "Traceback" not in out + err and "ChildFailedError" not in err, err[-3000:]

    # the refused checkpoint is untouched; the ranks' exit records went with the job
    assert hashlib.sha256(latest.read_bytes()).hexdigest() == before
    records = str(paths.exit_records_dir(job.job_name)).replace("{job_id}", str(job_id))
    assert local_cluster.ssh(f"test -e {shlex.quote(records)}", check=False).returncode == 1
