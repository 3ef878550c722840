"""Time to first job and per-stage overhead of the training DAG in a running deployment.

Starts a deployment on a fresh Airflow home (``airflow api-server``, ``scheduler`` with the
LocalExecutor, ``dag-processor``, ``triggerer``: ``tests/support/deployment.py``), the local profile moved to
a fresh project directory, and triggers ``vcloud_training`` through the REST API (what the UI's
trigger form does) with the tiny config, one run after the other, each under a run name of its own
(so no stage is skipped; the synthetic dataset is prepared by the first run only). For each run it
reads the run's jobs from ``sacct`` (by each job task's deterministic job name) and measures:

  * ``first_job``: from the REST trigger to the first job's ``Submit`` (the first ``sbatch``);
  * ``stage_gaps``: from each job's ``End`` to the next job task's ``Submit``
    (prepare_data -> preflight_imports -> stage0 -> stage1 -> stage2 -> stage3 -> export).

Each gap is split with the task instances' own times (REST): ``noticed`` (job End to the end of the
task that watched it: the trigger's poll, its event, the scheduler's resume and the task's
``execute_complete``), ``scheduled`` (that task's end to the next task's start) and ``submitting``
(the next task's start to its job's ``Submit``: the skip checks, the ``sbatch`` round trip). The
time to the first job is split by the tasks before it. ``sacct`` times are whole seconds.

The trigger's poll schedule is the provider's shipped one (first poll 10 s after the deferral, then
15 s growing by 1.5x per quiet poll to 300 s) unless ``--poll-interval`` / ``--max-poll-interval``
/ ``--first-poll-delay`` say otherwise. Each job task first watches its job itself for 20 s from the
job's exit record, as the pipeline ships (``--short-job-wait 0``: it defers at once, the trigger alone
notices every end).

    .venv/bin/python benchmarks/stage_overhead.py --runs 3      # about 6 minutes on 2 cores
    .venv/bin/python benchmarks/stage_overhead.py --runs 3 --baseline-short-job-wait 0   # and the baseline

``--baseline-short-job-wait 0`` then runs the same in a second deployment whose tasks defer at once
(the trigger alone notices every end) and prints both, with the baseline's figures over the shipped
ones (``baseline_over_shipped``).
Needs the local cluster (make cluster-up) and root (like the cluster tests); ``--keep DIR`` keeps
the Airflow homes (component logs, each run's task instances) in DIR.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO / "tests"), str(REPO / "providers" / "slurm" / "src"), str(REPO / "plugins"),
                str(REPO / "trainer" / "src"), str(REPO)]

DAG_ID = "vcloud_training"
JOB_TASKS = ("prepare_data", "preflight_imports", "stage0", "stage1", "stage2", "stage3", "export")
"""The DAG's job tasks in the order they submit (each waits for the one before)."""
BEFORE_FIRST_JOB = ("plan", "sync_code", "preflight_checks", "provision_env")
TERMINAL = {"success", "failed"}


@dataclass(frozen=True)
class Job:
    """One allocation in ``sacct`` (``-X``): its times as POSIX seconds (None while unknown)."""

    job_id: str
    name: str
    submit: float
    start: float | None
    end: float | None
    state: str


def _sacct_time(text: str) -> float | None:
    """``sacct``'s local ISO time (``2026-11-27T04:50:01``) as POSIX seconds; ``Unknown`` -> None."""
    if not text or text in {"Unknown", "None"}:
        return None
    return time.mktime(time.strptime(text, "%Y-%m-%dT%H:%M:%S"))


def parse_sacct(text: str) -> list[Job]:
    """Rows of ``sacct -X -n -P --format=JobIDRaw,JobName,Submit,Start,End,State``."""
    jobs = []
    for line in text.splitlines():
        fields = line.split("|")
        if len(fields) < 6:
            continue
        submit = _sacct_time(fields[2])
        if submit is None:
            continue
        jobs.append(Job(fields[0], fields[1], submit, _sacct_time(fields[3]), _sacct_time(fields[4]),
                        fields[5].split()[0] if fields[5] else ""))
    return jobs


def _iso(text: str | None) -> float | None:
    """An Airflow REST timestamp (``2026-11-27T04:50:01.123456Z``) as POSIX seconds."""
    if not text:
        return None
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def _span(later: float | None, earlier: float | None) -> float | None:
    return None if later is None or earlier is None else round(later - earlier, 1)


def run_figures(triggered: float, jobs_by_task: Mapping[str, Sequence[Job]],
                tis: Mapping[str, Mapping[str, Any]],
                timelines: Mapping[str, Mapping[str, float | None]] | None = None) -> dict[str, Any]:
    """One run's time to first job and its gaps between consecutive job tasks, each split by the
    task instances' times (``tis``: task id -> REST task instance) and, where given, by the watching
    task's log (``timelines``: task id -> ``watch_timeline``)."""
    start = {task: _iso(ti.get("start_date")) for task, ti in tis.items()}
    end = {task: _iso(ti.get("end_date")) for task, ti in tis.items()}
    submitted = [(min(j.submit for j in jobs), task) for task, jobs in jobs_by_task.items() if jobs]
    if not submitted:
        return {"first_job": None, "gaps": []}
    first_submit, first_task = min(submitted)
    before = {task: {"queued_after_previous": _span(start.get(task), prev_end),
                     "ran": _span(end.get(task), start.get(task))}
              for task, prev_end in _previous_ends(BEFORE_FIRST_JOB, end, triggered)}
    first = {"task": first_task, "seconds": round(first_submit - triggered, 1),
             "to_plan_start": _span(start.get("plan"), triggered), "tasks": before,
             "submitting": _span(first_submit, start.get(first_task))}
    gaps = []
    ran = [task for task in JOB_TASKS if jobs_by_task.get(task)]
    for prev, nxt in zip(ran, ran[1:]):
        prev_end = max((j.end for j in jobs_by_task[prev] if j.end is not None), default=None)
        next_submit = min(j.submit for j in jobs_by_task[nxt])
        gaps.append({"gap": f"{prev}->{nxt}", "seconds": _span(next_submit, prev_end),
                     "noticed": _span(end.get(prev), prev_end),
                     "scheduled": _span(start.get(nxt), end.get(prev)),
                     "submitting": _span(next_submit, start.get(nxt)),
                     **_watch_parts(prev_end, (timelines or {}).get(prev)),
                     "jobs": [j.job_id for j in jobs_by_task[prev]] + [j.job_id for j in jobs_by_task[nxt]]})
    return {"first_job": first, "gaps": gaps}


def _watch_parts(job_end: float | None, timeline: Mapping[str, float | None] | None) -> dict[str, Any]:
    """The ``noticed`` part split by the watching task's log: the deferral to the trigger's first
    poll, the job's end to the trigger's event, the event to the task's resumption, the resumed
    task's ``execute_complete``; ``noticed_by`` says whether the trigger or the task itself (a job that
    ended within ``short_job_wait``, no deferral) saw the end."""
    if not timeline:
        return {}
    by = "trigger" if timeline["deferred"] is not None else "task"  # a short job: the task saw its end itself
    return {"noticed_by": by, "watch": {"deferral_to_first_poll": _span(timeline["first_poll"], timeline["deferred"]),
                      "end_to_event": _span(timeline["fired"], job_end),
                      "event_to_resume": _span(timeline["resumed"], timeline["fired"]),
                      "resume_to_task_end": _span(timeline["ended"], timeline["resumed"])}}


def _previous_ends(tasks: Iterable[str], end: Mapping[str, float | None],
                   triggered: float) -> Iterable[tuple[str, float | None]]:
    prev: float | None = triggered
    for task in tasks:
        yield task, prev
        prev = end.get(task) or prev


def log_events(lines: Iterable[str]) -> list[tuple[float, str]]:
    """(time, event) of each JSON line of an Airflow 3 task or trigger log; other lines are skipped."""
    events = []
    for line in lines:
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if isinstance(entry, dict) and (stamp := _iso(entry.get("timestamp"))) is not None:
            events.append((stamp, str(entry.get("event", ""))))
    return events


def watch_timeline(task_log: Sequence[tuple[float, str]],
                   trigger_log: Sequence[tuple[float, str]]) -> dict[str, float | None]:
    """When a job task deferred, its trigger started, polled first and fired, and the task resumed
    and ended, from the try's task log and its trigger's log (``log_events``)."""
    deferred = next((t for t, e in task_log if e.startswith("Pausing task as DEFERRED")), None)
    resumed = next((t for t, e in task_log if e == "::group::Pre Execute" and deferred and t > deferred),
                   None)
    started = next((t for t, e in trigger_log if e.startswith("trigger ") and e.endswith(" starting")), None)
    first_poll = next((t for t, e in trigger_log if started and t > started), None)
    fired = next((t for t, e in trigger_log if e == "Trigger fired event"), None)
    return {"deferred": deferred, "trigger_started": started, "first_poll": first_poll, "fired": fired,
            "resumed": resumed, "ended": task_log[-1][0] if task_log and resumed else None}


def percentile(values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile (no interpolation: a figure that was measured)."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


def summary(values: Sequence[float]) -> dict[str, Any]:
    return {"n": len(values), "p50": percentile(values, 50), "p95": percentile(values, 95),
            "max": max(values) if values else None}


def aggregate(runs: Sequence[Mapping[str, Any]], first_target: float, gap_target: float) -> dict[str, Any]:
    """p50/p95 of the time to first job and of every gap, and of each gap's parts, over all runs."""
    firsts = [r["first_job"]["seconds"] for r in runs if r.get("first_job")]
    gaps = [g for r in runs for g in r["gaps"] if g["seconds"] is not None]
    parts = {part: summary([g[part] for g in gaps if g[part] is not None])
             for part in ("noticed", "scheduled", "submitting")}
    first_p95, gap_p95 = percentile(firsts, 95), percentile([g["seconds"] for g in gaps], 95)
    watch = {part: summary([g["watch"][part] for g in gaps
                            if g.get("watch") and g["watch"][part] is not None])
             for part in ("deferral_to_first_poll", "end_to_event", "event_to_resume", "resume_to_task_end")}
    return {
        "first_job": {**summary(firsts), "target_p95": first_target,
                      "holds": first_p95 is not None and first_p95 <= first_target},
        "stage_gap": {**summary([g["seconds"] for g in gaps]), "target_p95": gap_target,
                      "holds": gap_p95 is not None and gap_p95 <= gap_target, "parts": parts,
                      "noticed_parts": watch,
                      "noticed_by": {by: sum(1 for g in gaps if g.get("noticed_by") == by) for by in ("task", "trigger")}},
        "gaps": [{"run": r["run_id"], **g} for r in runs for g in r["gaps"]],
    }


# --- the deployment and the cluster (I/O) ---------------------------------------------------------------


def run_jobs(cluster: Any, run_id: str) -> dict[str, list[Job]]:
    """The run's jobs by task, from accounting once it holds every job submitted until now; every run of
    a requeued job (``-D``), since a requeue resets the job's ``Submit`` to the requeue's time."""
    from slurm_provider.operators import job_name_for

    cluster.accounting_caught_up()
    names = {job_name_for(DAG_ID, task, run_id): task for task in JOB_TASKS}
    out = cluster.root("sacct", "-X", "-D", "-n", "-P", "-a", "-S", "now-1days", f"--name={','.join(names)}",
                       "--format=JobIDRaw,JobName,Submit,Start,End,State").stdout
    by_task: dict[str, list[Job]] = {task: [] for task in JOB_TASKS}
    for job in parse_sacct(out):
        if job.name in names:
            by_task[names[job.name]].append(job)
    return by_task


def trigger(api: Any, run_name: str, max_epochs: int | None) -> tuple[str, float]:
    run_id = f"overhead-{run_name}-{uuid.uuid4().hex[:6]}"
    conf: dict[str, Any] = {"profile": "local", "config": "tiny", "run_name": run_name}
    if max_epochs:
        conf["max_epochs"] = max_epochs
    triggered = time.time()
    status, body = api.call("POST", f"/api/v2/dags/{DAG_ID}/dagRuns",
                            {"dag_run_id": run_id, "logical_date": None, "conf": conf})
    if status != 200:
        raise SystemExit(f"triggering {DAG_ID} failed: {status} {body}")
    return run_id, triggered


def wait_run_end(api: Any, run_id: str, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = api.get(f"/api/v2/dags/{DAG_ID}/dagRuns/{run_id}")["state"]
        if state in TERMINAL:
            return state
        time.sleep(3)
    raise SystemExit(f"run {run_id} did not end within {timeout:.0f} s: raise --run-timeout")


def task_instances(api: Any, run_id: str) -> dict[str, dict[str, Any]]:
    body = api.get(f"/api/v2/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances?limit=100")
    return {ti["task_id"]: ti for ti in body["task_instances"]}


def timelines(home: Path, run_id: str) -> dict[str, dict[str, float | None]]:
    """Each job task's ``watch_timeline`` from its last try's log files under the Airflow home."""
    out = {}
    for task in JOB_TASKS:
        folder = home / "logs" / f"dag_id={DAG_ID}" / f"run_id={run_id}" / f"task_id={task}"
        tries = sorted(folder.glob("attempt=*.log"), key=lambda p: int(p.name.split("=")[1].split(".")[0]))
        if not tries:
            continue
        trigger_logs = sorted(folder.glob(f"{tries[-1].name}.trigger.*.log"))
        task_log = log_events(tries[-1].read_text(errors="replace").splitlines())
        trigger_log = (log_events(trigger_logs[-1].read_text(errors="replace").splitlines())
                       if trigger_logs else [])
        out[task] = watch_timeline(task_log, trigger_log)
    return out


def compare(shipped: Mapping[str, Any], baseline: Mapping[str, Any]) -> dict[str, Any]:
    """The baseline's p50/p95 over the shipped ones (how many times longer the baseline took), for the
    time to the first job and the stage gaps (None where either side has no figure)."""
    def ratio(figure: str, q: str) -> float | None:
        ours, theirs = shipped[figure][q], baseline[figure][q]
        return round(theirs / ours, 2) if ours and theirs is not None else None

    return {f"{figure}_{q}": ratio(figure, q) for figure in ("first_job", "stage_gap") for q in ("p50", "p95")}


def measure(cluster: Any, env: Mapping[str, str], home: Path, args: argparse.Namespace, label: str,
            ) -> list[dict[str, Any]]:
    """``args.runs`` runs of the DAG, one after the other, in a deployment of its own on ``home``."""
    from support.deployment import deployment_with_dag

    runs = []
    home.mkdir(parents=True, exist_ok=True)
    with deployment_with_dag(dict(env), home, DAG_ID) as (_, api):
        for n in range(args.runs):
            run_id, triggered = trigger(api, f"{label}{n}", args.max_epochs)
            state = wait_run_end(api, run_id, args.run_timeout)
            tis = task_instances(api, run_id)
            (home / f"{run_id}.tis.json").write_text(json.dumps(tis, indent=1))
            figures = run_figures(triggered, run_jobs(cluster, run_id), tis, timelines(home, run_id))
            runs.append({"run_id": run_id, "state": state, **figures})
            first = figures["first_job"] and figures["first_job"]["seconds"]
            print(f"{run_id}: {state}, first job after {first} s, "
                  f"gaps {[g['seconds'] for g in figures['gaps']]}", file=sys.stderr)
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="training runs, one after the other")
    parser.add_argument("--max-epochs", type=int, default=None,
                        help="the runs' max_epochs (default: the config's)")
    parser.add_argument("--poll-interval", type=float, default=None)
    parser.add_argument("--max-poll-interval", type=float, default=None)
    parser.add_argument("--first-poll-delay", type=float, default=None)
    parser.add_argument("--short-job-wait", type=float, default=None,
                        help="seconds a job task watches its job itself before deferring (0: defer at once)")
    parser.add_argument("--baseline-short-job-wait", type=float, default=None,
                        help="then the same runs in a second deployment with this short_job_wait (0: every "
                             "task defers at once, the trigger alone notices every end), and the ratios")
    parser.add_argument("--run-timeout", type=float, default=1800)
    parser.add_argument("--first-job-target", type=float, default=60)
    parser.add_argument("--gap-target", type=float, default=10)
    parser.add_argument("--keep", type=Path, default=None, help="keep the Airflow homes here")
    args = parser.parse_args()

    from support.localcluster import bring_up
    from support.ports import free_port
    from support.deployment import airflow_env

    cluster = bring_up()
    os.environ.update(cluster.connection_env())
    top = Path(tempfile.mkdtemp(prefix="stage-overhead-")) if args.keep is None else args.keep
    sides = {"overhead": args.short_job_wait}
    if args.baseline_short_job_wait is not None:
        sides["baseline"] = args.baseline_short_job_wait
    results: dict[str, dict[str, Any]] = {}
    try:
        for label, short_job_wait in sides.items():
            home = top / label
            home.mkdir(parents=True, exist_ok=True)
            env = airflow_env(home, free_port(), cluster.test_dir())
            poll = {"VCLOUD_POLL_INTERVAL": args.poll_interval, "VCLOUD_MAX_POLL_INTERVAL": args.max_poll_interval,
                    "VCLOUD_FIRST_POLL_DELAY": args.first_poll_delay, "VCLOUD_SHORT_JOB_WAIT": short_job_wait}
            for key, value in poll.items():  # the tests' fast schedule is not what a deployment runs
                env.pop(key, None)
                if value is not None:
                    env[key] = str(value)
            runs = measure(cluster, env, home, args, label)
            results[label] = {"poll_schedule": {k: env.get(k, "shipped") for k in poll},
                              "runs": [{k: r[k] for k in ("run_id", "state", "first_job")} for r in runs],
                              **aggregate(runs, args.first_job_target, args.gap_target)}
    finally:
        if args.keep is None:
            shutil.rmtree(top, ignore_errors=True)
    result = {"benchmark": "stage_overhead", "config": "tiny", "profile": "local",
              "executor": "LocalExecutor", "cores": os.cpu_count(),
              "load_average_1m": round(os.getloadavg()[0], 2), **results.pop("overhead")}
    if "baseline" in results:
        result["baseline"] = results["baseline"]
        result["baseline_over_shipped"] = compare(result, results["baseline"])
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
