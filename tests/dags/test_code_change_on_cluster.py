"""A stage resumed by other code, through the training DAG on the local cluster (tiny config).

Three code versions train one run name, each synced by the DAG's own ``sync_code`` task from a tree
of its own (so each is a content hash of its own):

- A, the trainer as it was before CFDT's date decay had an optimizer group of its own
  (``vcloud/optim.py`` builds one group), trains stage 0 and stage 1 until stage 1 has written its
  first epoch; then its job is cancelled (as "mark failed" in the UI does): ``latest.pt`` stays,
  no ``COMPLETE``.
- C, whose change gate ends in a wider convolution (``vcloud/models/cfdt.py``), resumes stage 1:
  the weights no longer fit, so the job stops with exit 88 and the task's failure carries the
  trainer's refusal (both code hashes, what differs, the remedies); ``latest.pt`` is untouched.
- B, the project's own trainer (two optimizer groups), resumes stage 1 with the run's default
  ``on_code_change: keep_weights``: the weights go on with a fresh optimizer state, the task log
  says so in one line naming both code hashes, and the stage completes.

No job log holds a traceback. Jobs run for real, as the cluster user, in the local profile's image.
"""

from __future__ import annotations

import re
import shlex
import shutil
from pathlib import Path
from typing import Any

import pytest

from support.background import BackgroundStep
from support.localcluster import LocalCluster
from tests.dags.test_code_versions_on_cluster import stage_job
from tests.dags.test_dag_on_cluster import job_logs_tail, run_dag

pytestmark = [pytest.mark.usefixtures("cluster_connection", "airflow_home"), pytest.mark.timeout(3000)]
REPO = Path(__file__).resolve().parents[2]
RUN = "code-change"
EPOCHS = 3
"""Run A's epochs (stage 0 trains them all): its stage 1 job is cancelled within a tenth of a second of
its first epoch (:meth:`LocalCluster.job_at_first_epoch`), before its second (run B resumes it at
epoch 1), so never at its last."""
QUEUE_WAIT_S = 1200
"""How long a job of this test may wait for a node while the rest of the suite's jobs hold them."""

ONE_GROUP = '''

def build_optimizer(model, lr, weight_decay):  # this version: every parameter in one group
    return torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr, weight_decay=weight_decay)
'''
GATE_3X3 = "self.pair_out = nn.Conv2d(gc, 1, 3, padding=1)"
GATE_5X5 = "self.pair_out = nn.Conv2d(gc, 1, 5, padding=2)"



def code_version(root: Path, path: str, change: str | tuple[str, str]) -> Path:
    """A copy of the project's ``trainer/`` with ``path`` changed: text appended, or (old, new) replaced."""
    shutil.copytree(REPO / "trainer", root / "trainer",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info"))
    source = root / "trainer" / "src" / "vcloud" / path
    text = source.read_text()
    if isinstance(change, tuple):
        assert text.count(change[0]) == 1, f"{path} no longer has {change[0]!r}: update this test's change"
        text = text.replace(*change)
    else:
        text += change
    source.write_text(text)
    return root


def synced_from(monkeypatch: pytest.MonkeyPatch, tree: Path) -> None:
    """The next DAG run's ``sync_code`` task (run in this process by dag.test()) syncs ``tree``."""
    from vcloud_pipeline.dag import tasks

    monkeypatch.setitem(tasks.sync_code.__kwdefaults__, "project_root", tree)


class CancelAfterFirstEpoch(BackgroundStep):
    """Cancel run A's stage 1 job once its first epoch is checkpointed, as "mark failed" does."""

    def __init__(self, cluster: LocalCluster, project_dir: str) -> None:
        super().__init__()
        self.cluster, self.project_dir = cluster, project_dir
        self.job: int | None = None

    def step(self) -> None:
        cluster = self.cluster
        job = cluster.job_at_first_epoch(f"{self.project_dir}/outputs/{RUN}/stage1",
                                         lambda: stage_job(cluster, self.project_dir, RUN, "stage1"),
                                         timeout=3 * QUEUE_WAIT_S, what="run A's first stage 1 epoch")
        cluster.ssh(f"scancel {job}")
        self.job = job


def job_lines(output: str, job_id: str) -> list[str]:
    """The job's lines as they streamed into the task log."""
    return [line for line in output.splitlines() if f"[job {job_id}" in line]


def job_logs(cluster: LocalCluster, project_dir: str, job_id: str) -> str:
    logs = shlex.quote(f"{project_dir}/logs/{RUN}")
    return cluster.ssh(f"cat {logs}/*stage1*.{job_id}.out {logs}/*stage1*.{job_id}.err").stdout


@pytest.mark.slow
def test_a_stage_resumed_by_other_code_keeps_its_weights_or_is_refused_never_a_traceback(
        local_cluster: LocalCluster, project_dir: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capfd: pytest.CaptureFixture) -> None:
    stage1 = f"{project_dir}/outputs/{RUN}/stage1"
    latest = f"{stage1}/latest.pt"

    # A: one optimizer group; stage 1 stopped after its first epoch
    synced_from(monkeypatch, code_version(tmp_path / "a", "optim.py", ONE_GROUP))
    cancel = CancelAfterFirstEpoch(local_cluster, project_dir)
    cancel.start()
    _, states, values = run_dag(profile="local", config="tiny", run_name=RUN, stages=[0, 1], max_epochs=EPOCHS,
                                export=False)
    cancel.join(60)
    capfd.readouterr()
    assert cancel.error is None, f"{cancel.error!r}\n{job_logs_tail(local_cluster, project_dir, RUN, 'stage1')}"
    assert states["stage0"] == "success" and states["stage1"] == "failed", states
    hash_a = values["sync_code"]["code_hash"]
    assert local_cluster.ssh(f"test -f {shlex.quote(latest)} && test ! -e {shlex.quote(stage1)}/COMPLETE",
                             check=False).returncode == 0
    checkpoint_a = local_cluster.ssh(f"sha256sum {shlex.quote(latest)}").stdout.split()[0]

    # C: the change gate's output is wider: refused, whatever on_code_change says
    synced_from(monkeypatch, code_version(tmp_path / "c", "models/cfdt.py", (GATE_3X3, GATE_5X5)))
    _, states, values = run_dag(profile="local", config="tiny", run_name=RUN, stages=[1], max_epochs=2,
                                export=False, on_code_change="keep_weights")
    output = "".join(capfd.readouterr())
    hash_c = values["sync_code"]["code_hash"]
    assert states["preflight_imports"] == "success", states  # other code: the import check runs again
    assert states["stage1"] == "failed", f"{states}\n{job_logs_tail(local_cluster, project_dir, RUN, 'stage1')}"
    failed = re.search(r"Slurm job (\d+) ended FAILED", output)
    assert failed, output[-4000:]
    job_c = failed.group(1)
    refusal = (f"cannot resume stage 1 from {latest}: it was written by code {hash_a}, this job runs code {hash_c}, "
               "and its weights no longer fit the model: gate.pair_out.weight 1x8x3x3 -> 1x8x5x5. Nothing was trained.")
    failure = output[failed.start():]
    assert "Exit code 88: the trainer refused to resume the stage's latest.pt, written by other code" in failure, \
        failure[:3000]
    assert refusal in failure and 'mode: restart for this stage (DAG run params {"stages": [1], "mode": ' \
        '"restart"}' in failure, failure[:6000]
    assert f"finish the stage with code {hash_a}: deploy that code version" in failure
    assert "Hint: The stage's latest.pt was written by code this one cannot resume" in failure
    assert any(refusal in line for line in job_lines(output[:failed.start()], job_c)), output[-4000:]
    logs_c = job_logs(local_cluster, project_dir, job_c)
    assert "Traceback" not in logs_c and " | epoch " not in logs_c, logs_c[-4000:]
    assert local_cluster.ssh(f"sha256sum {shlex.quote(latest)}").stdout.split()[0] == checkpoint_a

    # B: the project's trainer, two optimizer groups: the weights resume with a fresh optimizer
    synced_from(monkeypatch, REPO)
    _, states, values = run_dag(profile="local", config="tiny", run_name=RUN, stages=[1], max_epochs=2,
                                export=False)
    output = "".join(capfd.readouterr())
    hash_b = values["sync_code"]["code_hash"]
    assert states["preflight_imports"] == "success", states
    assert states["stage1"] == "success", f"{states}\n{job_logs_tail(local_cluster, project_dir, RUN, 'stage1')}"
    summary: dict[str, Any] = values["stage1"]
    job_b = summary["job_id"]
    assert len({hash_a, hash_b, hash_c}) == 3
    assert summary["trained_code_hash"] == hash_b and summary["epochs"] == 2
    fresh = [line for line in job_lines(output, job_b) if "fresh optimizer state" in line]
    assert len(fresh) == 1, output[-4000:]
    assert (f"WARNING: stage 1: {latest} was written by code {hash_a}, this is code {hash_b}, and the optimizer's "
            "layout differs (groups 1 -> 2; group 0: -date_decay scalar; group 0 settings: +lr_scale; "
            "group 1 (new): +date_decay scalar); the weights fit: resuming them at epoch 1, step ") in fresh[0]
    assert "with a fresh optimizer state (train.on_code_change: keep_weights)" in fresh[0]
    logs_b = job_logs(local_cluster, project_dir, job_b)
    assert "Traceback" not in logs_b and "stage 1 complete: 2 epochs" in logs_b, logs_b[-4000:]
