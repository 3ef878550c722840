"""What a job task of the training run returns: the provider's job summary and the run's own facts.

:class:`RunJobSummary` is the provider's :class:`~slurm_provider.JobSummary` (the job, its ids, its
cost) with what the pipeline knows of it: which job of which run and profile it was, the code it ran
and the code that finished the stage, the stage's metrics and why it stopped (from its ``COMPLETE``
record), the allocation after it and its training curve. It is JSON in XCom (one flat mapping, the
provider's keys included) and parsed back by the run's summary and the HPC view.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from slurm_provider import JobSummary
from vcloud.stage_records import CompleteRecord


def _mapping(value: Any) -> dict[str, Any] | None:
    return dict(value) if isinstance(value, Mapping) else None


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _text(value: Any) -> str | None:
    return str(value) if value not in (None, "") else None


@dataclass(frozen=True)
class RunJobSummary:
    """One job task's outcome, as the run's summary, its report and the HPC view read it."""

    job: JobSummary
    label: str | None = None
    """Which job of the run (``stage1``, ``export``); None for a task of another DAG."""
    run: str | None = None
    profile: str | None = None
    code_hash: str | None = None
    """The code the jobs ran."""
    trained_code_hash: str | None = None
    """The code that finished the stage, as its ``COMPLETE`` record says."""
    states: Mapping[str, str] | None = None
    """Slurm's state of every job id of the task, when it ended."""
    allocation: Mapping[str, Any] | None = None
    """The allocation once the job ended (the HPC view's burn-down)."""
    metrics: Mapping[str, float] | None = None
    """Validation metrics of the stage's ``best.pt``."""
    best_epoch: int | None = None
    final_metrics: Mapping[str, float] | None = None
    epochs: int | None = None
    validation_gain: float | None = None
    gain_metric: str | None = None
    stop_reason: str | None = None
    stop_detail: str | None = None
    lineage: Mapping[str, Any] | None = None
    curve: Mapping[str, Any] | None = None

    @property
    def gpu_hours(self) -> float:
        return self.job.gpu_hours

    def with_stage(self, record: CompleteRecord) -> RunJobSummary:
        """This summary with what the stage's ``COMPLETE`` record says: the code that finished it, its last
        epoch's metrics and epoch count, its gain on validation, why it stopped and what it was built from."""
        return replace(self, trained_code_hash=record.code_hash, final_metrics=record.final_metrics,
                       epochs=record.epochs, validation_gain=record.validation_gain, gain_metric=record.gain_metric,
                       stop_reason=record.stop_reason, stop_detail=record.stop_detail, lineage=record.lineage)

    def to_json(self) -> dict[str, Any]:
        return {**self.job.to_json(), "job": self.label, "run": self.run, "profile": self.profile,
                "code_hash": self.code_hash, "trained_code_hash": self.trained_code_hash,
                "states": dict(self.states) if self.states is not None else None,
                "allocation": _mapping(self.allocation), "metrics": _mapping(self.metrics),
                "best_epoch": self.best_epoch, "final_metrics": _mapping(self.final_metrics),
                "epochs": self.epochs, "validation_gain": self.validation_gain, "gain_metric": self.gain_metric,
                "stop_reason": self.stop_reason, "stop_detail": self.stop_detail,
                "lineage": _mapping(self.lineage), "curve": _mapping(self.curve)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RunJobSummary:
        """The summary in ``data``: a run job's, or a plain job task's (whose run facts are then None).
        A value that is not a job summary raises ``ValueError`` naming what it lacks."""
        job = JobSummary.from_json(data)
        epoch, epochs = data.get("best_epoch"), data.get("epochs")
        return cls(job=job, label=_text(data.get("job")), run=_text(data.get("run")),
                   profile=_text(data.get("profile")), code_hash=_text(data.get("code_hash")),
                   trained_code_hash=_text(data.get("trained_code_hash")),
                   states=_mapping(data.get("states")), allocation=_mapping(data.get("allocation")),
                   metrics=_mapping(data.get("metrics")),
                   best_epoch=int(epoch) if isinstance(epoch, int) and not isinstance(epoch, bool) else None,
                   final_metrics=_mapping(data.get("final_metrics")),
                   epochs=int(epochs) if isinstance(epochs, int) and not isinstance(epochs, bool) else None,
                   validation_gain=_number(data.get("validation_gain")), gain_metric=_text(data.get("gain_metric")),
                   stop_reason=_text(data.get("stop_reason")), stop_detail=_text(data.get("stop_detail")),
                   lineage=_mapping(data.get("lineage")), curve=_mapping(data.get("curve")))
