"""The HPC view's API inside Airflow's own FastAPI app: authentication, and the JSON from XCom rows.

The records are seeded under DAG ids of their own and the view is limited to them (still through the
auth manager), so runs that other tests left in the same metadata database do not show here.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from airflow.api_fastapi.core_api.security import GetUserDep

from support.seed import seed_run, summary

pytestmark = pytest.mark.usefixtures("airflow_home")
TRAINING, LIFECYCLE = "hpcview_seed_training", "hpcview_seed_lifecycle"
SEEDED = {TRAINING, LIFECYCLE}
CURVES = "hpcview_seed_curves"
"""A training run whose finished stage recorded its curve and whose next stage trains (shown only there)."""
CURVE_RUN = f"curves-{uuid.uuid4().hex[:8]}"
POLLED_AGO_S = 40.0
"""How long before the module's start the seeded watch of ``stage2`` last had an answer from the cluster."""


@pytest.fixture(scope="module")
def client(airflow_home: Path) -> Iterator:
    """Airflow's API server app (with every plugin mounted) and a seeded metadata database."""
    from fastapi.testclient import TestClient

    from airflow.api_fastapi.app import create_app, purge_cached_app
    from airflow.utils.session import create_session

    from hpc_view.app import app as hpc_app
    from hpc_view.app import readable_dag_ids

    from vcloud.contract import training_curve

    polled_at = time.time() - POLLED_AGO_S
    with create_session() as session:
        seed_run(session, dag_id=TRAINING, run_id="manual__api_1", conf={"profile": "local"}, watch={
            "stage2": {"job_id": "104", "log_path": None, "log_offset": 0, "state": "PENDING", "reason": "Priority",
                       "expected_start": None, "polled_at": polled_at, "unreachable_since": None},
        }, tasks={
            "plan": ("success", None, {"request": {}}),
            "stage0": ("success", "101", summary(["101"], gpu_hours=0.5, elapsed_s=1800, job="stage0",
                                                 run="tiny", profile="local")),
            "stage1": ("success", "103", summary(["102", "103"], gpu_hours=1.25, elapsed_s=2700, restarts=1,
                                                 job="stage1", run="tiny", profile="local")),
            "stage2": ("deferred", "104", None),
        })
        seed_run(session, dag_id=LIFECYCLE, run_id="manual__api_2", conf={}, tasks={
            "job": ("success", "201", summary(["201"], gpu_hours=0.1, elapsed_s=360)),
        })
        seed_run(session, dag_id=CURVES, run_id="manual__api_3", conf={"profile": "local"}, tasks={
            "stage0": ("success", "301", summary(["301"], gpu_hours=0.01, elapsed_s=60, job="stage0",
                                                 run=CURVE_RUN, profile="local",
                                                 curve=training_curve(_metrics_lines(1, 12)).to_json())),
            "stage1": ("deferred", "302", None),  # training now; its run name comes from stage0's record
        })
    purge_cached_app()
    app = create_app("core")
    hpc_app.dependency_overrides[readable_dag_ids] = seeded_readable_dag_ids
    try:
        with TestClient(app) as test_client:
            yield test_client
    finally:
        hpc_app.dependency_overrides.clear()
        purge_cached_app()


def seeded_readable_dag_ids(user: GetUserDep) -> set[str]:
    """The DAGs the auth manager lets the user read, of those this module seeded."""
    from hpc_view.app import readable_dag_ids

    return readable_dag_ids(user) & SEEDED


def _token(role: str = "viewer") -> str:
    from airflow.api_fastapi.app import get_auth_manager
    from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser

    return get_auth_manager().generate_jwt(SimpleAuthManagerUser(username=f"{role}-user", role=role))


def test_requests_without_a_valid_token_are_refused(client) -> None:
    assert client.get("/hpc-view/api/jobs").status_code == 401
    forged = client.get("/hpc-view/api/jobs", headers={"Authorization": "Bearer not-a-jwt"})
    assert forged.status_code in (401, 403)
    page = client.get("/hpc-view/", follow_redirects=False)
    assert page.status_code == 303 and "/auth/login" in page.headers["location"]


def test_jobs_per_profile_with_budget_from_the_operators_records(client) -> None:
    response = client.get("/hpc-view/api/jobs", headers={"Authorization": f"Bearer {_token()}"})
    assert response.status_code == 200, response.text
    view = response.json()
    assert [p["profile"] for p in view["profiles"]] == ["local", ""]
    local, unassigned = view["profiles"]

    jobs = {job["task_id"]: job for job in local["jobs"]}
    assert set(jobs) == {"stage0", "stage1", "stage2"}  # plan's return value is not a Slurm record
    assert jobs["stage1"]["job_ids"] == ["102", "103"]
    assert [s["cause"] for s in jobs["stage1"]["submissions"]] == ["initial", "TIMEOUT"]
    assert jobs["stage1"]["resubmissions"] == 1 and jobs["stage1"]["restarts"] == 1
    assert jobs["stage1"]["elapsed"] == "00:45:00"
    assert jobs["stage1"]["state_description"].startswith("Finished; every process exited with code 0")
    assert jobs["stage1"]["log_url"] == f"/dags/{TRAINING}/runs/manual__api_1/tasks/stage1?slurm_job_id=103"
    waiting = jobs["stage2"]
    assert waiting["state"] is None and waiting["task_state"] == "deferred" and waiting["job_ids"] == ["104"]

    budget = local["budget"]
    assert budget["allocation"] == 1000 and budget["unit"] == "GPU-hours"
    # None of these records carries Slurm's figures: the profile's number, and it says so.
    assert budget["source"] == "profile" and budget["allocation_from"] == "profile local billing.allocation"
    assert budget["account_used"] is None and budget["used_from"] == "the jobs recorded here"
    assert budget["used"] == pytest.approx(1.75) and budget["left"] == pytest.approx(998.25)
    assert {row["stage"]: row["gpu_hours"] for row in budget["by_stage"]} == {"stage0": 0.5, "stage1": 1.25}
    assert budget["by_run"] == [{"run_id": "manual__api_1", "gpu_hours": 1.75}]
    assert [point["left"] for point in budget["burn"]] == [999.5, 998.25]
    assert "GPU-hours left of 1,000.0: 998.2500" in local["charts"]["burndown"] and "<svg" in local["charts"]["by_stage"]

    assert unassigned["title"] == "no cluster profile" and unassigned["budget"]["allocation"] is None
    assert [job["job_id"] for job in unassigned["jobs"]] == ["201"]


def test_session_cookie_works_like_the_ui_and_filters_follow_the_query(client) -> None:
    client.cookies.set("_token", _token())
    try:
        page = client.get("/hpc-view/")
        assert page.status_code == 200 and 'src="static/hpc_view.js"' in page.text and "viewer-user" in page.text
        one_run = client.get("/hpc-view/api/jobs", params={"dag_id": LIFECYCLE}).json()
        assert [p["profile"] for p in one_run["profiles"]] == [""]
        assert client.get("/hpc-view/static/hpc_view.js").status_code == 200
    finally:
        client.cookies.clear()


def test_only_dags_the_user_may_read_are_shown(client) -> None:
    from hpc_view.app import app as hpc_app
    from hpc_view.app import readable_dag_ids

    seeded = hpc_app.dependency_overrides[readable_dag_ids]
    hpc_app.dependency_overrides[readable_dag_ids] = lambda: {LIFECYCLE}
    try:
        view = client.get("/hpc-view/api/jobs", headers={"Authorization": f"Bearer {_token()}"}).json()
    finally:
        hpc_app.dependency_overrides[readable_dag_ids] = seeded
    assert [job["dag_id"] for p in view["profiles"] for job in p["jobs"]] == [LIFECYCLE]


def test_a_waiting_job_is_shown_as_its_watch_last_saw_it_with_its_age(client) -> None:
    headers = {"Authorization": f"Bearer {_token()}"}
    view = client.get("/hpc-view/api/jobs", headers=headers).json()
    waiting = {job["task_id"]: job for job in view["profiles"][0]["jobs"]}["stage2"]
    assert waiting["state"] is None and waiting["last_seen"] == "PENDING"
    assert waiting["as_of_s"] >= POLLED_AGO_S and waiting["pending"]["code"] == "Priority"
    assert re.fullmatch(r"PENDING as of \d+ (s|min) ago \(the watch's last poll\)\.", waiting["state_description"])
    # No route asks the cluster: the former "refresh from cluster" is gone.
    assert client.post("/hpc-view/api/refresh", headers=headers).status_code in (404, 405)


def _metrics_lines(first_step: int, last_step: int, *, val_every: int = 4) -> str:
    from vcloud.contract import metrics_train_record, metrics_val_record

    lines = []
    for step in range(first_step, last_step + 1):
        lines.append(metrics_train_record(global_step=step, epoch=1 + step // val_every, loss=1.0 / step, lr=1e-3,
                                          samples_per_s=8.0, time=1.7e9 + step))
        if step % val_every == 0:
            lines.append(metrics_val_record(global_step=step, epoch=step // val_every,
                                            metrics={"psnr": 18.0 + step / 4, "ssim": 0.5}, time=1.7e9 + step))
    return "".join(json.dumps(line) + "\n" for line in lines)


def _polyline_points(svg: str) -> int:
    [points] = re.findall(r'<polyline points="([^"]*)"', svg)
    return len(points.split())


def test_the_stages_training_curves_are_the_ones_their_tasks_recorded(client) -> None:
    from hpc_view.app import app as hpc_app
    from hpc_view.app import readable_dag_ids
    from hpc_view.curves import CURVE_INTERVAL_S
    from vcloud.contract import training_curve
    from vcloud_pipeline.plan.layout import run_paths
    from vcloud_pipeline.profile import load_profile

    paths = run_paths(load_profile("local"), CURVE_RUN)
    seeded = hpc_app.dependency_overrides[readable_dag_ids]
    hpc_app.dependency_overrides[readable_dag_ids] = lambda: {CURVES}
    try:
        view = client.get("/hpc-view/api/jobs", headers={"Authorization": f"Bearer {_token()}"}).json()
    finally:
        hpc_app.dependency_overrides[readable_dag_ids] = seeded

    [profile] = view["profiles"]
    assert view["curve_interval_s"] == CURVE_INTERVAL_S
    curves = {c["stage"]: c for c in profile["curves"]}
    assert set(curves) == {0, 1}
    assert curves[0]["run_name"] == curves[1]["run_name"] == CURVE_RUN
    assert (curves[0]["live"], curves[1]["live"]) == (False, True)
    assert (curves[0]["path"], curves[1]["path"]) == (str(paths.metrics_path(0)), str(paths.metrics_path(1)))
    done = curves[0]
    assert done["problem"] is None and done["points"] == training_curve(_metrics_lines(1, 12)).to_json()
    assert len(done["points"]["loss"]) == 12 and len(done["points"]["val_psnr"]) == 3
    assert _polyline_points(done["charts"]["loss"]) == 12 and _polyline_points(done["charts"]["val_psnr"]) == 3
    assert "validation PSNR: 21 at step 12" in done["charts"]["val_psnr"]
    training = curves[1]
    assert training["points"] == {"loss": [], "val_psnr": []}
    assert training["problem"].startswith(f"the stage is training: its job's watch draws the curve from "
                                          f"{paths.metrics_path(1)} on cluster connection vcloud_local_cluster once")
    assert training["live_at"] is None  # its watch has not read the file yet


def test_the_page_draws_each_stages_curves_in_the_profile_section(client) -> None:
    script = client.get("/hpc-view/static/hpc_view.js").text
    assert "Training curves" in script and "profile.curves" in script
    assert "c.charts.loss" in script and "c.charts.val_psnr" in script  # the inline SVG of the payload
