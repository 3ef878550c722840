"""A training stage's curve as the HPC view draws it: recorded when its job completes, followed while it trains.

When a stage's job completes its operator reads the whole ``metrics.jsonl`` once and records the
curve thinned to :data:`CURVE_POINTS` points a series. While it trains, the job's watch in the
triggerer follows the same file (``slurm_provider.watch.followed_files``): it reads only what the trainer
appended since the last read, and :func:`fold_metrics` adds those lines to the curve kept so far.
Both curves are thinned by :func:`vcloud.contract.thin_points`; the followed one keeps every
``every``-th point of each series, doubling ``every`` (and dropping every other point kept) whenever
the series would pass :data:`CURVE_POINTS`, so its points stay evenly spread over the steps however
long the stage trains, and its XCom stays a few tens of kB. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from vcloud.contract import TrainingCurve, thin_points, training_curve

CURVE_POINTS = 600
"""Points per series of a stage's curve (the HPC view draws it; the XCom stays a few tens of kB however
long the stage trained). Even: halving a followed series of ``CURVE_POINTS + 1`` points keeps every
other one."""
METRICS_FOLD = f"{__name__}.fold_metrics"
"""Import path of :func:`fold_metrics`, as a followed file names its fold."""
SERIES = ("loss", "val_psnr")


def recorded_curve(text: str) -> dict[str, Any]:
    """The curve of a whole ``metrics.jsonl`` text, as a completed stage's record carries it."""
    return training_curve(text).thinned(CURVE_POINTS).to_json()


def fold_metrics(state: Mapping[str, Any] | None, lines: list[str], *,
                 limit: int = CURVE_POINTS) -> dict[str, Any]:
    """The followed curve after ``lines`` (complete lines appended to ``metrics.jsonl``) were read.

    ``state`` is this function's last answer (None at first): the curve's points (readable by
    ``TrainingCurve.from_json``) and, per series, ``every`` (keep every ``every``-th new step) and
    ``seen`` (new steps seen so far). A step the trainer logs again (a resumed job starting from its
    last checkpoint) updates the point kept for that step, if any.
    """
    state = state or {}
    kept = TrainingCurve.from_json(state)
    new = training_curve("\n".join(lines))
    every, seen = dict(state.get("every") or {}), dict(state.get("seen") or {})
    out: dict[str, Any] = {}
    for name in SERIES:
        points, step_every, step_seen = _grow(list(getattr(kept, name)), getattr(new, name),
                                              int(every.get(name) or 1), int(seen.get(name) or 0), limit)
        out[name] = [[s, v] for s, v in points]
        every[name], seen[name] = step_every, step_seen
    return {**out, "every": every, "seen": seen}


def _grow(points: list[tuple[int, float]], new: tuple[tuple[int, float], ...], every: int, seen: int,
          limit: int) -> tuple[list[tuple[int, float]], int, int]:
    """One series after its new points: later steps kept every ``every``-th, halved past ``limit``."""
    index = {step: i for i, (step, _) in enumerate(points)}
    for step, value in new:
        if points and step <= points[-1][0]:
            if step in index:
                points[index[step]] = (step, value)
            continue
        if seen % every == 0:
            index[step] = len(points)
            points.append((step, value))
        seen += 1
        if len(points) > limit:
            points = list(thin_points(tuple(points), (len(points) + 1) // 2))
            index = {s: i for i, (s, _) in enumerate(points)}
            every *= 2
    return points, every, seen
