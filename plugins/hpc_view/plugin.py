"""Registers the HPC view with Airflow: its FastAPI app, a navigation entry and a task tab.

Loading it also points the Slurm operator's extra link at the view's row of the task's job.
"""

from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin

from slurm_provider import register_job_view

from hpc_view.app import URL_PREFIX, app

NAV_VIEW = {
    "name": "HPC jobs",
    "href": URL_PREFIX.lstrip("/") + "/",
    "destination": "nav",
    "category": "browse",
    "url_route": "hpc-view",
}
TASK_INSTANCE_VIEW = {
    "name": "Slurm job",
    "href": URL_PREFIX.lstrip("/") + "/?dag_id={DAG_ID}&run_id={RUN_ID}&task_id={TASK_ID}&map_index={MAP_INDEX}",
    "destination": "task_instance",
    "url_route": "hpc-view-task",
}

register_job_view(URL_PREFIX + "/")


class HpcViewPlugin(AirflowPlugin):
    name = "hpc_view"
    fastapi_apps = [{"app": app, "url_prefix": URL_PREFIX, "name": "vcloud HPC view"}]
    external_views = [NAV_VIEW, TASK_INSTANCE_VIEW]
