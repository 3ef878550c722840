"""Extra link from a Slurm task to its job in the Airflow UI.

The link opens the HPC view (``plugins/hpc_view``, mounted at ``/hpc-view``) on the task's DAG run,
with the task's row highlighted: every job id of the task (resubmissions included), its state,
elapsed time and GPU-hours, and a link to the task log. The trigger copies the job's output file
into the task log line by line, so the task's log view is the job's log view.
"""

from __future__ import annotations

from urllib.parse import quote, urlencode

from airflow.sdk import BaseOperatorLink, BaseXCom

JOB_ID_XCOM_KEY = "slurm_job_id"
JOB_VIEW_PREFIX = "/hpc-view/"


def task_log_url(base_url: str, dag_id: str, run_id: str, task_id: str, map_index: int, job_id: str) -> str:
    """URL of the task instance's log page in the Airflow 3 UI, tagged with the Slurm job id."""
    path = f"/dags/{quote(dag_id, safe='')}/runs/{quote(run_id, safe='')}/tasks/{quote(task_id, safe='')}"
    if map_index >= 0:
        path += f"/mapped/{map_index}"
    return f"{base_url.rstrip('/')}{path}?{urlencode({'slurm_job_id': job_id})}"


def job_view_url(base_url: str, dag_id: str, run_id: str, task_id: str, job_id: str) -> str:
    """URL of the task's row in the HPC view, scoped to its DAG run."""
    query = urlencode({"dag_id": dag_id, "run_id": run_id, "task_id": task_id})
    return f"{base_url.rstrip('/')}{JOB_VIEW_PREFIX}?{query}#job-{quote(job_id, safe='')}"


class SlurmJobLogLink(BaseOperatorLink):
    name = "Slurm job"

    def get_link(self, operator, *, ti_key) -> str:
        job_id = BaseXCom.get_value(ti_key=ti_key, key=JOB_ID_XCOM_KEY)
        if not job_id:
            return ""
        from airflow.configuration import conf

        base_url = conf.get("api", "base_url", fallback="http://localhost:8080")
        return job_view_url(base_url, ti_key.dag_id, ti_key.run_id, ti_key.task_id, str(job_id))
