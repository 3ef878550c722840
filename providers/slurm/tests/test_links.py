"""The operator's extra link: the task log by default, or a job page a setting or a plugin names."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from slurm_provider.links import job_view_path, job_view_url, register_job_view, task_log_url


@pytest.fixture
def registered_view() -> Iterator[None]:
    """Leave the process's registration as the test found it."""
    before = job_view_path()
    yield
    register_job_view(before)


def test_task_log_url_points_at_the_task_instance_and_names_the_job() -> None:
    url = task_log_url("http://airflow:8080/", "training", "manual__2026-11-21T10:00:00+00:00",
                       "stage_1", -1, "16082076")
    assert url == ("http://airflow:8080/dags/training/runs/manual__2026-11-21T10%3A00%3A00%2B00%3A00"
                   "/tasks/stage_1?slurm_job_id=16082076")
    assert task_log_url("http://a", "d", "r", "t", 3, "1").startswith("http://a/dags/d/runs/r/tasks/t/mapped/3?")


def test_job_view_url_opens_the_tasks_row_on_the_named_page() -> None:
    url = job_view_url("http://airflow:8080/", "/slurm-jobs/", "d", "manual__1", "train", "42")
    assert url == "http://airflow:8080/slurm-jobs/?dag_id=d&run_id=manual__1&task_id=train#job-42"


def test_a_registration_names_the_page_and_the_setting_wins(registered_view: None,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AIRFLOW__SLURM__JOB_VIEW_PATH", raising=False)
    register_job_view(None)
    assert job_view_path() is None
    register_job_view("/site-jobs/")
    assert job_view_path() == "/site-jobs/"
    monkeypatch.setenv("AIRFLOW__SLURM__JOB_VIEW_PATH", "/from-setting/")
    assert job_view_path() == "/from-setting/"
    with pytest.raises(ValueError, match="must start with '/'"):
        register_job_view("slurm-jobs")
