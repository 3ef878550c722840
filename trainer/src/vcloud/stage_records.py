"""``progress.json`` and ``COMPLETE`` as typed records: what a stage's trainer writes, what the orchestrator reads.

The trainer writes both files (:mod:`vcloud.training.markers`, atomically); the orchestrator reads them
over SSH (the stage decisions, the job task's summary, the run's report). Each side builds or parses
a :class:`ProgressRecord` or a :class:`CompleteRecord` here instead of reading keys, and a record
written by an earlier version (no stop, no start score, no lineage) still parses, with what it lacks
as None. Pure standard library, like :mod:`vcloud.contract`, whose names these files use.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from vcloud.contract import (
    HIGHER_IS_BETTER,
    LINEAGE_KEY,
    STATUS_COMPLETE,
    STOP_EPOCHS,
    STOP_REASONS,
    describe_lineage,
    now_text,
    recorded_lineage,
)


def _int(value: Any) -> int | None:
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _metrics(value: Any) -> dict[str, float] | None:
    return {str(k): v for k, v in value.items()} if isinstance(value, Mapping) else None


@dataclass(frozen=True)
class StopRecord:
    """Why a stage stopped: ``reason`` one of :data:`~vcloud.contract.STOP_REASONS`, ``detail`` the
    sentence for a person, ``epochs_planned`` the epoch count it was given."""

    reason: str
    detail: str
    epochs_planned: int

    def __post_init__(self) -> None:
        if self.reason not in STOP_REASONS:
            raise ValueError(f"stop reason {self.reason!r} is not one of {', '.join(STOP_REASONS)}")

    def to_json(self) -> dict[str, Any]:
        return {"reason": self.reason, "detail": self.detail, "epochs_planned": self.epochs_planned}

    @classmethod
    def from_json(cls, data: Any) -> StopRecord | None:
        """The stop a record carries; None when it carries none or one this version does not know."""
        if not isinstance(data, Mapping) or data.get("reason") not in STOP_REASONS:
            return None
        return cls(str(data["reason"]), str(data.get("detail") or ""), _int(data.get("epochs_planned")) or 0)


@dataclass(frozen=True)
class BestCheckpoint:
    """What ``best.pt`` scored: the metric it was chosen by, its value and epoch (0: the model the stage
    started from, kept because training did not beat it), its validation metrics and, where the stage
    scored its start, the start's value."""

    name: str | None = None
    value: float | None = None
    epoch: int | None = None
    metrics: dict[str, float] | None = None
    start_value: float | None = None

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"name": self.name, "value": self.value, "epoch": self.epoch}
        if self.metrics is not None:
            data["metrics"] = dict(self.metrics)
        if self.start_value is not None:
            data["start_value"] = self.start_value
        return data

    @classmethod
    def from_json(cls, data: Any) -> BestCheckpoint | None:
        if not isinstance(data, Mapping):
            return None
        return cls(name=str(data["name"]) if data.get("name") else None, value=_number(data.get("value")),
                   epoch=_int(data.get("epoch")), metrics=_metrics(data.get("metrics")),
                   start_value=_number(data.get("start_value")))

    def gain(self) -> float | None:
        """The value minus the start's, positive when better (in the metric's units: dB for psnr);
        None without a start score or for a metric of unknown direction."""
        value, start = self.value, self.start_value
        if value is None or start is None or self.name not in HIGHER_IS_BETTER:
            return None
        if not math.isfinite(value) or not math.isfinite(start):
            return None
        return value - start if HIGHER_IS_BETTER[self.name] else start - value


@dataclass(frozen=True)
class CompleteRecord:
    """The content of a stage's ``COMPLETE``: written once, when the stage stopped for good."""

    stage: int
    epochs: int | None
    """Epochs the stage trained."""
    step: int | None = None
    final_metrics: dict[str, float] | None = None
    """Validation metrics of the last epoch."""
    best: BestCheckpoint | None = None
    stop: StopRecord | None = None
    code_version: str | None = None
    code_hash: str | None = None
    """The synced code that finished the stage (None outside a cluster job)."""
    lineage: dict[str, str] | None = None
    """The sha256 of each earlier stage's ``best.pt`` the model was built from, by stage (None: not known)."""
    completed_at: str = field(default_factory=now_text)

    def to_json(self) -> dict[str, Any]:
        return {"stage": self.stage, "epochs": self.epochs, "step": self.step, "final_metrics": self.final_metrics,
                "best_metric": self.best.to_json() if self.best is not None else None,
                "stop": self.stop.to_json() if self.stop is not None else None,
                "code_version": self.code_version, "code_hash": self.code_hash,
                LINEAGE_KEY: dict(self.lineage) if self.lineage is not None else None,
                "completed_at": self.completed_at}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> CompleteRecord:
        lineage = data.get(LINEAGE_KEY)
        return cls(stage=_int(data.get("stage")) or 0, epochs=_int(data.get("epochs")), step=_int(data.get("step")),
                   final_metrics=_metrics(data.get("final_metrics")),
                   best=BestCheckpoint.from_json(data.get("best_metric")), stop=StopRecord.from_json(data.get("stop")),
                   code_version=data.get("code_version"), code_hash=data.get("code_hash"),
                   lineage={str(k): str(v) for k, v in lineage.items()} if isinstance(lineage, Mapping) else None,
                   completed_at=str(data.get("completed_at") or ""))

    @classmethod
    def parse(cls, text: str | None) -> CompleteRecord | None:
        """The record in a ``COMPLETE`` file's text; None for no file or one that is not a JSON object."""
        try:
            data = json.loads(text) if text else None
        except ValueError:
            return None
        return cls.from_json(data) if isinstance(data, Mapping) else None

    def best_epoch_and_metrics(self) -> tuple[int | None, dict[str, float] | None]:
        """(epoch, validation metrics) of ``best.pt``; records written before the best epoch's metrics
        were stored give the last epoch's."""
        if self.best is not None and self.best.metrics is not None:
            return self.best.epoch, dict(self.best.metrics)
        return self.epochs, self.final_metrics

    @property
    def stop_reason(self) -> str:
        """Why the stage stopped; a record written before stages stopped early trained its epochs."""
        return self.stop.reason if self.stop is not None else STOP_EPOCHS

    @property
    def stop_detail(self) -> str | None:
        return self.stop.detail if self.stop is not None and self.stop.detail else None

    @property
    def validation_gain(self) -> float | None:
        """What the stage's training bought on validation: ``best.pt``'s score minus that of the model
        it started from (stages 1-3 score their start), positive when better; 0 when the stage hands
        on its start; None when it scored no start (stage 0) or the record predates it."""
        return self.best.gain() if self.best is not None else None

    @property
    def gain_metric(self) -> str | None:
        """The validation metric the best and the gain are in (``train.best_metric``)."""
        return self.best.name if self.best is not None else None

    def built_from(self) -> dict[int, str]:
        return recorded_lineage(self.to_json())

    def describe_lineage(self) -> str:
        """One line for a summary: what the stage's ``best.pt`` was built from."""
        return describe_lineage(self.to_json())


@dataclass(frozen=True)
class ProgressRecord:
    """The content of a stage's ``progress.json``, rewritten at every checkpoint: where training stands
    (``epoch`` counts completed epochs; ``epoch`` and ``step`` tell the orchestrator whether an
    interrupted job moved forward) and the per-epoch history."""

    stage: int
    status: str
    epoch: int
    epochs_total: int
    step: int
    batch_in_epoch: int = 0
    batches_per_epoch: int = 0
    best: Mapping[str, Any] | None = None
    last_metrics: Mapping[str, float] = field(default_factory=dict)
    world_size: int = 1
    device: str = "cpu"
    code_hash: str | None = None
    updated_at: str = field(default_factory=now_text)
    history: tuple[Mapping[str, Any], ...] = ()
    stop: StopRecord | None = None
    """Why the stage stopped, once it is complete."""

    def to_json(self) -> dict[str, Any]:
        data = {"stage": self.stage, "status": self.status, "epoch": self.epoch, "epochs_total": self.epochs_total,
                "step": self.step, "batch_in_epoch": self.batch_in_epoch, "batches_per_epoch": self.batches_per_epoch,
                "best_metric": dict(self.best) if self.best is not None else None,
                "last_metrics": dict(self.last_metrics), "world_size": self.world_size, "device": self.device,
                "code_hash": self.code_hash, "updated_at": self.updated_at,
                "history": [dict(h) for h in self.history]}
        if self.status == STATUS_COMPLETE:
            data["stop"] = self.stop.to_json() if self.stop is not None else None
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ProgressRecord:
        best = data.get("best_metric")
        return cls(stage=_int(data.get("stage")) or 0, status=str(data.get("status") or ""),
                   epoch=_int(data.get("epoch")) or 0, epochs_total=_int(data.get("epochs_total")) or 0,
                   step=_int(data.get("step")) or 0, batch_in_epoch=_int(data.get("batch_in_epoch")) or 0,
                   batches_per_epoch=_int(data.get("batches_per_epoch")) or 0,
                   best=dict(best) if isinstance(best, Mapping) else None,
                   last_metrics=_metrics(data.get("last_metrics")) or {},
                   world_size=_int(data.get("world_size")) or 1, device=str(data.get("device") or "cpu"),
                   code_hash=data.get("code_hash"), updated_at=str(data.get("updated_at") or ""),
                   history=tuple(dict(h) for h in data.get("history") or () if isinstance(h, Mapping)),
                   stop=StopRecord.from_json(data.get("stop")))

    def completed(self, *, epoch: int, epochs_total: int, step: int, best: Mapping[str, Any] | None,
                  history: list[dict[str, Any]], stop: StopRecord | None) -> ProgressRecord:
        """This record once the stage is complete: marked complete at its final position, with why it stopped."""
        return replace(self, status=STATUS_COMPLETE, epoch=epoch, epochs_total=epochs_total, step=step,
                       batch_in_epoch=0, best=best, history=tuple(history), stop=stop, updated_at=now_text())
