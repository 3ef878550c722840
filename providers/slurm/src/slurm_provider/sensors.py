"""``SlurmJobSensor``: wait for a Slurm job someone else submitted (by id) to end successfully."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from airflow.sdk import BaseSensorOperator
from airflow.sdk.exceptions import AirflowException

from slurm_provider.timing import FIRST_POLL_DELAY, MAX_POLL_INTERVAL, POLL_INTERVAL
from slurm_provider.state_vocabulary import StateCategory
from slurm_provider.job_status import JobStatus
from slurm_provider.triggers import SlurmJobTrigger
from slurm_provider.watch.watch_request import WatchedJob, WatchSchedule
from slurm_provider.watch.events import FINISHED, WatchEvent
from slurm_provider.validation import validate_job_id


class SlurmJobSensor(BaseSensorOperator):
    """Succeeds when job ``job_id`` completes; fails when it ends any other way.

    Deferrable by default (the wait happens in the triggerer, sharing its poller); with
    ``deferrable=False`` it pokes with one ``squeue``/``sacct`` per poke, every ``poll_interval``
    unless ``poke_interval`` says otherwise. The intervals default to :mod:`slurm_provider.timing`'s.
    """

    template_fields: Sequence[str] = ("job_id",)

    def __init__(self, *, conn_id: str, job_id: str, deferrable: bool = True,
                 poll_interval: float = POLL_INTERVAL, max_poll_interval: float = MAX_POLL_INTERVAL,
                 first_poll_delay: float = FIRST_POLL_DELAY, **kwargs: Any) -> None:
        kwargs.setdefault("poke_interval", poll_interval)
        super().__init__(**kwargs)
        self.conn_id = conn_id
        self.job_id = job_id
        self.deferrable = deferrable
        self.poll_interval = poll_interval
        self.max_poll_interval = max_poll_interval
        self.first_poll_delay = first_poll_delay

    def execute(self, context: Any) -> Any:
        validate_job_id(self.job_id)
        if not self.deferrable:
            return super().execute(context)
        status = self._status()
        if status.state.is_terminal:
            return self._interpret(status)
        self.defer(trigger=SlurmJobTrigger(
            job=WatchedJob(conn_id=self.conn_id, job_id=str(self.job_id), pending_policy="warn"),
            schedule=WatchSchedule(poll_interval=self.poll_interval, max_poll_interval=self.max_poll_interval,
                                   first_poll_delay=self.first_poll_delay)), method_name="execute_complete")

    def poke(self, context: Any) -> bool:
        status = self._status()
        if status.state.category is StateCategory.WAITING:
            self.log.info("Job %s is %s", self.job_id, status.state.value)
            return False
        self._interpret(status)
        return True

    def execute_complete(self, context: Any, event: dict[str, Any]) -> Any:
        try:
            ended = WatchEvent.from_json(event)
        except ValueError as exc:
            raise AirflowException(f"waiting for job {self.job_id} failed: {exc}") from None
        if ended.kind != FINISHED or ended.status is None:
            raise AirflowException(f"waiting for job {self.job_id} failed: {ended.message}")
        return self._interpret(ended.status)

    def _status(self) -> JobStatus:
        from slurm_provider.hooks import SlurmHook

        job_id = str(self.job_id)
        with SlurmHook(self.conn_id) as hook:
            return hook.statuses([job_id])[job_id]

    def _interpret(self, status: JobStatus) -> dict[str, Any]:
        if status.state.category is StateCategory.UNKNOWN:
            raise AirflowException(f"job {status.job_id} is not known to the cluster (never success)")
        if not status.state.is_success:
            raise AirflowException(f"job {status.job_id} ended {status.state.value}: {status.state.description}"
                                   f" (exit code {status.exit_code}, reason {status.reason})")
        return status.to_event()
