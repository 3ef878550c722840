"""How late a job's end is noticed: from its ``End`` in ``sacct`` to its trigger's event, with exit
records and without (the poll alone), side by side in one run.

50 real jobs of mixed lengths per side run on the local cluster; their scripts leave an exit record
(``slurm_provider.watch.end_records``). Every job is watched by a real ``SlurmJobTrigger`` in one event loop,
each side through its own connection's shared poller (a triggerer each), on the shipped schedule
(first poll after 10 s, 15 s growing by 1.5x per quiet poll to 300 s; records read every 5 s). The
side without records is today's behaviour: the same trigger with ``read_end_record=False``. Each
side's jobs are submitted interleaved with the other's, so both meet the same queue, and each job is
watched from its submission on.

The delay of a job is the wall-clock time of its event minus the ``End`` that ``sacct`` holds for it
(whole seconds: a delay may read up to a second long). Also printed: what noticed each end, and the
scheduler calls each side's connection made to watch (its submissions left out).

    .venv/bin/python benchmarks/end_detection.py        # about 10 minutes
Needs the local cluster (make cluster-up) and its connection env.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import shlex
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO / "providers" / "slurm" / "src")]
STATE = Path("/var/lib/vcloud-localcluster")
CONN_ENV = STATE / "airflow_conn.env"
SSH = ["ssh", "-F", str(STATE / "ssh" / "config"), "vcloud-local"]
LENGTHS = (3, 8, 15, 25, 40, 60, 90, 120, 180, 240)
"""Seconds the jobs run (each five times per side): a dev-g check to a few minutes of a stage."""


def load_connections(conn_id: str, baseline_id: str) -> None:
    for line in CONN_ENV.read_text().splitlines():
        key, _, value = line.partition("=")
        os.environ.setdefault(key, shlex.split(value)[0])
    os.environ[f"AIRFLOW_CONN_{baseline_id.upper()}"] = os.environ[f"AIRFLOW_CONN_{conn_id.upper()}"]


def ssh(command: str) -> str:
    return subprocess.run([*SSH, command], capture_output=True, text=True, check=True, timeout=120).stdout


async def submit(conn_id: str, directory: str, seconds: int, side: str) -> tuple[str, str]:
    from slurm_provider.watch.end_records import end_record_shell
    from slurm_provider.hooks import SlurmAsyncHook

    name = f"enddet-{side}-{seconds}s"
    output = f"{directory}/{name}.%j.out"
    script = f"#!/bin/bash\n{end_record_shell(output)}\necho 'working for {seconds}s'\nsleep {seconds}\n"
    hook = SlurmAsyncHook(conn_id)
    try:
        job_id = str((await hook.submit(script, job_name=name, output=output, time_limit="10",
                                        extra_options=["--mem=100M", "--cpus-per-task=1"])).job_id)
    finally:
        await hook.close()
    return job_id, output.replace("%j", job_id)


async def watch(conn_id: str, job_id: str, log_path: str, records: bool) -> dict[str, Any]:
    from slurm_provider.triggers import SlurmJobTrigger

    trigger = SlurmJobTrigger.watching(conn_id=conn_id, job_id=job_id, log_path=log_path, read_end_record=records)
    async for event in trigger.run():
        return {"job_id": job_id, "event_at": time.time(), "kind": event.payload["kind"],
                "state": (event.payload["status"] or {}).get("state"), "noticed_by": event.payload["noticed_by"]}
    raise RuntimeError(f"the trigger of job {job_id} ended without an event")


def sacct_ends(job_ids: list[str]) -> dict[str, int]:
    """``End`` of each job as seconds since the epoch, once accounting holds all of them."""
    for _ in range(60):
        text = ssh(f"SLURM_TIME_FORMAT=%s sacct -X -n -P -o JobID,End -j {','.join(job_ids)}")
        ends = {jid: int(end) for jid, end in (line.split("|") for line in text.splitlines()) if end.isdigit()}
        if all(j in ends for j in job_ids):
            return ends
        time.sleep(5)
    raise RuntimeError("sacct did not account every job's end within 5 minutes")


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


def figures(side: list[dict[str, Any]], ends: dict[str, int], conn_id: str) -> dict[str, Any]:
    from slurm_provider.scheduler_calls import calls_of

    delays = [round(w["event_at"] - ends[w["job_id"]], 1) for w in side]
    calls = calls_of(conn_id)
    return {"jobs": len(delays), "p50_s": percentile(delays, 50), "p95_s": percentile(delays, 95),
            "max_s": max(delays), "mean_s": round(sum(delays) / len(delays), 1),
            "noticed_by": dict(Counter(w["noticed_by"] for w in side)),
            "states": dict(Counter(w["state"] for w in side)),
            "watch_scheduler_calls": calls.total - calls.by_verb.get("sbatch", 0),
            "watch_scheduler_calls_by_verb": {verb: n for verb, n in calls.by_verb.items() if verb != "sbatch"}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--per-length", type=int, default=5, help="jobs of each length per side")
    parser.add_argument("--lengths", default=",".join(map(str, LENGTHS)), help="seconds the jobs run, comma-separated")
    parser.add_argument("--conn-id", default="vcloud_local_cluster")
    args = parser.parse_args()
    baseline_id = f"{args.conn_id}_poll_only"
    load_connections(args.conn_id, baseline_id)
    directory = f"/srv/vcloud/scratch/vcloud/bench/end-detection-{uuid.uuid4().hex[:8]}"
    ssh(f"mkdir -p {shlex.quote(directory)}")
    lengths = [int(length) for length in args.lengths.split(",") for _ in range(args.per_length)]
    sides = {"with_records": (args.conn_id, True), "poll_only": (baseline_id, False)}
    submitted: dict[str, list[str]] = {side: [] for side in sides}

    from slurm_provider.scheduler_calls import forget_calls

    async def run() -> dict[str, list[dict[str, Any]]]:
        """Submit the jobs interleaved (both sides meet the same queue), each watched from its submission."""
        watches: dict[str, list[asyncio.Task[dict[str, Any]]]] = {side: [] for side in sides}
        for length in lengths:
            for side, (conn, records) in sides.items():
                job_id, log_path = await submit(conn, directory, length, side)
                submitted[side].append(job_id)
                watches[side].append(asyncio.ensure_future(watch(conn, job_id, log_path, records)))
        return {side: list(await asyncio.gather(*tasks)) for side, tasks in watches.items()}

    import logging

    import structlog.testing

    logging.getLogger("asyncssh").setLevel(logging.WARNING)
    logging.getLogger("paramiko").setLevel(logging.WARNING)
    logging.getLogger("slurm_provider").setLevel(logging.WARNING)
    forget_calls(args.conn_id)
    forget_calls(baseline_id)
    with structlog.testing.capture_logs(), contextlib.redirect_stdout(sys.stderr):  # the task logs
        events = asyncio.run(run())
    ends = sacct_ends([j for ids in submitted.values() for j in ids])
    ssh(f"rm -rf {shlex.quote(directory)}")
    print(json.dumps({
        "what": "delay from the job's End in sacct to its trigger's event, seconds",
        "schedule": "shipped: first poll 10 s, then 15 s x1.5 per quiet poll up to 300 s; records read every 5 s",
        "job_lengths_s": sorted(set(lengths)), "jobs_per_side": len(lengths),
        "with_records": figures(events["with_records"], ends, args.conn_id),
        "poll_only": figures(events["poll_only"], ends, baseline_id),
        "target": "p95 at most 15 s with records",
    }))


if __name__ == "__main__":
    main()
