"""A job task's return value, typed: :class:`JobSummary` to JSON and back, and what is not one."""

from __future__ import annotations

import json

import pytest

from slurm_provider import JobSummary
from slurm_provider.job_status import JobStatus
from slurm_provider.state_vocabulary import SlurmState

SUBMISSIONS = [{"job_id": "41", "number": 1, "cause": ""}, {"job_id": "42", "number": 2, "cause": "node fault"}]


def test_a_summary_of_the_job_that_ended_round_trips_through_json() -> None:
    status = JobStatus(job_id="42", state=SlurmState.COMPLETED, exit_code=0, elapsed_s=61, restarts=1,
                       node_list="nid005001", gpus=2)
    summary = JobSummary.of(status, ["41", "42"], 0.123456, SUBMISSIONS)
    data = json.loads(json.dumps(summary.to_json()))  # as Airflow keeps it
    assert data == {"job_id": "42", "job_ids": ["41", "42"], "state": "COMPLETED", "exit_code": 0, "elapsed_s": 61,
                    "restarts": 1, "node_list": "nid005001", "gpus": 2, "gpu_hours": 0.1235, "submissions": SUBMISSIONS}
    assert JobSummary.is_summary(data) and JobSummary.from_json(data) == summary


def test_a_subclass_may_add_keys_and_an_older_summary_still_parses() -> None:
    extended = {"job_id": "7", "job_ids": ["7"], "state": "COMPLETED", "gpu_hours": 1, "job": "stage1", "run": "r"}
    assert JobSummary.from_json(extended) == JobSummary(job_id="7", job_ids=("7",), state="COMPLETED", gpu_hours=1.0)
    older = {"job_id": 7, "job_ids": None, "state": "COMPLETED", "gpu_hours": None, "exit_code": "n/a"}
    parsed = JobSummary.from_json(older)
    assert (parsed.job_ids, parsed.gpu_hours, parsed.exit_code, parsed.restarts) == (("7",), 0.0, None, 0)


@pytest.mark.parametrize("value", [None, "done", ["7"], {"job_id": "7", "state": "COMPLETED"}])
def test_what_is_not_a_summary_is_told_apart_and_refused_naming_what_it_lacks(value: object) -> None:
    assert not JobSummary.is_summary(value)
    with pytest.raises(ValueError, match="mapping|not a job summary: no job_ids, gpu_hours"):
        JobSummary.from_json(value)  # type: ignore[arg-type]
