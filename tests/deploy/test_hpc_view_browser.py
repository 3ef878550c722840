"""The HPC view in a real browser: ``airflow standalone`` with a finished Slurm run in its history.

A real job runs on the local cluster through ``airflow dags test slurm_lifecycle`` (the run names
profile ``local``), then ``airflow standalone`` (LocalExecutor, SQLite, SimpleAuthManager) serves
the UI; headless Chromium signs in through Airflow's login page, opens the HPC view, and the test
compares what the page shows with ``sacct``'s own figures for that job. Screenshots of the page
and of the same view embedded in Airflow's navigation go to ``.artifacts/``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from deploy.cdp import CHROMIUM, Browser, free_port
from localcluster import LocalCluster

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / ".artifacts"
USER, PASSWORD = "admin", "vcloud-admin-pw"

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900),
              pytest.mark.skipif(CHROMIUM is None, reason="chromium missing: run include/test_deps.sh")]


def _airflow_env(home: Path, port: int) -> dict[str, str]:
    env = dict(os.environ)
    env.update({
        # standalone starts its components as `airflow ...` found on PATH
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home}/airflow.db",
        "AIRFLOW__LOGGING__BASE_LOG_FOLDER": str(home / "logs"),
        "AIRFLOW__API__PORT": str(port),
        "AIRFLOW__API__HOST": "127.0.0.1",
        "AIRFLOW__API__BASE_URL": f"http://127.0.0.1:{port}",
        "AIRFLOW__CORE__AUTH_MANAGER": "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": f"{USER}:admin",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(home / "passwords.json"),
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "False",
        "AIRFLOW__CORE__LAZY_LOAD_PLUGINS": "False",
        "AIRFLOW__SCHEDULER__ENABLE_HEALTH_CHECK": "False",
    })
    return env


def _run(argv: list[str], env: dict[str, str], timeout: float) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{' '.join(argv[:4])} exited {proc.returncode}:\n{proc.stderr[-3000:]}"
    return proc


@pytest.fixture(scope="module")
def finished_run(local_cluster: LocalCluster, cluster_connection: str,
                 tmp_path_factory: pytest.TempPathFactory) -> dict:
    """An Airflow home whose history holds one real, completed Slurm job of profile ``local``."""
    home = tmp_path_factory.mktemp("standalone-home")
    port = free_port()
    env = _airflow_env(home, port)
    (home / "passwords.json").write_text(json.dumps({USER: PASSWORD}))
    _run([sys.executable, "-m", "airflow", "db", "migrate"], env, 600)
    log_dir = local_cluster.test_dir()
    conf = {"profile": "local", "script": "#!/bin/bash\nsleep 5\necho hpc-view-test\n", "log_dir": log_dir,
            "time_limit": "2", "sbatch_options": ["--gpus=1"]}
    _run([sys.executable, "-m", "airflow", "dags", "test", "slurm_lifecycle", "-c", json.dumps(conf)], env, 600)
    script = ("import json\n"
              "from airflow.models.xcom import XComModel\n"
              "from airflow.utils.session import create_session\n"
              "with create_session() as s:\n"
              "    rows = s.query(XComModel).filter_by(dag_id='slurm_lifecycle', key='return_value').all()\n"
              "    print(json.dumps([dict(run_id=r.run_id, value=XComModel.deserialize_value(r)) for r in rows]))\n")
    records = json.loads(_run([sys.executable, "-c", script], env, 120).stdout.strip().splitlines()[-1])
    assert len(records) == 1, records
    return {"home": home, "port": port, "env": env, **records[0]}


@pytest.fixture(scope="module")
def standalone(finished_run: dict) -> Iterator[str]:
    """``airflow standalone`` on a free port; stopped with SIGINT (SIGTERM would orphan its children)."""
    home, port = finished_run["home"], finished_run["port"]
    log = open(home / "standalone.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "airflow", "standalone"], env=finished_run["env"],
                            stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while True:
            try:
                with urllib.request.urlopen(f"{base}/api/v2/monitor/health", timeout=5) as resp:
                    if resp.status == 200:
                        break
            except OSError:
                pass
            assert proc.poll() is None, f"airflow standalone exited early; see {log.name}"
            assert time.monotonic() < deadline, f"API server not up within 300 s; see {log.name}"
            time.sleep(1)
        yield base
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=30)
        log.close()


@pytest.fixture
def browser() -> Iterator[Browser]:
    chrome = Browser()
    try:
        yield chrome
    finally:
        chrome.close()


def _sacct_gpu_hours(cluster: LocalCluster, job_ids: list[str]) -> float:
    """GPUs x elapsed hours per job, straight from accounting (the ledger's own numbers)."""
    out = cluster.root("sacct", "-X", "-n", "-P", "-D", "-S", "now-2days", "-j", ",".join(job_ids),
                       "--format=JobIDRaw,ElapsedRaw,AllocTRES").stdout
    total = 0.0
    for line in out.splitlines():
        job, elapsed, tres = line.split("|")
        gpus = sum(int(part.split("=")[1]) for part in tres.split(",") if part.startswith("gres/gpu="))
        total += gpus * int(elapsed) / 3600
    return total


PAGE_JS = """JSON.stringify({
  profiles: [...document.querySelectorAll('section.profile')].map(s => ({
    profile: s.dataset.profile,
    allocation: s.querySelector('.budget-line .allocation')?.textContent,
    used: s.querySelector('.budget-line .used')?.textContent,
    left: s.querySelector('.budget-line .left')?.textContent,
    charts: s.querySelectorAll('.charts svg').length,
    burndown: s.querySelector('svg.burndown')?.getAttribute('aria-label'),
    jobs: [...s.querySelectorAll('table.jobs tbody tr')].map(r => ({
      job_id: r.dataset.jobId, run_id: r.dataset.runId, task_id: r.dataset.taskId, state: r.dataset.state,
      ids: [...r.querySelectorAll('code.job-id')].map(c => c.textContent),
      gpu_hours: r.querySelector('td.gpu-hours').textContent, text: r.textContent,
      highlighted: r.classList.contains('highlight')})),
  })),
})"""


def test_signed_in_user_sees_the_jobs_and_budget_the_ledger_holds(standalone: str, finished_run: dict,
                                                                 local_cluster: LocalCluster,
                                                                 browser: Browser) -> None:
    summary = finished_run["value"]
    run_id = finished_run["run_id"]
    browser.navigate(f"{standalone}/hpc-view/?dag_id=slurm_lifecycle&task_id=job")
    browser.wait_for("location.pathname.includes('/auth/login') && !!document.querySelector('input[type=password]')",
                     what="Airflow's login page")
    browser.type_into("input:not([type=password])", USER)
    browser.type_into("input[type=password]", PASSWORD)
    browser.press_enter()
    browser.wait_for("location.pathname.startsWith('/hpc-view') && document.body.dataset.loaded === 'true'",
                     what="the HPC view after signing in")
    shown = json.loads(browser.evaluate(PAGE_JS))
    browser.screenshot(ARTIFACTS / "hpc_view.png")

    assert [p["profile"] for p in shown["profiles"]] == ["local"]
    local = shown["profiles"][0]
    [row] = local["jobs"]
    ledger_hours = _sacct_gpu_hours(local_cluster, summary["job_ids"])
    assert ledger_hours > 0, "the job asked for --gpus=1, so accounting must bill it"
    assert row["ids"] == summary["job_ids"] and row["job_id"] == summary["job_id"]
    assert row["run_id"] == run_id and row["task_id"] == "job" and row["highlighted"]
    assert row["state"] == "COMPLETED" and "Finished; every process exited with code 0" in row["text"]
    assert row["gpu_hours"] == f"{ledger_hours:.4f}"
    assert local["allocation"] == "1,000.0"  # include/profiles/local.yaml billing.allocation
    assert local["used"] == f"{ledger_hours:.4f}"
    assert local["left"] == f"{1000 - ledger_hours:,.4f}"
    assert local["charts"] == 3 and local["burndown"] == f"GPU-hours left of 1,000.0: {1000 - ledger_hours:,.4f}"

    # The same page inside Airflow's own UI (navigation entry "HPC jobs", an iframe of /hpc-view/).
    browser.navigate(f"{standalone}/plugin/hpc-view")
    browser.wait_for("(() => { const f = document.querySelector('iframe');"
                     " return !!f && f.contentDocument?.body?.dataset.loaded === 'true'; })()",
                     what="the HPC view embedded in the Airflow UI", timeout=90)
    browser.screenshot(ARTIFACTS / "hpc_view_in_airflow_ui.png")
