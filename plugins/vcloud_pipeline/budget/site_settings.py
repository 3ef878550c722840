"""The site settings the pipeline relies on, read once per run by the preflight; pure.

Some of what the pipeline does only holds on a site configured a certain way, and nothing fails
when it is not: the ledger finds this project's finished jobs by their comment, which accounting
keeps only with ``AccountingStoreFlags=job_comment``; the check that no live job of the project
writes a run's directory lists the account's jobs, which ``PrivateData=jobs`` hides unless they are
the login user's own; the budget counts what the whole project spent only where an allocation is
read (Slurm's limit on the account or the site's command), and otherwise only this login user's jobs.

:func:`site_settings` turns ``scontrol show config`` and the allocation the preflight read into one
:class:`SiteSetting` per assumption, each saying whether it holds and, where it does not, what goes
wrong and what the pipeline does instead. The preflight logs them; none stops a run.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from vcloud_pipeline.budget.billing import COMMAND, PROFILE, SLURM, Allocation

UNSET = frozenset({"", "(null)", "none"})
"""How ``scontrol show config`` prints a list setting with nothing in it."""


@dataclass(frozen=True)
class SiteSetting:
    """One setting the pipeline relies on, as the site has it."""

    setting: str
    """What is relied on, in Slurm's words (``AccountingStoreFlags includes job_comment``)."""
    holds: bool
    seen: str
    """What the site says (the setting's value, or where the allocation is read)."""
    consequence: str = ""
    """What goes wrong where it does not hold."""
    fallback: str = ""
    """What the pipeline does instead."""

    def line(self) -> str:
        if self.holds:
            return f"site setting: {self.setting}: yes ({self.seen})"
        return f"site setting: {self.setting}: NO ({self.seen}). {self.consequence}. {self.fallback}"

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _words(value: str | None) -> set[str]:
    """The entries of a list setting (``job_comment,job_env`` -> {job_comment, job_env})."""
    words = {word.strip().lower() for word in (value or "").split(",")}
    return {word for word in words if word not in UNSET}


def _job_comments(config: Mapping[str, str]) -> SiteSetting:
    value = config.get("AccountingStoreFlags", "")
    return SiteSetting(
        setting="AccountingStoreFlags includes job_comment",
        holds="job_comment" in _words(value), seen=value or "unset",
        consequence="accounting keeps no comment of a finished job, and the ledger finds this project's jobs by "
                    "their comment: once they leave the queue, their hours drop out of what the budget counts as "
                    "spent",
        fallback="The budget check counts the spent hours only where the allocation is read from Slurm or the "
                 "site's command; a task's adoption of its own job goes by the job's name, which it keeps")


PRIVATE_DATA: dict[str, tuple[str, str]] = {
    "jobs": ("squeue lists only the login user's own jobs, so the check that no live job of the project writes "
             "a run's directory sees this user's jobs only, and a project member's job of the same run name "
             "goes unseen",
             "Each member gives runs their own names (the exclusive submit still refuses this user's own "
             "second writer)"),
    "usage": ("sshare hides the account's association and usage from this user (Slurm 22.05 lists none), so the "
              "allocation cannot be read from Slurm's limit on the account",
              "Read the allocation with the site's command (billing.allocation_source: command) where it has "
              "one; otherwise the profile's billing.allocation is the limit, less this user's jobs"),
}
"""What the pipeline reads that ``PrivateData=<entry>`` hides: the consequence and the fallback."""


def _visible(config: Mapping[str, str], entry: str) -> SiteSetting:
    value = config.get("PrivateData", "")
    consequence, fallback = PRIVATE_DATA[entry]
    return SiteSetting(setting=f"PrivateData does not hide {entry}", holds=entry not in _words(value),
                       seen=value or "unset", consequence=consequence, fallback=fallback)


def _allocation_read(allocation: Allocation) -> SiteSetting:
    sources = {SLURM: "Slurm's limit on the account", COMMAND: "the site's command", PROFILE: "the profile"}
    seen = sources.get(allocation.source, allocation.source)
    if allocation.note:
        seen = f"{seen}: {allocation.note}"
    read_from_site = allocation.source in (SLURM, COMMAND) and allocation.limit is not None
    fallback = ("The profile's billing.allocation is the limit, less this user's jobs"
                if allocation.limit is not None else "No budget limit stops a run: set billing.allocation in the "
                                                     "profile, or a GrpTRESMins limit on the account")
    return SiteSetting(
        setting="an allocation limit the site reports for the whole account",
        holds=read_from_site, seen=seen,
        consequence="the ledger reads this login user's jobs only (sacct without --allusers), so what other "
                    "members of the project spend is not subtracted",
        fallback=fallback)


def site_settings(config: Mapping[str, str] | None, allocation: Allocation) -> tuple[SiteSetting, ...]:
    """Every site setting the pipeline relies on, from ``scontrol show config`` and the allocation read;
    only the allocation's when the controller did not list its settings (``config`` None)."""
    read = () if config is None else (_job_comments(config), *(_visible(config, e) for e in PRIVATE_DATA))
    return (*read, _allocation_read(allocation))
