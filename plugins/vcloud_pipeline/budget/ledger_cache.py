"""The ledger's accounting read only where it is new: the runs that ended are kept on the worker host.

The ledger bills every run of this project's jobs of the last year (``sacct -D`` of a year), and the
pipeline reads it before each submit, after each job and in every preflight: on a site with months
of the project's jobs that is thousands of rows per read, the query site admins complain about. A
run that ended is final once accounting has its end. So a worker host keeps the runs that ended
(:class:`LedgerCache`, a JSON file per connection and account in the host's cache directory), and a read
asks ``sacct`` only for the jobs alive since the last read less :data:`OVERLAP_SECONDS` (for the skew
between the host's clock and the cluster's, and for accounting that records an end late): every run
that read returns replaces the kept one of the same job and start. A run that ended before that
window was returned by an earlier read that came at least the overlap after its end, so it is final.
The first read on a host, one every :data:`FULL_READ_SECONDS`, and any read whose file is missing or
unreadable, read the whole year again. Pure except :func:`load` and :func:`save`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path

from slurm_provider import JobStatus

log = logging.getLogger(__name__)

OVERLAP_SECONDS = 3600
"""How far before the last read an incremental read starts: clock skew and accounting's lag, with room."""

FULL_READ_SECONDS = 30 * 86400
"""The whole year is read again this often, whatever the cache holds."""

CACHE_VERSION = 1


@dataclass
class LedgerCache:
    """The runs that ended, as the last reads saw them, and when the host read them."""

    read_at: float
    """The host's clock (epoch seconds) at the last read."""
    full_at: float
    """The host's clock at the last read of the whole year."""
    runs: dict[str, dict] = field(default_factory=dict)
    """Run key (:func:`run_key`) -> ``JobStatus.to_event()`` of a run that ended."""


@dataclass(frozen=True)
class ReadPlan:
    since: str
    """sacct's ``--starttime`` for this read."""
    full: bool


def run_key(status: JobStatus) -> str:
    """One run of one job: its id and when it started (each start of a requeued job is its own run)."""
    return f"{status.job_id}@{status.start or ''}"


def plan_read(cache: LedgerCache | None, now: float, window_days: int) -> ReadPlan:
    """The whole window (``window_days`` back) when nothing usable is kept, else what is new."""
    if cache is None or now - cache.full_at >= FULL_READ_SECONDS or cache.read_at > now:
        return ReadPlan(f"now-{window_days}days", full=True)
    return ReadPlan(f"now-{int(now - cache.read_at) + OVERLAP_SECONDS}seconds", full=False)


def merge(cache: LedgerCache | None, plan: ReadPlan, statuses: Iterable[JobStatus], now: float,
          window_days: int) -> tuple[list[JobStatus], LedgerCache]:
    """The ledger's statuses (the live ones first, as the ledger takes a job's first status for its
    current one) and the cache to keep: every run this read returned over the kept one, less the kept
    runs that ended before the window (as a read of the whole window leaves them out; their end, in
    the cluster's local time, is read in this host's: hours apart at most)."""
    runs = {} if plan.full or cache is None else {
        key: event for key, event in cache.runs.items() if not _ended_before(event, now - window_days * 86400)}
    live = []
    for status in statuses:
        if status.is_terminal:
            runs[run_key(status)] = status.to_event()
        else:
            live.append(status)
            runs.pop(run_key(status), None)
    ended = [JobStatus.from_event(event) for event in runs.values()]
    full_at = now if plan.full or cache is None else cache.full_at
    return [*live, *ended], LedgerCache(read_at=now, full_at=full_at, runs=runs)


CACHE_DIR_ENV = "VCLOUD_CACHE_DIR"
"""Where a worker host keeps what it keeps between tasks; default ``$AIRFLOW_HOME/cache``."""


def _ended_before(event: dict, moment: float) -> bool:
    try:
        return datetime.fromisoformat(str(event.get("end"))).timestamp() < moment
    except ValueError:  # no end recorded ("Unknown", None): kept
        return False


def cache_file(conn_id: str, account: str, cache_dir: str | None = None) -> Path:
    """Where this host keeps the ledger of one connection and account."""
    base = cache_dir or os.environ.get(CACHE_DIR_ENV) or \
        Path(os.environ.get("AIRFLOW_HOME") or Path.home() / "airflow") / "cache"
    digest = hashlib.sha256(f"{conn_id}\0{account}".encode()).hexdigest()[:16]
    return Path(base) / "vcloud-ledger" / f"{digest}.json"


def load(path: Path) -> LedgerCache | None:
    """The kept ledger, or None (then the whole year is read) when it is missing or unreadable."""
    try:
        data = json.loads(path.read_text())
        if data.get("version") != CACHE_VERSION:
            return None
        return LedgerCache(read_at=float(data["read_at"]), full_at=float(data["full_at"]), runs=dict(data["runs"]))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        log.warning("ledger cache %s unreadable (%s): reading the whole year", path, exc)
        return None


def save(path: Path, cache: LedgerCache) -> None:
    """Written whole to a temp file and renamed: concurrent tasks on the host each leave a whole file."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".ledger-", suffix=".tmp")
        with os.fdopen(fd, "w") as out:
            json.dump({"version": CACHE_VERSION, **asdict(cache)}, out)
        os.replace(tmp, path)
    except OSError as exc:
        log.warning("could not keep the ledger in %s (%s): the next read reads the whole year", path, exc)
