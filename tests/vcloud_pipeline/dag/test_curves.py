"""The followed training curve (``fold_metrics``): what the triggerer keeps of a growing metrics.jsonl."""

from __future__ import annotations

import json

from vcloud.contract import TrainingCurve, metrics_train_record, metrics_val_record, training_curve
from vcloud_pipeline.dag.curves import CURVE_POINTS, METRICS_FOLD, fold_metrics, recorded_curve
from slurm_provider.watch.followed_files import load_fold


def _lines(first: int, last: int, *, val_every: int = 100) -> list[str]:
    lines = []
    for step in range(first, last + 1):
        lines.append(json.dumps(metrics_train_record(global_step=step, epoch=1, loss=1.0 / step, lr=1e-3,
                                                     samples_per_s=8.0, time=1.7e9 + step)))
        if step % val_every == 0:
            lines.append(json.dumps(metrics_val_record(global_step=step, epoch=1, metrics={"psnr": 20 + step / 1e3},
                                                       time=1.7e9 + step)))
    return lines


def _fold_in_chunks(lines: list[str], chunk: int, limit: int = CURVE_POINTS) -> dict:
    state = None
    for start in range(0, len(lines), chunk):
        state = fold_metrics(state, lines[start:start + chunk], limit=limit)
        json.dumps(state)  # JSON-safe after every read, as the XCom keeps it
    assert state is not None
    return state


def test_the_fold_is_what_the_followed_file_names() -> None:
    assert load_fold(METRICS_FOLD) is fold_metrics


def test_a_short_stage_followed_in_pieces_has_every_point_of_the_recorded_curve() -> None:
    lines = _lines(1, 250)
    state = _fold_in_chunks(lines, 7)
    assert TrainingCurve.from_json(state).to_json() == recorded_curve("\n".join(lines))
    assert state["every"] == {"loss": 1, "val_psnr": 1} and state["seen"] == {"loss": 250, "val_psnr": 2}


def test_a_long_stage_stays_within_the_limit_evenly_spread_over_its_steps() -> None:
    steps = 20 * CURVE_POINTS + 13
    state = _fold_in_chunks(_lines(1, steps), 37)
    loss = [s for s, _ in state["loss"]]
    assert CURVE_POINTS // 2 < len(loss) <= CURVE_POINTS and loss[0] == 1
    gaps = {b - a for a, b in zip(loss, loss[1:])}
    assert gaps == {state["every"]["loss"]}, gaps  # one step between every two points kept: evenly spread
    assert steps - loss[-1] < state["every"]["loss"]  # the newest steps are there
    assert len(json.dumps(state)) < 40_000


def test_the_chunking_does_not_change_the_curve() -> None:
    lines = _lines(1, 5 * CURVE_POINTS)
    assert _fold_in_chunks(lines, 1) == _fold_in_chunks(lines, 333) == _fold_in_chunks(lines, len(lines))


def test_a_resumed_job_logging_steps_again_updates_the_points_kept() -> None:
    first = _lines(1, 10)
    again = [json.dumps(metrics_train_record(global_step=step, epoch=1, loss=5.0, lr=1e-3, samples_per_s=8.0,
                                             time=1.8e9)) for step in (8, 9, 10, 11)]
    state = fold_metrics(fold_metrics(None, first), again)
    assert state["loss"][-4:] == [[8, 5.0], [9, 5.0], [10, 5.0], [11, 5.0]] and len(state["loss"]) == 11
    assert TrainingCurve.from_json(state) == training_curve("\n".join(first + again))


def test_lines_that_are_not_metrics_add_nothing() -> None:
    state = fold_metrics(None, ["", "not json", '{"kind": "train"}', '{"kind": "train", "global_step": 1, "loss": null}'])
    assert state["loss"] == [] and state["val_psnr"] == []
