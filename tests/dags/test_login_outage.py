"""The training DAG through an outage of its login node while stage 0 trains, on a compressed schedule.

The run logs in through a private login sshd of the local cluster (the shared one on port 2222
serves everyone else's tests); once stage 0's job runs and the task's watch has seen it run, that
sshd and every session it serves are stopped, as a maintenance break does. The job trains on, ends
and is forgotten by slurmctld while nobody can look; after at least ``OUTAGE_S`` (and not before the
job has ended and left squeue) the sshd comes back. The run must succeed with one job for stage 0 in
accounting, read from sacct, and the task log must say once that the login node was unreachable.

The schedule is compressed, not the path: a deployment polls every 15 s growing to 5 min and backs
off from an unreachable login node up to that same 5 min cap, waiting up to 24 h (``watch_deadline``);
here the deployment's settings (``VCLOUD_POLL_INTERVAL``, ``VCLOUD_MAX_POLL_INTERVAL``, which is also
the cap of the watch's back-off, ``VCLOUD_FIRST_POLL_DELAY``, ``VCLOUD_SHORT_JOB_WAIT``) are a few
seconds, so the outage lasts many times the back-off's cap in a minute or two. The watch's own log lines
(``still unreachable after N tries ...; next try in D s``) must show that the back-off reached its cap
and waited there several times, never longer, all through one outage: the path of a day-long
maintenance, at this scale. The deadline stays the shipped 24 h: the outage must not reach it.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from support.localcluster import LocalCluster, poll_until
from support.ports import free_port
from support.private_login import PrivateLogin
from support import migrated_db
from support.deployment import RECORDS_SCRIPT, airflow_env, run_cli

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900), pytest.mark.usefixtures("cluster_connection")]
RUN = "outage"
POLL_S = 2
"""``VCLOUD_POLL_INTERVAL``: seconds between the watch's first polls (and the login wait's first probe)."""
BACKOFF_CAP_S = 5
"""``VCLOUD_MAX_POLL_INTERVAL``: the longest interval between two polls, and the cap of the watch's
back-off from an unreachable login node (``slurm_provider.watch.poll_schedule.PollSchedule.transport_retry``:
``2 ** try`` seconds, jittered down to half, never more than the cap; 300 s in a deployment)."""
FIRST_POLL_S = 1
"""``VCLOUD_FIRST_POLL_DELAY``: fine for ``airflow dags test``, which runs the triggers inline."""
CAPPED_FROM_TRY = math.ceil(math.log2(BACKOFF_CAP_S))
"""The first try after which the back-off waits its cap: ``2 ** try >= BACKOFF_CAP_S``."""
OUTAGE_S = 8 * BACKOFF_CAP_S
"""The least the login node stays down (it also stays down until the job has left squeue, which
slurmctld's MinJobAge of 60 s makes the longer wait): the back-off must wait at its cap several times."""
MIN_CAPPED_WAITS = 5
"""Waits at the cap the outage must show at least (about 2.5-5 s each: a 40 s outage has more than 8)."""
MAX_EPOCHS = 8
"""Epochs of the tiny stage 0 (its configured count): with the job's start-up (3-4 s) long enough to be
seen running by the watch, which polls every few seconds, before it ends (0.4-10 s an epoch on the
local cluster, quiet or loaded: the job runs 7-90 s); it ends early in the outage, which then lasts
until slurmctld forgot it (MinJobAge, 60 s, and slurmctld's purge cadence: 1-2 min after its end)."""
BACKOFF_LINE = re.compile(r"Cluster (?P<conn>\S+) still unreachable after (?P<tries>\d+) tries \(.*\); "
                          r"next try in (?P<delay>\d+)s")
"""The watch's poller at every failed try (``slurm_provider.watch.poller``)."""


def _job_writing(cluster: LocalCluster, directory: str) -> tuple[str, str] | None:
    """(job id, state) of the live job whose comment names ``directory`` as the one it writes."""
    from slurm_provider.cli.exclusive_submit import exclusive_dir_marker

    marker = f'"xdir":"{exclusive_dir_marker(directory)}"'
    out = cluster.root("squeue", "-h", "-a", "-t", "all", "-o", "%i|%T|%k", check=False).stdout
    rows = [line.split("|", 2) for line in out.splitlines() if marker in line]
    return (rows[-1][0], rows[-1][1]) if rows else None


TRY_NUMBERS = """
with create_session() as s:
    print(json.dumps({ti.task_id: ti.try_number for ti in s.query(TaskInstance).filter_by(dag_id=dag_id)}))
"""


def _records_and_try_numbers(env: dict[str, str]) -> tuple[list[dict], dict[str, int]]:
    """``deployment.dag_run_records`` of the training DAG (every run: state, task states, XComs) and each
    task's try number in the deployment's database (the run has one DAG run), read by one process."""
    out = run_cli([sys.executable, "-c", RECORDS_SCRIPT + TRY_NUMBERS, "vcloud_training"], env, 120).stdout
    records, tries = out.strip().splitlines()[-2:]
    return json.loads(records), json.loads(tries)


def test_a_login_node_down_under_a_training_stage_is_waited_out_at_the_backoff_cap(
        local_cluster: LocalCluster, tmp_path: Path) -> None:
    login_dir = tmp_path / "login"
    login_dir.mkdir()
    login = PrivateLogin(local_cluster, login_dir)
    project_dir = local_cluster.test_dir()
    stage_dir = f"{project_dir}/outputs/{RUN}/stage0"
    home = tmp_path / "home"
    home.mkdir()
    # short_job_wait=0: every job task defers at once, so stage 0's short job is watched by its
    # trigger (whose poller meets the outage) from its first seconds.
    env = airflow_env(home, free_port(), project_dir, first_poll_delay=FIRST_POLL_S, short_job_wait=0)
    env.update({"VCLOUD_POLL_INTERVAL": str(POLL_S), "VCLOUD_MAX_POLL_INTERVAL": str(BACKOFF_CAP_S)})
    env.update(local_cluster.connection_env())
    env.update(login.connection_env())
    env["VCLOUD_PROFILE_OVERRIDES"] = json.dumps(
        {"local": {"paths.base": project_dir, "connection.conn_id": login.conn_id}})
    migrated_db.migrate(env)
    conf = {"profile": "local", "config": "tiny", "run_name": RUN, "stages": [0], "export": False,
            "max_epochs": MAX_EPOCHS}
    log = tmp_path / "dags-test.log"
    login.start()
    job_id = None
    with log.open("w") as out:
        run = subprocess.Popen([sys.executable, "-m", "airflow", "dags", "test", "vcloud_training", "--conf",
                                json.dumps(conf)], env=env, stdout=out, stderr=subprocess.STDOUT)
    started = time.monotonic()
    try:
        def stage_job_running() -> str | None:
            """Stage 0's job, once it runs and the task's watch has seen it run."""
            assert run.poll() is None, f"the run ended before stage 0 ran:\n{log.read_text()[-5000:]}"
            found = _job_writing(local_cluster, stage_dir)
            if found is None or found[1] != "RUNNING":
                return None
            return found[0] if f"Job {found[0]} RUNNING" in log.read_text(errors="replace") else None

        job_id = poll_until(stage_job_running, timeout=600, what="stage 0's job to run", interval=0.5)
        login.stop()
        down_at = time.monotonic()
        running_at_stop = _job_writing(local_cluster, stage_dir)
        assert running_at_stop == (job_id, "RUNNING"), (
            f"job {job_id} was {running_at_stop} when its login node went down, not RUNNING: "
            "raise MAX_EPOCHS")
        time.sleep(OUTAGE_S)  # the outage itself
        # ... and until the job has ended and slurmctld forgot it: only sacct can tell how it ended
        poll_until(lambda: _job_writing(local_cluster, stage_dir) is None, timeout=600,
                   what=f"job {job_id} to end and leave squeue", interval=1)
        down_for = time.monotonic() - down_at
        assert run.poll() is None, f"the run ended while its login node was down:\n{log.read_text()[-5000:]}"
        login.start()
        returncode = run.wait(timeout=600)
        run_s = time.monotonic() - started
    finally:
        if run.poll() is None:  # the test failed: stop the run and its job
            run.kill()
            run.wait(timeout=60)
            if job_id is not None:
                local_cluster.root("scancel", job_id, check=False)
        login.stop()

    text = log.read_text(errors="replace")
    assert returncode == 0, f"airflow dags test exited {returncode}:\n{text[-5000:]}"
    records, try_numbers = _records_and_try_numbers(env)
    [record] = records
    assert record["state"] == "success", record["task_states"]
    assert record["task_states"]["stage0"] == "success"
    stage0 = record["values"]["stage0"]
    assert stage0["job_ids"] == [job_id] and stage0["states"] == {job_id: "COMPLETED"}
    assert try_numbers["stage0"] == 1, "no task retry was spent on the outage"

    jobs = poll_until(lambda: local_cluster.jobs_writing(stage_dir), timeout=120, what="stage 0's job in sacct")
    assert jobs == [job_id], "exactly one job for stage 0"
    assert local_cluster.sacct_runs(int(job_id))[-1]["State"] == "COMPLETED"
    told = [line for line in text.splitlines() if "unreachable since" in line]
    assert len(told) == 1, told
    assert f"login node of {login.conn_id} unreachable since " in told[0]
    assert f"; job {job_id} last seen RUNNING; waiting up to 24 h" in told[0]
    assert any(f"login node of {login.conn_id} reachable again after " in line for line in text.splitlines())

    # The back-off of the watch: one outage, tried again after every failed try, reaching its cap
    # and waiting there several times, never longer.
    backoff = [(int(m["tries"]), int(m["delay"])) for m in map(BACKOFF_LINE.search, text.splitlines())
               if m and m["conn"] == login.conn_id]
    tries = [n for n, _ in backoff]
    assert tries == list(range(1, len(tries) + 1)), f"one outage, one back-off: {backoff}"
    assert len(tries) - CAPPED_FROM_TRY + 1 >= MIN_CAPPED_WAITS, (  # the waits after tries 3, 4, ...
        f"the back-off waited its cap of {BACKOFF_CAP_S} s fewer than {MIN_CAPPED_WAITS} times: {backoff}")
    assert all(delay <= BACKOFF_CAP_S for _, delay in backoff), (
        f"a wait beyond the cap of {BACKOFF_CAP_S} s (2 ** {tries[-1]} s uncapped): {backoff}")
    assert all(delay >= BACKOFF_CAP_S // 2 for n, delay in backoff if n >= CAPPED_FROM_TRY), (
        f"a wait at the cap shorter than the jitter allows ({BACKOFF_CAP_S} s, down to half): {backoff}")
    assert down_for >= OUTAGE_S
    capped = len(tries) - CAPPED_FROM_TRY + 1
    print(f"login node down for {down_for:.0f} s ({len(tries)} failed tries, {capped} "
          f"waits at the {BACKOFF_CAP_S} s cap); job {job_id} ended meanwhile and was read from sacct; "
          f"airflow dags test ran {run_s:.0f} s")
