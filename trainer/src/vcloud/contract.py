"""The contract between the orchestrator (the Airflow plugins) and the trainer, each fact once.

The orchestrator decides what a job did from the files the trainer leaves and the code it exits
with, and tells the trainer things through environment variables; a name that differs on the two
sides is a stage that never completes or a failure explained wrongly. Both sides import these
definitions from here. Pure standard library (no torch, no Airflow): the Airflow components import
it from ``trainer/src`` on their ``PYTHONPATH``, the jobs from the synced code.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

STAGES: tuple[int, ...] = (0, 1, 2, 3)
"""The training stages: 0 autoencoder, 1 draft transformer, 2 diffusion refiner, 3 self-training."""

# --------------------------------------------------------------------------- files of a run


def now_text() -> str:
    """When a record is written: UTC to the second, ISO 8601."""
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def stage_dir_name(stage: int) -> str:
    """A stage's directory inside the run's output directory."""
    return f"stage{stage}"


LATEST_CHECKPOINT = "latest.pt"
"""The resume point, rewritten every epoch (and every ``checkpoint_every_steps`` steps)."""

BEST_CHECKPOINT = "best.pt"
"""The best validation model so far: what the next stage, the export and the asset point at."""

PROGRESS_FILE = "progress.json"
"""Where training stands (:class:`vcloud.stage_records.ProgressRecord`), rewritten at every checkpoint."""

COMPLETE_FILE = "COMPLETE"
"""Written once, when the stage stopped training: it reached its epoch count or its validation
stopped improving (:class:`vcloud.stage_records.CompleteRecord`, its ``stop``)."""

METRICS_FILE = "metrics.jsonl"
"""The stage's training curve, append-only: one JSON object a line (:func:`metrics_train_record`
every log step, :func:`metrics_val_record` every validation). After a resume it holds the lines up
to the checkpoint's step and then the resumed run's: each step once, as in an uninterrupted run."""

TENSORBOARD_DIR = "tensorboard"
"""The stage's TensorBoard event files (the same curve; ``tensorboard --logdir RUN_DIR``)."""

def curve_png_name(stage: int) -> str:
    """Where the export writes a stage's training-curve plot, relative to the viewer directory (the
    run summary points at it there)."""
    return f"curves/stage{stage}.png"


DATA_INDEX = "index.json"
"""Written last into a prepared dataset: the dataset is complete when it exists."""

# --------------------------------------------------------------------------- the export's done marker

EXPORT_METRICS_FILE = "metrics.json"
"""The export's scores in the viewer directory: per series and on average; for a refiner the samples
drawn and the mean ``uncertainty`` (:func:`export_scores_words` says them)."""

EXPORTED_FILE = "EXPORTED"
"""Written last into the viewer directory by the DAG's export (atomically, :func:`exported_record`),
removed when an export starts: the viewer data there are complete for the stage outputs it names."""

EXPORT_DONE_PREFIX = f"{EXPORTED_FILE}."
"""``EXPORTED.<inputs digest>``, touched after ``EXPORTED``: the export of exactly these stage outputs is
done. The DAG's export task names it as its done marker, which the submit looks for under the viewer
directory's lock (as a stage's ``COMPLETE``), so two submits of one export never both run it."""


def exported_done_name(inputs: str) -> str:
    """The done marker of an export of the stage outputs whose digest is ``inputs``."""
    if not re.fullmatch(r"[0-9a-f]{16}", inputs):
        raise ValueError(f"not an export inputs digest: {inputs!r}")
    return f"{EXPORT_DONE_PREFIX}{inputs}"


EXPORT_INPUT_FILES: tuple[str, ...] = (BEST_CHECKPOINT, COMPLETE_FILE, METRICS_FILE)
"""Per stage, the files the export's output comes from: the model it restores (the highest stage's
``best.pt``, found by which exist), the stage's record, and the curve it plots."""


def export_input_names() -> tuple[str, ...]:
    """The files the export reads, relative to the run's output directory (``stage1/best.pt``...)."""
    return tuple(f"{stage_dir_name(stage)}/{name}" for stage in STAGES for name in EXPORT_INPUT_FILES)


def export_inputs_digest(stamps: Mapping[str, tuple[int, int]]) -> str:
    """16 hex digits naming the export's inputs: each of :func:`export_input_names` with its size and
    modification time in whole seconds (``stat -c '%s %Y'`` on the login node, ``os.stat`` in the job:
    the same file system), or as missing. A checkpoint rewritten with the same size has another
    mtime; a file that appears or goes changes the digest too."""
    lines = []
    for name in export_input_names():
        stamp = stamps.get(name)
        lines.append(f"{name} missing" if stamp is None else f"{name} {int(stamp[0])} {int(stamp[1])}")
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()[:16]


def exported_record(*, inputs: str, stamps: Mapping[str, tuple[int, int]], stage: int, checkpoint: str,
                    series: int, code_hash: str | None) -> dict[str, Any]:
    """The content of ``EXPORTED``: the inputs' digest (:func:`export_inputs_digest`) and the stamps it
    was made from, the stage and checkpoint exported, how many series, and the code that exported."""
    return {"inputs": inputs, "stamps": {name: list(stamp) for name, stamp in stamps.items()},
            "stage": stage, "checkpoint": checkpoint, "series": series, "code_hash": code_hash,
            "exported_at": now_text()}


def exported_inputs(text: str | None) -> str | None:
    """The inputs' digest an ``EXPORTED`` file names; None when it is missing or unreadable."""
    try:
        record = json.loads(text) if text else None
    except json.JSONDecodeError:
        return None
    digest = record.get("inputs") if isinstance(record, Mapping) else None
    return digest if isinstance(digest, str) and re.fullmatch(r"[0-9a-f]{16}", digest) else None

# --------------------------------------------------------------------------- exit codes

EXIT_OK = 0
"""The stage reached its epoch count (``COMPLETE`` is on disk), or the job did what it was for."""

EXIT_ERROR = 1
"""An error: exception, diverged loss, missing predecessor checkpoint (Python's own code)."""

EXIT_BAD_CONFIG = 2
"""Invalid command line or configuration (argparse's code); rerunning the same job cannot help."""

EXIT_REQUEUE = 85
"""Stopped on a signal (pre-timeout USR2 or TERM) after writing a checkpoint; rerunning resumes."""

EXIT_CODE_MISMATCH = 86
"""The job script refused to start: its code directory lacks the manifest of its hash."""

EXIT_GPUS_MISSING = 87
"""The job was given GPUs but PyTorch sees fewer: refused to train on the CPU, which would bill
GPU-hours for nothing."""

EXIT_RESUME_REFUSED = 88
"""The trainer refused to resume ``latest.pt`` written by other code: its weights no longer fit the
model this code builds (always refused), or its optimizer layout differs and the run asked for
:data:`ON_CODE_CHANGE_REFUSE`. Nothing was trained; the job's log names both code hashes and the
remedies (``mode: restart`` for the stage, or the code that wrote the checkpoint)."""

EXIT_RUNTIME_FAILED = 89
"""The job script's own: the container runtime did not start on the job's first node (a probe that
runs ``true`` in the image before the job's work). The node is at fault, not the job: with the
profile's ``jobs.bad_node_hours`` the node is left out and the job resubmitted elsewhere."""

NODE_FAULT_EXITS: tuple[int, ...] = (EXIT_GPUS_MISSING, EXIT_RUNTIME_FAILED)
"""Exit codes that say the job's node is at fault (its GPUs missing, its container runtime broken)."""

RECORDED_EXITS: tuple[int, ...] = (EXIT_REQUEUE, EXIT_GPUS_MISSING, EXIT_RESUME_REFUSED)
"""The trainer's exit codes that tell what a job did, not only that it failed. torchrun reports any
failed worker as its own exit 1; under torchrun each rank that exits with one of these records it
(:data:`RANK_EXITS_DIR_ENV`), and the launch (``python -m vcloud.launch``) exits with it instead.
Where ranks ended with several, the highest wins, as ``srun`` merges the exit codes of the nodes.
(:data:`EXIT_CODE_MISMATCH` is the job script's own, before any launch.)"""

# --------------------------------------------------------------------------- resuming after a code change

ON_CODE_CHANGE_SETTING = "train.on_code_change"
"""The trainer's config key that says what a resume does when ``latest.pt`` was written by code
whose optimizer layout differs (``--set train.on_code_change=refuse``); the DAG run's
``on_code_change`` param sets it in the training jobs' command line."""

ON_CODE_CHANGE_KEEP_WEIGHTS = "keep_weights"
"""Resume the weights (they still fit) with a fresh optimizer state, at the saved position."""

ON_CODE_CHANGE_REFUSE = "refuse"
"""Stop with :data:`EXIT_RESUME_REFUSED` instead."""

ON_CODE_CHANGE_CHOICES: tuple[str, ...] = (ON_CODE_CHANGE_KEEP_WEIGHTS, ON_CODE_CHANGE_REFUSE)
ON_CODE_CHANGE_DEFAULT = ON_CODE_CHANGE_KEEP_WEIGHTS

# --------------------------------------------------------------------------- job environment

CODE_HASH_ENV = "VCLOUD_CODE_HASH"
"""Set by the job script to its code hash; the trainer records it in every checkpoint and marker."""

GPUS_REQUIRED_ENV = "VCLOUD_GPUS_REQUIRED"
"""Set by the job script where the profile requires GPUs: how many this node was given."""

GPU_HINT_ENV = "VCLOUD_GPU_HINT"
"""The profile's advice, printed by a job that stops for missing GPUs."""

OUTPUTS_MIRROR_ENV = "VCLOUD_OUTPUTS_MIRROR"
"""Set by the job script of a training job whose outputs live on node-local disk (the profile's
``staging.stage_outputs``): the run's output directory on shared storage. The trainer (global rank
0) copies its stage directory there at every checkpoint (:mod:`vcloud.training.mirror`), so a node
failure loses at most the checkpoint interval; the job's own copy-back at the end stays."""

RANK_EXITS_DIR_ENV = "VCLOUD_EXIT_RECORD_DIR"
"""Set by the job script of a torchrun launch: a directory on shared storage, one per job (the
layout's ``RunPaths.exit_records_dir``), emptied by the job before each start. A rank that exits with
one of :data:`RECORDED_EXITS` writes :func:`exit_record_name` there, holding
:func:`exit_record_text`; the launch reads them after torchrun failed, those of other nodes' ranks
included."""


def exit_record_name(rank: int) -> str:
    """The exit record of global rank ``rank`` in the :data:`RANK_EXITS_DIR_ENV` directory."""
    return f"rank{rank}.exit"


def exit_record_rank(name: str) -> int | None:
    """The rank whose exit record is named ``name`` (:func:`exit_record_name`), or None for another file."""
    match = re.fullmatch(r"rank(\d+)\.exit", name)
    return int(match.group(1)) if match else None


def exit_record_text(code: int) -> str:
    """An exit record's content: the code, one line."""
    return f"{code}\n"


def parse_exit_record(text: str) -> int | None:
    """The code an exit record holds, or None for anything but one of :data:`RECORDED_EXITS`."""
    word = text.strip()
    code = int(word) if word.isdigit() else None
    return code if code in RECORDED_EXITS else None


# --------------------------------------------------------------------------- validation metrics

HIGHER_IS_BETTER: dict[str, bool] = {"psnr": True, "ssim": True, "sam": False, "mae": False, "rmse": False}
"""Every validation metric the trainer reports, and whether a higher value is better."""

METRIC_NAMES: tuple[str, ...] = tuple(HIGHER_IS_BETTER)


# --------------------------------------------------------------------------- metrics.jsonl

METRICS_KIND_TRAIN = "train"
METRICS_KIND_VAL = "val"


def metrics_train_record(*, global_step: int, epoch: int, loss: float, lr: float, samples_per_s: float,
                         time: float) -> dict[str, Any]:
    """A log step's line of ``metrics.jsonl``: ``loss`` is the mean per sample over the steps since
    the previous train line (global rank 0's samples), ``lr`` the rate of step ``global_step``,
    ``epoch`` the 1-based epoch the step belongs to, ``time`` seconds since the Unix epoch."""
    return {"kind": METRICS_KIND_TRAIN, "global_step": global_step, "epoch": epoch, "loss": loss, "lr": lr,
            "samples_per_s": samples_per_s, "time": time}


def metrics_val_record(*, global_step: int, epoch: int, metrics: Mapping[str, float],
                       time: float) -> dict[str, Any]:
    """A validation's line: every metric of :data:`METRIC_NAMES` at top level, after ``epoch`` epochs
    (0: the starting model, scored before the first step) and ``global_step`` steps."""
    return {"kind": METRICS_KIND_VAL, "global_step": global_step, "epoch": epoch, **dict(metrics), "time": time}


def parse_metrics_lines(text: str) -> list[dict[str, Any]]:
    """The records of a ``metrics.jsonl`` text, skipping what is not a whole JSON object (a last
    line the trainer is still writing, or one a killed job left torn)."""
    records = []
    for line in text.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and "kind" in record and "global_step" in record:
            records.append(record)
    return records


CURVE_METRIC = "psnr"
"""The validation metric a training curve shows next to the loss (the HPC view's and the export's)."""


@dataclass(frozen=True)
class TrainingCurve:
    """A stage's curve as the HPC view draws it and the export plots it: ``(global_step, value)``
    pairs in step order, each step once."""

    loss: tuple[tuple[int, float], ...] = ()
    """Training loss of every train line."""
    val_psnr: tuple[tuple[int, float], ...] = ()
    """Validation PSNR (dB) of every validation line; step 0 is the model the stage started from."""

    @property
    def empty(self) -> bool:
        return not self.loss and not self.val_psnr

    def to_json(self) -> dict[str, list[list[float]]]:
        return {"loss": [[s, v] for s, v in self.loss], "val_psnr": [[s, v] for s, v in self.val_psnr]}

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | None) -> TrainingCurve:
        """The curve of :meth:`to_json` (as stored in a task's XCom); malformed points are left out."""
        def series(key: str) -> tuple[tuple[int, float], ...]:
            points = (data or {}).get(key) or ()
            return tuple((int(p[0]), float(p[1])) for p in points
                         if isinstance(p, (list, tuple)) and len(p) == 2
                         and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in p))

        return cls(loss=series("loss"), val_psnr=series("val_psnr"))

    def thinned(self, limit: int) -> TrainingCurve:
        """At most ``limit`` points per series (:func:`thin_points`)."""
        return TrainingCurve(loss=thin_points(self.loss, limit), val_psnr=thin_points(self.val_psnr, limit))


def thin_points(points: tuple[tuple[int, float], ...], limit: int) -> tuple[tuple[int, float], ...]:
    """At most ``limit`` points, evenly spaced in the sequence, the first and the last kept: a
    weeks-long stage logs tens of thousands of steps, more than a chart (or an XCom) should hold."""
    if len(points) <= limit or limit < 2:
        return points
    stride = (len(points) - 1) / (limit - 1)
    return tuple(points[round(i * stride)] for i in range(limit))


def _series(records: list[dict[str, Any]], kind: str, key: str) -> tuple[tuple[int, float], ...]:
    by_step: dict[int, float] = {}
    for record in records:
        value, step = record.get(key), record.get("global_step")
        if record.get("kind") != kind or isinstance(step, bool) or not isinstance(step, int):
            continue
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            by_step[step] = float(value)  # a later line of the same step wins, as after a resume
        else:
            by_step.pop(step, None)  # null (a NaN loss) leaves a gap rather than an old value
    return tuple(sorted(by_step.items()))


def training_curve(text: str) -> TrainingCurve:
    """The curve of a ``metrics.jsonl`` text, read as it is, even while the trainer appends to it:
    torn lines are skipped (:func:`parse_metrics_lines`), a step seen twice keeps its last line, a
    value that is null (non-finite when written) is left out."""
    records = parse_metrics_lines(text)
    return TrainingCurve(loss=_series(records, METRICS_KIND_TRAIN, "loss"),
                         val_psnr=_series(records, METRICS_KIND_VAL, CURVE_METRIC))


# --------------------------------------------------------------------------- progress.json and COMPLETE
# (their records: vcloud.stage_records)

STATUS_RUNNING = "running"
STATUS_STOPPED = "stopped"
"""Stopped on a signal after checkpointing; the stage resumes when rerun."""
STATUS_COMPLETE = "complete"

STOP_EPOCHS = "epochs"
"""A stage stopped because it trained its epoch count."""
STOP_PATIENCE = "patience"
"""A stage stopped before its epoch count: its validation metric had not improved for
``train.stage{N}.patience`` validations, so more epochs would have spent GPU-hours for weights
the best-checkpoint rule throws away."""
STOP_REASONS: tuple[str, ...] = (STOP_EPOCHS, STOP_PATIENCE)


def gain_unit(metric: str | None) -> str:
    """How a gain in ``metric`` is written: ``dB`` for psnr, the metric's name otherwise."""
    return "dB" if metric == "psnr" else (metric or "")


def gain_per_gpu_hour(gain: float | None, gpu_hours: float | None) -> float | None:
    """Validation gain per GPU-hour spent (dB per GPU-hour for psnr); None without a gain or hours."""
    if gain is None or gpu_hours is None or gpu_hours <= 0:
        return None
    return gain / gpu_hours


# ---- lineage: the earlier stages' best.pt a stage was built from (vcloud.lineage checks it) ----

LINEAGE_KEY = "lineage"
"""A checkpoint's and a ``COMPLETE`` record's ``{stage: sha256 of its best.pt}``, as JSON keys."""

SHORT = 12
"""Hex digits of a digest in messages and summaries."""


def recorded_lineage(record: Mapping[str, Any] | None) -> dict[int, str]:
    """``{stage: digest}`` of a checkpoint or ``COMPLETE`` record; empty for records that predate it."""
    lineage = (record or {}).get(LINEAGE_KEY)
    if not isinstance(lineage, Mapping):
        return {}
    return {int(stage): str(digest) for stage, digest in lineage.items()}


def short_digest(digest: str | None) -> str:
    """A digest as messages and summaries show it (``missing``: none)."""
    return digest[:SHORT] if digest else "missing"


def describe_built_from(built_from: Mapping[int, str]) -> str:
    """``built from stage 0 best.pt 1a2b..., stage 1 best.pt ...`` (or from no earlier stage's)."""
    if not built_from:
        return "built from no earlier stage's best.pt"
    return "built from " + ", ".join(f"stage {stage} best.pt {short_digest(digest)}"
                                     for stage, digest in sorted(built_from.items()))


def describe_lineage(record: Mapping[str, Any] | None) -> str:
    """One line for a summary: what a stage's checkpoint was built from."""
    if not record or record.get(LINEAGE_KEY) is None:
        return "lineage not recorded"
    return describe_built_from(recorded_lineage(record))


# --------------------------------------------------------------------------- the export's scores


def export_scores_words(metrics: Mapping[str, Any] | None) -> str | None:
    """The export's ``metrics.json`` in one line for the run's summary: the stage, its scores and, for a
    refiner, the mean of how many samples and how sure it is; None when it holds no scores."""
    if not isinstance(metrics, Mapping) or not isinstance(metrics.get("mean"), Mapping):
        return None
    mean = metrics["mean"]
    try:
        words = (f"export of stage {metrics.get('stage')} on {metrics.get('series')} {metrics.get('split')} series: "
                 f"PSNR {float(mean['psnr']):.2f} dB, SSIM {float(mean['ssim']):.3f}, SAM {float(mean['sam']):.2f} deg")
        told = metrics.get("uncertainty")
        if isinstance(told, Mapping) and int(metrics.get("samples") or 1) > 1:
            words += (f"; the mean of {int(metrics['samples'])} samples, mean uncertainty "
                      f"{float(told['uncertainty']):.4f} (reflectance), its correlation with the error "
                      f"{float(told['uncertainty_error_corr']):.2f}, spread-skill ratio {float(told['spread_skill']):.2f}")
    except (KeyError, TypeError, ValueError):
        return None
    return words

