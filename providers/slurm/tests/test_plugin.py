"""Airflow loads the project's plugins (only their registration file) with the checkout's provider;
loading them points the Slurm extra link at the HPC view."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]


def test_airflow_loads_the_plugins_and_the_hpc_view_takes_the_slurm_link() -> None:
    probe = (
        "import json, sys\n"
        "from slurm_provider.links import job_view_path\n"
        "before = job_view_path()\n"
        "from airflow import plugins_manager as pm\n"
        "plugins, errors = pm._get_plugins()\n"
        "print(json.dumps({'plugins': [p.name for p in plugins], 'errors': errors, 'before': before,\n"
        "                  'after': job_view_path(),\n"
        "                  'top_level': sorted(m for m in ('states', 'operators', 'profiles', '__init__')\n"
        "                                      if m in sys.modules)}))\n"
    )
    env = {**os.environ, "AIRFLOW__CORE__PLUGINS_FOLDER": str(REPO / "plugins"),
           "PYTHONPATH": os.pathsep.join([str(REPO / "providers" / "slurm" / "src"), str(REPO / "trainer" / "src")])}
    env.pop("AIRFLOW__SLURM__JOB_VIEW_PATH", None)
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["errors"] == {}
    assert report["plugins"] == ["hpc_view"]
    assert (report["before"], report["after"]) == (None, "/hpc-view/")
    # .airflowignore keeps the loader from importing package modules as top-level modules.
    assert report["top_level"] == []
