"""What a job task returns when its job completed: :class:`JobSummary`, typed, JSON in XCom.

Airflow keeps a task's return value as JSON (its XCom ``return_value``); everything that reads it
back (a subclass adding its own facts, a UI plugin, a run's report) parses it with
:meth:`JobSummary.from_json` instead of reading keys, and a value that is not a summary (another
task's return value) is told apart by :meth:`JobSummary.is_summary`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from slurm_provider.job_status import JobStatus

REQUIRED_KEYS = ("job_id", "job_ids", "state", "gpu_hours")
"""What every job summary has; a value without them is not one."""


def _int(value: Any) -> int | None:
    if value is None or isinstance(value, bool):
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


@dataclass(frozen=True)
class JobSummary:
    """The job that ended (its last run, from accounting), every job id the task submitted or adopted,
    what they cost and how each submission came about."""

    job_id: str
    job_ids: tuple[str, ...]
    state: str
    """Slurm's state of the job that ended (``COMPLETED``)."""
    gpu_hours: float
    """GPU-hours of every run of every job of the task, as the operator bills them."""
    exit_code: int | None = None
    elapsed_s: int | None = None
    restarts: int = 0
    """Times Slurm requeued the job that ended (the same job id)."""
    node_list: str | None = None
    gpus: int = 0
    submissions: tuple[dict[str, Any], ...] = field(default_factory=tuple)
    """Each submission as :class:`~slurm_provider.resubmission.SubmissionHistory` records it (job id,
    number, cause)."""

    @classmethod
    def of(cls, status: JobStatus, job_ids: list[str], gpu_hours: float,
           submissions: list[dict[str, Any]]) -> JobSummary:
        return cls(job_id=status.job_id, job_ids=tuple(job_ids), state=status.state.value,
                   gpu_hours=round(gpu_hours, 4), exit_code=status.exit_code, elapsed_s=status.elapsed_s,
                   restarts=status.restarts, node_list=status.node_list, gpus=status.gpus,
                   submissions=tuple(submissions))

    def to_json(self) -> dict[str, Any]:
        return {"job_id": self.job_id, "job_ids": list(self.job_ids), "state": self.state,
                "exit_code": self.exit_code, "elapsed_s": self.elapsed_s, "restarts": self.restarts,
                "node_list": self.node_list, "gpus": self.gpus, "gpu_hours": self.gpu_hours,
                "submissions": [dict(s) for s in self.submissions]}

    @staticmethod
    def is_summary(value: Any) -> bool:
        """True for a job task's return value (this class's JSON, or a subclass's that extends it)."""
        return isinstance(value, Mapping) and all(key in value for key in REQUIRED_KEYS)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> JobSummary:
        """The summary in ``data`` (keys it does not know, a subclass's, are left to the subclass);
        a value that is not a summary says which key it lacks."""
        if not isinstance(data, Mapping):
            raise ValueError(f"a job summary is a mapping, got {type(data).__name__}")
        missing = [key for key in REQUIRED_KEYS if key not in data]
        if missing:
            raise ValueError(f"not a job summary: no {', '.join(missing)}")
        job_ids = data.get("job_ids") or [data["job_id"]]
        return cls(job_id=str(data["job_id"]), job_ids=tuple(str(j) for j in job_ids), state=str(data["state"]),
                   gpu_hours=float(data.get("gpu_hours") or 0.0), exit_code=_int(data.get("exit_code")),
                   elapsed_s=_int(data.get("elapsed_s")), restarts=_int(data.get("restarts")) or 0,
                   node_list=data.get("node_list") or None, gpus=_int(data.get("gpus")) or 0,
                   submissions=tuple(dict(s) for s in data.get("submissions") or () if isinstance(s, Mapping)))
