"""The HPC view's API inside Airflow's own FastAPI app: authentication, and the JSON from XCom rows.

The records are seeded under DAG ids of their own and the view is limited to them (still through the
auth manager), so runs that other tests left in the same metadata database do not show here.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from airflow.api_fastapi.core_api.security import GetUserDep

from deploy.seed import seed_run, summary

pytestmark = pytest.mark.usefixtures("airflow_home")
TRAINING, LIFECYCLE = "hpcview_seed_training", "hpcview_seed_lifecycle"
SEEDED = {TRAINING, LIFECYCLE}


@pytest.fixture(scope="module")
def client(airflow_home: Path) -> Iterator:
    """Airflow's API server app (with every plugin mounted) and a seeded metadata database."""
    from fastapi.testclient import TestClient

    from airflow.api_fastapi.app import create_app, purge_cached_app
    from airflow.utils.session import create_session

    from hpc_view.app import app as hpc_app
    from hpc_view.app import readable_dag_ids

    with create_session() as session:
        seed_run(session, dag_id=TRAINING, run_id="manual__api_1", conf={"profile": "local"}, tasks={
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
    assert client.post("/hpc-view/api/refresh").status_code == 401
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


def test_refresh_reports_a_cluster_it_cannot_reach_and_keeps_the_records(client, monkeypatch) -> None:
    from hpc_view.app import app as hpc_app
    from hpc_view.live import LiveStates

    def unreachable(conn_id: str, job_ids: list[str]):
        raise ConnectionError(f"no route to {conn_id}")

    monkeypatch.setattr(hpc_app.state, "live", LiveStates(source=unreachable))
    view = client.post("/hpc-view/api/refresh", headers={"Authorization": f"Bearer {_token()}"}).json()
    assert view["refreshed"] is True
    assert view["problems"] == ["cannot ask cluster connection vcloud_local_cluster: no route to vcloud_local_cluster"]
    local = view["profiles"][0]
    assert {job["task_id"]: job["state"] for job in local["jobs"]}["stage2"] is None
