"""SlurmSubmitOperator through dag.test() on the real local cluster: every way a job can end.

Each test runs the `slurm_lifecycle` DAG (tests/dag_fixtures) with its own script and log
directory, injects the fault a cluster would produce (requeue, node failure, preemption, a person's
scancel) from a background thread once the job runs, and counts the task's jobs in `sacct` to
prove that nothing was submitted twice. The node failure is confined to the CPU node of partition
`small`, where no other test runs jobs; preempting takes the `urgent` partition, whose nodes every
test uses, so that test is marked `exclusive_cluster` and runs after the others, alone.
"""

from __future__ import annotations

import re
import shlex

import pytest

from support.lifecycle import Injector, batch_script, jobs_of, run_lifecycle
from support.localcluster import LocalCluster, poll_until

pytestmark = pytest.mark.usefixtures("cluster_connection", "airflow_home")


def test_completed_job_succeeds_with_summary(local_cluster: LocalCluster, capfd: pytest.CaptureFixture) -> None:
    log_dir = local_cluster.test_dir()
    outcome = run_lifecycle(capfd, script=batch_script("echo working; sleep 2"), log_dir=log_dir,
                            sbatch_options=["--gpus=1"])
    assert outcome.state == "success", outcome.output[-3000:]
    summary = outcome.result
    assert summary["state"] == "COMPLETED" and summary["exit_code"] == 0
    assert summary["gpus"] == 1 and summary["elapsed_s"] >= 2
    assert 0 < summary["gpu_hours"] < 0.1
    assert re.fullmatch(r"nid00500[1-3]", summary["node_list"]), summary["node_list"]  # small-g's nodes
    assert jobs_of(local_cluster, outcome) == [summary["job_id"]]
    assert f"[job {summary['job_id']}] working" in outcome.output


def test_failed_job_reports_exit_code_log_tail_and_hint(local_cluster: LocalCluster,
                                                         capfd: pytest.CaptureFixture) -> None:
    log_dir = local_cluster.test_dir()
    body = "echo 'srun: error: Unable to create step for job 7: More processors requested than permitted' >&2; exit 3"
    outcome = run_lifecycle(capfd, script=batch_script(body), log_dir=log_dir)
    assert outcome.state == "failed"
    (job_id,) = jobs_of(local_cluster, outcome)
    assert f"Slurm job {job_id} ended FAILED" in outcome.output
    assert "Exit code 3." in outcome.output
    assert "More processors requested than permitted" in outcome.output
    assert "Hint: More CPUs requested than the node has: " in outcome.output and "--cpus-per-task" in outcome.output


PROGRESS_SCRIPT = """
P={progress}
epoch=0
if [ -f "$P" ]; then epoch=$(sed -E 's/.*"epoch": ([0-9]+).*/\\1/' "$P"); fi
epoch=$((epoch + 1))
echo "{{\\"epoch\\": $epoch, \\"step\\": 0}}" > "$P"
echo "run reached epoch $epoch"
[ "$epoch" -ge 2 ] && exit 0
sleep 600
"""


@pytest.mark.slow
def test_timeout_is_resubmitted_and_continues_progress(local_cluster: LocalCluster,
                                                        capfd: pytest.CaptureFixture) -> None:
    log_dir = local_cluster.test_dir()
    progress = f"{log_dir}/progress.json"
    outcome = run_lifecycle(capfd, script=batch_script(PROGRESS_SCRIPT.format(progress=shlex.quote(progress))),
                            log_dir=log_dir, time_limit="1", progress_path=progress)
    assert outcome.state == "success", outcome.output[-3000:]
    first, second = outcome.result["job_ids"]
    assert [s["cause"] for s in outcome.result["submissions"]] == ["initial", "TIMEOUT"]
    assert local_cluster.sacct_runs(int(first))[-1]["State"] == "TIMEOUT"
    assert jobs_of(local_cluster, outcome, expect=2) == sorted([first, second], key=int)
    assert local_cluster.ssh(f"cat {shlex.quote(progress)}").stdout.strip() == '{"epoch": 2, "step": 0}'


@pytest.mark.slow
def test_timeout_without_progress_is_not_resubmitted(local_cluster: LocalCluster,
                                                      capfd: pytest.CaptureFixture) -> None:
    log_dir = local_cluster.test_dir()
    outcome = run_lifecycle(capfd, script=batch_script("echo stuck; sleep 600"), log_dir=log_dir, time_limit="1",
                            progress_path=f"{log_dir}/progress.json")
    assert outcome.state == "failed"
    assert "ended TIMEOUT without progress" in outcome.output
    (job_id,) = jobs_of(local_cluster, outcome)
    # Slurm's own line (slurmstepd writes it to the job's error output) reaches the task log and the failure
    streamed, _, failure = outcome.output.partition(f"Slurm job {job_id} ended TIMEOUT")
    assert re.search(rf"\[job {job_id} stderr\] .*\*\*\* JOB {job_id} ON \S+ CANCELLED AT .* DUE TO TIME LIMIT \*\*\*",
                     streamed), streamed[-3000:]
    assert "Last lines of the job's error output (stderr):" in failure and "DUE TO TIME LIMIT" in failure, failure


def test_a_traceback_reaches_the_task_log_and_the_failure(local_cluster: LocalCluster,
                                                          capfd: pytest.CaptureFixture) -> None:
    """The job's stderr is a file of its own (--error): streamed into the task log line by line,
    marked as such, and its tail is part of the failure next to the output's."""
    log_dir = local_cluster.test_dir()
    body = ("echo preparing\n"
            "python3 -c 'print(\"loading\", flush=True); raise ValueError(\"band 13 is missing from the stack\")'")
    outcome = run_lifecycle(capfd, script=batch_script(body), log_dir=log_dir)
    assert outcome.state == "failed"
    (job_id,) = jobs_of(local_cluster, outcome)
    streamed, _, failure = outcome.output.partition(f"Slurm job {job_id} ended FAILED")
    assert f"[job {job_id}] preparing" in streamed and f"[job {job_id}] loading" in streamed, streamed[-3000:]
    assert f"[job {job_id} stderr] Traceback (most recent call last):" in streamed, streamed[-3000:]
    assert f"[job {job_id} stderr] ValueError: band 13 is missing from the stack" in streamed
    assert "Exit code 1." in failure
    errors = failure.index("Last lines of the job's error output (stderr):")
    assert "ValueError: band 13 is missing from the stack" in failure[errors:]
    assert f"{log_dir}/" in failure and f".{job_id}.err (errors)" in failure


def test_requeue_mid_run_keeps_waiting_then_completes(local_cluster: LocalCluster,
                                                       capfd: pytest.CaptureFixture) -> None:
    log_dir = local_cluster.test_dir()
    injector = Injector(local_cluster, log_dir, lambda job: local_cluster.root("scontrol", "requeue", str(job)))
    injector.start()
    outcome = run_lifecycle(capfd, log_dir=log_dir, sbatch_options=["--requeue", "--open-mode=append"],
                            script=batch_script('echo "restart ${SLURM_RESTART_COUNT:-0}"\n'
                                           '[ "${SLURM_RESTART_COUNT:-0}" -ge 1 ] && exit 0\nsleep 300'))
    injector.join(5)
    assert injector.error is None, injector.error
    assert outcome.state == "success", outcome.output[-3000:]
    assert outcome.result["restarts"] == 1
    assert jobs_of(local_cluster, outcome) == [str(injector.job_id)]
    states = [run["State"] for run in local_cluster.sacct_runs(injector.job_id)]
    assert states == ["REQUEUED", "COMPLETED"]


def test_a_batch_script_killed_from_outside_is_resubmitted_and_completes(local_cluster: LocalCluster,
                                                                           capfd: pytest.CaptureFixture) -> None:
    """The batch shell killed with SIGKILL (as an administrator's kill, or a restarted controller that
    lost the job's start, leaves it): Slurm says FAILED 0:9 and the script left no exit record. An
    interruption: resubmitted (cause KILLED), and the second job, which finds the first one's mark,
    completes."""
    from slurm_provider.watch.end_records import end_record_shell

    log_dir = local_cluster.test_dir()
    mark = shlex.quote(f"{log_dir}/started")
    injector = Injector(local_cluster, log_dir,
                        lambda job: local_cluster.root("scancel", "--batch", "--signal=KILL", str(job)))
    injector.start()
    body = f"{end_record_shell(f'{log_dir}/%x.%j.out')}\n[ -e {mark} ] && exit 0\ntouch {mark}\nsleep 300"
    outcome = run_lifecycle(capfd, script=batch_script(body), log_dir=log_dir)
    injector.join(5)
    assert injector.error is None, injector.error
    assert outcome.state == "success", outcome.output[-3000:]
    assert [s["cause"] for s in outcome.result["submissions"]] == ["initial", "KILLED"]
    first, second = outcome.result["job_ids"]
    assert first == str(injector.job_id)
    killed = local_cluster.sacct_runs(int(first))[-1]
    assert (killed["State"], killed["ExitCode"]) == ("FAILED", "0:9"), killed
    assert local_cluster.sacct_runs(int(second))[-1]["State"] == "COMPLETED"
    assert f"Job {first} ended FAILED of signal 9 before its script could end" in outcome.output
    assert jobs_of(local_cluster, outcome, expect=2) == sorted([first, second], key=int)


def test_cancel_by_a_person_fails_and_says_who(local_cluster: LocalCluster, capfd: pytest.CaptureFixture) -> None:
    log_dir = local_cluster.test_dir()
    injector = Injector(local_cluster, log_dir, lambda job: local_cluster.ssh(f"scancel {job}"))
    injector.start()
    outcome = run_lifecycle(capfd, script=batch_script("sleep 300"), log_dir=log_dir)
    injector.join(5)
    assert injector.error is None, injector.error
    assert outcome.state == "failed"
    uid = local_cluster.ssh("id -u").stdout.strip()
    assert f"Slurm job {injector.job_id} ended CANCELLED" in outcome.output
    assert f"Cancelled by uid/user {uid}" in outcome.output
    assert jobs_of(local_cluster, outcome) == [str(injector.job_id)]


def test_memory_overrun_is_explained(local_cluster: LocalCluster, capfd: pytest.CaptureFixture) -> None:
    log_dir = local_cluster.test_dir()
    hog = "python3 -c 'import time; b = bytearray(600 * 2**20); b[::4096] = b\"x\" * len(b[::4096]); time.sleep(30)'"
    outcome = run_lifecycle(capfd, script=batch_script(hog), log_dir=log_dir, sbatch_options=["--mem=100M"])
    assert outcome.state == "failed"
    (job_id,) = jobs_of(local_cluster, outcome)
    config = local_cluster.root("scontrol", "show", "config").stdout
    if "task/cgroup" in config:  # the kernel lets Slurm confine memory: the real OUT_OF_MEMORY state
        assert f"Slurm job {job_id} ended OUT_OF_MEMORY" in outcome.output
    else:  # OverMemoryKill: the step is killed, the job ends FAILED with Slurm's line in its log
        assert "Exceeded job memory limit" in outcome.output
    assert "Hint:" in outcome.output and "--mem" in outcome.output


def test_job_that_can_never_start_fails_clearly_and_is_cancelled(local_cluster: LocalCluster,
                                                                  capfd: pytest.CaptureFixture) -> None:
    log_dir = local_cluster.test_dir()
    outcome = run_lifecycle(capfd, script=batch_script("true"), log_dir=log_dir, time_limit="4-00:00:00")
    assert outcome.state == "failed"
    (job_id,) = jobs_of(local_cluster, outcome)
    # Slurm says PartitionTimeLimit or PartitionConfig, and may switch between them from one
    # scheduling pass to the next: the cancel names the reason Slurm gave at that moment.
    assert re.search(rf"job {job_id} will not start: Partition(TimeLimit|Config): ", outcome.output)
    assert re.search(rf"Job {job_id} was cancelled \(PENDING, reason Partition(TimeLimit|Config)\)",
                     outcome.output)
    assert local_cluster.wait_for_state(int(job_id), {"CANCELLED"}, timeout=30) == "CANCELLED"


def test_keep_job_on_give_up_leaves_a_job_that_cannot_start_for_a_person(
        local_cluster: LocalCluster, capfd: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURM_LIFECYCLE_KEEP_JOB", "1")
    log_dir = local_cluster.test_dir()
    outcome = run_lifecycle(capfd, script=batch_script("true"), log_dir=log_dir, time_limit="4-00:00:00")
    (job_id,) = jobs_of(local_cluster, outcome)
    try:
        assert outcome.state == "failed"
        assert re.search(rf"job {job_id} will not start: Partition(TimeLimit|Config): ", outcome.output)
        assert re.search(rf"Job {job_id} was kept in the queue \(PENDING, reason Partition(TimeLimit|Config)\) "
                         "because keep_job_on_give_up=True", outcome.output)
        assert local_cluster.current_state(int(job_id)) == "PENDING"
    finally:
        local_cluster.root("scancel", job_id, check=False)


def test_job_held_after_special_exit_is_cancelled_not_left_behind(local_cluster: LocalCluster,
                                                                  capfd: pytest.CaptureFixture) -> None:
    # The job asks for a person (scontrol requeuehold State=SpecialExit): Slurm holds it in the queue.
    log_dir = local_cluster.test_dir()
    body = 'echo "needs a person"\nscontrol requeuehold State=SpecialExit "$SLURM_JOB_ID"\nsleep 60'
    outcome = run_lifecycle(capfd, script=batch_script(body), log_dir=log_dir)
    assert outcome.state == "failed"
    (job_id,) = jobs_of(local_cluster, outcome)
    assert f"Slurm job {job_id} ended SPECIAL_EXIT" in outcome.output
    assert f"Job {job_id} was cancelled (SPECIAL_EXIT, reason job requeued in held state)" in outcome.output
    assert f"Cancelled job {job_id} (SPECIAL_EXIT" in outcome.output  # the task log says why, too
    assert local_cluster.wait_for_state(int(job_id), {"CANCELLED"}, timeout=30) == "CANCELLED"


def test_node_failure_with_requeue_runs_again_and_completes(local_cluster: LocalCluster,
                                                            capfd: pytest.CaptureFixture) -> None:
    # On the node of partition small (LUMI-C's), which no other partition and no other test uses.
    log_dir = local_cluster.test_dir()

    def fail_node(job: int) -> None:
        node = local_cluster.node_of(job)
        partitions = set(local_cluster.ssh(f"sinfo -h -N -n {node} -o %P").stdout.split())
        assert partitions == {"small"}, f"{node} is in {partitions}: other tests' jobs run there"
        local_cluster.root("scontrol", "update", f"nodename={node}", "state=down", "reason=lifecycle-test")
        try:
            poll_until(lambda: local_cluster.current_state(job) != "RUNNING", timeout=60,
                       what="the job to leave the failed node")
        finally:
            local_cluster.root("scontrol", "update", f"nodename={node}", "state=resume")

    injector = Injector(local_cluster, log_dir, fail_node)
    injector.start()
    outcome = run_lifecycle(capfd, log_dir=log_dir,
                            sbatch_options=["--requeue", "--open-mode=append", "--partition=small"],
                            script=batch_script('[ "${SLURM_RESTART_COUNT:-0}" -ge 1 ] && exit 0\nsleep 300'))
    injector.join(5)
    assert injector.error is None, injector.error
    assert outcome.state == "success", outcome.output[-3000:]
    states = [run["State"] for run in local_cluster.sacct_runs(injector.job_id)]
    assert states[0] == "NODE_FAIL" and states[-1] == "COMPLETED"
    assert jobs_of(local_cluster, outcome) == [str(injector.job_id)]


@pytest.mark.exclusive_cluster
def test_preemption_by_urgent_partition_requeues_and_completes(local_cluster: LocalCluster,
                                                               capfd: pytest.CaptureFixture) -> None:
    log_dir = local_cluster.test_dir()
    urgent: list[int] = []

    def preempt(job: int) -> None:
        # Every GPU of the job's node, there: only preempting the job frees them.
        urgent.append(local_cluster.sbatch("#!/bin/bash\nsleep 3\n", "--partition=urgent", "--gres=gpu:8",
                                           f"--nodelist={local_cluster.node_of(job)}",
                                           "--output=/dev/null", "--time=1"))

    injector = Injector(local_cluster, log_dir, preempt)
    injector.start()
    outcome = run_lifecycle(capfd, log_dir=log_dir,
                            sbatch_options=["--requeue", "--open-mode=append", "--gres=gpu:4"],
                            script=batch_script('[ "${SLURM_RESTART_COUNT:-0}" -ge 1 ] && exit 0\nsleep 300'))
    injector.join(5)
    assert injector.error is None, injector.error
    assert outcome.state == "success", outcome.output[-3000:]
    assert outcome.result["restarts"] >= 1
    states = [run["State"] for run in local_cluster.sacct_runs(injector.job_id)]
    assert states[0] in ("PREEMPTED", "REQUEUED") and states[-1] == "COMPLETED"
    assert jobs_of(local_cluster, outcome) == [str(injector.job_id)]
    assert local_cluster.wait_for_state(urgent[0], {"COMPLETED"}, timeout=60) == "COMPLETED"
