"""A job pending on its account's allocation: wait while teammates' running jobs hold it, fail when spent.

``AccountingStorageEnforce=safe`` starts a job only while ``GrpTRESMins`` less the account's usage
and less what its running jobs may still use (``TRESRunMins``) covers the job's TRES x its whole time
limit; otherwise the job pends with ``AssocGrp<TRES>Minutes``. That reason alone does not say
whether the job waits for the running jobs of the account (they release what they hold as they
end) or can never start (the usage alone leaves too little). :func:`judge` tells them apart from
one ``sshare`` of the account (:class:`~slurm_provider.cli.sshare.TresMinutes`); everything here is
pure, the watch (trigger) decides what to do with it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from slurm_provider.cli.sshare import TresMinutes
from slurm_provider.cli.values import parse_int, parse_tres, format_duration
from slurm_provider.job_status import JobStatus

@dataclass(frozen=True)
class AccountReading:
    """One ``sshare`` of an account, as the poller read it for every job pending on its allocation."""

    account: str
    tres: str
    figures: TresMinutes | None
    """None when sshare gave no answer or does not list the account (``problem`` says which)."""
    problem: str | None = None


def job_need(status: JobStatus, tres: str) -> int | None:
    """TRES-minutes the job must be able to pay before Slurm starts it: its ``tres`` count x its whole
    time limit in minutes (rounded up, as Slurm counts); None when Slurm did not show either."""
    count = parse_int(parse_tres(status.tres).get(tres))
    if count is None or not status.time_limit_s:
        return None
    return count * math.ceil(status.time_limit_s / 60)


@dataclass(frozen=True)
class AllocationVerdict:
    """What an account's figures mean for one job pending on its allocation."""

    job_id: str
    reason: str
    figures: TresMinutes
    need: int | None
    """TRES-minutes the job needs (:func:`job_need`), None when unknown."""

    @property
    def spent(self) -> bool:
        """True when the usage alone leaves less than the job needs: no running job's end can help."""
        left = self.figures.left_by_usage
        return left is not None and self.need is not None and left < self.need

    @property
    def judged(self) -> bool:
        """False when the limit or the job's need is unknown: nothing tells waiting from spent."""
        return self.figures.limit is not None and self.need is not None

    def holders(self) -> str:
        """``alice 900, bob 60`` (plus what users sshare does not show hold), or ``no running job``."""
        f = self.figures
        parts = [f"{user} {minutes}" for user, minutes in f.holders]
        hidden = f.running - sum(minutes for _, minutes in f.holders)
        if hidden > 0:
            parts.append(f"users sshare does not show {hidden}")
        return ", ".join(parts) if parts else "no running job"

    def _figures(self) -> str:
        f = self.figures
        limit = "no limit on the account itself" if f.limit is None else f"GrpTRESMins {f.tres}={f.limit}"
        return (f"{limit}, used {f.used} (GrpTRESRaw), running jobs hold {f.running} (TRESRunMins: "
                f"{self.holders()})")

    def _need(self) -> str:
        return "an unknown amount" if self.need is None else f"{self.need} {self.figures.tres}-minutes"

    def waiting(self) -> str:
        """The log line while the job waits for the running jobs of the account."""
        f = self.figures
        if not self.judged:
            return (f"Job {self.job_id} pends with {self.reason} on account {f.account} ({self._figures()}); "
                    f"it needs {self._need()}, so whether it ever fits is unknown: waiting")
        return (f"Job {self.job_id} waits for the allocation of account {f.account}: {self._figures()}. "
                f"It needs {self._need()}, the usage leaves {f.left_by_usage}: it starts once running jobs of "
                "the account have released enough")

    def spent_message(self) -> str:
        """The failure when the usage alone leaves too little."""
        f = self.figures
        return (f"job {self.job_id} will never start: {self.reason}: the allocation of account {f.account} is "
                f"spent for it: {self._figures()}; the usage leaves {f.left_by_usage} {f.tres}-minutes and the "
                f"job needs {self._need()} ({self.figures.tres} x its whole time limit), which no running "
                "job's end can free. Shorten its time limit or use fewer GPUs, or ask the project's PI or the "
                f"cluster support to raise GrpTRESMins of account {f.account}")


def judge(status: JobStatus, reason: str, figures: TresMinutes) -> AllocationVerdict:
    """The verdict on job ``status`` pending with ``reason`` on ``figures``' allocation."""
    return AllocationVerdict(job_id=status.job_id, reason=reason, figures=figures,
                             need=job_need(status, figures.tres))


def deadline_message(job_id: str, reason: str, waited_s: float, deadline_s: float, last: str | None) -> str:
    """The failure when the watch waited ``watch_deadline`` for the allocation in vain."""
    seen = f" Last seen: {last}." if last else ""
    return (f"job {job_id} still pends with {reason} after the watch waited {format_duration(waited_s)} for the "
            f"account's running jobs to release its allocation (watch_deadline {format_duration(deadline_s)}).{seen} "
            "Giving up; raise watch_deadline to wait longer, or ask whose jobs hold the allocation")
