"""``sshare``: an account's TRES-minute limit (``GrpTRESMins``), its usage and what its running
jobs may still use: the allocation as Slurm holds it."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from slurm_provider.cli.values import (
    SlurmOutputError,
    join_argv,
    output_lines,
    parse_tres_minutes,
    split_fields,
)
from slurm_provider.validation import validate_account

SSHARE_FIELDS: tuple[str, ...] = ("Account", "User", "GrpTRESMins", "GrpTRESRaw", "TRESRunMins")
"""Fields of ``sshare --format``: the association, its TRES-minute limits, the TRES-minutes it has
used (what Slurm holds against ``GrpTRESMins``) and the TRES-minutes its running jobs may still use."""


def build_sshare_account(account: str) -> str:
    """``sshare --all`` of one account: one ``|``-separated line per association (the account's own,
    with an empty user, then every user of it, not only the caller), fields :data:`SSHARE_FIELDS`.

    An allocation that Slurm enforces is a ``GrpTRESMins`` limit (``billing=6000000``) on the
    account; ``GrpTRESRaw`` is the usage counted against it and ``TRESRunMins`` what running jobs
    still hold (time limit left x TRES), which ``AccountingStorageEnforce=safe`` counts too before it
    starts a job. An account the user cannot see prints nothing and exits 0.
    """
    argv = ["sshare", "--noheader", "--parsable2", "--all", f"--accounts={validate_account(account)}",
            f"--format={','.join(SSHARE_FIELDS)}"]
    return join_argv(argv)


@dataclass(frozen=True)
class AssociationRow:
    """One association as ``sshare`` prints it (``slurm_provider.cli.sshare.build_sshare_account``), in TRES-minutes."""

    account: str
    user: str | None
    """``None`` for the account's own association (the one a project allocation is set on)."""
    limits: dict[str, int]
    """``GrpTRESMins``: TRES -> minutes the association may use in total; a TRES without a limit is absent."""
    used: dict[str, int]
    """``GrpTRESRaw``: TRES -> minutes used so far (what Slurm compares with ``limits``)."""
    running: dict[str, int]
    """``TRESRunMins``: TRES -> minutes the association's running jobs may still use (time limit left)."""


def parse_sshare(stdout: str | None) -> list[AssociationRow]:
    """Rows of ``slurm_provider.cli.sshare.build_sshare_account``; sshare indents user rows with a space."""
    rows = []
    for line in output_lines(stdout):
        fields = split_fields(line, SSHARE_FIELDS, "sshare")
        account = fields["Account"].strip()
        if not account:
            raise SlurmOutputError(f"sshare line names no account: {line!r}")
        rows.append(AssociationRow(
            account=account,
            user=fields["User"].strip() or None,
            limits=parse_tres_minutes(fields["GrpTRESMins"]),
            used=parse_tres_minutes(fields["GrpTRESRaw"]),
            running=parse_tres_minutes(fields["TRESRunMins"]),
        ))
    return rows


@dataclass(frozen=True)
class TresMinutes:
    """One TRES of an account's own association, in TRES-minutes, as Slurm enforces ``GrpTRESMins``."""

    account: str
    tres: str
    limit: int | None
    """``None``: the account has no ``GrpTRESMins`` limit on this TRES."""
    used: int
    running: int
    holders: tuple[tuple[str, int], ...] = ()
    """``(user, TRES-minutes)`` that each user's running jobs in the account may still use, largest
    first, users holding nothing left out. Where the site hides other users' usage (``PrivateData``)
    sshare lists only the caller: ``running`` less these is then held by users not shown."""

    @property
    def left(self) -> int | None:
        """What a new job may still use: the limit less usage and running jobs' remaining time."""
        return None if self.limit is None else self.limit - self.used - self.running

    @property
    def left_by_usage(self) -> int | None:
        """What the usage alone leaves of the limit: what a job can ever get once running jobs ended
        (they may use some of what they hold, never more)."""
        return None if self.limit is None else self.limit - self.used


def account_tres_minutes(rows: Iterable[AssociationRow], account: str,
                         tres: str = "billing") -> TresMinutes | None:
    """The account's own association (no user) for ``tres``, with what each user's running jobs hold;
    ``None`` when sshare did not list it."""
    rows = list(rows)
    held: dict[str, int] = {}
    for row in rows:
        if row.user is not None and row.running.get(tres, 0) > 0:
            held[row.user] = held.get(row.user, 0) + row.running[tres]
    holders = tuple(sorted(held.items(), key=lambda item: (-item[1], item[0])))
    for row in rows:
        if row.account == account and row.user is None:
            return TresMinutes(account=account, tres=tres, limit=row.limits.get(tres),
                               used=row.used.get(tres, 0), running=row.running.get(tres, 0), holders=holders)
    return None
