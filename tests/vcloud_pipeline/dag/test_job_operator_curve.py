"""A completed training stage records its curve for the HPC view (whose API server reads no cluster
file): read once on the worker, parsed by the trainer's own parser, thinned to a bounded size."""

from __future__ import annotations

import json

from slurm_provider.hooks import SlurmCommandFailed
from slurm_provider.transport import CommandResult
from vcloud.contract import metrics_train_record, metrics_val_record, training_curve
from vcloud_pipeline.dag.curves import CURVE_POINTS
from vcloud_pipeline.dag.job_operator import PipelineJobOperator

PATH = "/project/outputs/run one/stage0/metrics.jsonl"


class Files:
    """The login node's files as ``SlurmHook.read_file`` answers (None: missing)."""

    def __init__(self, files: dict[str, str], failing: bool = False) -> None:
        self.files, self.failing, self.read = files, failing, []

    def read_file(self, path: str) -> str | None:
        self.read.append(path)
        if self.failing:
            raise SlurmCommandFailed("reading exited 1: Permission denied", CommandResult("cat", 1, "", "denied"))
        return self.files.get(path)


def _metrics(steps: int) -> str:
    lines = []
    for step in range(1, steps + 1):
        lines.append(metrics_train_record(global_step=step, epoch=1, loss=1.0 / step, lr=1e-3, samples_per_s=8.0,
                                          time=1.7e9 + step))
        if step % 100 == 0:
            lines.append(metrics_val_record(global_step=step, epoch=1, metrics={"psnr": 20 + step / 1000},
                                            time=1.7e9 + step))
    return "".join(json.dumps(line) + "\n" for line in lines) + '{"kind": "train", "glob'  # a torn last line


def test_a_stage_records_its_curve_thinned_and_parsed_like_the_trainer_does() -> None:
    operator = PipelineJobOperator(task_id="stage0", job="stage0")
    files = Files({PATH: _metrics(CURVE_POINTS * 3)})
    curve = operator._curve(files, PATH)
    full = training_curve(files.files[PATH])
    assert files.read == [PATH]
    assert curve is not None and len(curve["loss"]) == CURVE_POINTS and len(full.loss) == CURVE_POINTS * 3
    assert curve["loss"][0] == list(full.loss[0]) and curve["loss"][-1] == list(full.loss[-1])
    assert curve["val_psnr"] == [list(p) for p in full.val_psnr]  # 18 points: kept whole
    assert len(json.dumps(curve)) < 50_000  # an XCom of tens of kB, however long the stage trained


def test_a_missing_or_unreadable_file_records_an_empty_curve_or_none() -> None:
    operator = PipelineJobOperator(task_id="stage0", job="stage0")
    assert operator._curve(Files({}), PATH) == {"loss": [], "val_psnr": []}
    assert operator._curve(Files({PATH: "x"}, failing=True), PATH) is None
