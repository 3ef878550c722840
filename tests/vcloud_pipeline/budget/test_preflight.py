"""The ledger from this project's jobs, the allocation (Slurm's limit or the profile's) and the budget
check that fails with the numbers and their sources."""

from __future__ import annotations

import shutil
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace

import pytest

from slurm_provider.cli.sbatch import JobComment
from slurm_provider.cli.sshare import build_sshare_account
from slurm_provider.hooks import SlurmHook
from slurm_provider.cli.sshare import TresMinutes
from slurm_provider.state_vocabulary import SlurmState
from slurm_provider.job_status import JobStatus
from vcloud_pipeline.plan.jobspec import JobSpec
from vcloud_pipeline.budget.preflight import (
    PROJECT_TAG,
    PreflightError,
    check_jobs_budget,
    ledger_from_statuses,
    read_allocation,
)
from vcloud_pipeline.budget.billing import Allocation, BudgetExceeded
from vcloud_pipeline.profile import load_profile
from support.fake_slurm import EPOCH, FakeRun, FakeSlurm
from tests.vcloud_pipeline.conftest import complete_profile

LUMI = load_profile("lumi")


def job(job_id: str, state: SlurmState, *, gpus: int, elapsed: int, partition: str = "small-g",
        stage: str | None = "stage1", account: str = "project_465002500", comment: str | None = None,
        nodes: str = "nid005001", limit: int | None = None, tres: str | None = None) -> JobStatus:
    """A job as sacct lists it; its AllocTRES by default what LUMI's profile gives a GCD (16 cores, 64G)."""
    text = comment if comment is not None else JobComment(dag="vcloud_training", task=stage or "t", run="r1",
                                                          attempt=1, stage=stage, project=PROJECT_TAG).to_json()
    if tres is None:
        tres = f"billing={gpus},cpu={16 * gpus},gres/gpu={gpus},mem={64 * gpus}G,node=1"
    return JobStatus(job_id=job_id, state=state, gpus=gpus, elapsed_s=elapsed, partition=partition,
                     account=account, comment=text, node_list=nodes, time_limit_s=limit, source="sacct",
                     tres=tres)


def test_ledger_bills_this_project_jobs_and_holds_the_rest_of_running_ones() -> None:
    statuses = [
        job("1", SlurmState.COMPLETED, gpus=1, elapsed=36000),                       # 10 h x 1 GPU-hour/h
        job("2", SlurmState.TIMEOUT, gpus=1, elapsed=7200, stage="stage2"),          # 2
        job("3", SlurmState.COMPLETED, gpus=8, elapsed=3600, partition="standard-g",
            nodes="nid[005001-005002]"),                                              # 2 nodes x 4 x 1 h = 8
        job("4", SlurmState.RUNNING, gpus=1, elapsed=3600, limit=4 * 3600),          # 1 spent, 3 held
        job("7", SlurmState.COMPLETED, gpus=1, elapsed=3600, partition="dev-g",
            tres="cpu=7,gres/gpu=1,mem=60G,node=1"),                                  # 0.5
        job("5", SlurmState.COMPLETED, gpus=4, elapsed=36000, comment="someone else's job"),
        job("6", SlurmState.COMPLETED, gpus=4, elapsed=36000, account="project_other"),
    ]
    ledger = ledger_from_statuses(LUMI, statuses)
    assert ledger.used == pytest.approx(10 + 2 + 8 + 1 + 0.5)
    assert ledger.reserved == pytest.approx(3) and ledger.queued == 0
    assert ledger.summary.by_stage[("r1", "stage2")] == pytest.approx(2)
    assert ledger.summary.jobs == 5


def test_budget_fails_with_the_numbers_when_a_stage_does_not_fit() -> None:
    allocation = Allocation.from_profile(LUMI, used=99990.0, held=0.0)
    spec = JobSpec.train(1, time_limit="3-00:00:00")
    with pytest.raises(BudgetExceeded, match=r"stage 1 needs up to 72.0 GPU-hours \(0.5 x max\(ceil\(16 cores / 8\), "
                                             r"ceil\(64G / 64G\), 1 GCDs\) x 72 h\); 10 of 100000 left by the usage"):
        check_jobs_budget(LUMI, {"stage1": spec}, allocation)


def test_budget_fails_when_the_stages_together_do_not_fit() -> None:
    allocation = Allocation.from_profile(LUMI, used=99900.0, held=0.0)
    specs = {f"stage{s}": JobSpec.train(s, time_limit="1-12:00:00") for s in range(4)}
    with pytest.raises(PreflightError, match=r"need up to 144.0 GPU-hours together .* 100 of 100000 left by the "
                                             r"usage: limit 100000 \(profile lumi billing.allocation\)"):
        check_jobs_budget(LUMI, specs, allocation)
    assert set(check_jobs_budget(LUMI, dict(list(specs.items())[:2]), allocation)) == {"stage0", "stage1"}
    # Running and queued jobs holding the rest make the run's jobs wait for them, not fail.
    busy = Allocation.from_profile(LUMI, used=99900.0, held=90.0)
    assert set(check_jobs_budget(LUMI, dict(list(specs.items())[:2]), busy)) == {"stage0", "stage1"}
    in_slurm = Allocation.from_slurm(LUMI, account="project_465002500", limit_minutes=6_000_000,
                                     used_minutes=5_994_000, running_minutes=0)
    with pytest.raises(PreflightError, match=r"144.0 GPU-hours together = 8640 billing-minutes .* 100 of 100000 "
                                             r"left by the usage: limit 100000 \(Slurm association limit GrpTRESMins "
                                             r"billing=6000000 on account project_465002500\)"):
        check_jobs_budget(LUMI, specs, in_slurm)


def accounting(answer: TresMinutes | None | str) -> FakeSlurm:
    """A site's sshare for ``SlurmHook.account_tres``, on the fake Slurm: the account's association (a
    limit or none), no association (None), or sshare failing with this stderr."""
    fake = FakeSlurm()
    if isinstance(answer, TresMinutes):
        fake.allocation(answer.account, limit=answer.limit, used=answer.used, running=answer.running,
                        tres=answer.tres)
    elif isinstance(answer, str):
        fake.erring["sshare"] = (1, answer)
    return fake


def hook(fake: FakeSlurm) -> SlurmHook:
    return SlurmHook("c", runner=fake)


def test_the_allocation_is_slurms_where_the_site_sets_a_limit_else_the_profiles() -> None:
    local = load_profile("local")
    statuses = [job("1", SlurmState.COMPLETED, gpus=1, elapsed=1800, account="vcloud_local"),
                job("2", SlurmState.PENDING, gpus=0, elapsed=0, account="vcloud_local", limit=1800),
                job("3", SlurmState.RUNNING, gpus=1, elapsed=600, account="vcloud_local", limit=1800)]
    ledger = ledger_from_statuses(local, statuses)
    assert (ledger.used, ledger.queued_jobs) == (pytest.approx(0.5 + 600 / 3600), 1)
    assert (ledger.queued, ledger.reserved) == (pytest.approx(0.5), pytest.approx(0.5 + 1200 / 3600))

    slurm = accounting(TresMinutes("vcloud_local", "billing", limit=60000, used=4200, running=20))
    allocation = read_allocation(hook(slurm), local, ledger)
    assert [asked.line for asked in slurm.asked] == [build_sshare_account("vcloud_local")]
    assert allocation.source == "slurm" and allocation.limit == 1000 and allocation.used == 70
    # Slurm holds the running job's time; this project's pending job is added to it.
    assert allocation.held == pytest.approx(20 / 60 + 0.5)
    assert "+ 1 queued job(s) of this project" in allocation.held_from

    cases = {
        "account vcloud_local has no GrpTRESMins limit on billing in Slurm":
            TresMinutes("vcloud_local", "billing", limit=None, used=4200, running=20),
        "sshare lists no association for account vcloud_local": None,
        "sshare gave no answer (sshare exited 1: sshare: error: Problem talking to the database)":
            "sshare: error: Problem talking to the database\n",
    }
    for note, answer in cases.items():
        fallback = read_allocation(hook(accounting(answer)), local, ledger)
        assert fallback.source == "profile" and fallback.note == note
        assert (fallback.limit, fallback.used, fallback.held) == (1000, ledger.used, ledger.reserved)
        assert fallback.limit_from == "profile local billing.allocation"
        assert fallback.used_from == "ledger: this project's jobs in sacct"

    never_asked = accounting(None)
    off = read_allocation(hook(never_asked), load_profile("local", overrides={"billing.slurm_tres": "none"}), ledger)
    assert off.source == "profile" and "billing.slurm_tres: none" in off.note and never_asked.asked == []


def test_a_missing_container_image_fails_preflight_naming_it(tmp_path) -> None:
    from support.local_shell import local_hook

    from vcloud_pipeline.budget.preflight import check_image

    with pytest.raises(PreflightError, match=r"container image /appl/local/csc/soft/ai/images/pytorch_2.5.1.*\.sif "
                                             r"of profile lumi is missing"):
        check_image(local_hook(), LUMI)
    image = tmp_path / "pytorch.sif"
    image.write_bytes(b"SIF")
    present = load_profile("lumi", overrides={"container.image": str(image)})
    assert check_image(local_hook(), present) == str(image)
    assert check_image(local_hook(), load_profile("local", overrides={"container.runtime": "none"})) is None


def test_a_charliecloud_image_must_be_a_directory_and_ch_run_installed(tmp_path, monkeypatch) -> None:
    from support.local_shell import local_hook

    from vcloud_pipeline.budget.preflight import check_image

    image = tmp_path / "vcloud-trainer"
    profile = load_profile("local", overrides={"container.image": str(image)})
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "bash").symlink_to(shutil.which("bash") or "/bin/bash")
    monkeypatch.setenv("PATH", str(bin_dir))  # a login node's PATH without ch-run
    with pytest.raises(PreflightError, match=r"ch-run \(Charliecloud\) is not installed .* charliecloud-runtime"):
        check_image(local_hook(), profile)
    (bin_dir / "ch-run").write_text("#!/bin/sh\n")
    (bin_dir / "ch-run").chmod(0o755)
    with pytest.raises(PreflightError, match=r"Charliecloud image directory .*/vcloud-trainer of profile local is "
                                             r"missing .*`make image`"):
        check_image(local_hook(), profile)
    image.write_text("not a directory image")
    with pytest.raises(PreflightError, match="is missing or unreadable"):
        check_image(local_hook(), profile)
    image.unlink()
    image.mkdir()
    assert check_image(local_hook(), profile) == str(image)


def _find_project_jobs(sacct_text: str, *, every_run: bool) -> list[JobStatus]:
    """``find_jobs_plan`` answered with a real capture: nothing in squeue, ``sacct -D`` rows."""
    from slurm_provider.hooks import find_jobs_plan
    from slurm_provider.transport import CommandResult

    plan = find_jobs_plan(None, '"project":"vcloud"', "now-7days", every_run)
    command = next(plan)
    try:
        while True:
            stdout = sacct_text if command.verb == "sacct" else ""
            command = plan.send(CommandResult(command.line, 0, stdout, ""))
    except StopIteration as done:
        return done.value


def test_every_run_of_a_requeued_job_is_billed() -> None:
    # The local cluster's capture of a job requeued twice (runs of 15 s, 1 s and 0 s), given one GPU.
    golden = Path(__file__).resolve().parents[3] / "providers" / "slurm" / "tests" / "golden" / "sacct_requeue.txt"
    text = golden.read_text().replace("billing=1,cpu=1,", "billing=1,cpu=1,gres/gpu=1,")
    latest_only = _find_project_jobs(text, every_run=False)
    runs = _find_project_jobs(text, every_run=True)
    assert [(s.job_id, s.state, s.elapsed_s) for s in latest_only] == [("31", SlurmState.COMPLETED, 0)]
    assert sorted((s.state.value, s.elapsed_s) for s in runs) == [("COMPLETED", 0), ("REQUEUED", 1), ("REQUEUED", 15)]
    local = load_profile("local")
    ledger = ledger_from_statuses(local, runs)
    assert ledger.used == pytest.approx(16 / 3600 * local.billing.factor)
    assert ledger.summary.jobs == 1 and ledger.reserved == 0


def test_a_resubmission_is_checked_against_the_budget_again(monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow.sdk.exceptions import AirflowFailException

    from vcloud_pipeline.dag.job_operator import PipelineJobOperator
    from vcloud_pipeline.plan.layout import run_key
    from vcloud_pipeline.plan.request import parse_request
    from vcloud_pipeline.dag.tasks import build_plan

    ctx = build_plan(parse_request({"profile": "lumi", "config": "full", "time_limit": "3-00:00:00"}))
    op = PipelineJobOperator(task_id="stage1", job="stage1")
    monkeypatch.setattr(op, "_bind", lambda context: (ctx, None))

    def cluster(used_hours: float) -> FakeSlurm:
        """The fake Slurm with one finished job of the project on 8 GPUs that used ``used_hours`` over two
        runs (requeued once: the ledger must read every run), and no answer from lumi-allocations (the
        profile's allocation and the ledger)."""
        fake = FakeSlurm()
        fake.site_command("lumi-allocations", exit_status=127, stderr="bash: lumi-allocations: command not found")
        half = timedelta(seconds=int(used_hours * 3600 / 8 / 2))
        ended = fake.add("9", "vcloud.stage1", state="COMPLETED", comment=job("9", SlurmState.COMPLETED, gpus=8,
                         elapsed=0).comment, account="project_465002500", partition="small-g", node="nid005001",
                         tres="billing=8,cpu=128,gres/gpu=8,mem=512G,node=1", submit=EPOCH + half,
                         start=EPOCH + half, end=EPOCH + 2 * half)
        ended.earlier.append(FakeRun("REQUEUED", 0, 0, EPOCH, EPOCH, EPOCH + half, "nid005001", "None"))
        return fake

    op.code_version = "c" * 64
    context = {"ti": SimpleNamespace(dag_id="vcloud_training", run_id="manual__r")}
    plenty = cluster(used_hours=1000)
    op.check_before_resubmit(context, SlurmHook("c", runner=plenty))  # plenty left: resubmit
    # ... and the run's code marker is refreshed before the submit: the code stays while the run lives.
    marker = f"{ctx.paths.run_markers_dir}/{run_key('vcloud_training', 'manual__r')}-{'c' * 64}"
    assert plenty.asked[-1].line == f"umask 002; mkdir -p {ctx.paths.run_markers_dir} && touch -- {marker}"
    assert plenty.verbs == ["squeue", "sacct", "script", "touch"], "the budget checked, then the marker refreshed"
    with pytest.raises(AirflowFailException, match=r"stage 1 needs up to 72.0 GPU-hours .* of 100000 left"):
        op.check_before_resubmit(context, SlurmHook("c", runner=cluster(used_hours=99_990)))


def site(*, sshare: TresMinutes | None = None, exit_status: int | None = None, stdout: str = "",
         stderr: str = "") -> FakeSlurm:
    """A login node as the allocation sources see it, on the fake Slurm: ``sshare``'s association (or
    none) and, where ``exit_status`` is given, what the site's ``lumi-allocations`` answers."""
    fake = accounting(sshare)
    if exit_status is not None:
        fake.site_command("lumi-allocations", exit_status=exit_status, stdout=stdout, stderr=stderr)
    return fake


def asked_of(fake: FakeSlurm) -> list[str]:
    """What the sources asked: sshare's command line, or the site command's script."""
    return [(asked.stdin or "").strip() if asked.verb == "script" else asked.line for asked in fake.asked]


LUMI_TABLE = (Path(__file__).parents[1] / "golden" / "lumi_allocations.txt").read_text()
SSHARE = TresMinutes("project_465002500", "billing", limit=6_000_000, used=60_000, running=600)
LUMI_RUN = "lumi-allocations -p project_465002500"


@pytest.mark.parametrize(
    ("profile", "overrides", "login", "source", "asked", "said"),
    [
        # LUMI reads lumi-allocations: its GPU column is the limit and the usage
        ("lumi", {}, site(exit_status=0, stdout=LUMI_TABLE), "command", [LUMI_RUN],
         f"limit 100000 (site command `{LUMI_RUN}`, data updated 2026-11-27 23:10:04.551093)"),
        # ... and falls back to the profile's allocation, saying why, where the command cannot answer
        ("lumi", {}, site(exit_status=127, stderr="bash: lumi-allocations: command not found"), "profile",
         [LUMI_RUN], f"`{LUMI_RUN}` failed with exit status 127 (bash: lumi-allocations: command not found)"),
        ("lumi", {}, site(exit_status=0, stdout="Error: No projects were found\n"), "profile", [LUMI_RUN],
         f"`{LUMI_RUN}` printed what the lumi-allocations parser cannot read: lumi-allocations printed no table"),
        # a profile may choose Slurm's limit or its own figure instead
        ("lumi", {"billing.allocation_source": "slurm", "billing.allocation_command": None}, site(sshare=SSHARE),
         "slurm", [build_sshare_account("project_465002500")],
         "limit 100000 (Slurm association limit GrpTRESMins billing=6000000 on account project_465002500)"),
        ("lumi", {"billing.allocation_source": "profile", "billing.allocation_command": None}, site(), "profile",
         [], "profile lumi reads its allocation from the profile (billing.allocation_source)"),
        # profiles that name no source keep the choice they had: Slurm where slurm_tres names a TRES
        ("local", {}, site(sshare=TresMinutes("vcloud_local", "billing", limit=60000, used=0, running=0)),
         "slurm", [build_sshare_account("vcloud_local")], "limit 1000 (Slurm association limit"),
        ("local", {}, site(sshare=None), "profile", [build_sshare_account("vcloud_local")],
         "sshare lists no association for account vcloud_local"),
        ("cosmos", {}, site(), "profile", [], "does not read Slurm's limit (billing.slurm_tres: none)"),
    ],
)
def test_the_allocation_is_read_where_the_profile_says(profile: str, overrides: dict, login: FakeSlurm, source: str,
                                                      asked: list[str], said: str) -> None:
    loaded = complete_profile(profile, overrides)
    ledger = ledger_from_statuses(loaded, [])
    allocation = read_allocation(hook(login), loaded, ledger)
    assert allocation.source == source and asked_of(login) == asked
    assert said in allocation.describe()


def test_the_refusal_says_the_site_command_gave_the_figures() -> None:
    allocation = read_allocation(hook(site(exit_status=0, stdout=LUMI_TABLE)), LUMI, ledger_from_statuses(LUMI, []))
    assert (allocation.limit, allocation.used, allocation.held) == (100000.0, 8123.5, 0.0)
    specs = {"stage1": JobSpec.train(1, partition="standard-g", gpus_per_node=8, nodes=1024)}
    with pytest.raises(BudgetExceeded) as err:
        check_jobs_budget(LUMI, specs, allocation)
    assert str(err.value) == (
        "stage 1 needs up to 196608.0 GPU-hours (1024 nodes x 4 GPU-hours/node-hour x 48 h); 91876.5 of 100000 left "
        f"by the usage: limit 100000 (site command `{LUMI_RUN}`, data updated 2026-11-27 23:10:04.551093), "
        f"used 8123.5 (`{LUMI_RUN}`: every job of the project, as the site bills it), held 0 (this project's "
        "queued and running jobs); no running job's end can free that. Shorten the time limit, use fewer GCDs, or "
        "ask the project's PI to apply for more (the site's command reports the project project_465002500)")
