"""The HPC view's FastAPI app, mounted by Airflow's API server under ``/hpc-view``.

Every route with data requires Airflow's authentication, exactly like the rest of the UI: the
JWT from the ``Authorization: Bearer`` header or the UI's session cookie (Airflow's own
``get_user`` dependency), and only the DAGs the user may read are shown. The page itself
redirects to Airflow's login when nobody is signed in; its script and style are static files.

No route runs a command on the cluster: the API server holds no cluster credentials. The page shows
what the workers and triggerers recorded in Airflow's database (the tasks' XComs and the watches'
notes), each with how old it is, so a hanging login node cannot hold a request thread.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

from fastapi import Depends, FastAPI, HTTPException, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles

from airflow.api_fastapi.auth.managers.models.base_user import BaseUser
from airflow.api_fastapi.common.db.common import SessionDep
from airflow.api_fastapi.core_api.security import GetUserDep, get_user

from hpc_view.curves import stage_curves
from hpc_view.records import records_from_xcoms
from hpc_view.store import load_xcom_rows
from hpc_view.view import build_view

STATIC_DIR = Path(__file__).resolve().parent / "static"
URL_PREFIX = "/hpc-view"

app = FastAPI(title="vcloud HPC view", description="Slurm jobs and GPU-hour budgets recorded by the Slurm operators",
              docs_url=None, redoc_url=None, openapi_url=None)
app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")


def readable_dag_ids(user: GetUserDep) -> set[str]:
    """DAGs the signed-in user may read, from Airflow's auth manager."""
    from airflow.api_fastapi.app import get_auth_manager

    return get_auth_manager().get_authorized_dag_ids(user=user, method="GET")


ReadableDagIds = Annotated[set[str], Depends(readable_dag_ids)]


def _records(session: Any, dag_ids: set[str], dag_id: str | None, run_id: str | None):
    return records_from_xcoms(load_xcom_rows(session, dag_ids, dag_id=dag_id, run_id=run_id))


@app.get("/", response_class=HTMLResponse, include_in_schema=False)
async def page(request: Request) -> Response:
    """The page (rendered by ``static/hpc_view.js`` from ``api/jobs``); sends strangers to the login."""
    try:
        user: BaseUser = await get_user(request, None, None)
    except HTTPException:
        from airflow.api_fastapi.app import get_auth_manager

        return RedirectResponse(get_auth_manager().get_url_login(next_url=str(request.url)), status_code=303)
    html = (STATIC_DIR / "index.html").read_text()
    return HTMLResponse(html.replace("{{ user }}", _escape(user.get_name())))


@app.get("/api/jobs")
def jobs(session: SessionDep, dag_ids: ReadableDagIds, dag_id: Annotated[str | None, Query()] = None,
         run_id: Annotated[str | None, Query()] = None) -> dict[str, Any]:
    """Per profile: the jobs the operators recorded (a waiting job as its watch last saw it, and
    when), the GPU-hour budget and its charts, and the training curves the stages recorded."""
    records = _records(session, dag_ids, dag_id, run_id)
    return build_view(records, curves=stage_curves(records))


def _escape(text: str) -> str:
    from html import escape

    return escape(text or "")
