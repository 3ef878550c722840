"""What a job task of the training run returns (:class:`RunJobSummary`): the provider's summary and the run's facts."""

from __future__ import annotations

import json

from slurm_provider import JobSummary

from vcloud_pipeline.dag.job_summary import RunJobSummary

JOB = JobSummary(job_id="42", job_ids=("41", "42"), state="COMPLETED", gpu_hours=0.5, restarts=1)


def test_a_run_jobs_summary_is_one_flat_json_mapping_with_the_providers_keys_and_parses_back() -> None:
    summary = RunJobSummary(job=JOB, label="stage1", run="r", profile="lumi", code_hash="c" * 64,
                            states={"41": "NODE_FAIL", "42": "COMPLETED"}, metrics={"psnr": 31.5}, best_epoch=3,
                            epochs=4, validation_gain=0.25, gain_metric="psnr", stop_reason="epochs",
                            curve={"steps": [1, 2]})
    data = json.loads(json.dumps(summary.to_json()))
    assert {k: data[k] for k in JOB.to_json()} == JOB.to_json()
    assert (data["job"], data["run"], data["restarts"], data["validation_gain"]) == ("stage1", "r", 1, 0.25)
    assert RunJobSummary.from_json(data) == summary
    assert summary.gpu_hours == 0.5


def test_a_plain_job_tasks_summary_parses_with_no_run_facts() -> None:
    parsed = RunJobSummary.from_json(JOB.to_json())
    assert parsed.job == JOB and parsed.label is None and parsed.metrics is None and parsed.validation_gain is None
