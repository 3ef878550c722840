"""The jobs of a training run, as a type: ``JobLabel.STAGE2``, not the string ``"stage2"`` parsed back.

A label is a :class:`~enum.StrEnum`, so it is its own text wherever a person or a file reads it
(XCom keys, file names, ``stage2`` in a job name); the stage it trains and the DAG task that
submits it are properties of the label, never sliced out of its text.
"""

from __future__ import annotations

from enum import StrEnum

from vcloud.contract import STAGES


class JobLabel(StrEnum):
    """One job of a run, in the order the DAG submits them."""

    DATA = "data"
    """Generate and prepare the synthetic dataset (profiles without the real one)."""
    PREFLIGHT = "preflight"
    """Import the trainer's packages on the debug partition, in the jobs' exact environment."""
    STAGE0 = "stage0"
    STAGE1 = "stage1"
    STAGE2 = "stage2"
    STAGE3 = "stage3"
    EXPORT = "export"
    """Export the viewer data of the best stage."""

    @classmethod
    def of_stage(cls, stage: int) -> JobLabel:
        if stage not in STAGES:
            raise ValueError(f"stage {stage!r} not a training stage (known: {', '.join(map(str, STAGES))})")
        return _BY_STAGE[stage]

    @property
    def stage(self) -> int | None:
        """The training stage this job trains; None for the other jobs."""
        return _STAGE_OF.get(self)

    @property
    def trains(self) -> bool:
        return self.stage is not None

    @property
    def task_id(self) -> str:
        """The DAG task that submits this job."""
        return _TASK_IDS.get(self, self.value)


_BY_STAGE = {0: JobLabel.STAGE0, 1: JobLabel.STAGE1, 2: JobLabel.STAGE2, 3: JobLabel.STAGE3}
_STAGE_OF = {label: stage for stage, label in _BY_STAGE.items()}
_TASK_IDS = {JobLabel.DATA: "prepare_data", JobLabel.PREFLIGHT: "preflight_imports"}

STAGE_LABELS: tuple[JobLabel, ...] = tuple(_BY_STAGE[stage] for stage in STAGES)


def training_label(text: object) -> JobLabel | None:
    """The training stage's label ``text`` names (a key read back from an XCom, a ledger or a job
    comment), or None for another job's label or anything else."""
    label = JobLabel._value2member_map_.get(text) if isinstance(text, str) else None
    return label if isinstance(label, JobLabel) and label.trains else None
