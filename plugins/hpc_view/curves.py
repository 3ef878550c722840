"""The training curves of the stages the view shows, read from the cluster at most once an interval.

Each training stage appends to its ``metrics.jsonl`` a line per log step (about one a minute) and
per validation (:mod:`vcloud.contract`). The view reads the files of the newest stage records
through the Slurm hook (``SlurmHook.read_file``, one connection per cluster for all of them),
parses them with the trainer's own parser (``vcloud.contract.training_curve``: a line still being
written is skipped) and keeps the parsed points: a file is read again only when its points are
older than ``CURVE_INTERVAL_S`` (``FINISHED_INTERVAL_S`` once every task that writes it has ended),
whatever the number of people looking. On LUMI each read is a command on a shared login node.

Where a stage's file is comes from the job record (cluster profile, run name, stage label) and the
profile's layout (``vcloud_pipeline.plan.layout.run_paths``), as the training DAG computed it.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from vcloud.contract import TrainingCurve, training_curve

from hpc_view.charts import thin, training_curve_charts
from hpc_view.records import UNASSIGNED, WAITING_TASK_STATES, JobRecord

CURVE_INTERVAL_S = 30.0
"""Least age of a running stage's points before its file is read again (the trainer logs about
once a minute)."""
FINISHED_INTERVAL_S = 600.0
"""The same for a stage whose tasks have all ended: its file changes only if the run is trained again."""
MAX_CURVES = 8
"""Stage curves per view, the newest records first: each is one read on the login node."""
MAX_POINTS = 600
"""Points per series in the payload and the charts (:func:`hpc_view.charts.thin`)."""

_STAGE_LABEL = re.compile(r"^stage(\d)$")

FileSource = Callable[[str, list[str]], Mapping[str, str | None]]
"""``(conn_id, paths) -> {path: text or None when missing}``; the default opens a ``SlurmHook``."""

Locate = Callable[[str, str, int], tuple[str, str]]
"""``(profile, run name, stage) -> (conn_id, metrics.jsonl path)``; raises ``ValueError`` saying why not."""


def hook_read_files(conn_id: str, paths: list[str]) -> dict[str, str | None]:
    """Every file over one connection to the cluster's login node."""
    from slurm_provider.hooks import SlurmHook

    with SlurmHook(conn_id) as hook:
        return {path: hook.read_file(path) for path in paths}


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
    """One stage's curve to show: the newest record of that run and stage, and where its file is."""

    record: JobRecord
    run_name: str
    stage: int
    live: bool
    conn_id: str | None = None
    path: str | None = None
    problem: str | None = None


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
        if key in chosen:
            if is_live(record) and not chosen[key].live:
                chosen[key] = replace(chosen[key], live=True)
            continue
        if len(chosen) >= limit:
            continue
        if not run_name:
            chosen[key] = CurveTarget(record, "", stage, is_live(record), problem=(
                "no run name recorded yet (the DAG run's conf names none and no job of it has finished), "
                "so the view does not know where the stage writes metrics.jsonl"))
            continue
        try:
            conn_id, path = locate(record.profile, run_name, stage)
        except ValueError as exc:
            chosen[key] = CurveTarget(record, run_name, stage, is_live(record), problem=str(exc))
            continue
        chosen[key] = CurveTarget(record, run_name, stage, is_live(record), conn_id, path)
    return sorted(chosen.values(), key=lambda t: (t.record.profile, t.run_name, t.stage))


@dataclass(frozen=True)
class CurveRead:
    """What the view knows of one file: its points, whether it existed, when it was read."""

    curve: TrainingCurve
    exists: bool
    read_at: float


@dataclass
class CurveReads:
    """Parsed ``metrics.jsonl`` files per (connection, path), shared by every request of the API
    server process; a file is read again only when its points are older than the interval."""

    source: FileSource = hook_read_files
    interval_s: float = CURVE_INTERVAL_S
    finished_interval_s: float = FINISHED_INTERVAL_S
    clock: Callable[[], float] = time.monotonic

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._cache: dict[tuple[str, str], CurveRead] = {}

    def read(self, wanted: Mapping[str, Mapping[str, bool]]
             ) -> tuple[dict[tuple[str, str], CurveRead], dict[str, str]]:
        """``wanted``: per connection, each path and whether its stage is live. Returns what is known
        of each path (the cached read where a new one failed) and, per connection that could not be
        read, why."""
        known: dict[tuple[str, str], CurveRead] = {}
        problems: dict[str, str] = {}
        with self._lock:
            for conn_id, paths in wanted.items():
                now = self.clock()
                due = sorted(path for path, live in paths.items()
                             if (cached := self._cache.get((conn_id, path))) is None
                             or now - cached.read_at >= self._interval(live))
                if due:
                    try:
                        texts = self.source(conn_id, due)
                    except Exception as exc:  # transport errors, a missing connection: shown, never fatal
                        problems[conn_id] = (f"cannot read the training curves over cluster connection "
                                             f"{conn_id}: {exc}")
                    else:
                        read_at = self.clock()
                        for path in due:
                            text = texts.get(path)
                            curve = training_curve(text or "")
                            self._cache[(conn_id, path)] = CurveRead(curve, text is not None, read_at)
                for path in paths:
                    if (conn_id, path) in self._cache:
                        known[(conn_id, path)] = self._cache[(conn_id, path)]
        return known, problems

    def _interval(self, live: bool) -> float:
        return self.interval_s if live else self.finished_interval_s

    def age(self, read: CurveRead) -> float:
        return max(self.clock() - read.read_at, 0.0)


def stage_curves(records: Iterable[JobRecord], reads: CurveReads, locate: Locate = profile_metrics_path, *,
                 limit: int = MAX_CURVES, max_points: int = MAX_POINTS) -> list[dict[str, Any]]:
    """The payload's curves: per stage where its file is, its points (thinned to ``max_points``) and
    its two charts, or why there is nothing to show."""
    targets = curve_targets(records, locate, limit=limit)
    wanted: dict[str, dict[str, bool]] = {}
    for target in targets:
        if target.conn_id and target.path:
            paths = wanted.setdefault(target.conn_id, {})
            paths[target.path] = paths.get(target.path, False) or target.live
    known, problems = reads.read(wanted)
    out = []
    for target in targets:
        record = target.record
        read = known.get((target.conn_id, target.path)) if target.conn_id and target.path else None
        problem = target.problem or (problems.get(target.conn_id) if target.conn_id else None)
        if read is not None and not read.exists and problem is None:
            problem = "no metrics.jsonl yet: the stage has not started training"
        curve = read.curve if read is not None else TrainingCurve()
        curve = TrainingCurve(loss=thin(curve.loss, max_points), val_psnr=thin(curve.val_psnr, max_points))
        out.append({
            "profile": record.profile, "run_name": target.run_name, "stage": target.stage,
            "label": record.stage, "dag_id": record.dag_id, "run_id": record.run_id,
            "task_id": record.task_id, "job_id": record.job_id, "state": record.state,
            "task_state": record.task_state, "live": target.live,
            "path": target.path, "problem": problem,
            "read_age_s": None if read is None else round(reads.age(read), 1),
            "points": curve.to_json(), "charts": training_curve_charts(curve),
        })
    return out
