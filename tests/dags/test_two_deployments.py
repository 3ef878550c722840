"""Two Airflow deployments train the same run on the same cluster at the same moment.

Each is its own Airflow home, database and process (:mod:`support.dag_runner`), both with the same
profile, project directory and run name, started together. Whatever their timing, every directory a
job writes (the synthetic dataset, each stage's outputs, the viewer export) gets exactly one job
between them: the second submitter finds the first one's live job and watches it, or finds the
stage complete and skips it. Both runs end successfully, and accounting shows one job per stage.
Then the race is narrowed to what decides it, stage 0 of a new run name, and run ten times in a row
by the same two deployments.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from support.concurrent_deployments import RacingDeployments, deployments
from support.localcluster import LocalCluster, poll_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(2400), pytest.mark.usefixtures("cluster_connection")]
RUN = "shared"
REPEATS = 10


def test_two_deployments_get_one_job_per_directory_of_a_whole_run_and_of_ten_stage_races_in_a_row(
        local_cluster: LocalCluster, tmp_path: Path) -> None:
    project_dir = local_cluster.test_dir()
    envs = deployments(local_cluster, tmp_path, project_dir, {"a": None, "b": None})
    with RacingDeployments(envs, tmp_path) as racing:  # each deployment's process and parsed DAG stay
        _a_whole_run_gets_one_job_per_directory(racing, local_cluster, project_dir)
        _ten_races_for_stage0_get_one_job_each(racing, local_cluster, project_dir)


def _a_whole_run_gets_one_job_per_directory(racing: RacingDeployments, local_cluster: LocalCluster,
                                            project_dir: str) -> None:
    """Every directory of one run (data, each stage, the export) gets one job between the two."""
    states, logs = racing.run_together(run_name=RUN, force_stages=[3])  # stage 3 too: every stage once
    for name, state in states.items():
        assert state == "success", f"deployment {name}'s run ended {state}:\n{logs[name][-5000:]}"

    outputs = f"{project_dir}/outputs/{RUN}"
    directories = {"data": f"{project_dir}/data/synthetic-tiny", "export": f"{project_dir}/viewer_data/{RUN}",
                   **{f"stage{n}": f"{outputs}/stage{n}" for n in range(4)}}

    def every_directory_has_its_job() -> dict[str, list[str]] | None:
        found = {k: local_cluster.jobs_writing(d) for k, d in directories.items()}
        return found if all(found.values()) else None

    poll_until(every_directory_has_its_job, timeout=120, what="every directory's job in sacct")
    local_cluster.accounting_caught_up()  # a second job would be in accounting by now
    jobs = {k: local_cluster.jobs_writing(d) for k, d in directories.items()}
    assert not {what: ids for what, ids in jobs.items() if len(ids) != 1}, jobs  # the ones with more named
    for stage in range(4):
        local_cluster.ssh(f"test -f {outputs}/stage{stage}/COMPLETE")
    # Every shared job was watched by both deployments or skipped by the later one: never submitted twice.
    watched = sum("watching it instead of submitting a second job" in text for text in logs.values())
    assert watched >= 1, "the race was never run: one deployment finished before the other started"


def _ten_races_for_stage0_get_one_job_each(racing: RacingDeployments, local_cluster: LocalCluster,
                                           project_dir: str) -> None:
    """The race above narrowed to what decides it (stage 0 of a new run name, both deployments at
    once) and run ten times in a row, beside whatever else loads the machine: each time, exactly one
    stage-0 job, both runs successful."""
    outcomes = []
    for attempt in range(REPEATS):
        run = f"race{attempt}"
        states, texts = racing.run_together(run_name=run, stages=[0], export=False)
        for name, state in states.items():
            assert state == "success", f"{run}: deployment {name}'s run ended {state}:\n{texts[name][-5000:]}"
        stage_dir = f"{project_dir}/outputs/{run}/stage0"
        local_cluster.ssh(f"test -f {stage_dir}/COMPLETE")
        local_cluster.accounting_caught_up()
        jobs = local_cluster.jobs_writing(stage_dir)
        said = "\n".join(texts.values())
        how = ("watched" if "watching it instead of submitting a second job" in said else
               "done under the lock" if "found under the submit lock" in said else "skipped")
        outcomes.append((run, jobs, how))
        assert len(jobs) == 1, outcomes
    print("ten races, one job each:", outcomes)
