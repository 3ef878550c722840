"""Multi-node training through the DAG, with the real sites' own job scripts on the local cluster.

The Cosmos profile runs with its site facts mapped (include/local_cluster/site_facts.yaml):
Singularity-style launch through the stand-in, torchrun across nodes with the rendezvous it renders
(the same lines as LUMI's: MASTER_ADDR the allocation's first node, node rank from SLURM_NODEID),
gloo on the CPU. Multi-node jobs take whole nodes (4 APUs on Cosmos, 8 GCDs on LUMI), so Cosmos
keeps these runs to 8 ranks on this machine's two cores.
"""

from __future__ import annotations

import base64
import io
import json
import re
import shlex
import shutil
import subprocess
import sys
import threading
import uuid
from pathlib import Path
from typing import Any

import pytest

from support.localcluster import LocalCluster, poll_until
from tests.dags.test_dag_on_cluster import job_logs_tail, run_dag

pytestmark = [pytest.mark.usefixtures("cluster_connection", "airflow_home"), pytest.mark.timeout(1500)]


def site_project(local_cluster: LocalCluster, monkeypatch: pytest.MonkeyPatch, profile: str, root: str) -> str:
    """A fresh project directory under the site's own file system root, and the site facts on."""
    from vcloud_pipeline.profile.site_facts import LOCAL_SITE_FACTS, SITE_FACTS_ENV

    # ``root`` may say {user}, as the profile's own paths do (it is the login's until the run knows it).
    template = f"{root}/tests/{uuid.uuid4().hex[:12]}"
    base = template.replace("{user}", local_cluster.user)
    local_cluster.ssh(f"mkdir -p {shlex.quote(base)}")
    monkeypatch.setenv(SITE_FACTS_ENV, str(LOCAL_SITE_FACTS))
    monkeypatch.setenv("VCLOUD_PROFILE_OVERRIDES", json.dumps({profile: {"paths.base": template}}))
    monkeypatch.setenv("VCLOUD_POLL_INTERVAL", "2")
    monkeypatch.setenv("VCLOUD_MAX_POLL_INTERVAL", "5")
    monkeypatch.setenv("VCLOUD_FIRST_POLL_DELAY", "1")
    return base


def read_json(cluster: LocalCluster, path: str) -> dict[str, Any]:
    return json.loads(cluster.ssh(f"cat {shlex.quote(path)}").stdout)


def write_wide_dataset(cluster: LocalCluster, data_dir: str, tmp_path: Path) -> None:
    """The tiny-wide synthetic dataset where the run reads its data (prepare_data then finds it):
    tiny's 6 training series are fewer than 8 ranks x batch 2, and the trainer refuses that."""
    from vcloud.data.synthetic import generate_raw

    raw, prepared = tmp_path / "raw", tmp_path / "prepared"
    generate_raw(raw, "tiny-wide")
    subprocess.run([sys.executable, "-m", "vcloud.data.prepare", "--raw", str(raw), "--out", str(prepared)],
                   check=True, capture_output=True, text=True, timeout=300)
    Path(data_dir).parent.mkdir(parents=True, exist_ok=True)
    shutil.copytree(prepared, data_dir)
    cluster.root("chown", "-R", f"{cluster.user}:{cluster.user}", str(Path(data_dir).parents[1]))


def load_state(cluster: LocalCluster, path: str) -> dict[str, Any]:
    """A checkpoint on the cluster, read over the login node."""
    import torch

    raw = cluster.ssh(f"base64 -w0 {shlex.quote(path)}").stdout
    return torch.load(io.BytesIO(base64.b64decode(raw)), weights_only=True, map_location="cpu")


@pytest.mark.slow
def test_a_two_node_stage_equals_one_node_with_the_same_global_batch(
        local_cluster: LocalCluster, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Cosmos stage 0 through the DAG on 2 nodes x 4 APUs (torchrun across the nodes: 8 gloo ranks,
    batch 2 each) against one node's 4 ranks with batch 4, run with the same image, code and data:
    the same global batch of the same samples, so the same weights."""
    import torch
    from vcloud_pipeline.plan.layout import run_paths
    from vcloud_pipeline.profile import load_profile, overrides_from_environ

    base = site_project(local_cluster, monkeypatch, "cosmos", "/cosmos/vast/scratch/{user}")
    profile = load_profile("cosmos", overrides_from_environ("cosmos"), login=local_cluster.user)
    data = str(run_paths(profile, "two-nodes", synthetic_preset="tiny").data_dir)
    write_wide_dataset(local_cluster, data, tmp_path)
    _, states, values = run_dag(profile="cosmos", config="tiny", run_name="two-nodes", stages=[0], max_epochs=2,
                                export=False, nodes=2, gpus_per_node=4)
    assert states["stage0"] == "success", f"{states}\n{job_logs_tail(local_cluster, base, 'two-nodes', 'stage0')}"

    job_id = values["stage0"]["job_id"]
    node_list = local_cluster.ssh(f"sacct -X -n -P -j {job_id} -o NodeList").stdout.split()[-1]
    assert len(set(local_cluster.ssh(f"scontrol show hostnames {node_list}").stdout.split())) == 2, node_list
    out = local_cluster.ssh(f"cat {shlex.quote(base)}/logs/two-nodes/*stage0*.out").stdout
    assert "rank 0/8 (gloo)" in out, out[-3000:]
    inner = local_cluster.ssh(f"cat {shlex.quote(base)}/jobs/two-nodes/*stage0.inner.*.sh").stdout
    assert "--nnodes=2" in inner and "--nproc_per_node=4" in inner, inner
    assert "singularity exec --rocm" in local_cluster.ssh(
        f"cat {shlex.quote(base)}/jobs/two-nodes/*stage0.sbatch").stdout

    # The reference: one node, 4 ranks of batch 4, the same image, code and dataset; and a control
    # with batch 2 (half the global batch), which must land far outside the tolerance.
    code = values["sync_code"]["code_dir"]
    image = profile.container.image if profile.container else ""

    def one_node(out: str, batch: int) -> dict[str, Any]:
        command = (f"cd {code} && PYTHONPATH={code}/trainer/src python3 -m torch.distributed.run --standalone "
                   f"--nproc_per_node=4 -m vcloud.train --stage 0 --config {code}/trainer/configs/model_tiny.yaml "
                   f"--data {data} --out {out} --max-epochs 2 --set train.stage0.batch_size={batch}")
        ran = local_cluster.ssh(f"SINGULARITY_BIND=/cosmos/vast/scratch/{local_cluster.user} srun -p small-g -N1 "
                                f"--gpus=4 -c 4 -t 10 singularity exec {image} bash -c {shlex.quote(command)}",
                                check=False, timeout=600)
        assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-3000:]
        return load_state(local_cluster, f"{out}/stage0/latest.pt")

    two = load_state(local_cluster, f"{base}/outputs/two-nodes/stage0/latest.pt")
    one = one_node(f"{base}/reference", 4)
    assert two["world_size"] == 8 and one["world_size"] == 4
    assert two["global_step"] == one["global_step"] > 0
    # Gloo sums 8 and 4 gradients in different orders: float32 rounding, about 2e-5 on weights of ~1.
    tolerance = 1e-4
    for name, tensor in one["model"].items():
        torch.testing.assert_close(two["model"][name], tensor, rtol=tolerance, atol=tolerance, msg=name)
    assert two["train_state"]["history"][-1]["val_psnr"] == pytest.approx(
        one["train_state"]["history"][-1]["val_psnr"], abs=1e-3)
    control = one_node(f"{base}/control", 2)
    largest = max(float((control["model"][n] - t).abs().max()) for n, t in one["model"].items()
                  if t.is_floating_point())
    assert largest > 10 * tolerance, largest


@pytest.mark.exclusive_cluster
def test_a_node_failing_mid_epoch_on_cosmos_costs_at_most_the_epoch_in_progress(
        local_cluster: LocalCluster, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Cosmos stage 0 on two nodes, training on node-local disk: after the first checkpoint the
    job's nodes hang and the second node goes DOWN. The shared directory already holds that
    checkpoint (copied back at every checkpoint, not only at exit); the job ends NODE_FAIL, is
    requeued, stages the shared outputs back, resumes and completes; every epoch appears once.

    The job's processes are stopped (SIGSTOP, :meth:`LocalCluster.hang_job`) as soon as the first
    checkpoint shows and before the node is set DOWN, so the job trains no further while the fault
    is injected: a few epochs are enough for it to come mid-run, however slowly the test sees them."""
    from vcloud_pipeline.plan.layout import run_paths
    from vcloud_pipeline.profile import load_profile, overrides_from_environ

    base = site_project(local_cluster, monkeypatch, "cosmos", "/cosmos/vast/scratch/{user}")
    run, epochs = "node-fail", 6
    profile = load_profile("cosmos", overrides_from_environ("cosmos"), login=local_cluster.user)
    write_wide_dataset(local_cluster, str(run_paths(profile, run, synthetic_preset="tiny").data_dir), tmp_path)
    shared = f"{base}/outputs/{run}/stage0"
    seen: dict[str, Any] = {}

    def shared_progress() -> dict[str, Any] | None:
        """The shared progress.json, read on this machine (its file system is the cluster's, as
        write_wide_dataset relies on): a poll without an SSH session each time."""
        try:
            return json.loads(Path(shared, "progress.json").read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return None

    def fail_a_node_after_the_first_checkpoint() -> None:
        """In the background while dag.test() runs the stage (it needs the main thread)."""
        try:
            def running_with_a_shared_checkpoint() -> tuple[str, dict[str, Any]] | None:
                # (progress.json exists from the start; its history grows by one line per epoch)
                progress = shared_progress()
                if not progress or not progress["history"]:
                    return None
                rows = local_cluster.root("squeue", "-h", "-u", local_cluster.user, "-t", "R",
                                          "-o", "%i %D %N %j", check=False).stdout.splitlines()
                jobs = [row.split() for row in rows if ".stage0." in row and row.split()[1] == "2"]
                if len(jobs) == 1:
                    return jobs[0][0], {"nodes": jobs[0][2], **progress}
                return None

            job_id, progress = poll_until(running_with_a_shared_checkpoint, timeout=900, interval=0.2,
                                          what="the two-node stage job's first checkpoint in the shared directory")
            seen.update(job_id=job_id, epochs_before=len(progress["history"]))
            seen["stopped"] = local_cluster.hang_job(job_id)
            seen["epochs_when_hung"] = len((shared_progress() or {}).get("history", []))
            node = local_cluster.ssh(f"scontrol show hostnames {progress['nodes']}").stdout.split()[-1]
            local_cluster.root("scontrol", "update", f"nodename={node}", "state=down", "reason=vcloud-test")
            seen["node"] = node
            poll_until(lambda: any(r["State"] == "NODE_FAIL" for r in local_cluster.sacct_runs(int(job_id))),
                       timeout=120, what="NODE_FAIL in sacct")
            seen["node_fail"] = True
        except BaseException as exc:  # reported by the main thread
            seen["error"] = exc
        finally:
            if "node" in seen:
                local_cluster.root("scontrol", "update", f"nodename={seen['node']}", "state=resume", check=False)
            elif seen.get("stopped"):  # no node went down: let the job go on rather than hang the suite
                local_cluster.root("kill", "-CONT", *seen["stopped"], check=False)

    thread = threading.Thread(target=fail_a_node_after_the_first_checkpoint, daemon=True)
    thread.start()
    try:
        _, states, values = run_dag(profile="cosmos", config="tiny", run_name=run, stages=[0], max_epochs=epochs,
                                    export=False, nodes=2, gpus_per_node=4, max_resubmits=2)
    finally:
        thread.join(timeout=300)
    assert "error" not in seen, seen["error"]
    assert seen.get("node_fail"), seen
    assert states["stage0"] == "success", f"{states}\n{job_logs_tail(local_cluster, base, run, 'stage0')}"
    job_id, done_before = seen["job_id"], seen["epochs_before"]
    assert 1 <= done_before < epochs, seen

    runs = [r["State"] for r in local_cluster.sacct_runs(int(job_id))]
    assert "NODE_FAIL" in runs and runs[-1] == "COMPLETED", runs
    progress = read_json(local_cluster, f"{shared}/progress.json")
    trained = [entry["epoch"] for entry in progress["history"]]
    assert trained == list(range(1, epochs + 1)), trained  # every epoch once, in order
    log = local_cluster.ssh(f"cat {shlex.quote(base)}/logs/{run}/*stage0*.out").stdout
    assert "resumed from" in log, log[-3000:]
    assert values["stage0"]["epochs"] == epochs, values["stage0"]
    # What the resumed start repeated: at most the epoch in progress when the node went down.
    train_lines = [json.loads(line) for line in
                   local_cluster.ssh(f"cat {shlex.quote(shared)}/metrics.jsonl").stdout.splitlines() if line]
    steps = [r["global_step"] for r in train_lines if r["kind"] == "train"]
    assert steps == sorted(set(steps)), steps  # resumed cleanly: no step logged twice
    resumed_at = [int(m) for m in re.findall(r"resumed from \S+: epoch (\d+)", log)]
    assert resumed_at and resumed_at[0] >= done_before, (resumed_at, done_before)
