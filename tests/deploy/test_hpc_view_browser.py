"""The HPC view in a real browser: a local deployment with a finished tiny training run in its history.

``airflow dags test vcloud_training`` runs the whole DAG (profile ``local``, config ``tiny``) on the
local cluster, like ``make demo``, with the profile's ``paths.base`` moved to a fresh directory
(``VCLOUD_PROFILE_OVERRIDES``) so the data job, the code sync and every stage run for real and
collide with no other test. Then a local deployment on the same home
(``support.deployment.LocalDeployment``: API server, scheduler with the LocalExecutor, DAG processor
and triggerer; SQLite, SimpleAuthManager) serves the UI on that database; headless Chromium signs in
through Airflow's login page, opens the HPC view for that DAG, and the test compares every job and
budget figure the page shows with ``sacct`` and with the run's own records (the operators' XComs,
the ``summary`` task's ledger).
Screenshots of the page and of the same view embedded in Airflow's navigation go to ``.artifacts/``.
"""

from __future__ import annotations

import datetime
import json
import shlex
from collections.abc import Iterator
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path

import pytest

from vcloud.contract import training_curve
from vcloud_pipeline.plan.layout import run_paths
from vcloud_pipeline.profile import load_profile
from support.cdp import CHROMIUM, Browser
from support.localcluster import LocalCluster, poll_until
from support.ports import free_port
from support.deployment import PASSWORD, USER, LocalDeployment, airflow, airflow_env, dag_run_records, migrate

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / ".artifacts"
DAG_ID = "vcloud_training"
SLURM_TASKS = ["prepare_data", "preflight_imports", "stage0", "stage1", "stage2", "stage3", "export"]
"""The tasks of a first run in an empty project directory that each leave one Slurm job record."""
ALLOCATION_ENDS = (datetime.date.today() + datetime.timedelta(weeks=4)).isoformat()
ALLOCATION = 1000.0  # GrpTRESMins=billing=60000 on account vcloud_local (cluster.sh), 60 billing-minutes a GPU-hour

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


@pytest.fixture(autouse=True)
def _chromium_installed() -> None:
    if CHROMIUM is None:
        pytest.fail("chromium is missing: run include/test_deps.sh (make test does)", pytrace=False)


@pytest.fixture(scope="module")
def finished_run(local_cluster: LocalCluster, cluster_connection: str,
                 tmp_path_factory: pytest.TempPathFactory) -> dict:
    """An Airflow home whose history holds one finished tiny ``vcloud_training`` run of profile ``local``."""
    home = tmp_path_factory.mktemp("airflow-home")
    port = free_port()
    project_dir = local_cluster.test_dir()
    env = airflow_env(home, port, project_dir)
    # The allocation's period ends in four weeks: the run's summary and the page pace the spending.
    env["VCLOUD_PROFILE_OVERRIDES"] = json.dumps({"local": {"paths.base": project_dir,
                                                           "billing.allocation_ends": ALLOCATION_ENDS}})
    migrate(env)
    run_name = f"hpcview-{Path(project_dir).name}"
    # Two epochs a stage: a curve of two points per stage is a curve, and the page's figures are the same.
    conf = {"profile": "local", "config": "tiny", "run_name": run_name, "force_stages": [3], "max_epochs": 2}
    # A whole tiny run; the rest of the suite shares the two cores and the cluster meanwhile.
    airflow("dags", "test", DAG_ID, "--conf", json.dumps(conf), env=env, timeout=1200)
    runs = dag_run_records(DAG_ID, env)
    assert len(runs) == 1, runs
    [run] = runs
    assert run["state"] == "success" and run["conf"]["run_name"] == run_name, run
    failed = {task: state for task, state in run["task_states"].items() if state != "success"}
    assert not failed, f"every task of a first tiny run in an empty project directory succeeds: {failed}"
    return {"home": home, "port": port, "env": env, "project_dir": project_dir, "run_name": run_name, **run}


@pytest.fixture(scope="module")
def deployment(finished_run: dict) -> Iterator[LocalDeployment]:
    with LocalDeployment(finished_run["env"], finished_run["home"]) as airflow_deployment:
        # Ready when Airflow's own DAG list shows the DAG to the user (its DAG processor has
        # registered the bundles): the HPC view filters by the same readable DAGs.
        api = airflow_deployment.api()
        poll_until(lambda: api.get(f"/api/v2/dags?dag_id_pattern={DAG_ID}")["total_entries"] >= 1,
                   timeout=180, interval=2, what=f"Airflow to list {DAG_ID} to {USER}")
        yield airflow_deployment


@pytest.fixture
def browser() -> Iterator[Browser]:
    chrome = Browser()
    try:
        yield chrome
    finally:
        chrome.close()


def page_figure(value: float) -> str:
    """A GPU-hour figure as hpc_view.js's fmt() prints the JSON's value: Intl.NumberFormat rounds
    the number's shortest decimal form half away from zero (12.85 -> "12.9"), where Python's
    format rounds the binary value (12.85 -> "12.8")."""
    digits = 4 if abs(value) < 10 else 1
    return f"{Decimal(repr(value)).quantize(Decimal(1).scaleb(-digits), rounding=ROUND_HALF_UP):,}"


def _sacct_jobs(cluster: LocalCluster, job_ids: list[str]) -> dict[str, tuple[str, float]]:
    """Per job: its last state and GPUs x elapsed hours over all its starts, straight from accounting."""
    out = cluster.root("sacct", "-X", "-n", "-P", "-D", "-S", "now-2days", "-j", ",".join(job_ids),
                       "--format=JobIDRaw,State,ElapsedRaw,AllocTRES").stdout
    jobs: dict[str, tuple[str, float]] = {}
    for line in out.splitlines():
        job, state, elapsed, tres = line.split("|")
        gpus = sum(int(part.split("=")[1]) for part in tres.split(",") if part.startswith("gres/gpu="))
        jobs[job] = (state.split()[0], jobs.get(job, ("", 0.0))[1] + gpus * int(elapsed) / 3600)
    return jobs


PAGE_JS = """JSON.stringify({
  profiles: [...document.querySelectorAll('section.profile')].map(s => ({
    profile: s.dataset.profile,
    allocation: s.querySelector('.budget-line .allocation')?.textContent,
    used: s.querySelector('.budget-line .used')?.textContent,
    left: s.querySelector('.budget-line .left')?.textContent,
    account_used: s.querySelector('.budget-line .account-used')?.textContent,
    source: s.querySelector('.budget-source')?.dataset.source,
    pace: s.querySelector('p.pace')?.textContent,
    pace_verdict: s.querySelector('p.pace')?.dataset.verdict,
    source_text: s.querySelector('.budget-source')?.textContent,
    charts: s.querySelectorAll('.charts svg').length,
    run_stage: [...s.querySelectorAll('table.run-stage tbody tr')].map(r => ({
      run_id: r.dataset.runId, stage: r.dataset.stage, gpu_hours: r.querySelector('td.num').textContent})),
    burndown: s.querySelector('svg.burndown')?.getAttribute('aria-label'),
    curves: [...s.querySelectorAll('div.curve')].map(c => ({
      stage: Number(c.dataset.stage), run_name: c.dataset.runName, svgs: c.querySelectorAll('svg.curve').length,
      points: [...c.querySelectorAll('svg.curve polyline')].map(p => p.getAttribute('points').trim().split(/\\s+/).length)})),
    jobs: [...s.querySelectorAll('table.jobs tbody tr')].map(r => ({
      job_id: r.dataset.jobId, run_id: r.dataset.runId, task_id: r.dataset.taskId, state: r.dataset.state,
      ids: [...r.querySelectorAll('code.job-id')].map(c => c.textContent),
      gpu_hours: r.querySelector('td.gpu-hours').textContent, text: r.textContent,
      highlighted: r.classList.contains('highlight')})),
  })),
})"""


DIAGNOSE_JS = """(async () => JSON.stringify({
  jobs: await (await fetch('/hpc-view/api/jobs?dag_id=%s', {credentials: 'same-origin'})).text(),
  status: document.getElementById('status')?.textContent,
}))()"""


def _diagnose(browser: Browser, deployment: LocalDeployment) -> str:
    """What the page's API and the deployment's API server and DAG processor say now, for a failure
    message."""
    try:
        now = browser.evaluate(DIAGNOSE_JS % DAG_ID)
    except RuntimeError as exc:
        now = f"(could not ask the page: {exc})"
    return (f"page API now: {now}\n{deployment.log_tail('api-server')}\n"
            f"{deployment.log_tail('dag-processor')}")


def test_signed_in_user_sees_the_jobs_and_budget_the_ledger_holds(deployment: LocalDeployment,
                                                                 finished_run: dict,
                                                                 local_cluster: LocalCluster,
                                                                 browser: Browser) -> None:
    run_id, values = finished_run["run_id"], finished_run["values"]
    browser.navigate(f"{deployment.base}/hpc-view/?dag_id={DAG_ID}&task_id=stage3")
    browser.wait_for("location.pathname.includes('/auth/login') && !!document.querySelector('input[type=password]')",
                     what="Airflow's login page")
    browser.type_into("input:not([type=password])", USER)
    browser.type_into("input[type=password]", PASSWORD)
    browser.press_enter()
    # Signing in may load the page more than once: read it from a document that has rendered the
    # run's profile (a page that never shows it fails here, with what its API says).
    try:
        shown = json.loads(browser.wait_for(
            "location.pathname.startsWith('/hpc-view') && document.body.dataset.loaded === 'true'"
            f" && document.querySelectorAll('section.profile').length > 0 && {PAGE_JS}",
            what="the HPC view after signing in, showing the run's profile", timeout=120))
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{_diagnose(browser, deployment)}") from None
    browser.screenshot(ARTIFACTS / "hpc_view.png")

    assert [p["profile"] for p in shown["profiles"]] == ["local"], _diagnose(browser, deployment)
    local = shown["profiles"][0]
    rows = {row["task_id"]: row for row in local["jobs"]}
    assert sorted(rows) == sorted(SLURM_TASKS) and len(local["jobs"]) == len(SLURM_TASKS), list(rows)

    recorded = {task: values[task] for task in SLURM_TASKS}
    all_ids = [job for task in SLURM_TASKS for job in recorded[task]["job_ids"]]
    ledger = _sacct_jobs(local_cluster, all_ids)
    assert sorted(ledger) == sorted(all_ids), f"sacct knows jobs {sorted(ledger)}, the run recorded {all_ids}"
    run_ledger = values["summary"]["ledger"]["by_stage"]
    for task in SLURM_TASKS:
        row, summary = rows[task], recorded[task]
        assert row["run_id"] == run_id and row["highlighted"] == (task == "stage3"), (task, row)
        assert row["ids"] == summary["job_ids"] and row["job_id"] == summary["job_id"], (task, row, summary)
        assert finished_run["run_name"] in row["text"]
        billed = round(sum(ledger[job][1] for job in summary["job_ids"]), 4)
        assert billed > 0, f"{task}: every job asks for --gpus=1, so accounting must bill it"
        assert summary["gpu_hours"] == billed, (task, summary["gpu_hours"], billed)
        assert run_ledger[f"{run_id} {summary['job']}"] == billed, (task, run_ledger)
        assert row["gpu_hours"] == f"{billed:.4f}", (task, row["gpu_hours"], billed)
        assert row["state"] == summary["state"] == ledger[summary["job_id"]][0] == "COMPLETED", (task, row)
        assert "Finished; every process exited with code 0" in row["text"], (task, row["text"])

    used = sum(recorded[task]["gpu_hours"] for task in SLURM_TASKS)
    # The budget is the Slurm limit on the account, as the run's last job read it when it ended.
    slurm = recorded["export"]["allocation"]
    assert slurm["source"] == "slurm" and slurm["limit"] == ALLOCATION, slurm
    assert local["source"] == "slurm", local["source_text"]
    assert "Allocation from: Slurm association limit GrpTRESMins billing=60000 on account vcloud_local" \
        in local["source_text"]
    assert "Slurm GrpTRESRaw billing=" in local["source_text"]
    assert local["allocation"] == f"{ALLOCATION:,.1f}"
    assert local["used"] == f"{used:.4f}"
    assert local["account_used"] == page_figure(round(slurm["used"], 4))
    assert local["left"] == f"{ALLOCATION - slurm['used']:,.4f}"
    left = ALLOCATION - slurm["used"]
    shown_left = f"{left:,.4f}" if used < 10 else f"{left:,.1f}"
    assert local["charts"] == 3 and local["burndown"] == f"GPU-hours left of {ALLOCATION:,.1f} (Slurm limit): {shown_left}"
    # A tiny run's minutes against 1,000 GPU-hours over four weeks: under-spending, said by the run's
    # summary (from sacct) and by the page (from the recorded jobs), with the date it ends.
    for pace in (values["summary"]["pace"]["words"], local["pace"]):
        assert " would spend the " in pace and f" left by {ALLOCATION_ENDS}; at this rate about " in pace, pace
    assert values["summary"]["pace"]["verdict"] == local["pace_verdict"] == "under", local["pace"]
    assert local["pace"].startswith("Pace: under-spending: "), local["pace"]
    per_stage = {(r["run_id"], r["stage"]): r["gpu_hours"] for r in local["run_stage"]}
    assert per_stage == {(run_id, recorded[task]["job"]): f"{run_ledger[f'{run_id} ' + recorded[task]['job']]:.4f}"
                         for task in SLURM_TASKS}

    # Each stage's training curve, loss and validation PSNR: its metrics.jsonl on the cluster as the
    # stage's task read it on the worker when the job completed (the API server reads no file).
    paths = run_paths(load_profile("local", overrides={"paths.base": finished_run["project_dir"]}),
                      finished_run["run_name"])
    expected = []
    for stage in (0, 1, 2, 3):
        curve = training_curve(local_cluster.ssh(f"cat {shlex.quote(str(paths.metrics_path(stage)))}").stdout)
        assert curve.loss and curve.val_psnr, f"stage {stage} wrote no curve"
        assert recorded[f"stage{stage}"]["curve"] == curve.to_json(), f"stage {stage}'s recorded curve"
        expected.append({"stage": stage, "run_name": finished_run["run_name"], "svgs": 2,
                         "points": [len(curve.loss), len(curve.val_psnr)]})
    assert local["curves"] == expected
    # ... and the run summary points at the export's plot of each, from the same files
    assert values["summary"]["curves"] == {f"stage{stage}": str(paths.curve_png(stage)) for stage in (0, 1, 2, 3)}

    # The same page inside Airflow's own UI (navigation entry "HPC jobs", an iframe of /hpc-view/).
    browser.navigate(f"{deployment.base}/plugin/hpc-view")
    browser.wait_for("(() => { const f = document.querySelector('iframe');"
                     " return !!f && f.contentDocument?.body?.dataset.loaded === 'true'; })()",
                     what="the HPC view embedded in the Airflow UI", timeout=90)
    browser.screenshot(ARTIFACTS / "hpc_view_in_airflow_ui.png")
