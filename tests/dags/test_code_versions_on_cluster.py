"""Code on the cluster is immutable per content hash, through the training DAG on the local cluster.

Run A trains stage 0 through dag.test() (tiny config). Once A's job has written its first
checkpoint, a background thread suspends it (as an administrator may), syncs run B's code with the
DAG's own sync task, and has Slurm requeue A's job. Runs A and B each sync a copy of the project's
``trainer/`` with one trainer file changed, so each is a content hash of its own (the cleanup keeps
a hash that any live job of the account runs, and the rest of the suite runs the project's own
tree); the profile keeps only
the newest code directory (``paths.code_keep: 1``), so B's cleanup would remove A's code were it not
for A's live job. A's job must resume and complete with A's code (its log, its checkpoints, the
stage's XCom), both code directories must exist until A's job has ended, and the cleanup after that
removes A's directory only once no queued job references it.
"""

from __future__ import annotations

import json
import shlex
import shutil
import uuid
from pathlib import Path
from typing import Any

import pytest

from support.background import BackgroundStep
from support.localcluster import LocalCluster, poll_until
from tests.dags.test_dag_on_cluster import job_err_log, job_logs_tail, run_dag

pytestmark = [pytest.mark.usefixtures("cluster_connection", "airflow_home"), pytest.mark.timeout(3000)]
REPO = Path(__file__).resolve().parents[2]
CLUSTER_PYTHON = "/opt/vcloud-localcluster/venv/bin/python"
RUN_A, RUN_B = "code-a", "code-b"
EPOCHS = 5
"""Run A's epochs: its job is suspended within a tenth of a second of its first checkpoint
(:meth:`LocalCluster.job_at_first_epoch`), epochs before it could end."""
QUEUE_WAIT_S = 1200
"""How long a job of this test may wait for the node while the rest of the suite's jobs hold it."""


@pytest.fixture
def profile_overrides() -> dict[str, Any]:
    return {"paths.code_keep": 1}


def changed_tree(root: Path, change: str) -> Path:
    """A copy of the project's ``trainer/`` with one trainer file changed: a content hash no other
    test's jobs use (they all run the project's own tree), so only this test's jobs keep it."""
    shutil.copytree(REPO / "trainer", root / "trainer",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info"))
    metrics = root / "trainer" / "src" / "vcloud" / "metrics.py"
    metrics.write_text(metrics.read_text() + f"\n# {change} {uuid.uuid4().hex}\n")
    return root


@pytest.fixture
def run_a_tree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The tree run A's DAG syncs (its ``sync_code`` task runs in this process under dag.test())."""
    from vcloud_pipeline.dag import tasks

    tree = changed_tree(tmp_path / "run-a", "run A's change")
    monkeypatch.setitem(tasks.sync_code.__kwdefaults__, "project_root", tree)
    return tree


def code_dirs(cluster: LocalCluster, project_dir: str) -> set[str]:
    """The code root's entries, hidden ones included, but the DAG runs' markers (``.runs``), the
    preflight checks' proofs (``.preflight``) and the sync lock of each code directory there."""
    entries = set(cluster.ssh(f"ls -A {shlex.quote(project_dir)}/code").stdout.split()) - {".runs", ".preflight"}
    return entries - {f".{name}.sync-lock" for name in entries}


def preflight_proved(cluster: LocalCluster, project_dir: str) -> set[str]:
    """The codes whose preflight check left a proof (``.preflight/<code>/``)."""
    return set(cluster.ssh(f"ls -A {shlex.quote(project_dir)}/code/.preflight").stdout.split())


def stage_job(cluster: LocalCluster, project_dir: str, run: str, stage: str) -> int | None:
    """The id of the run's stage job that squeue lists (its output goes to the run's log directory)."""
    out = cluster.root("squeue", "-h", "-t", "all", "-O", "JobID:20,Name:200,STDOUT:400", check=False).stdout
    for line in out.splitlines():
        job_id, name, stdout = (line.split(None, 2) + ["", ""])[:3]
        if f".{stage}." in name and stdout.startswith(f"{project_dir}/logs/{run}/"):
            return int(job_id)
    return None


def checkpoint_code_hash(cluster: LocalCluster, path: str) -> str:
    """The ``code_hash`` a checkpoint records, read on the cluster with the jobs' own interpreter."""
    code = f"import torch; print(torch.load({path!r}, weights_only=True)['code_hash'])"
    return cluster.ssh(f"{CLUSTER_PYTHON} -c {shlex.quote(code)}", timeout=120).stdout.strip()


class RunB(BackgroundStep):
    """While run A trains: suspend A's job, sync run B's code, then requeue A's job."""

    def __init__(self, cluster: LocalCluster, project_dir: str, tree: Path) -> None:
        super().__init__()
        self.cluster, self.project_dir, self.tree = cluster, project_dir, tree
        self.seen: dict[str, Any] = {}

    def step(self) -> None:
        from slurm_provider.hooks import SlurmHook
        from vcloud_pipeline.plan.request import parse_request
        from vcloud_pipeline.dag.tasks import build_plan, sync_code

        cluster, stage_dir = self.cluster, f"{self.project_dir}/outputs/{RUN_A}/stage0"
        # On a busy cluster the data and stage jobs queue for a while before they run.
        job = cluster.job_at_first_epoch(stage_dir, lambda: stage_job(cluster, self.project_dir, RUN_A, "stage0"),
                                         timeout=2 * QUEUE_WAIT_S + 300, what="run A's first stage 0 epoch")
        cluster.suspend_training(job, stage_dir)
        self.seen["job"] = job
        self.seen["dirs_before_b"] = code_dirs(cluster, self.project_dir)

        ctx = build_plan(parse_request({"profile": "local", "config": "tiny", "run_name": RUN_B,
                                              "stages": [0], "export": False}))
        with SlurmHook(ctx.profile.connection.conn_id) as hook:
            self.seen["b"] = sync_code(ctx, hook, project_root=self.tree)
        self.seen["dirs_after_b"] = code_dirs(cluster, self.project_dir)

        cluster.root("scontrol", "resume", str(job))
        cluster.root("scontrol", "requeue", str(job))
        self.seen["restarted"] = poll_until(
            lambda: "(restart 1)" in job_err_log(cluster, self.project_dir, RUN_A, "stage0", str(job)),
            timeout=QUEUE_WAIT_S, what=f"job {job} to start again after the requeue")
        self.seen["dirs_while_requeued"] = code_dirs(cluster, self.project_dir)


@pytest.mark.slow
def test_a_requeued_job_runs_its_own_code_after_another_run_synced_new_code(
        local_cluster: LocalCluster, project_dir: str, run_a_tree: Path, tmp_path: Path) -> None:
    run_b = RunB(local_cluster, project_dir, changed_tree(tmp_path / "run-b", "run B's change"))
    run_b.start()
    _, states, values = run_dag(profile="local", config="tiny", run_name=RUN_A, stages=[0], max_epochs=EPOCHS,
                                export=False)
    run_b.join(60)
    assert run_b.error is None, f"{run_b.error!r}\n{job_logs_tail(local_cluster, project_dir, RUN_A, 'stage0')}"
    assert states["stage0"] == "success", f"{states}\n{job_logs_tail(local_cluster, project_dir, RUN_A, 'stage0')}"

    hash_a, synced_b = values["sync_code"]["code_hash"], run_b.seen["b"]
    hash_b = synced_b["code_hash"]
    from vcloud_pipeline.code.tree import CodeTree
    from vcloud_pipeline.code.upload import local_manifest

    assert hash_a == local_manifest(CodeTree(run_a_tree)).hash != local_manifest(CodeTree(REPO)).hash
    assert hash_a != hash_b and synced_b["code_sent"]
    # B's sync left A's code alone although only one directory is to be kept: A's job was suspended
    assert run_b.seen["dirs_before_b"] == {hash_a}
    assert synced_b["code_dirs_removed"] == []
    assert run_b.seen["dirs_after_b"] == run_b.seen["dirs_while_requeued"] == {hash_a, hash_b}

    # A's job was requeued once, resumed from its checkpoint and completed with A's code
    summary, job = values["stage0"], run_b.seen["job"]
    assert summary["job_ids"] == [str(job)] and summary["restarts"] >= 1, summary
    assert summary["code_hash"] == summary["trained_code_hash"] == hash_a
    assert summary["epochs"] == EPOCHS
    err = job_err_log(local_cluster, project_dir, RUN_A, "stage0", str(job))
    assert f"with code {hash_a} (restart 0)" in err and f"with code {hash_a} (restart 1)" in err
    assert hash_b not in err
    out = local_cluster.ssh(f"cat {shlex.quote(project_dir)}/logs/{RUN_A}/*stage0*{job}*.out").stdout
    assert f"resumed from {project_dir}/outputs/{RUN_A}/stage0/latest.pt" in out
    assert f"code {hash_a})" in out and "training goes on with code" not in out
    stage = f"{project_dir}/outputs/{RUN_A}/stage0"
    assert checkpoint_code_hash(local_cluster, f"{stage}/latest.pt") == hash_a
    assert checkpoint_code_hash(local_cluster, f"{stage}/best.pt") == hash_a
    complete = json.loads(local_cluster.ssh(f"cat {shlex.quote(stage)}/COMPLETE").stdout)
    assert complete["code_hash"] == hash_a
    assert code_dirs(local_cluster, project_dir) == {hash_a, hash_b}  # both, until A's job ended

    # After A's job ended, B syncs again (nothing sent): its cleanup removes A's code once no
    # queued job references it any more.
    from slurm_provider.hooks import SlurmHook
    from vcloud_pipeline.plan.request import parse_request
    from vcloud_pipeline.dag.tasks import build_plan, sync_code

    ctx = build_plan(parse_request({"profile": "local", "config": "tiny", "run_name": RUN_B,
                                          "stages": [0], "export": False}))
    held = local_cluster.sbatch("#!/bin/bash\ntrue\n", "--hold", "--output=/dev/null",
                                f'--comment={{"code":"{hash_a}"}}')  # e.g. a job of run A someone queued by hand
    try:
        with SlurmHook(ctx.profile.connection.conn_id) as hook:
            again = sync_code(ctx, hook, project_root=run_b.tree)
        assert not again["code_sent"] and again["code_dirs_removed"] == []
        assert code_dirs(local_cluster, project_dir) == {hash_a, hash_b}
    finally:
        local_cluster.ssh(f"scancel {held}")
    local_cluster.wait_for_state(held, {"CANCELLED"}, timeout=60)
    assert preflight_proved(local_cluster, project_dir) == {hash_a}  # run A's import check passed
    with SlurmHook(ctx.profile.connection.conn_id) as hook:
        last = sync_code(ctx, hook, project_root=run_b.tree)
    assert last["code_dirs_removed"] == [hash_a]
    assert code_dirs(local_cluster, project_dir) == {hash_b}
    # A's sync lock and the proof of its preflight check went with its directory; B's lock stays.
    entries = set(local_cluster.ssh(f"ls -A {shlex.quote(project_dir)}/code").stdout.split())
    assert entries == {hash_b, f".{hash_b}.sync-lock", ".runs", ".preflight"}, entries
    assert preflight_proved(local_cluster, project_dir) == set()
