"""The training DAG end to end on the local Slurm cluster (tiny config), through dag.test().

Each test gets its own project directory on the cluster (``paths.base`` overridden through
``VCLOUD_PROFILE_OVERRIDES``), so the synthetic dataset job, the code sync and every stage run for
real, as the cluster user, inside the local profile's Charliecloud image: every job log must name
the image's build hash. One epoch per stage keeps a run to a few minutes on two cores.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import math
import re
import shlex
import uuid
from pathlib import Path
from typing import Any

import pytest
import rasterio.io

from slurm_provider import job_name_for

from support.localcluster import LocalCluster

pytestmark = [pytest.mark.usefixtures("cluster_connection", "airflow_home"), pytest.mark.timeout(1500)]
REPO = Path(__file__).resolve().parents[2]
STAGES = ["stage0", "stage1", "stage2", "stage3"]



def image_line(cluster: LocalCluster) -> str:
    """What the inner script logs inside the image `make image` built (its hash is next to it)."""
    from vcloud_pipeline.profile import load_profile

    container = load_profile("local").container
    assert container is not None and container.runtime == "charliecloud"
    built = cluster.ssh(f"cat {shlex.quote(container.image + '.sha256')}").stdout.strip()
    return f"vcloud inner script: in Charliecloud image {built} on "


def job_err_log(cluster: LocalCluster, project_dir: str, run: str, label: str, job_id: str) -> str:
    """The stderr log of one job of the run (every start of it: logs are appended across requeues)."""
    return cluster.ssh(f"cat {shlex.quote(f'{project_dir}/logs/{run}')}/*{label}*.{job_id}.err").stdout


def _dag():
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(dag_folder=str(REPO / "dags")).dags["vcloud_training"]


def run_dag(**conf: Any) -> tuple[str, dict[str, str], dict[str, Any]]:
    """(run id, task states, return values) of one dag.test() run; the run's own state is under
    ``"<run>"`` in the task states."""
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    dag_run = _dag().test(run_conf=conf)
    states = {ti.task_id: str(ti.state) for ti in dag_run.get_task_instances()}
    states["<run>"] = str(dag_run.state)
    values: dict[str, Any] = {}
    with create_session() as session:
        rows = session.query(XComModel).filter_by(dag_id="vcloud_training", run_id=dag_run.run_id,
                                                  key="return_value").all()
        for row in rows:
            values[row.task_id] = json.loads(row.value) if isinstance(row.value, (str, bytes)) else row.value
    return dag_run.run_id, states, values


def asset_events(run_id: str) -> dict[str, dict]:
    from airflow.models.asset import AssetEvent, AssetModel
    from airflow.utils.session import create_session

    with create_session() as session:
        rows = (session.query(AssetModel.name, AssetEvent.extra).join(AssetEvent, AssetEvent.asset_id == AssetModel.id)
                .filter(AssetEvent.source_run_id == run_id).all())
    return {name: extra for name, extra in rows}


@pytest.mark.slow
def test_full_run_then_restart_from_stage_2(local_cluster: LocalCluster, project_dir: str) -> None:
    # The tiny config names no unlabeled domain: stage 3 is trained only because the run forces it.
    run_id, states, values = run_dag(profile="local", config="tiny", run_name="e2e", max_epochs=1, max_resubmits=1,
                                     force_stages=[3])
    assert all(state == "success" for state in states.values()), states

    outputs = f"{project_dir}/outputs/e2e"
    listing = local_cluster.ssh(f"cd {shlex.quote(outputs)} && ls stage0 stage1 stage2 stage3").stdout
    assert listing.count("best.pt") == 4 and listing.count("COMPLETE") == 4
    viewer = local_cluster.ssh(f"ls {shlex.quote(project_dir)}/viewer_data/e2e").stdout.split()
    assert {"metrics.json", "quicklooks", "geotiff"} <= set(viewer)
    # Stage 3 is a refiner: its export is the mean of its samples, with their spread as a 14th band.
    exported = json.loads(local_cluster.ssh(f"cat {shlex.quote(project_dir)}/viewer_data/e2e/metrics.json").stdout)
    assert exported["stage"] == 3 and exported["samples"] == 4, {k: exported.get(k) for k in ("stage", "samples")}
    assert exported["geotiff_bands"][-1] == "uncertainty" and exported["panels"][-1] == "uncertainty"
    assert exported["uncertainty"]["uncertainty"] >= 0.0
    said = values["summary"]["export"]  # the run's summary states the same
    assert said.startswith("export of stage 3 on ") and "; the mean of 4 samples, mean uncertainty " in said, said
    geotiff = f"{project_dir}/viewer_data/e2e/{exported['per_series'][0]['geotiff']}"
    encoded = local_cluster.ssh(f"base64 -w0 {shlex.quote(geotiff)}").stdout
    with rasterio.io.MemoryFile(base64.b64decode(encoded)) as memory, memory.open() as tif:
        assert tif.count == 14 and tif.crs is not None

    synced = values["sync_code"]
    code_dir = f"{project_dir}/code/{synced['code_hash']}"
    assert synced["code_dir"] == code_dir
    manifest = local_cluster.ssh(f"cat {shlex.quote(code_dir)}/.vcloud_manifest.json").stdout
    assert json.loads(manifest)["hash"] == synced["code_hash"]
    assert local_cluster.ssh(f"test -f {shlex.quote(code_dir)}/trainer/src/vcloud/data/__init__.py",
                             check=False).returncode == 0
    assert local_cluster.ssh(f"ls {shlex.quote(project_dir)}/code").stdout.split() == [synced["code_hash"]]

    for stage in STAGES:
        summary = values[stage]
        assert summary["state"] == "COMPLETED" and summary["states"] == {summary["job_id"]: "COMPLETED"}
        assert summary["job_ids"] == [summary["job_id"]]
        assert summary["gpu_hours"] > 0
        assert summary["code_hash"] == summary["trained_code_hash"] == synced["code_hash"]
        assert summary["epochs"] == 1 and summary["metrics"]["psnr"] > 0
        assert image_line(local_cluster) in job_err_log(local_cluster, project_dir, "e2e", stage, summary["job_id"])
    assert values["prepare_data"]["state"] == "COMPLETED"
    assert values["preflight_checks"]["test_only"].keys() == {*STAGES, "export"}
    # The budget is what Slurm holds on the account, checked before anything ran and recorded after
    # each job; its usage only grows as the run's jobs are billed.
    checked = values["preflight_checks"]["allocation"]
    assert checked["source"] == "slurm" and checked["limit_from"].startswith("Slurm association limit GrpTRESMins")
    assert set(values["preflight_checks"]["worst_case"]) == {"preflight", "data", *STAGES, "export"}
    # The local cluster holds every site setting the pipeline relies on, as read by the preflight.
    settings = {s["setting"]: (s["holds"], s["seen"]) for s in values["preflight_checks"]["site_settings"]}
    assert settings["AccountingStoreFlags includes job_comment"] == (True, "job_comment"), settings
    assert settings["PrivateData does not hide jobs"] == (True, "none"), settings
    assert all(holds for holds, _ in settings.values()) and len(settings) == 4, settings
    after = [values[label]["allocation"] for label in ["prepare_data", "preflight_imports", *STAGES, "export"]]
    assert all(a["source"] == "slurm" and a["limit"] == checked["limit"] for a in after), after
    assert [a["slurm"]["used"] for a in after] == sorted(a["slurm"]["used"] for a in after)
    assert values["summary"]["allocation"]["slurm"]["used"] >= after[-1]["slurm"]["used"] >= checked["slurm"]["used"]
    complete3 = values["summary"]["stages"]["stage3"]
    assert values["stage3"]["final_metrics"] == complete3["final_metrics"]
    assert (values["stage3"]["best_epoch"], values["stage3"]["metrics"]) == \
        (complete3["best_metric"]["epoch"], complete3["best_metric"]["metrics"]), "the metrics of best.pt"

    events = asset_events(run_id)
    assert events["vcloud_stage1_checkpoint"]["path"] == f"{outputs}/stage1/best.pt"
    assert events["vcloud_stage1_checkpoint"]["run"] == "e2e"
    assert events["vcloud_viewer_export"]["path"] == f"{project_dir}/viewer_data/e2e"

    # Like the seed's START_STAGE=2: stages 0 and 1 are left alone, 2 and 3 trained again.
    run_id2, states2, values2 = run_dag(profile="local", config="tiny", run_name="e2e", max_epochs=1,
                                        start_stage=2, mode="restart", export=False, force_stages=[3])
    assert states2["stage0"] == "skipped" and states2["stage1"] == "skipped", states2
    assert states2["prepare_data"] == "skipped"  # the prepared dataset exists
    assert states2["stage2"] == "success" and states2["stage3"] == "success", states2
    assert states2["export"] == "skipped" and states2["summary"] == "success"
    # The same code, image and job shape passed the import check in the first run: not checked again.
    assert states2["preflight_imports"] == "skipped", states2
    key = values["sync_code"]["preflight_key"]
    assert values2["sync_code"]["preflight_key"] == key
    proof = json.loads(local_cluster.ssh(f"cat {shlex.quote(project_dir)}/code/.preflight/{synced['code_hash']}/{key[:16]}.json").stdout)
    assert (proof["job_id"], proof["code_hash"], proof["run"]) == \
        (values["preflight_imports"]["job_id"], synced["code_hash"], "e2e"), proof
    assert set(values2["preflight_checks"]["test_only"]) == {"stage2", "stage3"}
    moved = local_cluster.ssh(f"ls -d {shlex.quote(outputs)}/stage*.replaced-* {shlex.quote(outputs)}/stage*.superseded-*"
                              ).stdout.split()
    # stage 2's fresh start moves stage 3 (trained on the old stage 2) aside with it; stage 3's own
    # restart then finds nothing to move
    assert sorted(Path(m).name.split("-")[0] for m in moved) == ["stage2.replaced", "stage3.superseded"], moved
    assert values2["stage2"]["job_id"] != values["stage2"]["job_id"]
    assert "vcloud_stage0_checkpoint" not in asset_events(run_id2)

    # A third run in resume mode finds everything complete and submits nothing.
    _, states3, _ = run_dag(profile="local", config="tiny", run_name="e2e", max_epochs=1, export=False)
    assert [states3[s] for s in STAGES] == ["skipped"] * 4, states3


@pytest.mark.parametrize("conn_id", ["vcloud_local_cluster", "vcloud_local_cluster_openssh"])
def test_a_dry_run_reaches_the_cluster_with_nothing_but_the_connection(
        local_cluster: LocalCluster, project_dir: str, conn_id: str, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The key only in the connection (its private_key extra, no key file) and HOME an empty directory:
    the code sync (rsync), the checks and the imports job (hook and trigger) all log in the connection's
    way, or not at all. The openssh connection is chosen by the dotted override connection.conn_id."""
    home = tmp_path / "empty-home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    if conn_id == "vcloud_local_cluster":
        key_only = local_cluster.key_only_connection()
        monkeypatch.setenv("AIRFLOW_CONN_VCLOUD_LOCAL_CLUSTER", json.dumps(key_only))
    monkeypatch.setenv("VCLOUD_PROFILE_OVERRIDES", json.dumps(
        {"local": {"paths.base": project_dir, "connection.conn_id": conn_id}}))
    from slurm_provider.transport import SSHCommand

    rsyncs: list[tuple[list[str], str]] = []  # each rsync the sync ran, with the private key it was given
    real_run = SSHCommand.run

    def recording_run(self: SSHCommand, argv, *, timeout: float):
        key = Path(self.log_file).parent / "id"
        rsyncs.append((list(argv), key.read_text() if key.exists() else ""))
        return real_run(self, argv, timeout=timeout)

    monkeypatch.setattr(SSHCommand, "run", recording_run)

    _, states, values = run_dag(profile="local", config="tiny", run_name="dry", dry_run=True)
    assert states["<run>"] == "success", states
    assert states["sync_code"] == "success" and states["preflight_imports"] == "success", states
    assert [states[s] for s in STAGES] == ["skipped"] * 4 and states["prepare_data"] == "skipped"
    synced = values["sync_code"]
    assert synced["code_sent"] is True
    manifest = json.loads(local_cluster.ssh(f"cat {shlex.quote(synced['manifest_path'])}").stdout)
    assert manifest["hash"] == synced["code_hash"]
    uploaded = local_cluster.ssh(f"ls {shlex.quote(project_dir)}/jobs/dry").stdout.split()
    assert sum(name.endswith(".sbatch") for name in uploaded) == len(synced["scripts"]), uploaded
    assert sum(".inner." in name and name.endswith(".sh") for name in uploaded) == len(synced["scripts"]), uploaded
    assert values["preflight_imports"]["state"] == "COMPLETED"
    assert list(home.iterdir()) == [], "something used the worker's HOME"

    assert len(rsyncs) == 2, "code and job scripts"
    for argv, key in rsyncs:
        ssh = shlex.split(argv[argv.index("-e") + 1])
        if conn_id == "vcloud_local_cluster":
            assert key == local_cluster.key_file.read_text()  # the connection's private_key, nothing else
            assert ssh[:3] == ["ssh", "-F", "/dev/null"] and "IdentitiesOnly=yes" in ssh
            assert "StrictHostKeyChecking=yes" in ssh
            assert any(o.startswith("UserKnownHostsFile=/") for o in ssh)
            assert argv[-1].startswith("127.0.0.1:")
        else:
            assert ssh[:3] == ["ssh", "-F", str(local_cluster.ssh_config)]
            assert argv[-1].startswith("vcloud-local:")
            assert not any(o.startswith("ControlPath") for o in ssh), "the alias's own master, not ours"


def test_an_exported_run_run_again_exports_again_only_when_a_stage_output_changed(
        local_cluster: LocalCluster, project_dir: str, capfd) -> None:
    run = f"exp-{uuid.uuid4().hex[:6]}"
    conf: dict[str, Any] = dict(profile="local", config="tiny", run_name=run, stages=[0], max_epochs=1)
    _, states, values = run_dag(**conf)
    assert states["stage0"] == "success" and states["export"] == "success", states
    viewer, outputs = f"{project_dir}/viewer_data/{run}", f"{project_dir}/outputs/{run}"
    marker = json.loads(local_cluster.ssh(f"cat {shlex.quote(viewer)}/EXPORTED").stdout)
    assert marker["stage"] == 0 and set(marker["stamps"]) == {"stage0/best.pt", "stage0/COMPLETE",
                                                                "stage0/metrics.jsonl"}
    done = local_cluster.ssh(f"cd {shlex.quote(viewer)} && ls -d EXPORTED*").stdout.split()
    assert done == ["EXPORTED", f"EXPORTED.{marker['inputs']}"], done  # the submit's done marker
    capfd.readouterr()

    # The same run again: stage 0 is complete, and the export names exactly these outputs.
    _, again, _ = run_dag(**conf)
    out = "".join(capfd.readouterr())
    assert again["stage0"] == "skipped" and again["export"] == "skipped", again
    assert f"export: already exported from these stage outputs (inputs {marker['inputs']}, {viewer}/EXPORTED)" in out

    # A stage output rewritten since (a checkpoint of the same size, another mtime): exported again.
    local_cluster.ssh(f"touch -d '+1 minute' {shlex.quote(outputs)}/stage0/best.pt")
    _, changed, values3 = run_dag(**conf)
    out = "".join(capfd.readouterr())
    assert changed["stage0"] == "skipped" and changed["export"] == "success", changed
    assert f"export: exporting the viewer data of the best stage: the stage outputs changed since the last " \
           f"export (inputs {marker['inputs']}, now " in out
    assert json.loads(local_cluster.ssh(f"cat {shlex.quote(viewer)}/EXPORTED").stdout)["inputs"] != marker["inputs"]
    # sacct: two export jobs wrote the run's viewer directory, the first run's and the third's
    exports = local_cluster.jobs_writing(viewer)
    print(f"sacct, jobs that wrote {viewer}: {exports}")
    assert sorted(exports, key=int) == [str(values["export"]["job_id"]), str(values3["export"]["job_id"])]


def test_a_stage_without_its_predecessor_fails_before_submitting(project_dir: str, capfd) -> None:
    _, states, _ = run_dag(profile="local", config="tiny", run_name="orphan", stages=[2], dry_run=False)
    out = "".join(capfd.readouterr())
    assert states["stage2"] == "failed", states
    assert "stage 2 reads stage 1's best.pt" in out and "/outputs/orphan/stage1/best.pt does not exist" in out
    assert states["stage3"] == "upstream_failed"
    assert states["<run>"] == "failed", "a run whose stage failed is never a success"


def test_preflight_refuses_a_run_the_usage_leaves_too_little_for_and_lets_one_wait_for_running_jobs(
        local_cluster: LocalCluster, project_dir: str, capfd, monkeypatch: pytest.MonkeyPatch) -> None:
    with local_cluster.private_account(billing_minutes=25) as account:
        monkeypatch.setenv("VCLOUD_PROFILE_OVERRIDES", json.dumps(
            {"local": {"paths.base": project_dir, "account": account.name}}))
        # Nothing of the account ran, and its limit is 25 billing-minutes: the preflight job (5) and the
        # data job (20) fit, stage 0 (1 GPU x 30 min) not, whatever ends.
        run_id, states, values = run_dag(profile="local", config="tiny", run_name="budget", max_epochs=1)
        out = "".join(capfd.readouterr())
        assert states["preflight_checks"] == "failed", states
        later = ["prepare_data", "preflight_imports", *STAGES, "export"]
        assert {task: states[task] for task in later} == dict.fromkeys(later, "upstream_failed"), states
        assert states["<run>"] == "failed"
        assert (
            "stage 0 needs up to 0.5 GPU-hours (1 GPUs x 0.5 h x 1.0 = 30 billing-minutes); 0.42 of 0.42 left by "
            f"the usage: limit 0.42 (Slurm association limit GrpTRESMins billing=25 on account {account.name}), "
            f"used 0 (Slurm GrpTRESRaw billing=0 of account {account.name}, every job of the account), "
            "held 0 (Slurm TRESRunMins billing=0 of the account's running jobs); no running job's end can free "
            "that.") in out, out[-4000:]
        assert f"ask the project's PI or the cluster support to raise GrpTRESMins of account {account.name}" in out
        # The summary still reports the allocation, with its source.
        assert values["summary"]["allocation"]["source"] == "slurm"
        assert values["summary"]["allocation"]["slurm"]["limit"] == 25
        # Not one job of this DAG run reached Slurm (sbatch --test-only makes no job).
        comments = local_cluster.root("sacct", "-a", "-X", "-n", "-P", "-S", "now-1hours",
                                      "--format=JobIDRaw,Comment").stdout
        assert run_id not in comments

        # Another user's running job holds all but 10 of a 1000-minute allocation: the run's jobs fit
        # what the usage leaves, so the preflight lets them wait for it instead of refusing the run.
        account.set_limit(1000)
        holder = int(local_cluster.root("sbatch", "--parsable", f"--account={account.name}", "--gpus=1",
                                        "--time=990", "--output=/dev/null", "--wrap=sleep 3000").stdout.strip())
        local_cluster.wait_for_state(holder, {"RUNNING"}, timeout=180)
        _, states, values = run_dag(profile="local", config="tiny", run_name="budget-waits", dry_run=True)
    assert states["preflight_checks"] == "success", states
    checked = values["preflight_checks"]
    allocation, stage0 = checked["allocation"], checked["worst_case"]["stage0"]
    assert stage0 == 0.5 and allocation["source"] == "slurm"
    # What root's running job holds shrinks, and its usage grows, as it runs (every 5 minutes in Slurm).
    assert 980 <= allocation["slurm"]["running"] + allocation["slurm"]["used"] <= 990
    # Stage 0 does not fit what is free now, only what the usage leaves: it would wait, not be refused.
    assert allocation["left"] < stage0 <= allocation["remaining"]


def job_logs_tail(cluster: LocalCluster, project_dir: str, run: str, label: str, chars: int = 3000) -> str:
    """The end of every log of one task's jobs in the run: what a failed assertion should show."""
    logs = shlex.quote(f"{project_dir}/logs/{run}")
    return cluster.ssh(f"tail -c {chars} {logs}/*{label}* 2>&1", check=False).stdout


def _epoch_seconds(log: str) -> float:
    """Mean wall seconds per epoch from the trainer's per-epoch lines (``<date> <time> stage 1 | epoch k/n``)."""
    stamps = [dt.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S")
              for m in re.finditer(r"^(\S+ \S+) stage 1 \| epoch \d+/", log, re.MULTILINE)]
    assert len(stamps) >= 3, log[-2000:]
    return max(0.2, (stamps[-1] - stamps[0]).total_seconds() / (len(stamps) - 1))


@pytest.mark.slow
def test_a_stage_that_hits_its_time_limit_requeues_and_loses_no_epoch(local_cluster: LocalCluster,
                                                                       project_dir: str) -> None:
    """Stage 1 with a 2-minute limit: USR2 60-90 s before it, checkpoint, requeue, resume, complete.

    Slurm checks for due signals every 30 s, so a start gets 30-60 s before its USR2; a start whose
    trainer has not installed its handler yet (or has finished) must still end resumably.

    The epoch count is sized from a measured epoch time so that one 2-minute slot can never hold the
    whole stage, whatever the machine's speed: a slot trains at most 60 s before its USR2, and the
    stage is about 150 s of training at the probe's pace, so even a machine twice as fast as it was
    for the probe (a busy probe) needs a second slot.
    """
    def logs(label: str) -> str:
        return job_logs_tail(local_cluster, project_dir, "tl", label)

    _, states, _ = run_dag(profile="local", config="tiny", run_name="tl", stages=[0], max_epochs=1, export=False)
    assert states["stage0"] == "success", f"{states}\n{logs('stage0')}"
    _, states, _ = run_dag(profile="local", config="tiny", run_name="tl", stages=[1], max_epochs=6, export=False)
    assert states["stage1"] == "success", f"{states}\n{logs('stage1')}"
    probe_log = local_cluster.ssh(f"cat {shlex.quote(project_dir)}/logs/tl/*stage1*.out").stdout
    epochs_total = min(600, max(14, math.ceil(150 / _epoch_seconds(probe_log))))

    _, states, values = run_dag(profile="local", config="tiny", run_name="tl", stages=[1], mode="restart",
                                max_epochs=epochs_total, time_limit="00:02:00", export=False)
    assert states["stage1"] == "success", f"{states}\n{logs('stage1')}"
    summary = values["stage1"]
    assert summary["restarts"] >= 1, summary  # requeued by the job itself, same job id
    assert summary["job_ids"] == [summary["job_id"]]
    assert summary["epochs"] == epochs_total

    stage1 = f"{project_dir}/outputs/tl/stage1"
    progress = json.loads(local_cluster.ssh(f"cat {shlex.quote(stage1)}/progress.json").stdout)
    epochs = [entry["epoch"] for entry in progress["history"]]
    assert epochs == list(range(1, epochs_total + 1)), epochs  # every epoch once: none lost, none repeated
    log = local_cluster.ssh(f"cat {shlex.quote(project_dir)}/logs/tl/*stage1*.out").stdout
    assert "stopped on SIGUSR2" in log or "stopped on USR2" in log, log[-3000:]
    assert "resumed from" in log
    err = job_err_log(local_cluster, project_dir, "tl", "stage1", summary["job_id"])
    assert err.count(image_line(local_cluster)) >= 2, err[-3000:]  # the first start and the resumed one


def test_a_stage_whose_trainer_raises_shows_the_traceback_in_the_task_log(local_cluster: LocalCluster,
                                                                          project_dir: str, capfd) -> None:
    """A broken prepared dataset (its index is not JSON) makes the stage-0 trainer raise: the traceback
    streams into the task log as the job writes it, and the task's failure repeats it with the
    exit code explained, instead of a bare "exit code 1"."""
    prepared = f"{project_dir}/data/synthetic-tiny/prepared"
    local_cluster.ssh(f"mkdir -p {shlex.quote(prepared)} && printf '{{\"format\": ' > {shlex.quote(prepared)}/index.json")
    _, states, _ = run_dag(profile="local", config="tiny", run_name="raises", stages=[0], max_epochs=1, export=False)
    out = "".join(capfd.readouterr())
    assert states["stage0"] == "failed", states
    failed = re.search(r"Slurm job (\d+) ended FAILED", out)
    assert failed, out[-4000:]
    job_id = failed.group(1)
    streamed, failure = out[:failed.start()], out[failed.start():]
    assert re.search(rf"\[job {job_id}(?: stderr)?\] Traceback \(most recent call last\):", streamed), streamed[-4000:]
    assert re.search(rf"\[job {job_id}(?: stderr)?\] json\.decoder\.JSONDecodeError", streamed), streamed[-4000:]
    assert "Exit code 1: the program raised an error" in failure, failure[:3000]
    assert "Traceback (most recent call last):" in failure and "JSONDecodeError" in failure, failure[:6000]
    # the job's error output is streamed too, marked as such (the container launcher writes there)
    assert f"[job {job_id} stderr] " in streamed, streamed[-4000:]


def test_the_rendered_template_view_shows_the_script_slurm_ran(local_cluster: LocalCluster,
                                                                 project_dir: str) -> None:
    """A job task's Rendered Template (``script``) is the outer script Slurm stored for its job, byte
    for byte: bound from the sync's XCom before Airflow records the fields, never re-rendered by Jinja."""
    from airflow.models.renderedtifields import RenderedTaskInstanceFields
    from airflow.utils.session import create_session

    run_id, states, values = run_dag(profile="local", config="tiny", run_name="shown", dry_run=True)
    assert states["preflight_imports"] == "success", states
    with create_session() as session:
        row = session.query(RenderedTaskInstanceFields).filter_by(
            dag_id="vcloud_training", run_id=run_id, task_id="preflight_imports").one()
    shown = row.rendered_fields
    (job_id,) = values["preflight_imports"]["job_ids"]
    stored = local_cluster.ssh(f"scontrol write batch_script {shlex.quote(str(job_id))} -").stdout
    # One name: the script's directive is the name the task submitted the job with (sacct's).
    name = job_name_for("vcloud_training", "preflight_imports", run_id)
    assert stored.startswith(f"#!/bin/bash\n#SBATCH --job-name={name}\n"), stored[:200]
    assert local_cluster.root("sacct", "-X", "-n", "-P", "-j", str(job_id), "--format=JobName").stdout.strip() == name
    assert shown["script"] == stored == values["sync_code"]["scripts"]["preflight"]
    assert shown["log_dir"] == f"{project_dir}/logs/shown"
    assert shown["code_version"] == values["sync_code"]["code_hash"]
