"""Calls to the Slurm controller per cluster connection: what they are, how many, how far apart.

Sites limit how often a user may ask ``slurmctld`` (Slurm's rate limiter lets a burst through, then a
few calls a second; some sites allow four a minute), and every Slurm client the provider runs on the
login node counts: ``squeue``, ``sacct``, ``scontrol``, ``sshare``, ``sbatch`` (``--test-only`` too).
Reading a log or a file over SSH does not. This module says which command lines are scheduler calls
(pure), keeps one :class:`SchedulerCalls` tally per connection in the process (the hooks feed it, a
benchmark or a test reads it), spaces the calls of one connection by the site's ceiling
(:data:`MIN_CALL_INTERVAL_EXTRA`), and recognises Slurm's "slow down" answers.
"""

from __future__ import annotations

import re
import shlex
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

SLURM_CLIENTS: frozenset[str] = frozenset({
    "sacct", "sacctmgr", "salloc", "sattach", "sbatch", "sbcast", "scancel", "scontrol", "sdiag", "sinfo",
    "sprio", "squeue", "sreport", "srun", "sshare", "sstat", "strigger",
})
"""Slurm client programs: each run asks ``slurmctld`` (or ``slurmdbd``) once or more."""

MIN_CALL_INTERVAL_EXTRA = "min_call_interval"
"""Connection extra: the site's ceiling as the least number of seconds between two scheduler calls
of one connection (e.g. 15 where a site allows four a minute). Unset or 0: no ceiling."""

RATE_LIMIT_ANSWERS: tuple[str, ...] = (
    "rate limit exceeded",
    "socket timed out on send/recv operation",
)
"""What a Slurm client prints when the controller refuses or cannot serve it *now* (its rate limiter,
or a controller too busy to answer in time): a reason to ask less often, never a failed job. A
controller that cannot be contacted at all is down, not busy: that stays an outage, which the
watch's deadline bounds."""

_SEPARATORS = {"&&", "||", "|", ";", "&", "(", ")", "{", "}", "!", "then", "do", "else", "if", "while",
               "until", "exec", "command", "env", "timeout", "nice", "xargs"}
_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
_DURATION = re.compile(r"^\d+(?:\.\d+)?[smhd]?$")


def slurm_verbs(command_line: str) -> tuple[str, ...]:
    """The Slurm clients a remote command line runs, in order (``("squeue", "squeue")`` for a line
    that runs squeue twice); empty for a line that only reads or writes files.

    A word counts when it stands where a command does (the line's start, or after ``&&``, ``;``,
    ``|``, ``then``, ``$(``, an environment assignment ...) and its last path part is a Slurm client;
    the script of ``sh -c '...'`` is read the same way. A file name such as ``squeue.out`` or an
    argument ``'/x/sacct y'`` is not a call.
    """
    verbs: list[str] = []
    _collect(command_line, verbs, depth=0)
    return tuple(verbs)


def _collect(text: str, verbs: list[str], depth: int) -> None:
    try:
        lexer = shlex.shlex(text, posix=True, punctuation_chars=";&|()")
        lexer.whitespace_split = True
        lexer.commenters = ""
        words = list(lexer)
    except ValueError:  # unbalanced quotes: read it word by word
        words = text.split()
    at_command, previous = True, ""
    for word in words:
        if previous == "-c" and depth < 3:
            _collect(word, verbs, depth + 1)  # the script of ``sh -c '...'``
        after_timeout, previous = previous == "timeout", word
        if at_command and after_timeout and _DURATION.match(word):
            continue  # ``timeout 10 squeue``
        if word in _SEPARATORS or all(c in ";&|()" for c in word):
            at_command = True
            continue
        if at_command and _ASSIGNMENT.match(word):
            continue
        if at_command and word.rsplit("/", 1)[-1] in SLURM_CLIENTS:
            verbs.append(word.rsplit("/", 1)[-1])
        at_command = False


def is_rate_limited(stderr: str | None) -> bool:
    """True when a Slurm client's error output says the controller will not serve us now."""
    text = (stderr or "").lower()
    return any(answer in text for answer in RATE_LIMIT_ANSWERS)


def min_call_interval(extra: Mapping[str, Any]) -> float:
    """The ceiling a connection's extras ask for, in seconds between calls (0: none); a value that is
    not a non-negative number is refused, naming the extra."""
    value = extra.get(MIN_CALL_INTERVAL_EXTRA)
    if value in (None, ""):
        return 0.0
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        seconds = -1.0
    if not seconds >= 0:
        raise ValueError(f"connection extra {MIN_CALL_INTERVAL_EXTRA}={value!r} must be a number of seconds "
                         "(0 or more), e.g. 15 where the site allows four scheduler calls a minute")
    return seconds


@dataclass
class SchedulerCalls:
    """Every scheduler call one connection made in this process, and when the next may go."""

    conn_id: str
    by_verb: Counter[str] = field(default_factory=Counter)
    times: list[float] = field(default_factory=list)
    """``time.monotonic()`` of each call, in order."""
    rate_limited: int = 0
    """Answers that asked us to slow down (:func:`is_rate_limited`)."""
    _next_free: float = 0.0
    _last_start: float | None = None

    @property
    def total(self) -> int:
        return sum(self.by_verb.values())

    def reserve(self, gap: float, now: float | None = None) -> float:
        """Seconds to wait before the next call so calls stay ``gap`` apart; takes that turn.

        No lock is needed: the turn is taken at once, so callers that ask one after the other queue up.
        """
        now = time.monotonic() if now is None else now
        start = max(now, self._next_free) if gap > 0 else now
        self._next_free = start + gap
        return start - now

    def claim(self, gap: float, now: float | None = None) -> float:
        """Seconds still to wait so that this call starts ``gap`` after the last one that really started
        (0: go now, and this call is now the last one started).

        :meth:`reserve` queues callers, but a caller woken late would leave the next one less than
        ``gap`` after it: the ceiling holds for the calls' real starts only if each start is checked
        against the previous start. Check and claim happen with no await between them.
        """
        now = time.monotonic() if now is None else now
        if self._last_start is not None and now < self._last_start + gap:
            return self._last_start + gap - now
        self._last_start = now
        return 0.0

    def record(self, verbs: tuple[str, ...], now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        for verb in verbs:
            self.by_verb[verb] += 1
            self.times.append(now)

    def per_minute(self, start: float, end: float) -> float:
        """Calls per minute between two ``time.monotonic()`` readings."""
        if end <= start:
            return 0.0
        return sum(1 for t in self.times if start <= t < end) * 60.0 / (end - start)

    def snapshot(self) -> dict[str, Any]:
        return {"conn_id": self.conn_id, "total": self.total, "by_verb": dict(sorted(self.by_verb.items())),
                "rate_limited": self.rate_limited}


_CALLS: dict[str, SchedulerCalls] = {}


def calls_of(conn_id: str) -> SchedulerCalls:
    """The tally of ``conn_id`` in this process (made on first use)."""
    calls = _CALLS.get(conn_id)
    if calls is None:
        calls = _CALLS[conn_id] = SchedulerCalls(conn_id)
    return calls


def forget_calls(conn_id: str | None = None) -> None:
    """Start the tally of one connection (or of all) afresh."""
    if conn_id is None:
        _CALLS.clear()
    else:
        _CALLS.pop(conn_id, None)
