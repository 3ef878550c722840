"""The exclusive submit: one ``sbatch`` under a lock in the directory the job writes, refused while a
live job of the project writes there, or while the directory's work is done.

One remote shell takes the lock (``mkdir``, a stale one by a holder that is gone is broken), asks
``squeue`` for live jobs whose comment names the directory, looks for the done markers, moves the
outputs aside for a fresh start when asked, and only then runs ``sbatch``; what it found is printed
with the markers below instead of a job id.
"""

from __future__ import annotations

import hashlib
import re
import shlex
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from slurm_provider.cli.sbatch import JobComment, build_sbatch_submit
from slurm_provider.cli.squeue import build_squeue_live_jobs
from slurm_provider.validation import ValidationError, validate_remote_path

LIVE_MARKER = "__SLURM_PROVIDER_LIVE__"
"""Printed (with the login user after it) instead of a job id when live jobs already write the directory."""

DONE_MARKER = "__SLURM_PROVIDER_DONE__"
"""Printed instead of a job id when the directory's done markers exist: nothing is left to do."""

MOVED_MARKER = "__SLURM_PROVIDER_MOVED__"
"""Printed before the job id, with a directory after it, for each directory whose outputs were moved aside."""


SUBMIT_LOCK_NAME = ".slurm-submit.lock"

SUBMIT_LOCK_OWNER = "owner"
"""File inside the lock directory: ``<host> <pid>`` of the shell that holds it, touched while held."""

SUBMIT_LOCK_STALE_MINUTES = 1
"""An owner file on another login node not refreshed for this long belongs to a submit that died."""

SUBMIT_LOCK_WAIT_TENTHS = 1200
"""How long (tenths of a second) a submit waits for the lock before it gives up with exit 75."""

EXIT_LOCK_BUSY = 75
"""The exclusive submit's exit status when another submit held the lock all along (EX_TEMPFAIL):
nothing was submitted, and trying again later is right."""

EXIT_NO_DIRECTORY = 70
"""The exclusive submit's exit status when the directory cannot be created or its outputs moved aside."""

EXIT_QUERY_FAILED = 76
"""The exclusive submit's exit status when ``squeue`` gave no answer (slurmctld busy): nothing was
submitted, and trying again later is right."""


def exclusive_dir_marker(directory: str) -> str:
    """The short digest a job comment carries for the directory the job writes (``"xdir":"..."``)."""
    return hashlib.sha256(directory.rstrip("/").encode()).hexdigest()[:16]




def lock_acquire_lines(lock: str, *, program: str = "sbatch", what: str = "submit") -> list[str]:
    """Shell lines that take a lock such as the submit lock, a directory (``mkdir`` is atomic on every POSIX file
    system, Lustre included), for a live holder only.

    The holder writes ``<host> <pid>`` into the lock and a keeper touches it every few seconds while
    it is held. A waiter on the same host takes the lock over when that pid is gone; a waiter on
    another login node when the owner file went unrefreshed for ``SUBMIT_LOCK_STALE_MINUTES``. A
    takeover renames the lock away and checks that it took the very lock it judged dead, putting it
    back otherwise. A submit that waits ``SUBMIT_LOCK_WAIT_TENTHS`` in vain exits ``EXIT_LOCK_BUSY``, saying
    "``<program>: error: another <what> holds <lock>``". The lock is released when the shell exits.
    Other one-writer steps on the login node (installing a job environment) take the same kind of lock.
    """
    owner = f'"$lock"/{SUBMIT_LOCK_OWNER}'
    return [
        f"lock={shlex.quote(lock)}; here=$(hostname); waited=0",
        'until mkdir -m 775 "$lock" 2>/dev/null; do '
        f'holder=$(cat {owner} 2>/dev/null); stale=; '
        'if [ -n "$holder" ]; then '
        'if [ "${holder%% *}" = "$here" ]; then [ -d "/proc/${holder#* }" ] || stale=1; '
        f'elif [ -n "$(find {owner} -mmin +{SUBMIT_LOCK_STALE_MINUTES} 2>/dev/null)" ]; then stale=1; fi; '
        f'elif [ -n "$(find "$lock" -maxdepth 0 -mmin +{SUBMIT_LOCK_STALE_MINUTES} 2>/dev/null)" ]; then stale=1; fi; '
        'if [ -n "$stale" ]; then '
        'if mv -T "$lock" "$lock.stale.$$" 2>/dev/null; then '
        f'if [ "$(cat "$lock.stale.$$/{SUBMIT_LOCK_OWNER}" 2>/dev/null)" = "$holder" ]; then rm -rf "$lock.stale.$$"; '
        'else mv -T "$lock.stale.$$" "$lock" 2>/dev/null; fi; fi; continue; fi; '
        'waited=$((waited + 1)); '
        f'if [ "$waited" -gt {SUBMIT_LOCK_WAIT_TENTHS} ]; then '
        f'echo "{program}: error: another {what} holds $lock (${{holder:-owner unknown}}); try again" >&2; '
        f'exit {EXIT_LOCK_BUSY}; fi; '
        "sleep 0.1; done",
        f'echo "$here $$" > {owner}',
        f'( while sleep 5 && [ -d "/proc/$$" ]; do touch -c {owner} 2>/dev/null || exit 0; done ) '
        "</dev/null >/dev/null 2>&1 & keeper=$!",
        f"trap 'kill $keeper 2>/dev/null; rm -f {owner}; rmdir \"$lock\" 2>/dev/null' EXIT",
    ]


def build_exclusive_sbatch_submit(*, exclusive_dir: str, done_markers: Sequence[str] = (),
                                  replace: str | None = None, supersede: Sequence[str] = (),
                                  live_account: str | None = None, **submit: Any) -> str:
    """Submit unless a live job already writes ``exclusive_dir``, or it is done; one command.

    Under a lock directory inside ``exclusive_dir`` held by a live holder (see :func:`lock_acquire_lines`),
    one ``squeue`` lists every user's live jobs of the project's account (``live_account``, else
    ``submit['account']``; every account's when neither names one) whose comment names the
    directory's digest: if there is one, it prints ``LIVE_MARKER``, the login user and those rows,
    and submits nothing. Otherwise, when every one of ``done_markers`` (paths relative to the
    directory) exists, it prints ``DONE_MARKER`` and submits nothing: the work is done. Otherwise it
    runs :func:`build_sbatch_submit` (the script on stdin). Two Airflow deployments, or two members
    of a project, that submit for the same directory at the same moment thus get one job between
    them, and one that comes a moment after the job finished gets none.

    ``replace`` (a stamp such as ``20260312T101500``) asks for a fresh start: the done markers are
    not looked at, and before ``sbatch`` what the directory holds is moved into
    ``<directory>.replaced-<stamp>``, and what each ``supersede`` directory holds (outputs computed
    from the old ones, e.g. later training stages) into ``<that directory>.superseded-<stamp>``,
    each printed after ``MOVED_MARKER``. A live job writing a ``supersede`` directory counts as a
    live writer too. The job and its outputs are created with ``umask 002``: the project's members
    share the directories. The comment in ``submit`` must carry the directory's digest
    (``JobComment.xdir``).
    """
    directory = _directory(exclusive_dir, "exclusive_dir")
    comment = submit.get("comment")
    marker = exclusive_dir_marker(directory)
    if not isinstance(comment, JobComment) or comment.xdir != marker:
        raise ValidationError("comment", f"must be a JobComment with xdir={marker!r} for {directory}")
    markers = [_relative(m, "done_markers") for m in done_markers]
    later = [_directory(d, "supersede") for d in supersede]
    if later and replace is None:
        raise ValidationError("supersede", "only a replacing submit moves other directories aside (give replace)")
    if replace is not None and not re.fullmatch(r"[A-Za-z0-9._-]{1,64}", replace):
        raise ValidationError("replace", "must be a stamp of letters, digits, '.', '_' or '-'", replace)
    account = live_account if live_account is not None else submit.get("account")
    needles = " ".join(f"-e {shlex.quote(_xdir_needle(d))}" for d in [directory, *later])
    lines = [
        "umask 002",
        f"mkdir -p {shlex.quote(directory)} || exit {EXIT_NO_DIRECTORY}",
        *lock_acquire_lines(f"{directory}/{SUBMIT_LOCK_NAME}"),
        f"live=$({build_squeue_live_jobs(account)}) || exit {EXIT_QUERY_FAILED}",
        f"match=$(printf '%s\\n' \"$live\" | grep -F {needles})",
        f'if [ -n "$match" ]; then echo "{LIVE_MARKER} $(id -un)"; printf \'%s\\n\' "$match"; exit 0; fi',
    ]
    if replace is None and markers:
        present = " && ".join(f"[ -e {shlex.quote(directory + '/' + m)} ]" for m in markers)
        lines.append(f"if {present}; then echo {DONE_MARKER}; exit 0; fi")
    if replace is not None:
        moves = [(directory, f"{directory}.replaced-{replace}", SUBMIT_LOCK_NAME)]
        moves += [(d, f"{d}.superseded-{replace}", SUBMIT_LOCK_NAME) for d in later]
        for source, target, keep in moves:
            src, dst = shlex.quote(source), shlex.quote(target)
            lines.append(
                f"if [ -d {src} ] && [ -n \"$(find {src} -mindepth 1 -maxdepth 1 ! -name {keep} -print -quit)\" ]; "
                f"then mkdir {dst} && find {src} -mindepth 1 -maxdepth 1 ! -name {keep} -exec mv -t {dst} -- {{}} + "
                f"|| exit {EXIT_NO_DIRECTORY}; echo {MOVED_MARKER} {dst}; fi")
    lines.append(build_sbatch_submit(**submit))
    return "; ".join(lines)


def _xdir_needle(directory: str) -> str:
    """The text a job comment holds when the job writes ``directory`` (compact JSON, see JobComment)."""
    return f'"xdir":"{exclusive_dir_marker(directory)}"'


def _directory(value: str, field: str) -> str:
    return validate_remote_path(value.rstrip("/") or "/", field, absolute=True)


def _relative(value: str, field: str) -> str:
    value = validate_remote_path(value, field)
    if value.startswith("/") or ".." in value.split("/"):
        raise ValidationError(field, f"{value!r} must be a path inside the directory (relative, no '..')", value)
    return value
