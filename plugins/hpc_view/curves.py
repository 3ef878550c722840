"""The training curves of the stages the view shows, as the workers and triggerers read them. No cluster command.

Each training stage appends to its ``metrics.jsonl`` a line per log step (about one a minute) and
per validation (:mod:`vcloud.contract`). While the stage trains, the trigger watching its job
follows the file (``slurm_provider.watch.followed_files``): at most every ``follow_interval`` seconds (60)
it reads what the trainer appended and keeps the curve so far, thinned to
``vcloud_pipeline.dag.curves.CURVE_POINTS`` points a series, in the task try's ``slurm_followed``
XCom; the view draws it with how old the last read is ("as of 40 s ago"). When the stage's job
completes, its operator (on a worker) reads the whole file once and records the curve in its return
value; the view draws that record. The API server holds no cluster credentials and never reads the
file itself.

Where a stage's file is comes from the job record (cluster profile, run name, stage label) and the
profile's layout (``vcloud_pipeline.plan.layout.run_paths``), as the training DAG computed it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
import time
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from typing import Any

from slurm_provider import span

from vcloud.contract import TrainingCurve

from hpc_view.charts import thin, training_curve_charts
from hpc_view.records import UNASSIGNED, WAITING_TASK_STATES, JobRecord

CURVE_INTERVAL_S = 30.0
"""How often an open page loads the view again while a stage trains (its task's record may change)."""
MAX_CURVES = 8
"""Stage curves per view, the newest records first."""
MAX_POINTS = 600
"""Points per series in the payload and the charts (:func:`hpc_view.charts.thin`)."""

_STAGE_LABEL = re.compile(r"^stage(\d)$")

Locate = Callable[[str, str, int], tuple[str, str]]
"""``(profile, run name, stage) -> (conn_id, metrics.jsonl path)``; raises ``ValueError`` saying why not."""


def profile_metrics_path(profile_name: str, run_name: str, stage: int) -> tuple[str, str]:
    """Where a stage of a run writes ``metrics.jsonl``, by the profile's layout."""
    from vcloud_pipeline.plan.layout import run_paths
    from vcloud_pipeline.profile import ProfileError, load_profile, overrides_from_environ

    if profile_name == UNASSIGNED:
        raise ValueError("the DAG run names no cluster profile, so the view does not know where the run's "
                         "files are")
    try:
        profile = load_profile(profile_name, overrides_from_environ(profile_name))
    except ProfileError as exc:
        raise ValueError(str(exc)) from None
    return profile.connection.conn_id, str(run_paths(profile, run_name).metrics_path(stage))


def stage_number(label: str) -> int | None:
    """The training stage of a job label (``stage2`` -> 2); None for other jobs (data, export)."""
    match = _STAGE_LABEL.match(label)
    return int(match.group(1)) if match else None


def is_live(record: JobRecord) -> bool:
    """The task still waits for its job: the file may grow."""
    return not record.final and record.task_state in WAITING_TASK_STATES


@dataclass(frozen=True)
class CurveTarget:
    """One stage's curve to show: the newest record of that run and stage, where its file is, and the
    newest curve a completed job of it recorded."""

    record: JobRecord
    run_name: str
    stage: int
    live: bool
    conn_id: str | None = None
    path: str | None = None
    problem: str | None = None
    recorded: JobRecord | None = None
    """The newest final record of this run and stage that carries a curve (the file is append-only:
    a stage trained again shows the earlier steps too)."""
    followed: Mapping[str, Any] | None = None
    """While the stage trains: its file as the watch of its job follows it (``FollowedFile.to_json``)."""


def _followed(record: JobRecord, path: str | None) -> Mapping[str, Any] | None:
    """The live record's followed file at ``path`` (None: not followed, or not live)."""
    return record.followed.get(path) if path and is_live(record) else None


def curve_targets(records: Iterable[JobRecord], locate: Locate = profile_metrics_path, *,
                  limit: int = MAX_CURVES) -> list[CurveTarget]:
    """The stages of the newest ``limit`` runs-and-stages among ``records``, ordered by run and stage.

    A record without a run name (a task still waiting, of a DAG run whose ``conf`` names none)
    takes it from another record of the same DAG run.
    """
    records = list(records)
    names = {(r.dag_id, r.run_id): r.run_name for r in records if r.run_name}
    chosen: dict[tuple[str, str, int], CurveTarget] = {}
    for record in reversed(records):  # newest first: waiting tasks, then the latest to finish
        stage = stage_number(record.stage)
        if stage is None:
            continue
        run_name = record.run_name or names.get((record.dag_id, record.run_id), "")
        key = (record.profile, run_name or f"{record.dag_id}/{record.run_id}", stage)
        recorded = record if record.final and record.curve is not None else None
        if key in chosen:
            target = chosen[key]
            if is_live(record) and not target.live:
                target = replace(target, live=True)
            if target.recorded is None and recorded is not None:
                target = replace(target, recorded=recorded)
            if target.followed is None and (followed := _followed(record, target.path)) is not None:
                target = replace(target, followed=followed)
            chosen[key] = target
            continue
        if len(chosen) >= limit:
            continue
        if not run_name:
            chosen[key] = CurveTarget(record, "", stage, is_live(record), recorded=recorded, problem=(
                "no run name recorded yet (the DAG run's conf names none and no job of it has finished), "
                "so the view does not know where the stage writes metrics.jsonl"))
            continue
        try:
            conn_id, path = locate(record.profile, run_name, stage)
        except ValueError as exc:
            chosen[key] = CurveTarget(record, run_name, stage, is_live(record), recorded=recorded, problem=str(exc))
            continue
        chosen[key] = CurveTarget(record, run_name, stage, is_live(record), conn_id, path, recorded=recorded,
                                  followed=_followed(record, path))
    return sorted(chosen.values(), key=lambda t: (t.record.profile, t.run_name, t.stage))


def _read_at(target: CurveTarget) -> float | None:
    """When the watch last read the training stage's file (epoch seconds), None if it has not."""
    read_at = (target.followed or {}).get("read_at")
    return float(read_at) if isinstance(read_at, (int, float)) and not isinstance(read_at, bool) else None


def _problem(target: CurveTarget, curve: TrainingCurve, now: float) -> str | None:
    """Why the chart shows less than the stage has written, or nothing; None when it is all there."""
    if target.problem:
        return target.problem
    where = f"{target.path} on cluster connection {target.conn_id}"
    if target.live:
        followed = target.followed or {}
        if followed.get("problem"):
            return (f"the stage is training; its watch stopped following {where} ({followed['problem']}): the "
                    "curve is drawn when its job completes")
        read_at = _read_at(target)
        if read_at is None:
            return (f"the stage is training: its job's watch draws the curve from {where} once the trainer has "
                    "written to it (read at most once a minute; the API server does not read the cluster)")
        return (f"the stage is training: its curve as of {span(max(now - read_at, 0.0))} ago, as its job's watch "
                f"last read {where}; complete when the job completes")
    if target.recorded is None:
        return f"no curve recorded by the stage's task (it ended without a completed job): see {where}"
    if curve.empty:
        return "the stage recorded no training curve (metrics.jsonl was missing or empty when its job completed)"
    return None


def stage_curves(records: Iterable[JobRecord], locate: Locate = profile_metrics_path, *,
                 limit: int = MAX_CURVES, max_points: int = MAX_POINTS,
                 now: float | None = None) -> list[dict[str, Any]]:
    """The payload's curves: per stage where its file is, the points its task recorded (thinned to
    ``max_points``), or while it trains the points its job's watch read so far with how old they are
    (``live_at``, ``as_of_s``; ``now`` defaults to the clock), and its two charts, or why there is
    nothing to show."""
    now = time.time() if now is None else now
    out = []
    for target in curve_targets(records, locate, limit=limit):
        record = target.record
        read_at = _read_at(target) if target.live else None
        recorded: Mapping[str, Any] | None = target.recorded.curve if target.recorded is not None else None
        if read_at is not None and isinstance((target.followed or {}).get("state"), Mapping):
            recorded = target.followed["state"]  # type: ignore[index]
        curve = TrainingCurve.from_json(recorded)
        curve = TrainingCurve(loss=thin(curve.loss, max_points), val_psnr=thin(curve.val_psnr, max_points))
        out.append({
            "profile": record.profile, "run_name": target.run_name, "stage": target.stage,
            "label": record.stage, "dag_id": record.dag_id, "run_id": record.run_id,
            "task_id": record.task_id, "job_id": record.job_id, "state": record.state,
            "task_state": record.task_state, "live": target.live,
            "path": target.path, "conn_id": target.conn_id, "problem": _problem(target, curve, now),
            "live_at": datetime.fromtimestamp(read_at, timezone.utc).isoformat() if read_at is not None else None,
            "as_of_s": round(max(now - read_at, 0.0), 1) if read_at is not None else None,
            "recorded_at": (target.recorded.finished_at.isoformat()
                            if target.recorded is not None and target.recorded.finished_at else None),
            "points": curve.to_json(), "charts": training_curve_charts(curve),
        })
    return out
