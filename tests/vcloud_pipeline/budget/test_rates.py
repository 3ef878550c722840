"""LUMI's billing rules per partition against the figures its billing page documents
(docs/runjobs/lumi_env/billing.md of Lumi-supercomputer/lumi-userguide): one GPU-hour is one MI250X
module (2 GCDs) for one hour; standard-g bills 4 GPU-hours per node-hour; small-g and dev-g bill
0.5 x max(ceil(cores / 8), ceil(memory / 64 GB), GCDs) per hour."""

from __future__ import annotations

import pytest

from vcloud_pipeline.budget.rates import HourlyRate, JobShape, hourly_rate
from vcloud_pipeline.profile import load_profile

LUMI = load_profile("lumi")
GIB = 1024.0


@pytest.mark.parametrize(
    ("partition", "shape", "hours", "gpu_hours"),
    [
        # standard-g: "one node hours correspond to 4 GPU-hours", whatever the job holds of the node
        ("standard-g", JobShape(nodes=1, gpus=8, cores=56, mem_mib=0), 1, 4.0),
        ("standard-g", JobShape(nodes=1, gpus=1, cores=7), 1, 4.0),
        # the page's example: 4 nodes for 24 hours = 4 * 4 * 24
        ("standard-g", JobShape(nodes=4, gpus=32, cores=224), 24, 384.0),
        # small-g, 1 GCD, 16 cores, 64 GB: 0.5 x max(2, 1, 1)
        ("small-g", JobShape(nodes=1, gpus=1, cores=16, mem_mib=64 * GIB), 1, 1.0),
        # small-g, 1 GCD, 8 cores, 64 GB: 0.5 x max(1, 1, 1)
        ("small-g", JobShape(nodes=1, gpus=1, cores=8, mem_mib=64 * GIB), 1, 0.5),
        # the page's examples: 2 GCDs for 24 hours = 24; 1 GCD with 128 GB for 24 hours = 24
        ("small-g", JobShape(nodes=1, gpus=2, cores=16, mem_mib=128 * GIB), 24, 24.0),
        ("small-g", JobShape(nodes=1, gpus=1, cores=8, mem_mib=128 * GIB), 24, 24.0),
        # small-g, 4 GCDs with the whole node's 56 cores and 256 GB: 0.5 x max(7, 4, 4)
        ("small-g", JobShape(nodes=1, gpus=4, cores=56, mem_mib=256 * GIB), 1, 3.5),
        # dev-g, 1 GCD, 7 cores, 60 GB: 0.5 x max(1, 1, 1)
        ("dev-g", JobShape(nodes=1, gpus=1, cores=7, mem_mib=60 * GIB), 1, 0.5),
        # dev-g, 8 GCDs, 56 cores, 480 GB: 0.5 x max(7, 8, 8)
        ("dev-g", JobShape(nodes=1, gpus=8, cores=56, mem_mib=480 * GIB), 1, 4.0),
        # dev-g, 8 GCDs, 56 cores, 512 GB on 2 nodes of 4 each: 0.5 x max(7, 8, 8) per hour, for 2 hours
        ("dev-g", JobShape(nodes=2, gpus=8, cores=56, mem_mib=512 * GIB), 2, 8.0),
    ],
)
def test_lumi_partitions_bill_as_the_billing_page_says(partition: str, shape: JobShape, hours: float,
                                                       gpu_hours: float) -> None:
    assert hourly_rate(LUMI, partition, shape).amount(hours * 3600) == gpu_hours


@pytest.mark.parametrize(
    ("partition", "shape", "rule"),
    [
        ("standard-g", JobShape(nodes=1, gpus=8), "1 node x 4 GPU-hours/node-hour"),
        ("standard-g", JobShape(nodes=3, gpus=24), "3 nodes x 4 GPU-hours/node-hour"),
        ("small-g", JobShape(nodes=1, gpus=1, cores=16, mem_mib=64 * GIB),
         "0.5 x max(ceil(16 cores / 8), ceil(64G / 64G), 1 GCDs)"),
        ("dev-g", JobShape(nodes=1, gpus=2, cores=14, mem_mib=120 * GIB),
         "0.5 x max(ceil(14 cores / 8), ceil(120G / 64G), 2 GCDs)"),
        ("gone-g", JobShape(nodes=1, gpus=2), "2 GCDs"),  # not in the profile: the flat factor
    ],
)
def test_the_rule_reads_as_the_site_states_it(partition: str, shape: JobShape, rule: str) -> None:
    assert hourly_rate(LUMI, partition, shape).rule == rule


def test_the_description_puts_the_hours_after_the_rule_and_the_flat_factor_last() -> None:
    assert HourlyRate(4.0, "1 node x 4 GPU-hours/node-hour").describe(72 * 3600) == (
        "1 node x 4 GPU-hours/node-hour x 72 h")
    assert HourlyRate(8.0, "8 GCDs", factor=1.0).describe(1800) == "8 GCDs x 0.5 h x 1.0"
    assert HourlyRate(8.0, "8 GCDs", factor=1.0).amount(-5) == 0.0


@pytest.mark.parametrize(
    ("tres", "shape"),
    [
        ("billing=16,cpu=16,gres/gpu=1,mem=64G,node=1", JobShape(nodes=1, gpus=1, cores=16, mem_mib=64 * GIB)),
        ("cpu=112,mem=960G,node=2,gres/gpu=16", JobShape(nodes=2, gpus=16, cores=112, mem_mib=960 * GIB)),
        ("cpu=4,mem=500M,node=1", JobShape(nodes=1, gpus=0, cores=4, mem_mib=500)),
        ("cpu=1,mem=1T", JobShape(nodes=1, gpus=0, cores=1, mem_mib=1024 * GIB)),
        ("", JobShape(nodes=1, gpus=0)),
        (None, JobShape(nodes=1, gpus=0)),
    ],
)
def test_what_a_job_held_from_sacct_alloc_tres(tres: str | None, shape: JobShape) -> None:
    assert JobShape.from_tres(tres, nodes=shape.nodes, gpus=shape.gpus) == shape


def test_profiles_without_billing_rules_keep_their_factor_per_gpu_hour() -> None:
    for name in ("local", "levante", "cosmos"):
        profile = load_profile(name)
        assert {spec.billing.kind for spec in profile.partitions.values()} == {"gpu"}, name
        partition = profile.default_partition
        rate = hourly_rate(profile, partition, JobShape(nodes=1, gpus=2, cores=64, mem_mib=512 * GIB))
        per_node = profile.accelerator.per_node if profile.partitions[partition].full_node else 2
        assert rate.per_hour == per_node * profile.billing.factor, name
