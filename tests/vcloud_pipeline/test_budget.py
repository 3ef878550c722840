"""GPU-hour worst cases, the ledger and the budget check, with LUMI's numbers."""

from __future__ import annotations

import pytest

from vcloud_pipeline.budget import (
    BudgetExceeded,
    Usage,
    billed_hours,
    check_budget,
    gpus_from_tres,
    summarize_ledger,
    worst_case,
)
from vcloud_pipeline.jobspec import JobSpec
from vcloud_pipeline.profiles import load_profile
from tests.vcloud_pipeline.conftest import complete_profile


def test_single_gcd_for_three_days() -> None:
    worst = worst_case(load_profile("lumi"), JobSpec.train(1))
    assert worst.amount == 72.0 and worst.describe() == "1 GCDs x 72 h x 1.0"


def test_full_node_partition_bills_all_eight_gcds_per_node() -> None:
    lumi = load_profile("lumi")
    assert worst_case(lumi, JobSpec.train(1, partition="standard-g", gpus_per_node=8)).amount == 8 * 48
    assert worst_case(lumi, JobSpec.train(1, partition="standard-g", gpus_per_node=8, nodes=4)).amount == 4 * 8 * 48
    # a preflight on a full-node partition still pays for the whole node
    assert worst_case(lumi, JobSpec.preflight(partition="standard-g")).units == 8


def test_the_seeds_576_gpu_hours_and_the_failure_message() -> None:
    lumi = load_profile("lumi", overrides={"partitions.small-g.max_gpus_per_node": 8,
                                           "partitions.small-g.cpus_per_node": 128})
    spec = JobSpec.train(1, gpus_per_node=8)
    assert worst_case(lumi, spec).amount == 576.0
    with pytest.raises(BudgetExceeded) as err:
        check_budget(lumi, spec, used=100_000 - 412.5)
    assert str(err.value).startswith(
        "stage 1 needs up to 576.0 GPU-hours (8 GCDs x 72 h x 1.0); 412.5 of 100000 left")
    assert check_budget(lumi, spec, used=100_000 - 576).amount == 576.0


def test_reserved_hours_of_queued_jobs_count() -> None:
    lumi = load_profile("lumi")
    check_budget(lumi, JobSpec.train(0), used=99_900)
    with pytest.raises(BudgetExceeded, match=r"28 of 100000 left, 72 held by queued jobs"):
        check_budget(lumi, JobSpec.train(0), used=99_900, reserved=72)


def test_untracked_allocation_always_fits() -> None:
    levante = complete_profile("levante")
    assert check_budget(levante, JobSpec.train(0, gpus_per_node=4), used=1e9).amount == 48.0


def test_ledger_per_run_and_stage() -> None:
    lumi = load_profile("lumi")
    rows = [
        Usage("full", "stage0", "small-g", 1, 1, 12 * 3600, "16000001"),
        Usage("full", "stage1", "small-g", 1, 1, 27 * 60 * 46, "16082076"),
        Usage("full", "stage1", "standard-g", 2, 3, 3600, "16100000"),  # billed as 2 whole nodes
        Usage("ddp-test", "preflight", "dev-g", 1, 1, 180, "16100001"),
    ]
    summary = summarize_ledger(lumi, rows)
    assert summary.by_stage[("full", "stage0")] == 12.0
    assert summary.by_stage[("full", "stage1")] == pytest.approx(20.7 + 16.0)
    assert summary.by_run["ddp-test"] == pytest.approx(0.05)
    assert summary.total == pytest.approx(12 + 20.7 + 16 + 0.05)
    assert summary.jobs == 4 and summary.left == pytest.approx(100_000 - summary.total)
    assert summary.lines()[-1] == "total: 48.75 of 100000 (99951.25 left) over 4 job(s)"


def test_unknown_partition_in_the_ledger_bills_allocated_gpus() -> None:
    assert billed_hours(load_profile("lumi"), Usage("r", "stage0", "gone-g", 1, 2, 1800)) == 1.0


@pytest.mark.parametrize(
    ("tres", "gpus"),
    [("billing=16,cpu=16,gres/gpu=1,mem=256M,node=1", 1), ("cpu=56,gres/gpu:mi250=8,node=1", 8), ("cpu=1", 0), ("", 0)],
)
def test_gpus_from_sacct_tres(tres: str, gpus: int) -> None:
    assert gpus_from_tres(tres) == gpus
