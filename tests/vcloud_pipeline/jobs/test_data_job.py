"""The synthetic dataset job: a short job on the debug partition that generates, then prepares."""

from __future__ import annotations

import pytest

from vcloud_pipeline.plan.jobspec import JobKind, JobSpec, JobSpecError
from vcloud_pipeline.plan.layout import run_paths
from vcloud_pipeline.profile import load_profile
from vcloud_pipeline.jobs.render import render_job


def test_data_job_generates_and_prepares_into_the_profile_data_dir_on_the_debug_partition() -> None:
    profile = load_profile("local", overrides={"paths.base": "/srv/vcloud/it's here"})
    paths = run_paths(profile, "r")
    job = render_job(profile, JobSpec.data("tiny"), paths, "a" * 64)
    assert job.job_name == "vcloud-r-data"
    assert "--partition=dev-g" in job.sbatch_options
    assert job.resources.time_seconds == profile.jobs.export_time_seconds
    python = profile.software.python
    assert (f"{python} -m vcloud.data.synthetic --out '/srv/vcloud/it'\"'\"'s here/data/raw' --preset tiny && "
            f"{python} -m vcloud.data.prepare --raw '/srv/vcloud/it'\"'\"'s here/data/raw' "
            f"--out '/srv/vcloud/it'\"'\"'s here/data/prepared' --overwrite &") in job.inner
    assert "EXPECTED_CODE_HASH=" + "a" * 64 in job.outer


def test_data_jobs_need_a_preset_and_only_data_jobs_take_one() -> None:
    assert JobSpec.data("small").kind is JobKind.DATA
    with pytest.raises(JobSpecError, match="data_preset is required for data jobs"):
        JobSpec(kind=JobKind.DATA)
    with pytest.raises(JobSpecError, match="only for them"):
        JobSpec.train(0, data_preset="tiny")
    with pytest.raises(JobSpecError, match="not a preset name"):
        JobSpec.data("tiny; rm -rf /")


def test_only_the_local_profile_generates_synthetic_data() -> None:
    assert load_profile("local").synthetic_data is True
    assert load_profile("lumi").synthetic_data is False
    assert load_profile("lumi", overrides={"synthetic_data": True}).synthetic_data is True
