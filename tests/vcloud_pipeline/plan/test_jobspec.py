"""Job requests checked against partition limits before they reach the queue."""

from __future__ import annotations

import pytest

from vcloud_pipeline.plan.jobspec import JobKind, JobSpec, JobSpecError, resolve_resources
from vcloud_pipeline.profile import load_profile
from tests.vcloud_pipeline.conftest import complete_profile


def test_lumi_single_gcd_defaults_are_the_guides() -> None:
    res = resolve_resources(load_profile("lumi"), JobSpec.train(1))
    assert res.partition.name == "small-g"
    assert (res.nodes, res.gpus_per_node, res.cpus_per_task, res.mem) == (1, 1, 16, "64G")
    assert res.time_seconds == 3 * 86400


def test_cpu_default_is_capped_at_the_node() -> None:
    res = resolve_resources(load_profile("lumi"), JobSpec.train(1, gpus_per_node=4))
    assert res.cpus_per_task == 56 and res.mem == "256G"


def test_full_node_partition_bills_every_gcd() -> None:
    res = resolve_resources(load_profile("lumi"), JobSpec.train(1, partition="standard-g", gpus_per_node=8, nodes=2))
    assert res.gpus_per_node == 8 and res.nodes == 2 and res.mem is None
    with pytest.raises(JobSpecError, match=r"standard-g of profile lumi allocates whole nodes and bills all 8 GCDs"):
        resolve_resources(load_profile("lumi"), JobSpec.train(1, partition="standard-g"))


def test_preflight_defaults_to_the_debug_partition() -> None:
    res = resolve_resources(load_profile("lumi"), JobSpec.preflight())
    assert res.partition.name == "dev-g" and res.time_seconds == 900


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (JobSpec.train(0, partition="small-gx"), r"partition 'small-gx' not in profile lumi \(known: small-g, standard-g, dev-g\)"),
        (JobSpec.train(0, gpus_per_node=5), r"small-g of profile lumi allows 4 GCDs per node; asked for 5"),
        (JobSpec.train(0, nodes=2), r"small-g of profile lumi allows at most 1 node\(s\) per job; asked for 2"),
        (JobSpec.train(0, time_limit="4-00:00:00"), r"allows at most 72 h; asked for 96 h"),
        (JobSpec.train(0, partition="dev-g", time_limit="00:05:00"), r"not longer than the pre-timeout signal lead"),
        (JobSpec.train(0, partition="standard-g", nodes=2, gpus_per_node=4), r"whole nodes"),
        (JobSpec.export(gpus_per_node=2), r"export jobs run one process on one GCD"),
    ],
)
def test_requests_beyond_partition_limits_are_refused(spec: JobSpec, message: str) -> None:
    with pytest.raises(JobSpecError, match=message):
        resolve_resources(load_profile("lumi"), spec)


def test_levante_cpu_request_above_gpu_node_cores_is_refused_before_submit() -> None:
    levante = complete_profile("levante")
    with pytest.raises(JobSpecError, match=r"64 CPU cores per node; asked for 128.*More processors requested than permitted"):
        resolve_resources(levante, JobSpec.train(1, cpus_per_task=128))
    assert resolve_resources(levante, JobSpec.train(1, cpus_per_task=64)).cpus_per_task == 64


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"kind": JobKind.TRAIN, "stage": 4}, "not a training stage"),
        ({"kind": JobKind.EXPORT, "stage": 1}, "export jobs have no stage"),
        ({"kind": JobKind.TRAIN, "stage": 0, "nodes": 0}, "nodes must be a positive integer"),
        ({"kind": JobKind.TRAIN, "stage": 0, "mem": "lots"}, "not a Slurm memory size"),
        ({"kind": JobKind.TRAIN, "stage": 0, "config": "/etc/passwd"}, "inside the code directory"),
        ({"kind": JobKind.TRAIN, "stage": 0, "config": "../x.yaml"}, "inside the code directory"),
        ({"kind": JobKind.TRAIN, "stage": 0, "time_limit": "soon"},
         "time_limit: 'soon' is not a Slurm time limit; use one of Slurm's forms"),
        ({"kind": JobKind.TRAIN, "stage": 1, "on_code_change": "ignore"},
         "on_code_change 'ignore' is for training jobs only, one of keep_weights, refuse"),
        ({"kind": JobKind.EXPORT, "on_code_change": "refuse"}, r"for training jobs only.*\(kind export\)"),
    ],
)
def test_job_spec_validation(kwargs: dict, message: str) -> None:
    with pytest.raises(JobSpecError, match=message):
        JobSpec(**kwargs)


def test_kind_accepts_its_string_value() -> None:
    assert JobSpec(kind="export").kind is JobKind.EXPORT  # type: ignore[arg-type]
    assert JobSpec.train(2).label == "stage2" and JobSpec.preflight().label == "preflight"


def test_stage_jobs_of_a_profile_with_stage_time_min_may_start_shorter_other_jobs_never() -> None:
    lumi = load_profile("lumi")
    assert lumi.jobs.stage_time_min == 24 * 3600
    assert resolve_resources(lumi, JobSpec.train(1)).time_min_seconds == 24 * 3600  # of small-g's 3 days
    assert resolve_resources(lumi, JobSpec.train(1, time_limit="12:00:00")).time_min_seconds is None, \
        "a limit at or below the time-min has nothing to shorten"
    assert resolve_resources(lumi, JobSpec.preflight()).time_min_seconds is None
    assert resolve_resources(lumi, JobSpec.export()).time_min_seconds is None
    assert resolve_resources(load_profile("local"), JobSpec.train(1)).time_min_seconds is None


def test_a_stage_time_min_that_leaves_no_time_to_train_is_refused_with_the_least_that_works() -> None:
    with pytest.raises(ValueError, match=r"stage_time_min 900 s .* at least 1200 s"):
        load_profile("lumi", overrides={"jobs": {"stage_time_min": "00:15:00"}})
