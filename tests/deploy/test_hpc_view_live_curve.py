"""A training stage's curve in the HPC view while its job still runs, from what the triggerer read.

A local deployment of separate components (``airflow api-server``, scheduler, DAG processor, triggerer)
runs ``vcloud_training`` with the tiny config, stage 0 only and enough epochs to train for a while,
the local profile moved to a fresh project directory. The stage's watch follows its
``metrics.jsonl`` (every 5 s here, ``VCLOUD_FOLLOW_INTERVAL``; once a minute by default). While the
job is RUNNING in ``squeue``, the view's JSON, fetched through the API server, shows the stage's curve
with points and how old they are, and later more points read on from where the last read stopped;
the API server's processes neither start an ``ssh`` nor hold a connection to the login node.
"""

from __future__ import annotations

import shlex
import uuid
from typing import Any

import pytest

from support.deployment import RestClient, airflow_env, deployment_with_dag
from deploy.test_hpc_view_outage import cluster_contacts, get_json
from support.localcluster import LocalCluster, poll_until
from support.ports import free_port

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]
DAG_ID, STAGE = "vcloud_training", "stage0"
FOLLOW_INTERVAL_S = 5


def _curve(api: RestClient, run_id: str) -> dict[str, Any] | None:
    view = get_json(f"{api.base}/hpc-view/api/jobs?dag_id={DAG_ID}&run_id={run_id}", api.token)
    curves = [c for profile in view["profiles"] for c in profile["curves"] if c["label"] == STAGE]
    return curves[0] if curves else None


def _points(curve: dict[str, Any]) -> int:
    return len(curve["points"]["loss"]) + len(curve["points"]["val_psnr"])



def test_a_training_stage_shows_its_curve_with_its_age_while_its_job_runs(
        local_cluster: LocalCluster, cluster_connection: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    home = tmp_path_factory.mktemp("live-curve-home")
    project_dir = local_cluster.test_dir()
    env = airflow_env(home, free_port(), project_dir, first_poll_delay=10)
    env["VCLOUD_FOLLOW_INTERVAL"] = str(FOLLOW_INTERVAL_S)
    run_name = f"live-{uuid.uuid4().hex[:6]}"
    run_id = f"live-curve-{run_name}"
    conf = {"profile": "local", "config": "tiny", "stages": [0], "export": False, "run_name": run_name,
            "max_epochs": 500}
    metrics = f"{project_dir}/outputs/{run_name}/{STAGE}/metrics.jsonl"
    try:
        with deployment_with_dag(env, home, DAG_ID) as (components, api):
            api_server = components.procs["api-server"].pid
            api.trigger(DAG_ID, run_id, conf)
            contacts: list[str] = []

            def drawn_while_running(more_than: int = 0) -> tuple[dict[str, Any], str] | None:
                curve = _curve(api, run_id)
                contacts.extend(cluster_contacts(api_server, local_cluster.ssh_port))
                if curve is None or not curve["live"] or curve["live_at"] is None or _points(curve) <= more_than:
                    return None
                state = local_cluster.current_state(int(curve["job_id"]))  # squeue, after the view answered
                assert state in ("RUNNING", "CONFIGURING", "PENDING"), f"job {curve['job_id']} is {state}"
                return (curve, state) if state == "RUNNING" else None

            try:
                first, _ = poll_until(drawn_while_running, timeout=1200, interval=3,
                                      what="the view to draw the running stage's curve from its watch's reads")
                later, _ = poll_until(lambda: drawn_while_running(_points(first)), timeout=300, interval=3,
                                      what="the view to draw more points of the running stage")
            except AssertionError as exc:
                raise AssertionError(f"{exc}\n{components.log_tail('triggerer')}\n"
                                     f"{components.log_tail('scheduler')}") from None
            assert contacts == [], contacts  # the API server never reached for the cluster
            assert cluster_contacts(components.procs["triggerer"].pid, local_cluster.ssh_port), \
                "the check sees the triggerer's connection"
            for curve in (first, later):
                assert curve["path"] == metrics and curve["state"] is None and curve["task_state"] == "deferred"
                assert curve["problem"].startswith("the stage is training: its curve as of ")
                assert curve["as_of_s"] is not None and curve["as_of_s"] >= 0
                assert curve["points"]["loss"], curve["points"]
            assert later["live_at"] > first["live_at"] and later["job_id"] == first["job_id"]
            # The running job's row gives a person the commands to reach it, with the connection's login.
            view = get_json(f"{api.base}/hpc-view/api/jobs?dag_id={DAG_ID}&run_id={run_id}", api.token)
            [row] = [job for profile in view["profiles"] for job in profile["jobs"] if job["task_id"] == STAGE]
            handles = row["handles"]
            assert handles is not None and handles["job_id"] == str(later["job_id"]), row
            assert handles["shell"].endswith(f"'srun --jobid={later['job_id']} --overlap --pty bash -l'"), handles
            assert handles["cancel"].startswith(f"ssh -p {local_cluster.ssh_port} -i ") and \
                handles["cancel"].endswith(f"@127.0.0.1 'scancel {later['job_id']}'"), handles
            # What was drawn is what the trainer wrote: each point a line of the file, in step order.
            text = local_cluster.ssh(f"cat {shlex.quote(metrics)}").stdout
            from vcloud.contract import training_curve

            written = dict(training_curve(text).loss)
            steps = [step for step, _ in later["points"]["loss"]]
            assert steps == sorted(steps) and steps[0] == min(written)
            assert all(written[step] == pytest.approx(value) for step, value in later["points"]["loss"])
            print(f"stage curve drawn while job {later['job_id']} ran: {_points(first)} then {_points(later)} "
                  f"point(s), {later['problem']}")
    finally:
        local_cluster.cancel_jobs_under(project_dir)
