"""Airflow loads the project's plugin (and only its registration file) from plugins/."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from slurm_provider.links import task_log_url

REPO = Path(__file__).resolve().parents[2]


def test_airflow_registers_the_plugin_and_its_extra_link() -> None:
    probe = (
        "import json, sys\n"
        "from airflow import plugins_manager as pm\n"
        "plugins, errors = pm._get_plugins()\n"
        "links = [type(link).__name__ for link in pm.get_operator_extra_links()]\n"
        "print(json.dumps({'plugins': [p.name for p in plugins], 'errors': errors, 'links': links,\n"
        "                  'top_level': sorted(m for m in ('states', 'operators', 'profiles', '__init__')\n"
        "                                      if m in sys.modules)}))\n"
    )
    env = {**os.environ, "AIRFLOW__CORE__PLUGINS_FOLDER": str(REPO / "plugins")}
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["errors"] == {}
    assert "slurm_provider" in report["plugins"]
    assert "SlurmJobLogLink" in report["links"]
    # .airflowignore keeps the loader from importing package modules as top-level modules.
    assert report["top_level"] == []


def test_task_log_url_points_at_the_task_instance_and_names_the_job() -> None:
    url = task_log_url("http://airflow:8080/", "vcloud_training", "manual__2026-11-21T10:00:00+00:00",
                       "stage_1", -1, "16082076")
    assert url == ("http://airflow:8080/dags/vcloud_training/runs/manual__2026-11-21T10%3A00%3A00%2B00%3A00"
                   "/tasks/stage_1?slurm_job_id=16082076")
    assert task_log_url("http://a", "d", "r", "t", 3, "1").startswith("http://a/dags/d/runs/r/tasks/t/mapped/3?")
