"""A job pending on its account's allocation, through dag.test() on the real local cluster.

Each test makes a Slurm account of its own with a small ``GrpTRESMins=billing=N`` (the shared
account's limit stays as it is; ``AccountingStorageEnforce=...safe`` and ``TRESBillingWeights=
GRES/gpu=1.0``: a GPU-minute is a billing-minute). Case 1: another user's running GPU job holds most
of the allocation for its long time limit, so the task's job pends with ``AssocGrpBillingMinutes``:
the task waits, logs whose running jobs hold how much, and succeeds once that job ends. Case 2: the
account's usage leaves less than the job needs: the task fails at once and cancels its job.
"""

from __future__ import annotations

import re
import threading

import pytest

from support.lifecycle import Injector, batch_script, jobs_of, run_lifecycle
from support.localcluster import LocalCluster, PrivateAccount, poll_until
from slurm_provider.watch.allocation import AllocationVerdict

pytestmark = pytest.mark.usefixtures("cluster_connection", "airflow_home")

REASON = "AssocGrpBillingMinutes"


def _pending_on_the_allocation(cluster: LocalCluster, job: int) -> bool:
    out = cluster.root("squeue", "-h", "-j", str(job), "-o", "%T %r", check=False).stdout.split()
    return out == ["PENDING", REASON]


def test_a_job_waits_while_a_teammates_running_job_holds_the_allocation(
        local_cluster: LocalCluster, capfd: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    log_dir = local_cluster.test_dir()
    # Evidence that the watch judged the allocation and said who holds it: the real verdict's log line,
    # noted as it is written (the trigger runs in this process under dag.test()).
    said = threading.Event()
    waiting = AllocationVerdict.waiting

    def noting(verdict: AllocationVerdict) -> str:
        text = waiting(verdict)
        if verdict.figures.holders:
            said.set()
        return text

    monkeypatch.setattr(AllocationVerdict, "waiting", noting)
    with local_cluster.private_account(billing_minutes=300) as account:
        # root's 1-GPU job holds 250 of the 300 billing-minutes for its time limit; the task's job asks
        # 1 GPU x 100 minutes: 50 are free now, 300 less the usage once root's job ends.
        holder = int(local_cluster.root("sbatch", "--parsable", f"--account={account.name}", "--gpus=1",
                                        "--time=250", "--output=/dev/null", "--wrap=sleep 3000").stdout.strip())
        local_cluster.wait_for_state(holder, {"RUNNING"}, timeout=180)
        assert 240 <= account.billing()[3].get("root", 0) <= 250  # Slurm counts it down every 5 minutes

        def end_the_holder_once_the_task_said_who_holds_it(job: int) -> None:
            poll_until(lambda: _pending_on_the_allocation(local_cluster, job), timeout=120,
                       what=f"job {job} to pend with {REASON}")
            assert said.wait(180), "the task never logged whose running jobs hold the allocation"
            local_cluster.root("scancel", str(holder))

        injector = Injector(local_cluster, log_dir, end_the_holder_once_the_task_said_who_holds_it,
                            states=frozenset({"PENDING"}))
        injector.start()
        outcome = run_lifecycle(capfd, script=batch_script("echo started after the holder ended"), log_dir=log_dir,
                                time_limit="100", sbatch_options=["--gpus=1"], account=account.name)
        injector.join(5)
    assert injector.error is None, injector.error
    assert outcome.state == "success", outcome.output[-4000:]
    (job_id,) = jobs_of(local_cluster, outcome)
    # What root's running job holds shrinks, and its usage grows, as it runs (every 5 minutes in Slurm).
    said_line = re.search(
        rf"Job {job_id} waits for the allocation of account {account.name}: GrpTRESMins billing=300, used (\d+) "
        r"\(GrpTRESRaw\), running jobs hold (\d+) \(TRESRunMins: root (\d+)\)\. It needs 100 billing-minutes, "
        r"the usage leaves (\d+): it starts once running jobs of the account have released enough \(for at most "
        r"1-00:00:00: watch_deadline\)", outcome.output)
    assert said_line, outcome.output[-4000:]
    used, held, by_root, leaves = map(int, said_line.groups())
    assert 240 <= held == by_root <= 250 and used + held <= 250 and leaves == 300 - used
    assert f"[job {job_id}] started after the holder ended" in outcome.output
    assert local_cluster.sacct_runs(holder)[-1]["State"].startswith("CANCELLED")


def _spend(account: PrivateAccount, cluster: LocalCluster) -> int:
    """Run a short 2-GPU job on the account and wait until Slurm counts its usage; returns the usage."""
    job = int(cluster.root("sbatch", "--parsable", f"--account={account.name}", "--gpus=2", "--time=5",
                           "--output=/dev/null", "--wrap=sleep 45").stdout.strip())
    cluster.wait_for_state(job, {"COMPLETED"}, timeout=300)
    return poll_until(lambda: account.billing()[1], timeout=120,
                      what=f"slurmctld to count job {job}'s billing-minutes as usage of {account.name}")


def test_a_job_the_usage_leaves_too_little_for_fails_at_once_and_is_cancelled(
        local_cluster: LocalCluster, capfd: pytest.CaptureFixture) -> None:
    log_dir = local_cluster.test_dir()
    with local_cluster.private_account(billing_minutes=1000) as account:
        used = _spend(account, local_cluster)
        # The usage leaves 5 billing-minutes; the job asks 1 GPU x 10 minutes and nothing runs that could
        # release anything.
        account.set_limit(used + 5)
        outcome = run_lifecycle(capfd, script=batch_script("echo never runs"), log_dir=log_dir, time_limit="10",
                                sbatch_options=["--gpus=1"], account=account.name)
        (job_id,) = jobs_of(local_cluster, outcome)
        state = local_cluster.wait_for_state(int(job_id), {"CANCELLED"}, timeout=60)
    assert outcome.state == "failed", outcome.output[-4000:]
    assert state == "CANCELLED"
    assert (f"job {job_id} will never start: {REASON}: the allocation of account {account.name} is spent for it: "
            f"GrpTRESMins billing={used + 5}, used {used} (GrpTRESRaw), running jobs hold 0 (TRESRunMins: no "
            "running job); the usage leaves 5 billing-minutes and the job needs 10 billing-minutes") in outcome.output
    assert f"Job {job_id} was cancelled (PENDING, reason {REASON})" in outcome.output
    assert "waits for the allocation" not in outcome.output
