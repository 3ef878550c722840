"""metrics.jsonl: strict JSON lines, appended; cut back to the checkpoint's step on resume."""

from __future__ import annotations

import json
import math
from pathlib import Path

from vcloud.contract import metrics_train_record, metrics_val_record, parse_metrics_lines
from vcloud.training.metrics_file import MetricsFile, encode_record, keep_through_step


def _train(step: int) -> dict:
    return metrics_train_record(global_step=step, epoch=1, loss=0.5 / step, lr=1e-3, samples_per_s=4.0,
                                time=1.0 + step)


def _write(path: Path, records: list[dict], tail: str = "") -> None:
    path.write_text("".join(encode_record(r) + "\n" for r in records) + tail)


def test_lines_are_strict_json_with_non_finite_values_as_null() -> None:
    line = encode_record(metrics_val_record(global_step=3, epoch=1, metrics={"psnr": math.inf, "sam": 2.5},
                                            time=10.0))
    assert json.loads(line) == {"kind": "val", "global_step": 3, "epoch": 1, "psnr": None, "sam": 2.5, "time": 10.0}
    assert "\n" not in line


def test_resume_drops_lines_after_the_checkpoint_and_a_torn_last_line(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    val = metrics_val_record(global_step=4, epoch=1, metrics={"psnr": 30.0}, time=9.0)
    _write(path, [_train(3), _train(4), val, _train(5), _train(6)], tail='{"kind": "train", "global_st')
    assert keep_through_step(path, 4) == 3
    assert parse_metrics_lines(path.read_text()) == [_train(3), _train(4), val]
    assert path.read_text().endswith("\n")
    assert not list(tmp_path.glob(".*.tmp"))


def test_nothing_to_drop_leaves_the_file_untouched(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    _write(path, [_train(1), _train(2)])
    before = path.stat().st_mtime_ns, path.read_text()
    assert keep_through_step(path, 2) == 0
    assert (path.stat().st_mtime_ns, path.read_text()) == before
    assert keep_through_step(tmp_path / "missing.jsonl", 5) == 0


def test_fresh_start_keeps_no_line_of_a_run_that_left_no_checkpoint(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    _write(path, [_train(1)])
    assert keep_through_step(path, None) == 1
    assert path.read_text() == ""


def test_open_cuts_back_then_appends(tmp_path: Path) -> None:
    path = tmp_path / "stage0" / "metrics.jsonl"
    path.parent.mkdir()
    _write(path, [_train(1), _train(2), _train(3)])
    metrics = MetricsFile.open(path, resumed_step=2)
    metrics.append(_train(3))
    metrics.close()
    assert [r["global_step"] for r in parse_metrics_lines(path.read_text())] == [1, 2, 3]
