"""A job's exit record: a one-line file its batch script leaves next to its output when it ends.

Slurm says a job ended only when someone asks it (a scheduler call), and the shared poller asks less
often the longer nothing changes (up to every 300 s). The record lets the poller notice the end from
a file read over the SSH connection it already holds, then ask Slurm once to confirm. Both sides
share the path rule here: the record of the job whose output file is ``<path>`` is ``<path>.end``.

The record names the run it belongs to (``SLURM_JOB_ID``, ``SLURM_RESTART_COUNT``), and a run that
requeued its job says so: a reader takes a record for the end only when it is of the watched job, of
its newest run (no older than the restart count Slurm last reported), and not requeued. Slurm's
confirmation stays the judge: a record is a reason to ask, never the answer.

    job=123 restart=0 exit=0 end=1764218000 requeued=0
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

END_RECORD_SUFFIX = ".end"
_SHELL_PATTERNS = {"%j": '"${SLURM_JOB_ID:-0}"', "%x": '"${SLURM_JOB_NAME:-job}"'}
"""Slurm's filename patterns an exit record's path may hold, as the batch script expands them."""


def end_record_path(output_path: str) -> str:
    """Where the job writing ``output_path`` leaves its exit record (``%j`` patterns stay patterns)."""
    return f"{output_path}{END_RECORD_SUFFIX}"


@dataclass(frozen=True)
class EndRecord:
    """One run's end, as its batch script wrote it."""

    job_id: str
    restart: int
    exit_code: int
    ended_at: int
    """Seconds since the epoch, on the job's node."""
    requeued: bool
    """The run requeued its own job (``scontrol requeue``): another run follows."""

    def ends(self, job_id: str, restarts_seen: int) -> bool:
        """Whether this record says job ``job_id`` ended, given the restart count Slurm last reported:
        a requeued run, an older run's record or another job's is not the end."""
        return self.job_id == str(job_id) and not self.requeued and self.restart >= restarts_seen


def parse_end_record(text: str) -> EndRecord | None:
    """The record in ``text`` (its first line); None when it is incomplete or not a record."""
    fields = dict(word.partition("=")[::2] for word in text.strip().split("\n", 1)[0].split())
    try:
        return EndRecord(fields["job"], int(fields["restart"]), int(fields["exit"]), int(fields["end"]),
                         fields["requeued"] == "1")
    except (KeyError, ValueError):
        return None


def end_record_shell(output_pattern: str) -> str:
    """Lines for a bash batch script (after its own traps) that leave the exit record when it exits.

    ``output_pattern`` is the script's ``--output`` with ``%j`` for the job id and ``%x`` for the job
    name, which the script expands from ``SLURM_JOB_ID`` and ``SLURM_JOB_NAME``: a submit that names
    the job and its output on the command line (as ``SlurmSubmitOperator`` does, ``%x.%j.out`` in its
    log directory) gets its record where its watch looks. Other patterns are refused. The record is
    written by an ``EXIT`` trap, so it is left on every way out of the script, a signal the script
    traps included; a ``SIGKILL`` (a node that fails) leaves none, and the poller's ``squeue`` notices
    that end. A script that requeues its own job sets ``requeued=1`` before it does. Written to a
    temp file that ``mktemp`` creates exclusively next to the record (a name nobody can foresee, so no
    link another member of a group-writable log directory planted is followed), then renamed: a
    reader never sees half a record. A script killed by a signal it does not
    trap records the status of its last command (bash's EXIT trap is not told the signal): Slurm's
    confirmation says how the job ended, the record only that it did."""
    if "%" in re.sub(r"%[jx]", "", output_pattern):
        raise ValueError(f"output pattern {output_pattern!r}: only %j and %x are expanded in an exit record's path")
    path = "".join(_SHELL_PATTERNS.get(part) or shlex.quote(part)
                   for part in re.split(r"(%[jx])", end_record_path(output_pattern)) if part)
    return "\n".join([
        "# Exit record next to the job's output (slurm_provider.watch.end_records): the watch notices the end",
        "# from it without asking Slurm. requeued=1 when this run requeues the job: not the end.",
        f"readonly END_RECORD={path}",
        "requeued=0",
        "# shellcheck disable=SC2317  # invoked from the EXIT trap",
        "write_end_record() {",
        '    local tmp',
        '    tmp="$(mktemp "${END_RECORD}.XXXXXX" 2>/dev/null)" || return 0',
        "    # The time from bash itself (%(%s)T, -1 = now): a date command forked while Slurm ends the job",
        "    # may be killed first, and left the record with an empty end= that no reader parses.",
        "    if ! printf 'job=%s restart=%s exit=%s end=%(%s)T requeued=%s\\n' \"${SLURM_JOB_ID:-0}\" "
        '"${SLURM_RESTART_COUNT:-0}" "$1" -1 "$requeued" 2>/dev/null > "$tmp" \\',
        '        || ! chmod 0644 -- "$tmp" 2>/dev/null || ! mv -f -- "$tmp" "$END_RECORD" 2>/dev/null; then',
        '        rm -f -- "$tmp"',
        "    fi",
        "}",
        "trap 'write_end_record \"$?\"' EXIT",
    ])
