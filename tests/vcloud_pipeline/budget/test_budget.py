"""GPU-hour worst cases, the ledger and the budget check, with LUMI's numbers."""

from __future__ import annotations

import pytest

from slurm_provider.cli.values import gpus_from_tres
from vcloud_pipeline.budget.billing import (
    Allocation,
    BudgetExceeded,
    Usage,
    billed_hours,
    check_budget,
    slurm_minutes_from_units,
    summarize_ledger,
    units_from_slurm_minutes,
    worst_case,
)
from vcloud_pipeline.plan.jobspec import JobSpec
from vcloud_pipeline.profile import load_profile
from tests.vcloud_pipeline.conftest import complete_profile


def test_single_gcd_with_sixteen_cores_for_three_days() -> None:
    worst = worst_case(load_profile("lumi"), JobSpec.train(1))
    assert worst.amount == 72.0
    assert worst.describe() == "0.5 x max(ceil(16 cores / 8), ceil(64G / 64G), 1 GCDs) x 72 h"


def test_full_node_partition_bills_four_gpu_hours_per_node_hour() -> None:
    lumi = load_profile("lumi")
    assert worst_case(lumi, JobSpec.train(1, partition="standard-g", gpus_per_node=8)).amount == 4 * 48
    four = worst_case(lumi, JobSpec.train(1, partition="standard-g", gpus_per_node=8, nodes=4))
    assert four.amount == 4 * 4 * 48 and four.describe() == "4 nodes x 4 GPU-hours/node-hour x 48 h"
    # a preflight on a full-node partition still pays for the whole node
    assert worst_case(lumi, JobSpec.preflight(partition="standard-g")).describe() == (
        "1 node x 4 GPU-hours/node-hour x 0.25 h")


def test_a_profile_without_billing_rules_bills_its_factor_per_gpu_hour() -> None:
    local = load_profile("local")
    assert worst_case(local, JobSpec.train(0)).describe() == "1 GPUs x 0.5 h x 1.0"
    flat = load_profile("lumi", overrides={f"partitions.{name}.billing": None
                                           for name in ("small-g", "standard-g", "dev-g")})
    assert worst_case(flat, JobSpec.train(1, partition="standard-g", gpus_per_node=8)).describe() == (
        "8 GCDs x 48 h x 1.0")


def test_the_seeds_eight_gcds_for_three_days_and_the_failure_message() -> None:
    lumi = load_profile("lumi", overrides={"partitions.small-g.max_gpus_per_node": 8,
                                           "partitions.small-g.cpus_per_node": 128})
    spec = JobSpec.train(1, gpus_per_node=8)  # 128 cores, 512G: 16 slices of 8 cores
    assert worst_case(lumi, spec).amount == 576.0
    with pytest.raises(BudgetExceeded) as err:
        check_budget(lumi, spec, ledger(lumi, used=100_000 - 412.5))
    assert str(err.value).startswith(
        "stage 1 needs up to 576.0 GPU-hours (0.5 x max(ceil(128 cores / 8), ceil(512G / 64G), 8 GCDs) x 72 h); "
        "412.5 of 100000 left by the usage: limit 100000 "
        "(profile lumi billing.allocation), used 99587.5 (ledger: this project's jobs in sacct), held 0 (")
    assert str(err.value).endswith("raise billing.allocation of profile lumi if the project got more")
    assert check_budget(lumi, spec, ledger(lumi, used=100_000 - 576)).amount == 576.0


def ledger(profile, *, used: float, held: float = 0.0) -> Allocation:
    return Allocation.from_profile(profile, used=used, held=held)


def test_what_running_and_queued_jobs_hold_makes_a_job_wait_and_only_the_usage_refuses_it() -> None:
    lumi = load_profile("lumi")
    alone = ledger(lumi, used=99_900)
    assert check_budget(lumi, JobSpec.train(0), alone).amount == 72 and alone.wait_note(72) == ""
    # Teammates' running jobs hold all but 28 of the 100 the usage leaves: the 72-hour job waits for them.
    held = ledger(lumi, used=99_900, held=72)
    assert check_budget(lumi, JobSpec.train(0), held).amount == 72
    assert held.waits_for_holders(72) and not held.waits_for_holders(28) and not held.waits_for_holders(101)
    assert held.wait_note(72) == (" [running and queued jobs hold 72 now (this project's queued and running jobs), "
                                  "so it waits until they have released enough: 28 is free at the moment]")
    # The usage alone leaves 50: no running job's end frees 72.
    with pytest.raises(BudgetExceeded, match=r"50 of 100000 left by the usage: .* held 72 \(this project's queued and "
                                             r"running jobs\); no running job's end can free that"):
        check_budget(lumi, JobSpec.train(0), ledger(lumi, used=99_950, held=72))


def test_untracked_allocation_always_fits() -> None:
    levante = complete_profile("levante")
    untracked = Allocation.from_profile(levante, used=1e9, held=0.0)
    assert untracked.limit is None and untracked.left is None
    assert check_budget(levante, JobSpec.train(0, gpus_per_node=4), untracked).amount == 48.0


def test_slurm_minutes_and_gpu_hours_convert_in_one_place() -> None:
    local = load_profile("local")  # TRESBillingWeights=GRES/gpu=1.0: one GPU-hour is 60 billing-minutes
    assert (local.billing.slurm_tres, local.billing.slurm_minutes_per_unit) == ("billing", 60.0)
    assert units_from_slurm_minutes(local.billing, 60000) == 1000.0 == local.billing.allocation
    assert slurm_minutes_from_units(local.billing, worst_case(local, JobSpec.train(0)).amount) == 30.0
    halved = load_profile("local", overrides={"billing.slurm_minutes_per_unit": 120})
    assert units_from_slurm_minutes(halved.billing, 60000) == 500.0


def test_slurms_limit_wins_and_the_refusal_names_every_figure_and_its_source() -> None:
    local = load_profile("local")
    held = Allocation.from_slurm(local, account="vcloud_local", limit_minutes=600, used_minutes=540,
                                 running_minutes=30, queued=0.25, queued_jobs=1)
    assert (held.limit, held.used, held.held, held.left) == (10.0, 9.0, 0.75, 0.25)
    assert held.source == "slurm" and held.remaining == 1.0
    # 1 GPU x 30 min = 0.5 GPU-hours: the usage leaves 1, running and queued jobs hold all but 0.25 of it.
    assert check_budget(local, JobSpec.train(0), held).amount == 0.5 and held.waits_for_holders(0.5)
    spent = Allocation.from_slurm(local, account="vcloud_local", limit_minutes=600, used_minutes=580,
                                  running_minutes=10, queued=0.25, queued_jobs=1)
    with pytest.raises(BudgetExceeded) as err:
        check_budget(local, JobSpec.train(0), spent)
    assert str(err.value) == (
        "stage 0 needs up to 0.5 GPU-hours (1 GPUs x 0.5 h x 1.0 = 30 billing-minutes); 0.33 of 10 left by the "
        "usage: limit 10 (Slurm association limit GrpTRESMins billing=600 on account vcloud_local), "
        "used 9.67 (Slurm GrpTRESRaw billing=580 of account vcloud_local, every job of the account), "
        "held 0.42 (Slurm TRESRunMins billing=10 of the account's running jobs + 1 queued job(s) of this project); "
        "no running job's end can free that. "
        "Shorten the time limit, use fewer GPUs, or ask the project's PI or the cluster support to raise "
        "GrpTRESMins of account vcloud_local")
    assert held.to_json()["slurm"] == {"account": "vcloud_local", "tres": "billing", "limit": 600, "used": 540,
                                       "running": 30, "minutes_per_unit": 60.0}
    assert "billing=600" in held.describe() and held.to_json()["left"] == 0.25


GIB = 1024.0


def test_ledger_per_run_and_stage() -> None:
    lumi = load_profile("lumi")
    rows = [
        Usage("full", "stage0", "small-g", 1, 1, 12 * 3600, "16000001", cores=16, mem_mib=64 * GIB),
        Usage("full", "stage1", "small-g", 1, 1, 27 * 60 * 46, "16082076", cores=16, mem_mib=64 * GIB),
        Usage("full", "stage1", "standard-g", 2, 3, 3600, "16100000"),  # 2 whole nodes: 8 GPU-hours
        Usage("ddp-test", "preflight", "dev-g", 1, 1, 360, "16100001", cores=7, mem_mib=60 * GIB),
    ]
    summary = summarize_ledger(lumi, rows)
    assert summary.by_stage[("full", "stage0")] == 12.0
    assert summary.by_stage[("full", "stage1")] == pytest.approx(20.7 + 8.0)
    assert summary.by_run["ddp-test"] == pytest.approx(0.05)
    assert summary.total == pytest.approx(12 + 20.7 + 8 + 0.05)
    assert summary.jobs == 4 and summary.left == pytest.approx(100_000 - summary.total)
    assert summary.lines()[-1] == "total: 40.75 over 4 job(s)"


def test_unknown_partition_in_the_ledger_bills_allocated_gpus() -> None:
    assert billed_hours(load_profile("lumi"), Usage("r", "stage0", "gone-g", 1, 2, 1800)) == 1.0


@pytest.mark.parametrize(
    ("tres", "gpus"),
    [("billing=16,cpu=16,gres/gpu=1,mem=256M,node=1", 1), ("cpu=56,gres/gpu:mi250=8,node=1", 8), ("cpu=1", 0), ("", 0)],
)
def test_gpus_from_sacct_tres(tres: str, gpus: int) -> None:
    assert gpus_from_tres(tres) == gpus
