"""Runs of the training DAG at the same time in one deployment, their jobs bounded by the cluster's pool.

One deployment (``airflow api-server``, ``scheduler`` with the LocalExecutor, ``dag-processor``,
``triggerer``) with the sites' facts mapped to the local cluster (``VCLOUD_SITE_FACTS``), so the
local profile and Cosmos' own profile (node-local staging, ``singularity exec --rocm``) both run
there through one connection, and so share one pool, ``slurm_vcloud_local_cluster``, created with
2 slots and ``include_deferred`` as ``python -m vcloud_pipeline.dag.pools --create`` does. Two runs with
different run names, one per profile, are triggered through the REST API: both train at once (each
has a job task deferred on its job at the same moment), both succeed, and sacct holds exactly one
job per stage of each. While both hold their slot (the processes of their running jobs stopped, their
pending jobs held, so that the moment lasts), a third run's first job task waits in Airflow for a slot and
submits nothing: the pool bounds the jobs in flight on the cluster. The local run's name triggered
a second time while that run trains adds no job to any stage. Each run's code is recorded
(``<paths.code>/.runs``) while it runs and released when it ends.
"""

from __future__ import annotations

import json
import shlex
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from support.deployment import RestClient, airflow_env, deployment_with_dag
from support.localcluster import LocalCluster, poll_until
from support.ports import free_port

DAG_ID = "vcloud_training"
POOL = "slurm_vcloud_local_cluster"
SLOTS = 2
STAGES = ["stage0", "stage1", "stage2", "stage3"]
JOB_TASKS = ["prepare_data", "preflight_imports", *STAGES, "export"]
TERMINAL = {"success", "failed"}

pytestmark = [pytest.mark.slow, pytest.mark.timeout(3000)]


@pytest.fixture(scope="module")
def deployment(local_cluster: LocalCluster, cluster_connection: str,
               tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    from vcloud_pipeline.profile.site_facts import LOCAL_SITE_FACTS

    home = tmp_path_factory.mktemp("concurrent-runs-home")
    local_dir = local_cluster.test_dir()
    # Cosmos' jobs bind /cosmos/vast/scratch/{user} into the container: its base lives there, written
    # with {user} as the profile writes it (the connection's login fills it in).
    cosmos_base = f"/cosmos/vast/scratch/{{user}}/tests/{uuid.uuid4().hex[:12]}/vcloud"
    cosmos_dir = cosmos_base.replace("{user}", local_cluster.user)
    local_cluster.ssh(f"mkdir -p {shlex.quote(cosmos_dir)}")
    # Both runs hold a slot with a deferred job task: the tiny config's stages are deferred at once.
    env = airflow_env(home, free_port(), local_dir, first_poll_delay=10, short_job_wait=0)
    env["VCLOUD_SITE_FACTS"] = str(LOCAL_SITE_FACTS)
    env["VCLOUD_PROFILE_OVERRIDES"] = json.dumps({"local": {"paths.base": local_dir},
                                                  "cosmos": {"paths.base": cosmos_base}})
    try:
        with deployment_with_dag(env, home, DAG_ID, pool_slots=SLOTS) as (components, api):
            yield {"components": components, "api": api, "home": home,
                   "bases": {"local": local_dir, "cosmos": cosmos_dir}}
    finally:  # a failed test must not leave a job of its runs behind for the rest of the suite
        out = local_cluster.root("squeue", "-h", "-O", "JobID:20,STDOUT:400", check=False).stdout
        for line in out.splitlines():
            fields = line.split(None, 1)
            if len(fields) == 2 and fields[1].startswith((f"{local_dir}/", f"{cosmos_dir}/")):
                local_cluster.root("scancel", fields[0], check=False)


# --- reading the deployment and the cluster ---------------------------------------------------------


def _trigger(api: RestClient, profile: str, run_name: str, **conf: Any) -> str:
    run_id = f"concurrent-{run_name}-{uuid.uuid4().hex[:6]}"
    conf = {"profile": profile, "config": "tiny", "run_name": run_name, "max_epochs": 1, "force_stages": [3], **conf}
    status, body = api.call("POST", f"/api/v2/dags/{DAG_ID}/dagRuns",
                            {"dag_run_id": run_id, "logical_date": None, "conf": conf})
    assert status == 200, body
    return run_id


def _tis(api: RestClient, run_id: str) -> dict[str, dict[str, Any]]:
    body = api.get(f"/api/v2/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances?limit=100")
    return {ti["task_id"]: ti for ti in body["task_instances"]}


def _pool(api: RestClient) -> dict[str, Any]:
    return api.get(f"/api/v2/pools/{POOL}")


def _jobs_in_squeue(cluster: LocalCluster, needle: str) -> dict[str, str]:
    """Job id -> state of every job in squeue whose comment contains ``needle``."""
    out = cluster.root("squeue", "-h", "-O", "JobID:20,State:20,Comment:4000", check=False).stdout
    jobs = {}
    for line in out.splitlines():
        fields = line.split(None, 2)
        if len(fields) == 3 and needle in fields[2]:
            jobs[fields[0]] = fields[1]
    return jobs


def _jobs_of_run(cluster: LocalCluster, run_id: str) -> dict[str, str]:
    return _jobs_in_squeue(cluster, f'"run":"{run_id}"')


class PoolWatch(threading.Thread):
    """Reads the pool's slots once a second while the runs go: the most it ever had occupied."""

    def __init__(self, api: RestClient) -> None:
        super().__init__(daemon=True)
        self.api, self.samples, self.done = api, [], threading.Event()

    def run(self) -> None:
        while not self.done.wait(1.0):
            try:
                self.samples.append(_pool(self.api))
            except Exception:  # the API server is busy for a moment: the next sample counts
                continue


def _freeze_both(cluster: LocalCluster, api: RestClient, runs: list[str]) -> list[tuple[str, str, list[str]]]:
    """Once both runs have a job task deferred at the same moment (both hold a slot), keep them there:
    stop the processes of their running jobs (SIGSTOP; Slurm is not told, so a job's next step starts
    normally once they go on: after ``scontrol suspend`` and resume Slurm 22.05 refused a staging job's
    next step with "Invalid generic resource (gres) specification"), hold their pending ones. Returns
    (job, how, pids) to undo."""
    while True:
        poll_until(lambda: _pool(api)["deferred_slots"] == SLOTS, timeout=1200, interval=1,
                   what=f"both runs to hold a slot of {POOL} with a deferred job task")
        jobs = {run_id: _jobs_of_run(cluster, run_id) for run_id in runs}
        if not all(any(s in ("RUNNING", "PENDING") for s in states.values()) for states in jobs.values()):
            time.sleep(1)  # a run's job is not in squeue yet, or has just ended: look again
            continue
        frozen: list[tuple[str, str, list[str]]] = []
        for run_id in runs:
            for job, state in jobs[run_id].items():
                if state == "RUNNING":
                    try:
                        pids = cluster.hang_job(job)
                    except AssertionError:  # it ended in between
                        continue
                    if pids:  # none: its script has ended and Slurm ends the job any moment
                        frozen.append((job, "stop", pids))
                elif state == "PENDING":
                    cluster.root("scontrol", "hold", job, check=False)
                    frozen.append((job, "hold", []))
        held = {job for job, _, _ in frozen}
        live = {run_id: {j for j, s in _jobs_of_run(cluster, run_id).items() if j in held and s in ("RUNNING", "PENDING")}
                for run_id in runs}
        if all(live.values()) and _pool(api)["deferred_slots"] == SLOTS:
            return frozen
        _thaw(cluster, frozen)  # a job ended in between: wait for the next such moment
        time.sleep(2)


def _thaw(cluster: LocalCluster, frozen: list[tuple[str, str, list[str]]]) -> None:
    for job, how, pids in frozen:
        if how == "stop":
            if pids:
                cluster.root("kill", "-CONT", *pids, check=False)
        else:
            cluster.root("scontrol", "release", job, check=False)


def _wait_end(deployment: dict[str, Any], run_id: str) -> dict[str, Any]:
    api = deployment["api"]

    def ended() -> dict[str, Any] | None:
        run = api.get(f"/api/v2/dags/{DAG_ID}/dagRuns/{run_id}")
        return run if run["state"] in TERMINAL else None

    try:
        return poll_until(ended, timeout=1800, interval=5, what=f"run {run_id} to end")
    except AssertionError as exc:
        raise AssertionError(f"{exc}: {_states(api, run_id)}\n{deployment['components'].log_tail('scheduler')}") \
            from None


def _return_value(api: RestClient, run_id: str, task_id: str) -> Any:
    return api.get(f"/api/v2/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances/{task_id}"
                   "/xcomEntries/return_value?deserialize=true")["value"]


def _states(api: RestClient, run_id: str) -> dict[str, str]:
    return {task: ti["state"] for task, ti in _tis(api, run_id).items()}


def _scheduler_beats(api: RestClient, beats: int) -> None:
    """Return once the scheduler has heartbeated ``beats`` more times (each beat follows its loops)."""
    def beat() -> str:
        return api.get("/api/v2/monitor/health")["scheduler"]["latest_scheduler_heartbeat"]

    seen = [beat()]

    def advanced() -> bool:
        now = beat()
        if now != seen[-1]:
            seen.append(now)
        return len(seen) > beats

    poll_until(advanced, timeout=300, interval=1, what=f"{beats} scheduler heartbeats")


# --- the test ------------------------------------------------------------------------------------------


def test_two_runs_on_two_profiles_train_at_once_and_the_pool_bounds_their_jobs(
        deployment: dict[str, Any], local_cluster: LocalCluster) -> None:
    from vcloud_pipeline.plan.layout import run_key

    api, bases = deployment["api"], deployment["bases"]
    pool = _pool(api)
    assert (pool["slots"], pool["include_deferred"]) == (SLOTS, True), pool
    watch = PoolWatch(api)
    watch.start()
    names = {"local": "conc-local", "cosmos": "conc-cosmos"}
    runs = {profile: _trigger(api, profile, name) for profile, name in names.items()}

    frozen = _freeze_both(local_cluster, api, list(runs.values()))
    try:
        # Both runs are in flight together, and each recorded the code it uses until it ends.
        for profile, run_id in runs.items():
            assert api.get(f"/api/v2/dags/{DAG_ID}/dagRuns/{run_id}")["state"] == "running"
            markers = local_cluster.ssh(f"ls {shlex.quote(bases[profile])}/code/.runs").stdout.split()
            assert [m.split("-")[0] for m in markers] == [run_key(DAG_ID, run_id)], markers
        # A third run: its first job task finds no free slot, waits in Airflow and submits nothing,
        # however often the scheduler looks at it.
        third = _trigger(api, "local", "conc-third", stages=[0], export=False)
        poll_until(lambda: _states(api, third).get("prepare_data") == "scheduled", timeout=600, interval=1,
                   what="the third run's first job task to wait for a slot")
        _scheduler_beats(api, 3)
        assert _states(api, third)["prepare_data"] == "scheduled"
        assert _jobs_of_run(local_cluster, third) == {}
        pool = _pool(api)
        assert (pool["open_slots"], pool["deferred_slots"], pool["scheduled_slots"]) == (0, SLOTS, 1), pool
        # The local run's name triggered again while that run trains: its stages watch the first run's
        # jobs or skip complete stages; the first run adopts what the second submits first. (An export
        # is made again where the stage outputs changed since the last one: this run asks for none.)
        again = _trigger(api, "local", names["local"], export=False)
    finally:
        _thaw(local_cluster, frozen)

    ended = {run_id: _wait_end(deployment, run_id) for run_id in [*runs.values(), third, again]}
    watch.done.set()
    watch.join(10)
    for run_id, run in ended.items():
        assert run["state"] == "success", (run_id, _states(api, run_id))
    # Every job task of every run waited in its cluster's pool; never more jobs in flight than slots.
    for run_id in [*runs.values(), third, again]:
        pools = {task: ti["pool"] for task, ti in _tis(api, run_id).items() if task in JOB_TASKS}
        assert set(pools.values()) == {POOL}, pools
        assert _tis(api, run_id)["plan"]["pool"] == "default_pool"
    assert watch.samples and max(s["occupied_slots"] for s in watch.samples) <= SLOTS
    assert any(s["deferred_slots"] == SLOTS for s in watch.samples)

    # One job per stage and run in sacct; the data job of the local base is shared by its two runs.
    directories = {f"{profile} {stage}": f"{bases[profile]}/outputs/{names[profile]}/{stage}"
                   for profile in names for stage in STAGES}
    directories.update({f"{profile} export": f"{bases[profile]}/viewer_data/{names[profile]}" for profile in names})
    directories.update({f"{profile} data": f"{bases[profile]}/data/synthetic-tiny" for profile in names})
    directories["third stage0"] = f"{bases['local']}/outputs/conc-third/stage0"

    def every_directory_has_its_job() -> dict[str, list[str]] | None:
        found = {what: local_cluster.jobs_writing(path) for what, path in directories.items()}
        return found if all(found.values()) else None

    jobs = poll_until(every_directory_has_its_job, timeout=120, what="every directory's job in sacct")
    assert not {what: ids for what, ids in jobs.items() if len(ids) != 1}, jobs  # the ones with more named
    # The second run of the local run's name made no job of any stage: each of its stages watched the
    # one job (or adopted it into the first run) or skipped the stage.
    for stage in [*STAGES, "export"]:
        ti = _tis(api, again)[stage]
        assert ti["state"] in ("success", "skipped"), (stage, ti["state"])
        if ti["state"] == "success":
            assert _return_value(api, again, stage)["job_ids"] == jobs[f"local {stage}"], stage
    for profile in names:
        for stage in STAGES:
            local_cluster.ssh(f"test -f {shlex.quote(directories[f'{profile} {stage}'])}/COMPLETE")
        # The runs ended: nothing keeps their code for them any more.
        assert local_cluster.ssh(f"ls -A {shlex.quote(bases[profile])}/code/.runs").stdout.split() == []
    print(f"two runs at once, one per profile, {SLOTS} slots: jobs per stage {jobs}")
