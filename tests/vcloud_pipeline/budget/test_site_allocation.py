"""Parsing what a site's allocation command prints: LUMI's ``lumi-allocations``, from golden samples
written in the format its source prints (Lumi-supercomputer/lumi-allocations, ``printQuotas``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from vcloud_pipeline.budget.site_allocation import (
    SiteAllocation,
    SiteOutputError,
    parse_lumi_allocations,
    parse_site_allocation,
)
from vcloud_pipeline.profile import load_profile

GOLDEN = Path(__file__).parents[1] / "golden"


@pytest.mark.parametrize(
    ("sample", "project", "expected"),
    [
        ("lumi_allocations.txt", "project_465002500",
         SiteAllocation(limit=100000.0, used=8123.5, updated="2026-11-27 23:10:04.551093")),
        ("lumi_allocations.txt", "project_462000008",
         SiteAllocation(limit=None, used=0.0, updated="2026-11-27 23:10:04.551093")),  # "0/0 (N/A)"
        # the 2023 version: no "Data updated" line, "N/A" alone where nothing is allocated
        ("lumi_allocations_2023.txt", "project_465002500", SiteAllocation(limit=100000.0, used=8123.5)),
        ("lumi_allocations_2023.txt", "project_462000008", SiteAllocation(limit=None, used=0.0)),
    ],
)
def test_lumi_allocations_gpu_hours_of_the_project(sample: str, project: str, expected: SiteAllocation) -> None:
    assert parse_lumi_allocations((GOLDEN / sample).read_text(), project) == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("Error: You do not have permissions to access project_465002500\n",
         r"printed no table \(no line starting with 'Project \|'\): 'Error: You do not have permissions"),
        ("Project |CPU (used/allocated)|Storage (used/allocated)\nproject_465002500|1/2 (50.0%) core/hours|N/A\n",
         r"no column 'GPU \(used/allocated\)' \(columns: Project, CPU \(used/allocated\), Storage"),
        ("Project |GPU (used/allocated)\nproject_465002500|lots\n",
         r"GPU cell of project_465002500 is not 'used/allocated \(x%\) gpu/hours': 'lots'"),
        ("Project |GPU (used/allocated)\nproject_465000001|1/2 (50.0%) gpu/hours\n",
         r"lists no project project_465002500 \(listed: project_465000001\); check the profile's account"),
    ],
)
def test_output_it_cannot_read_says_what_it_found(text: str, message: str) -> None:
    with pytest.raises(SiteOutputError, match=message):
        parse_lumi_allocations(text, "project_465002500")


def test_the_lumi_profile_names_the_command_and_its_format() -> None:
    lumi = load_profile("lumi")
    command = lumi.billing.allocation_command
    assert lumi.billing.source == "command" and command is not None
    assert command.run == "lumi-allocations -p project_465002500"  # {account} filled in, shell-quoted
    quoted = load_profile("lumi", overrides={"account": "project x"}).billing.allocation_command
    assert quoted is not None and quoted.run == "lumi-allocations -p 'project x'"
    golden = (GOLDEN / "lumi_allocations.txt").read_text()
    assert parse_site_allocation(command, golden, lumi.account).limit == 100000.0


def test_the_lumi_profile_on_the_local_cluster_reads_slurms_limit() -> None:
    from vcloud_pipeline.profile import overrides_from_environ
    from vcloud_pipeline.profile.site_facts import LOCAL_SITE_FACTS, SITE_FACTS_ENV

    facts = overrides_from_environ("lumi", {SITE_FACTS_ENV: str(LOCAL_SITE_FACTS)})
    here = load_profile("lumi", overrides=facts)
    assert here.billing.source == "slurm" and here.billing.allocation_command is None
    assert here.partitions["standard-g"].billing.kind == "node"  # billed as on LUMI
