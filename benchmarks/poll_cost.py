"""Poll cost of watching many Slurm jobs: the shared poller versus one status query per job.

Submits N jobs to the local cluster (held back with --begin so they wait in the queue without using
the node), then in one run:
  * ours: N SlurmJobTrigger instances in one event loop, all subscribed to the connection's shared
    poller, for a number of poll cycles;
  * per job: the same hook asked for each job's status separately each cycle (what a trigger per
    job does).
Counts remote commands per cycle and SSH connections opened, then cancels the jobs.

    .venv/bin/python benchmarks/poll_cost.py --jobs 200
Needs the local cluster (make cluster-up) and its connection env (/var/lib/vcloud-localcluster/airflow_conn.env).
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

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO / "providers" / "slurm" / "src")]
CONN_ENV = Path("/var/lib/vcloud-localcluster/airflow_conn.env")


def load_connection_env() -> None:
    for line in CONN_ENV.read_text().splitlines():
        key, _, value = line.partition("=")
        os.environ.setdefault(key, shlex.split(value)[0])


async def submit_jobs(conn_id: str, count: int) -> list[str]:
    from slurm_provider.hooks import SlurmAsyncHook

    hook = SlurmAsyncHook(conn_id)
    try:
        ids = []
        for i in range(count):
            result = await hook.submit("#!/bin/bash\ntrue\n", job_name=f"pollcost-{i}", output="/dev/null",
                                       time_limit="1", extra_options=["--begin=now+1hour"])
            ids.append(str(result.job_id))
        return ids
    finally:
        await hook.close()


async def measure_shared_poller(conn_id: str, job_ids: list[str], cycles: int) -> dict[str, float]:
    from slurm_provider import hooks, triggers
    from slurm_provider.watch.poller import _POLLERS

    made: list[hooks.SlurmAsyncHook] = []

    def factory(cid: str):
        def make():
            made.append(hooks.SlurmAsyncHook(cid))
            return made[-1]
        return make

    triggers._hook_factory = factory
    watchers = [
        asyncio.ensure_future(_drain(triggers.SlurmJobTrigger.watching(conn_id=conn_id, job_id=j, poll_interval=1.0,
                                                              max_poll_interval=1.0, first_poll_delay=0.0)))
        for j in job_ids
    ]
    while not _POLLERS or next(iter(_POLLERS.values())).cycles < cycles + 1:
        await asyncio.sleep(0.2)
    poller = next(iter(_POLLERS.values()))
    start_cycles, start_commands = poller.cycles, made[0].commands_issued
    while poller.cycles < start_cycles + cycles:
        await asyncio.sleep(0.2)
    measured_cycles = poller.cycles - start_cycles
    commands = made[0].commands_issued - start_commands
    for watcher in watchers:
        watcher.cancel()
    await asyncio.gather(*watchers, return_exceptions=True)
    return {"commands_per_cycle": commands / measured_cycles, "connections": sum(h.connections_opened for h in made),
            "hooks": len(made), "cycles": measured_cycles}


async def _drain(trigger) -> None:
    async for _ in trigger.run():
        return


async def measure_per_job(conn_id: str, job_ids: list[str], cycles: int) -> dict[str, float]:
    from slurm_provider.hooks import SlurmAsyncHook

    hook = SlurmAsyncHook(conn_id)
    try:
        for _ in range(cycles):
            for job_id in job_ids:
                await hook.statuses([job_id])
        return {"commands_per_cycle": hook.commands_issued / cycles, "connections": hook.connections_opened}
    finally:
        await hook.close()


async def cancel_jobs(conn_id: str, job_ids: list[str]) -> None:
    from slurm_provider.hooks import SlurmAsyncHook

    hook = SlurmAsyncHook(conn_id)
    try:
        for job_id in job_ids:
            await hook.cancel(job_id)
    finally:
        await hook.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--cycles", type=int, default=3)
    parser.add_argument("--conn-id", default="vcloud_local_cluster")
    args = parser.parse_args()
    load_connection_env()
    import logging

    logging.getLogger("asyncssh").setLevel(logging.WARNING)

    async def run() -> dict[str, float]:
        started = time.monotonic()
        job_ids = await submit_jobs(args.conn_id, args.jobs)
        print(f"submitted {len(job_ids)} jobs in {time.monotonic() - started:.1f}s", flush=True)
        try:
            ours = await measure_shared_poller(args.conn_id, job_ids, args.cycles)
            print(f"shared poller: {ours}", flush=True)
            per_job = await measure_per_job(args.conn_id, job_ids, args.cycles)
            print(f"per-job polling: {per_job}", flush=True)
        finally:
            await cancel_jobs(args.conn_id, job_ids)
        return {
            "jobs": len(job_ids),
            "ours_commands_per_cycle": ours["commands_per_cycle"],
            "per_job_commands_per_cycle": per_job["commands_per_cycle"],
            "ratio": round(per_job["commands_per_cycle"] / ours["commands_per_cycle"], 1),
            "ours_ssh_connections": ours["connections"],
            "per_job_ssh_connections_one_hook": per_job["connections"],
        }

    print(json.dumps(asyncio.run(run())))


if __name__ == "__main__":
    main()
