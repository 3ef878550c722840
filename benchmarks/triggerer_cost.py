"""Triggerer cost: one real ``airflow triggerer`` watching N deferred job tasks over three clusters'
connections, with ``SlurmJobTrigger`` (one shared poller per connection) and, in the same run, with
Airflow's own ``SSHRemoteJobTrigger`` (one trigger, one SSH connection and its own polls per job).

Setup, all real: N Slurm jobs on the local cluster, held back by ``--begin=now+1hour`` (they wait in
the queue without using a node) and cancelled at the end; three login sshds of the cluster user on
their own ports (``tests/support/private_login.py``), one Airflow connection each, so "one SSH connection per
cluster" is counted against three distinct endpoints; an Airflow home with its own SQLite database,
one DAG run and N deferred task instances whose Trigger rows the triggerer claims as it claims any
deferred task's. Each variant gets a fresh ``airflow triggerer`` process; both poll at the same fixed
interval (``--interval``), so "per poll" means the same thing on both sides.

Measured over ``--polls`` poll intervals in steady state (every trigger polled twice, and two
intervals in a row made no more than the steady number of polls):
  * CPU seconds of the triggerer's process tree (supervisor and trigger runner) per watched job per
    poll, from /proc; the polls are counted on the login nodes: a ``squeue`` (ours: one per
    connection per cycle) or a ``stat`` of the job's log (the anchor: one per job per poll) runs
    through a counting wrapper first on the sshds' PATH;
  * resident memory of the process tree (sum of RSS, and the largest process);
  * TCP connections from the process tree to the three login ports;
  * CPU of the three login sshds and every session below them (what the login node pays).

    .venv/bin/python benchmarks/triggerer_cost.py --jobs 1000      # about 8 minutes
Needs root and the local cluster (make cluster-up).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import psutil

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "tests"), str(REPO / "providers" / "slurm" / "src")]

from support.localcluster import LocalCluster, poll_until  # noqa: E402
from support.ports import free_port  # noqa: E402
from support.private_login import PrivateLogin, descendants  # noqa: E402
from support.deployment import airflow_env  # noqa: E402

DAG_ID = "triggerer_cost"
DAG_FILE = f'''\
from airflow.providers.standard.operators.empty import EmptyOperator
from airflow.sdk import DAG

with DAG("{DAG_ID}", schedule=None):
    EmptyOperator(task_id="watch_job")
'''
CONNECTIONS = 3


def counting_wrapper(directory: Path, command: str) -> None:
    """``command`` on the sessions' PATH: one byte appended to ``<command>.calls``, then the real one."""
    path = directory / command
    path.write_text(f"#!/bin/sh\nprintf . >> {directory}/{command}.calls\nexec /usr/bin/{command} \"$@\"\n")
    path.chmod(0o755)
    (directory / f"{command}.calls").touch()
    (directory / f"{command}.calls").chmod(0o666)


def calls(directory: Path, command: str) -> int:
    return (directory / f"{command}.calls").stat().st_size


def tree(pid: int) -> list[int]:
    return [pid, *descendants(pid)]


def _processes(pids: list[int]) -> list[psutil.Process]:
    """The processes of ``pids`` that still run (one may end while it is measured)."""
    found = []
    for pid in pids:
        try:
            found.append(psutil.Process(pid))
        except psutil.Error:
            continue
    return found


def cpu_seconds(pids: list[int]) -> float:
    """User + system time of the processes and of their reaped children."""
    total = 0.0
    for process in _processes(pids):
        try:
            times = process.cpu_times()
        except psutil.Error:
            continue
        total += times.user + times.system + times.children_user + times.children_system
    return total


def rss_mib(pids: list[int]) -> tuple[float, float]:
    """(sum, largest) resident set size of the processes, MiB."""
    sizes = []
    for process in _processes(pids):
        try:
            sizes.append(process.memory_info().rss / 2**20)
        except psutil.Error:
            continue
    return round(sum(sizes), 1), round(max(sizes, default=0), 1)


def tcp_connections(pids: list[int], ports: set[int]) -> int:
    """Established TCP connections owned by ``pids`` whose remote end is 127.0.0.1 on ``ports``."""
    count = 0
    for process in _processes(pids):
        try:
            connections = process.net_connections(kind="tcp4")
        except psutil.Error:
            continue
        count += sum(1 for c in connections if c.status == psutil.CONN_ESTABLISHED and c.raddr
                     and c.raddr.ip == "127.0.0.1" and c.raddr.port in ports)
    return count


class Bench:
    """The cluster side (jobs, sshds, wrappers) and the Airflow side (home, DB rows, triggerer)."""

    def __init__(self, jobs: int, interval: float, polls: int, work: Path) -> None:
        self.jobs, self.interval, self.polls, self.work = jobs, interval, polls, work
        self.cluster = LocalCluster(state_dir=Path("/var/lib/vcloud-localcluster"), user="vcloud",
                                    scratch=Path("/srv/vcloud/scratch/vcloud"), account="vcloud_local",
                                    conn_id="vcloud_local_cluster")
        self.bin = work / "bin"
        self.bin.mkdir(mode=0o755)
        work.chmod(0o755)
        for command in ("squeue", "stat"):
            counting_wrapper(self.bin, command)
        self.logins: list[PrivateLogin] = []
        self.job_ids: list[str] = []
        self.remote_dir = f"{self.cluster.scratch}/bench/triggerer-cost-{uuid.uuid4().hex[:8]}"
        self.home = work / "airflow"
        self.triggerer: subprocess.Popen[bytes] | None = None

    # -- cluster side -------------------------------------------------------------------------
    def start_logins(self) -> None:
        for n in range(CONNECTIONS):
            directory = self.work / f"login{n}"
            directory.mkdir()
            login = PrivateLogin(self.cluster, directory, conn_id=f"bench_cluster_{n}", path_first=str(self.bin))
            # The anchor opens one connection per job at once; let sshd accept them all.
            login.config.write_text(login.config.read_text().replace(
                "MaxStartups 100:30:200", f"MaxStartups {self.jobs + 10}"))
            self.logins.append(login)
            login.start()

    def submit_jobs(self) -> None:
        """N held jobs in one SSH session; their log files exist (empty), their exit files do not."""
        script = (f"mkdir -p {shlex.quote(self.remote_dir)} && cd {shlex.quote(self.remote_dir)} && "
                  f"for i in $(seq 0 {self.jobs - 1}); do : > job-$i.log; "
                  "sbatch --parsable --job-name=triggerer-cost-$i --output=/dev/null --time=1 "
                  "--begin=now+1hour --wrap=true || exit 1; done")
        out = self.cluster.ssh(script, timeout=600).stdout.split()
        self.job_ids = [line.split(";")[0] for line in out]
        assert len(self.job_ids) == self.jobs, f"submitted {len(self.job_ids)} of {self.jobs} jobs"

    def login_pids(self) -> list[int]:
        """The three sshds and every session process below them."""
        return [p for login in self.logins if login.pid for p in tree(login.pid)]

    def cancel_jobs(self) -> None:
        for start in range(0, len(self.job_ids), 200):
            self.cluster.ssh("scancel " + " ".join(self.job_ids[start:start + 200]), check=False, timeout=120)

    def close(self) -> None:
        self.stop_triggerer()
        if self.job_ids:
            self.cancel_jobs()
        self.cluster.ssh(f"rm -rf {shlex.quote(self.remote_dir)}", check=False)
        for login in self.logins:
            login.close()

    # -- Airflow side -------------------------------------------------------------------------
    def prepare_airflow(self) -> None:
        self.home.mkdir()
        dags = self.work / "dags"
        dags.mkdir()
        (dags / "triggerer_cost.py").write_text(DAG_FILE)
        env = airflow_env(self.home, free_port(), str(self.work / "project"))
        for login in self.logins:
            env.update(login.connection_env())
        env.update({"AIRFLOW__CORE__DAGS_FOLDER": str(dags),
                    "AIRFLOW__TRIGGERER__CAPACITY": str(self.jobs + 100),
                    "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(free_port())})
        os.environ.update(env)  # this process seeds the database too
        for argv in (["db", "migrate"], ["dags", "reserialize"]):
            proc = subprocess.run([sys.executable, "-m", "airflow", *argv], capture_output=True, text=True,
                                  timeout=600)
            assert proc.returncode == 0, f"airflow {' '.join(argv)}: {proc.stderr[-3000:]}"

    def seed(self, run_id: str, make_trigger: Any) -> None:
        """One DAG run and N deferred task instances, each waiting on the trigger for its job."""
        from airflow.models.dag_version import DagVersion
        from airflow.models.dagbag import DBDagBag
        from airflow.models.taskinstance import TaskInstance
        from airflow.models.trigger import Trigger
        from airflow.sdk import timezone
        from airflow.utils.session import create_session
        from airflow.utils.state import DagRunState, TaskInstanceState
        from airflow.utils.types import DagRunTriggeredByType, DagRunType

        with create_session() as session:
            dag = DBDagBag().get_latest_version_of_dag(DAG_ID, session=session)
            assert dag is not None, f"DAG {DAG_ID} not serialized; see `airflow dags reserialize`"
            version = DagVersion.get_latest_version(DAG_ID, session=session)
            now = timezone.utcnow()
            dag.create_dagrun(run_id=run_id, run_after=now, run_type=DagRunType.MANUAL,
                              triggered_by=DagRunTriggeredByType.TEST, state=DagRunState.RUNNING,
                              session=session)
            task = dag.get_task("watch_job")
            for n, job_id in enumerate(self.job_ids):
                trigger = Trigger.from_object(make_trigger(n, job_id))
                session.add(trigger)
                session.flush()
                ti = TaskInstance(task, dag_version_id=version.id, run_id=run_id, map_index=n)
                ti.state = TaskInstanceState.DEFERRED
                ti.try_number = 1
                ti.trigger_id = trigger.id
                ti.next_method = "execute_complete"
                session.add(ti)

    def finish(self, run_id: str) -> int:
        """Take the run's tasks off their triggers; returns how many were still deferred (watched)."""
        from airflow.models.taskinstance import TaskInstance
        from airflow.models.trigger import Trigger
        from airflow.utils.session import create_session
        from airflow.utils.state import TaskInstanceState

        with create_session() as session:
            tis = session.query(TaskInstance).filter_by(dag_id=DAG_ID, run_id=run_id).filter(
                TaskInstance.map_index >= 0).all()
            deferred = sum(1 for ti in tis if ti.state == TaskInstanceState.DEFERRED and ti.trigger_id)
            trigger_ids = [ti.trigger_id for ti in tis if ti.trigger_id]
            for ti in tis:
                ti.state, ti.trigger_id = TaskInstanceState.SUCCESS, None
            session.flush()
            session.query(Trigger).filter(Trigger.id.in_(trigger_ids)).delete(synchronize_session=False)
        return deferred

    def claimed(self) -> int:
        from airflow.models.trigger import Trigger
        from airflow.utils.session import create_session

        with create_session() as session:
            return session.query(Trigger).filter(Trigger.triggerer_id.is_not(None)).count()

    def start_triggerer(self, name: str) -> None:
        log = open(self.work / f"triggerer-{name}.log", "wb")
        self.triggerer = subprocess.Popen([sys.executable, "-m", "airflow", "triggerer"], stdout=log,
                                          stderr=subprocess.STDOUT, start_new_session=True)

    def stop_triggerer(self) -> None:
        proc, self.triggerer = self.triggerer, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)

    def wait_for_steady_polls(self, name: str, counter: str, per_poll: int, timeout: float = 900) -> None:
        """Until every trigger polled twice and two intervals saw no more than the steady number of
        polls: triggers still starting make extra polls (a new watcher wakes the shared poller)."""
        base, deadline = calls(self.bin, counter), time.monotonic() + timeout
        while time.monotonic() < deadline:
            before = calls(self.bin, counter)
            time.sleep(2 * self.interval)
            assert self.triggerer is not None and self.triggerer.poll() is None, \
                f"triggerer exited; see {self.work}/triggerer-{name}.log"
            after = calls(self.bin, counter)
            if after - base >= 2 * per_poll and after - before <= 2.5 * per_poll:
                return
        raise TimeoutError(f"{name}: polls not steady within {timeout:.0f} s")

    # -- one variant --------------------------------------------------------------------------
    def measure(self, name: str, make_trigger: Any, poll_counter: str, counter_per_poll: int) -> dict[str, Any]:
        """Seed, start a triggerer, wait for steady polls, measure ``--polls`` intervals, stop."""
        run_id = f"{name}-{uuid.uuid4().hex[:6]}"
        self.seed(run_id, make_trigger)
        started = time.monotonic()
        self.start_triggerer(name)
        assert self.triggerer is not None
        pid = self.triggerer.pid
        poll_until(lambda: self.claimed() >= self.jobs or None, timeout=600, what=f"{name}: triggers claimed")
        self.wait_for_steady_polls(name, poll_counter, counter_per_poll)
        warm_up = time.monotonic() - started
        ports = {login.port for login in self.logins}
        cpu0, login0 = cpu_seconds(tree(pid)), cpu_seconds(self.login_pids())
        polls0, t0 = calls(self.bin, poll_counter), time.monotonic()
        rss, biggest, conns = [], [], []
        while time.monotonic() < t0 + self.polls * self.interval:
            assert self.triggerer.poll() is None, f"triggerer exited; see {self.work}/triggerer-{name}.log"
            pids = tree(pid)
            total, largest = rss_mib(pids)
            rss.append(total)
            biggest.append(largest)
            conns.append(tcp_connections(pids, ports))
            time.sleep(min(5.0, self.interval / 3))
        cpu, login_cpu = cpu_seconds(tree(pid)) - cpu0, cpu_seconds(self.login_pids()) - login0
        seconds = time.monotonic() - t0
        polls = (calls(self.bin, poll_counter) - polls0) / counter_per_poll
        processes = len(tree(pid))
        self.stop_triggerer()
        log = (self.work / f"triggerer-{name}.log").read_text(errors="replace")
        watched = self.finish(run_id)
        return {
            "watched_jobs_at_end": watched,
            "warm_up_s": round(warm_up, 1),
            "measured_s": round(seconds, 1),
            "polls_per_job": round(polls, 2),
            "cpu_s": round(cpu, 2),
            "cpu_s_per_job_per_poll": round(cpu / (self.jobs * polls), 7) if polls else None,
            "cpu_share_of_one_core": round(cpu / seconds, 3),
            "rss_mib_sum": max(rss),
            "rss_mib_largest_process": max(biggest),
            "processes": processes,
            "ssh_connections": max(conns),
            # the triggerer's own alarms, start-up included: its event loop held up past 0.2 s, and
            # the trigger runner silent past 30 s (the triggerer then skips its heartbeat and looks dead)
            "loop_blocked_warnings": log.count("async thread was blocked"),
            "runner_deadlock_alarms": log.count("appears deadlocked"),
            "login_nodes_cpu_s": round(login_cpu, 2),
            "login_nodes_cpu_s_per_job_per_poll": round(login_cpu / (self.jobs * polls), 7) if polls else None,
        }


def ours(bench: Bench):
    def make(n: int, job_id: str):
        from slurm_provider.triggers import SlurmJobTrigger

        return SlurmJobTrigger.watching(conn_id=f"bench_cluster_{n % CONNECTIONS}", job_id=job_id,
                               poll_interval=bench.interval, max_poll_interval=bench.interval,
                               first_poll_delay=10, log_path=f"{bench.remote_dir}/job-{n}.log")
    return make


def anchor(bench: Bench):
    def make(n: int, job_id: str):
        from airflow.providers.ssh.triggers.ssh_remote_job import SSHRemoteJobTrigger

        return SSHRemoteJobTrigger(ssh_conn_id=f"bench_cluster_{n % CONNECTIONS}", remote_host=None,
                                   job_id=job_id, job_dir=bench.remote_dir,
                                   log_file=f"{bench.remote_dir}/job-{n}.log",
                                   exit_code_file=f"{bench.remote_dir}/job-{n}.exit",
                                   remote_os="posix", poll_interval=int(bench.interval))
    return make


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=1000, help="watched jobs (and deferred tasks)")
    parser.add_argument("--interval", type=float, default=15, help="poll interval of both triggers, seconds")
    parser.add_argument("--polls", type=int, default=4, help="poll intervals measured per variant")
    parser.add_argument("--keep", action="store_true", help="keep the Airflow home and logs (printed)")
    args = parser.parse_args()
    assert os.geteuid() == 0, "run as root: the benchmark starts sshds of the cluster user"
    work = Path(tempfile.mkdtemp(prefix="triggerer-cost-"))
    bench = Bench(args.jobs, args.interval, args.polls, work)
    try:
        bench.start_logins()
        t = time.monotonic()
        bench.submit_jobs()
        print(f"submitted {args.jobs} held jobs in {time.monotonic() - t:.0f} s", file=sys.stderr, flush=True)
        bench.prepare_airflow()
        slurm = bench.measure("slurm_job_trigger", ours(bench), "squeue", CONNECTIONS)
        print(f"SlurmJobTrigger: {slurm}", file=sys.stderr, flush=True)
        ssh = bench.measure("ssh_remote_job_trigger", anchor(bench), "stat", args.jobs)
        print(f"SSHRemoteJobTrigger: {ssh}", file=sys.stderr, flush=True)
    finally:
        bench.close()
        if args.keep:
            print(f"kept {work}", file=sys.stderr)
        else:
            subprocess.run(["rm", "-rf", str(work)], check=False)

    def ratio(key: str) -> float | None:
        return round(ssh[key] / slurm[key], 1) if slurm.get(key) and ssh.get(key) is not None else None

    print(json.dumps({
        "jobs": args.jobs, "connections": CONNECTIONS, "poll_interval_s": args.interval,
        "machine_cores": os.cpu_count(),
        "slurm_job_trigger": slurm, "ssh_remote_job_trigger": ssh,
        "ratio_anchor_to_ours": {key: ratio(key) for key in (
            "cpu_s_per_job_per_poll", "cpu_share_of_one_core", "rss_mib_sum", "ssh_connections",
            "login_nodes_cpu_s_per_job_per_poll")},
    }))


if __name__ == "__main__":
    main()
