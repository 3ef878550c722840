"""Extra link from a Slurm task to its job in the Airflow UI.

By default the link opens the task instance's log page, tagged with the job id: the trigger copies
the job's output file into the task log line by line, so the task's log view is the job's log view.
A deployment with a page of its own for Slurm jobs points the link there instead, with the setting
``[slurm] job_view_path`` (``AIRFLOW__SLURM__JOB_VIEW_PATH``) or, from a plugin, with
:func:`register_job_view`: the page is opened at ``<base_url><path>?dag_id=..&run_id=..&task_id=..``
with the anchor ``#job-<job id>``. Airflow 3 computes the link in the worker when the task ends,
after the worker loaded the deployment's plugins.
"""

from __future__ import annotations

from urllib.parse import quote, urlencode

from airflow.sdk import BaseOperatorLink, BaseXCom

JOB_ID_XCOM_KEY = "slurm_job_id"

_registered_job_view: str | None = None


def register_job_view(path: str | None) -> None:
    """Open the extra link on the page at ``path`` (under the API server's base URL); None: the task log.

    The setting ``[slurm] job_view_path`` wins over a registration.
    """
    global _registered_job_view
    if path is not None and not path.startswith("/"):
        raise ValueError(f"job view path {path!r} must start with '/' (a path under Airflow's base URL)")
    _registered_job_view = path


def job_view_path() -> str | None:
    """The page the link opens: the setting, else the registered path, else None (the task log)."""
    from airflow.sdk import conf

    configured = conf.get("slurm", "job_view_path", fallback="") or ""
    return configured.strip() or _registered_job_view


def task_log_url(base_url: str, dag_id: str, run_id: str, task_id: str, map_index: int, job_id: str) -> str:
    """URL of the task instance's log page in the Airflow 3 UI, tagged with the Slurm job id."""
    path = f"/dags/{quote(dag_id, safe='')}/runs/{quote(run_id, safe='')}/tasks/{quote(task_id, safe='')}"
    if map_index >= 0:
        path += f"/mapped/{map_index}"
    return f"{base_url.rstrip('/')}{path}?{urlencode({'slurm_job_id': job_id})}"


def job_view_url(base_url: str, view_path: str, dag_id: str, run_id: str, task_id: str, job_id: str) -> str:
    """URL of the task's row on the job page at ``view_path``, scoped to its DAG run."""
    query = urlencode({"dag_id": dag_id, "run_id": run_id, "task_id": task_id})
    return f"{base_url.rstrip('/')}{view_path}?{query}#job-{quote(job_id, safe='')}"


class SlurmJobLogLink(BaseOperatorLink):
    name = "Slurm job"

    def get_link(self, operator, *, ti_key) -> str:
        job_id = BaseXCom.get_value(ti_key=ti_key, key=JOB_ID_XCOM_KEY)
        if not job_id:
            return ""
        from airflow.sdk import conf

        base_url = conf.get("api", "base_url", fallback="http://localhost:8080")
        view_path = job_view_path()
        if view_path is None:
            map_index = getattr(ti_key, "map_index", -1)
            return task_log_url(base_url, ti_key.dag_id, ti_key.run_id, ti_key.task_id,
                                -1 if map_index is None else int(map_index), str(job_id))
        return job_view_url(base_url, view_path, ti_key.dag_id, ti_key.run_id, ti_key.task_id, str(job_id))
