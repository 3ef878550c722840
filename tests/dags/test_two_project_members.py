"""Two members of one project (two login users of one Slurm account) train the same run name.

Each has an Airflow deployment of their own (a DAG runner process, :mod:`support.dag_runner`, with
its own home and database) and their own connection (their own user and key), and both trigger the run at the same
moment in the project's shared directory. Whatever their timing, every directory a job writes gets
exactly one job between them: a stage is trained by one member's job, and the other member's task
either finds it complete or refuses, naming the live job, its user and its run, without submitting
a second writer and without adopting a job that is not its user's.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from support.concurrent_deployments import dags_test_together, deployments
from support.localcluster import LocalCluster, poll_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800), pytest.mark.usefixtures("cluster_connection")]
RUN = "team"


def _sacct_user(cluster: LocalCluster, job_id: str) -> str:
    return cluster.root("sacct", "-X", "-n", "-P", "-j", job_id, "--format=User").stdout.split()[0]


def test_two_members_of_a_project_get_one_job_per_stage_or_a_refusal_naming_the_other(
        local_cluster: LocalCluster, tmp_path: Path) -> None:
    project_dir = local_cluster.test_dir()
    local_cluster.ssh(f"chmod 2775 {shlex.quote(project_dir)}")  # the project group's directory
    users = {"a": (local_cluster.user, local_cluster.conn_id),
             "b": (local_cluster.teammate, local_cluster.teammate_conn_id)}
    envs = deployments(local_cluster, tmp_path, project_dir, {n: conn for n, (_, conn) in users.items()})
    states, logs = dags_test_together(envs, tmp_path, run_name=RUN, force_stages=[3])  # stage 3 too: every stage once

    outputs = f"{project_dir}/outputs/{RUN}"
    directories = {"data": f"{project_dir}/data/synthetic-tiny", **{f"stage{n}": f"{outputs}/stage{n}" for n in range(4)}}

    def every_stage_has_its_job() -> dict[str, list[str]] | None:
        found = {k: local_cluster.jobs_writing(d) for k, d in directories.items()}
        return found if all(found.values()) else None

    jobs = poll_until(every_stage_has_its_job, timeout=120, what="every stage's job in sacct")
    assert not {what: ids for what, ids in jobs.items() if len(ids) != 1}, jobs  # the ones with more named
    for stage in range(4):
        local_cluster.ssh(f"test -f {outputs}/stage{stage}/COMPLETE")
    trained_by = {label: _sacct_user(local_cluster, ids[0]) for label, ids in jobs.items()}
    assert set(trained_by.values()) <= {u for u, _ in users.values()}, trained_by

    refused = {}
    for name, (user, _) in users.items():
        other = next(u for n, (u, _) in users.items() if n != name)
        said = re.findall(rf"job (\d+) of user {other} \(DAG vcloud_training, run [^,]+, task \w+\) is "
                          rf"(?:RUNNING|PENDING|CONFIGURING|COMPLETING) and writes (\S+); this task logs in as {user}",
                          logs[name])
        if states[name] != "success":
            assert said, f"deployment {name} failed without naming the other member's job:\n{logs[name][-5000:]}"
            job_id, where = said[0]
            assert f"ask {other} to cancel it (scancel {job_id})" in logs[name]
            assert _sacct_user(local_cluster, job_id) == other
            assert where in {*directories.values(), f"{project_dir}/viewer_data/{RUN}"}, where
            refused[name] = job_id
    assert len(refused) <= 1, "at most one member is refused: the other trains the run to its end"
    print(f"trained by {trained_by}; refused (deployment: the other member's job): {refused}")
    assert "watching it instead of submitting a second job" not in logs["a"] + logs["b"], \
        "a job of another user is never adopted"
