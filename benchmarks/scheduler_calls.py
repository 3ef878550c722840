"""Scheduler calls per minute per cluster connection while watching 1, 200 or 2,000 jobs.

Every watched job is a real ``SlurmJobTrigger`` in one event loop, subscribed to the connection's
shared poller, which polls through a real ``SlurmAsyncHook``; every Slurm client call the hook makes
is counted by ``slurm_provider.scheduler_calls`` (what a site's rate limit counts). The poll schedule
is the shipped one (first poll after 10 s, 15 s growing by 1.5x per quiet poll to 300 s), run on a
compressed clock: every interval divided by ``--speed``, every figure reported in the schedule's own
minutes.

Scenarios (each says in its ``squeue`` field what answered):
  * ``1 job``: one real job on the local cluster, held back by ``--begin=now+1hour`` (it waits in the
    queue without changing state), asked with the real ``squeue`` over SSH;
  * ``200`` / ``2000 jobs``: stand-in ``squeue`` answers (rows in the format the golden files captured
    from Slurm 22.05, one per requested id), through the same hook, parser and poller;
  * ``2000 jobs, one changing every poll``: the busiest case (a change resets the interval to 15 s:
    four calls a minute), without a ceiling and with the connection's ``min_call_interval`` at 30 s.

    .venv/bin/python benchmarks/scheduler_calls.py            # about 4.5 minutes
Needs the local cluster (make cluster-up) and its connection env for the 1-job scenario
(``--no-cluster`` skips it).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO / "providers" / "slurm" / "src")]
CONN_ENV = Path("/var/lib/vcloud-localcluster/airflow_conn.env")
GOLDEN_ROW = REPO / "providers" / "slurm" / "tests" / "golden" / "squeue_live.txt"


def load_connection_env() -> None:
    for line in CONN_ENV.read_text().splitlines():
        key, _, value = line.partition("=")
        os.environ.setdefault(key, shlex.split(value)[0])


class StandInSqueue:
    """Answers ``squeue --jobs=...`` with one captured row per requested id (a job pending on its
    ``--begin`` time); with ``churn`` one job flips between PENDING and RUNNING at every call."""

    def __init__(self, churn: bool = False) -> None:
        rows = GOLDEN_ROW.read_text().splitlines()
        self.template = next(row for row in rows if "|PENDING|BeginTime|" in row)
        self.churn = churn
        self.calls = 0

    async def run(self, command: str, *, stdin: Any = None, timeout: float) -> Any:
        from slurm_provider.transport import CommandResult

        self.calls += 1
        if " squeue " not in f" {command} ":
            return CommandResult(command, 0, "", "")
        ids = command.split("--jobs=", 1)[1].split()[0].strip("'").split(",")
        lines = []
        for n, job_id in enumerate(ids):
            fields = self.template.split("|")
            fields[0] = fields[1] = job_id
            if self.churn and n == 0 and self.calls % 2:
                fields[3:5] = ["RUNNING", "None"]
            lines.append("|".join(fields))
        return CommandResult(command, 0, "\n".join(lines) + "\n", "")

    async def close(self) -> None:
        pass


async def watch(conn_id: str, job_ids: list[str], speed: float, minutes: float,
                runner: Any | None, min_call_interval: float | None) -> dict[str, Any]:
    """Watch ``job_ids`` for ``minutes`` of the schedule; calls per schedule minute."""
    import structlog.testing

    from slurm_provider import hooks, triggers
    from slurm_provider.scheduler_calls import calls_of, forget_calls
    from slurm_provider.timing import FIRST_POLL_DELAY, MAX_POLL_INTERVAL, POLL_INTERVAL

    def factory(cid: str):
        return lambda: hooks.SlurmAsyncHook(cid, runner=runner, min_call_interval=min_call_interval)

    triggers._hook_factory = factory
    forget_calls(conn_id)
    started = time.monotonic()
    with structlog.testing.capture_logs():
        watchers = [asyncio.ensure_future(_drain(triggers.SlurmJobTrigger.watching(
            conn_id=conn_id, job_id=job_id, poll_interval=POLL_INTERVAL / speed,
            max_poll_interval=MAX_POLL_INTERVAL / speed, first_poll_delay=FIRST_POLL_DELAY / speed)))
            for job_id in job_ids]
        await asyncio.sleep(minutes * 60 / speed)
        for watcher in watchers:
            watcher.cancel()
        await asyncio.gather(*watchers, return_exceptions=True)
    calls = calls_of(conn_id)
    per_minute = [0] * int(minutes)
    for t in calls.times:
        minute = int((t - started) * speed / 60)
        if minute < len(per_minute):
            per_minute[minute] += 1
    return {"calls": calls.total, "by_verb": dict(calls.by_verb), "calls_per_minute": per_minute,
            "most_in_a_minute_from_minute_3": max(per_minute[2:]),
            "mean_per_minute_minutes_10_on": round(sum(per_minute[10:]) / max(len(per_minute) - 10, 1), 2)}


async def _drain(trigger: Any) -> None:
    async for _ in trigger.run():
        return


async def held_job(conn_id: str) -> str:
    from slurm_provider.hooks import SlurmAsyncHook

    hook = SlurmAsyncHook(conn_id)
    try:
        result = await hook.submit("#!/bin/bash\ntrue\n", job_name="schedcalls-1", output="/dev/null",
                                   time_limit="1", extra_options=["--begin=now+1hour"])
        return str(result.job_id)
    finally:
        await hook.close()


async def cancel(conn_id: str, job_id: str) -> None:
    from slurm_provider.hooks import SlurmAsyncHook

    hook = SlurmAsyncHook(conn_id)
    try:
        await hook.cancel(job_id)
    finally:
        await hook.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=30, help="schedule minutes watched per scenario")
    parser.add_argument("--speed", type=float, default=60, help="clock compression of the stand-in scenarios")
    parser.add_argument("--cluster-speed", type=float, default=20, help="clock compression against the cluster")
    parser.add_argument("--churn-speed", type=float, default=10,
                        help="clock compression of the busiest case (a poll of 2,000 changing jobs takes a "
                             "fraction of a second of CPU, which a faster clock would count as minutes)")
    parser.add_argument("--churn-minutes", type=float, default=12)
    parser.add_argument("--conn-id", default="vcloud_local_cluster")
    parser.add_argument("--no-cluster", action="store_true")
    args = parser.parse_args()

    async def run() -> dict[str, Any]:
        scenarios: dict[str, Any] = {}
        if not args.no_cluster:
            load_connection_env()
            job_id = await held_job(args.conn_id)
            try:
                result = await watch(args.conn_id, [job_id], args.cluster_speed, args.minutes, None, 0.0)
            finally:
                await cancel(args.conn_id, job_id)
            scenarios["1 job"] = {"squeue": "real squeue of the local cluster (Slurm 22.05) over SSH",
                                  "speed": args.cluster_speed, **result}
        for count in (200, 2000):
            ids = [str(1_000_000 + n) for n in range(count)]
            result = await watch(f"stand_in_{count}", ids, args.speed, args.minutes, StandInSqueue(), 0.0)
            scenarios[f"{count} jobs"] = {"squeue": "stand-in answers in Slurm 22.05's captured row format",
                                          "speed": args.speed, **result}
        ids = [str(2_000_000 + n) for n in range(2000)]
        for ceiling in (0.0, 30.0):
            result = await watch(f"stand_in_churn_{ceiling:.0f}", ids, args.churn_speed, args.churn_minutes,
                                 StandInSqueue(churn=True), ceiling / args.churn_speed)
            scenarios[f"2000 jobs, one changing every poll, ceiling {ceiling:.0f} s"] = {
                "squeue": "stand-in answers in Slurm 22.05's captured row format", "speed": args.churn_speed,
                "min_call_interval_s": ceiling, **result}
        return {"schedule": "shipped: first poll 10 s, then 15 s x1.5 per quiet poll up to 300 s",
                "minutes": args.minutes, "target": "at most 2 calls a minute per cluster after the first minutes",
                "scenarios": scenarios}

    import logging

    logging.getLogger("asyncssh").setLevel(logging.WARNING)
    logging.getLogger("slurm_provider").setLevel(logging.WARNING)
    print(json.dumps(asyncio.run(run())))


if __name__ == "__main__":
    main()
