"""Which code directories on the cluster may go, and removing them after a sync.

Every content hash has a directory of its own under ``paths.code`` (:mod:`vcloud_pipeline.layout`)
and every job's scripts point at theirs, so directories pile up with every code change. After a
sync, a directory is removed only when all of these hold:

- no job of the account (or of the login user) that Slurm still lists references it in its job
  comment (``"code": "<hash>"``, written by the operator), unless the job ended for good: queued,
  running, requeued, held, suspended and completing jobs keep their code, and so do jobs that
  ended interrupted (time limit, node failure, preemption), since the operator may resubmit the
  same script, and ``SPECIAL_EXIT`` jobs, held in the queue for a person to release;
- no unfinished DAG run uses it: each run's sync writes a marker naming its code
  (``<paths.code>/.runs/<run key>-<hash>``), each job it submits or resubmits refreshes it, and the
  run's ``summary`` task removes it. That covers what Slurm no longer shows: a later stage not yet
  submitted, a resubmission after an interrupted job squeue has forgotten. A marker untouched for
  :data:`RUN_MARKER_EXPIRY_S` belongs to a run that vanished (its Airflow database gone) and is
  removed;
- it is not among the newest ``paths.code_keep`` complete directories (by the manifest's mtime,
  which a sync that finds its code already there refreshes), nor the one just synced;
- it is complete (has its manifest), or incomplete and untouched for :data:`INCOMPLETE_GRACE_S`
  (a transfer that died; a transfer in progress is younger).

A directory is renamed to a hidden name first and then deleted, so a job never sees half of it.
:func:`plan_retention` decides, from facts only (unit-tested); the rest is three SSH commands.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import PurePosixPath

from slurm_provider.cli.squeue import build_squeue_account_jobs
from slurm_provider.cli.squeue import SqueueRow, parse_squeue
from slurm_provider.state_vocabulary import SlurmState, parse_state

from vcloud_pipeline.layout import MANIFEST_NAME, REMOVING_SUFFIX, RUN_MARKERS, RunPaths, is_code_hash, is_run_key
from vcloud_pipeline.profile import ClusterProfile
from vcloud_pipeline.remote import CommandRunner, run_checked

INCOMPLETE_GRACE_S = 24 * 3600.0
"""A directory without its manifest this long after its last change is a dead transfer, not a
running one (rsync gives up after ``sync.RSYNC_TIMEOUT``)."""

RUN_MARKER_EXPIRY_S = 30 * 24 * 3600.0
"""A run marker untouched this long belongs to a run that vanished. A live run refreshes it with every
job it submits; between two submissions lies at most one job's wait in the queue and its time limit
(3 days on LUMI), so a month leaves a multi-week run ample margin."""


@dataclass(frozen=True)
class RunMarker:
    """``<paths.code>/.runs/<key>-<hash>``: DAG run ``key`` uses code ``hash``, last refreshed then."""

    key: str
    hash: str
    touched_at: float

    @property
    def name(self) -> str:
        return f"{self.key}-{self.hash}"


@dataclass(frozen=True)
class CodeDir:
    """One directory under ``paths.code`` as the login node sees it."""

    hash: str
    synced_at: float | None
    """mtime of its manifest (written last by the sync that completed it, refreshed by a sync that
    reused it); None while the directory is incomplete."""
    changed_at: float
    """ctime of the directory itself: the last time an entry was created or removed in it."""
    removing: bool = False
    """A directory already renamed for removal (a removal that was interrupted)."""

    @property
    def complete(self) -> bool:
        return self.synced_at is not None


@dataclass(frozen=True)
class RetentionPlan:
    """What a cleanup does with each code directory, and why."""

    remove: tuple[str, ...] = ()
    in_use: tuple[str, ...] = ()
    """Kept: a live job references them."""
    newest: tuple[str, ...] = ()
    """Kept: the current one and the newest ``keep`` complete ones."""
    incomplete: tuple[str, ...] = ()
    """Kept: no manifest yet, changed within the grace period (a transfer may be running)."""
    leftovers: tuple[str, ...] = ()
    """Renamed for removal by an earlier cleanup that did not finish: deleted now."""
    in_runs: tuple[str, ...] = ()
    """Kept: an unfinished DAG run uses them (its marker), though no job Slurm lists does."""
    expired_runs: tuple[RunMarker, ...] = ()
    """Markers of runs that vanished (untouched for :data:`RUN_MARKER_EXPIRY_S`): deleted now."""

    def lines(self) -> list[str]:
        """One line per decision, for the task log."""
        out = [f"removing unused code directory {h}" for h in self.remove]
        out += [f"keeping code directory {h}: a queued, running or requeued job uses it" for h in self.in_use]
        out += [f"keeping code directory {h}: an unfinished DAG run uses it" for h in self.in_runs]
        out += [f"finishing the removal of code directory {h}" for h in self.leftovers]
        out += [f"forgetting DAG run {m.key}, untouched for {RUN_MARKER_EXPIRY_S / 86400:.0f} days (code {m.hash})"
                for m in self.expired_runs]
        return out


# --------------------------------------------------------------------------- pure decisions


def code_hash_of_comment(comment: str | None) -> str | None:
    """The code hash in a job comment (``{"code": "<hash>", ...}``), or None.

    Any JSON object with a ``code`` field counts, not only the operator's full comment: a person
    who submits a rendered script by hand can protect its code with ``--comment='{"code":"<hash>"}'``.
    """
    if not comment or not comment.lstrip().startswith("{"):
        return None
    try:
        data = json.loads(comment)
    except ValueError:
        return None
    code = data.get("code") if isinstance(data, dict) else None
    return code if is_code_hash(code) else None


def job_keeps_its_code(state_text: str) -> bool:
    """True unless the job ended for good: waiting states, ``SPECIAL_EXIT`` (requeued and held
    for a person to release), and interrupted ends the operator may resubmit with the same script
    (an unreadable state keeps it too)."""
    state = parse_state(state_text)
    return not state.is_terminal or state.is_retryable or state is SlurmState.SPECIAL_EXIT


def hashes_in_use(rows: Iterable[SqueueRow]) -> set[str]:
    """Code hashes that jobs Slurm still lists need."""
    return {code for row in rows if job_keeps_its_code(row.state)
            and (code := code_hash_of_comment(row.comment)) is not None}


def plan_retention(dirs: Sequence[CodeDir], *, in_use: Iterable[str], current: str, keep: int, now: float,
                   incomplete_grace_s: float = INCOMPLETE_GRACE_S, runs: Sequence[RunMarker] = (),
                   run_expiry_s: float = RUN_MARKER_EXPIRY_S) -> RetentionPlan:
    """Decide which code directories (and run markers) go. Pure.

    ``current`` (the hash just synced) always stays; so do the newest ``keep`` complete ones,
    every one in ``in_use``, every one an unexpired run marker names, and incomplete ones changed
    within ``incomplete_grace_s``. Run markers older than ``run_expiry_s`` go.
    """
    if keep < 1:
        raise ValueError(f"keep must be at least 1 (got {keep})")
    used = set(in_use)
    expired = tuple(sorted((m for m in runs if now - m.touched_at >= run_expiry_s), key=lambda m: m.name))
    by_runs = {m.hash for m in runs if m not in expired}
    live = [d for d in dirs if not d.removing]
    complete = sorted((d for d in live if d.complete), key=lambda d: (d.synced_at or 0.0, d.hash), reverse=True)
    newest = {current} | {d.hash for d in complete[:keep]}
    remove, kept_in_use, kept_incomplete, kept_by_runs = [], [], [], []
    for d in sorted(live, key=lambda d: d.hash):
        if d.hash in newest:
            continue
        if d.hash in used:
            kept_in_use.append(d.hash)
        elif d.hash in by_runs:
            kept_by_runs.append(d.hash)
        elif not d.complete and now - d.changed_at < incomplete_grace_s:
            kept_incomplete.append(d.hash)
        else:
            remove.append(d.hash)
    return RetentionPlan(
        remove=tuple(remove),
        in_use=tuple(kept_in_use),
        newest=tuple(sorted(h for h in newest if any(d.hash == h for d in live))),
        incomplete=tuple(kept_incomplete),
        leftovers=tuple(sorted(d.hash for d in dirs if d.removing)),
        in_runs=tuple(kept_by_runs),
        expired_runs=expired,
    )


def newest_complete(dirs: Sequence[CodeDir], *, other_than: str) -> str | None:
    """The most recently synced complete directory besides ``other_than``: the best basis for
    sending only what changed."""
    candidates = [d for d in dirs if d.complete and not d.removing and d.hash != other_than]
    if not candidates:
        return None
    return max(candidates, key=lambda d: (d.synced_at or 0.0, d.hash)).hash


# --------------------------------------------------------------------------- commands and parsing


def list_code_dirs_command(code_root: PurePosixPath | str) -> str:
    """One shell line: the login node's clock, every directory under ``code_root`` with its ctime,
    every manifest with its mtime and every run marker with its mtime (ages are measured on the
    cluster's clock, not the worker's)."""
    root = shlex.quote(str(code_root))
    markers = shlex.quote(f"{code_root}/{RUN_MARKERS}")
    return (f"echo \"now $(date +%s)\"; [ -d {root} ] || exit 0; "
            f"find {root} -mindepth 1 -maxdepth 1 -type d -printf 'dir %C@ %f\\n'; "
            f"find {root} -mindepth 2 -maxdepth 2 -type f -name {shlex.quote(MANIFEST_NAME)} "
            f"-printf 'manifest %T@ %h\\n'; "
            f"[ -d {markers} ] || exit 0; find {markers} -mindepth 1 -maxdepth 1 -type f -printf 'run %T@ %f\\n'")


@dataclass(frozen=True)
class CodeDirListing:
    dirs: list[CodeDir]
    now: float
    """The login node's clock when it listed them."""
    runs: list[RunMarker] = field(default_factory=list)
    """The markers of the DAG runs that recorded their code."""


def parse_code_dirs(stdout: str) -> CodeDirListing:
    """The code directories in :func:`list_code_dirs_command`'s output; other entries are ignored."""
    changed: dict[str, tuple[float, bool]] = {}
    synced: dict[str, float] = {}
    runs: list[RunMarker] = []
    now: float | None = None
    for line in stdout.splitlines():
        kind, _, rest = line.partition(" ")
        stamp, _, name = rest.partition(" ")
        try:
            when = float(stamp)
        except ValueError:
            continue
        if kind == "now":
            now = when
        elif kind == "dir":
            removing = name.startswith(".") and name.endswith(REMOVING_SUFFIX)
            code = name[1:-len(REMOVING_SUFFIX)] if removing else name
            if is_code_hash(code):
                changed[code] = (when, removing)
        elif kind == "manifest":
            code = PurePosixPath(name).name
            if is_code_hash(code):
                synced[code] = when
        elif kind == "run":
            key, _, code = name.partition("-")
            if is_run_key(key) and is_code_hash(code):
                runs.append(RunMarker(key=key, hash=code, touched_at=when))
    if now is None:
        raise ValueError(f"the code directory listing lacks the login node's clock: {stdout[:200]!r}")
    return CodeDirListing(
        dirs=[CodeDir(hash=h, synced_at=None if removing else synced.get(h), changed_at=when, removing=removing)
              for h, (when, removing) in sorted(changed.items())],
        now=now, runs=runs)


def removal_command(paths: RunPaths, plan: RetentionPlan) -> str | None:
    """Rename each directory to go to its hidden name, then delete it; delete the expired run markers;
    None when nothing goes."""
    if not plan.remove and not plan.leftovers and not plan.expired_runs:
        return None
    parts = [f"rm -f -- {shlex.quote(str(paths.run_marker(m.key, m.hash)))}" for m in plan.expired_runs]
    for code in plan.remove:
        src, dst = shlex.quote(str(paths.code(code).dir)), shlex.quote(str(paths.code_being_removed(code)))
        parts.append(f"mv -T -- {src} {dst} && rm -rf -- {dst}")
    for code in plan.leftovers:
        parts.append(f"rm -rf -- {shlex.quote(str(paths.code_being_removed(code)))}")
    return "set -e; " + "; ".join(parts)


# --------------------------------------------------------------------------- I/O


def list_code_dirs(runner: CommandRunner, paths: RunPaths) -> CodeDirListing:
    return parse_code_dirs(run_checked(runner, list_code_dirs_command(paths.code_root),
                                       what=f"listing the code directories in {paths.code_root}"))


def live_jobs(runner: CommandRunner, account: str) -> list[SqueueRow]:
    """Every job Slurm lists for the account and the login user."""
    return parse_squeue(run_checked(runner, build_squeue_account_jobs(account),
                                    what=f"listing the jobs of account {account}"))


def remove_unused_code_dirs(profile: ClusterProfile, paths: RunPaths, runner: CommandRunner,
                            current: str) -> RetentionPlan:
    """Remove the code directories :func:`plan_retention` lets go; returns the plan it carried out.

    A job submitted after the queue was read belongs to a run that has just synced its code (or
    found it there, refreshing its manifest), so its directory is among the newest and stays.
    """
    listing = list_code_dirs(runner, paths)
    rows = live_jobs(runner, profile.account)
    plan = plan_retention(listing.dirs, in_use=hashes_in_use(rows), current=current,
                          keep=profile.paths.code_keep, now=listing.now, runs=listing.runs)
    command = removal_command(paths, plan)
    if command is not None:
        run_checked(runner, command, what=f"removing unused code directories in {paths.code_root}", timeout=600)
    return plan


# --------------------------------------------------------------------------- the runs' markers


def mark_run_command(paths: RunPaths, key: str, code_hash: str, about: str) -> str:
    """Record that DAG run ``key`` uses ``code_hash``: its marker (written whole, then renamed into
    place), replacing a marker of other code the run used before. ``about`` (the DAG run, the run
    name) is the marker's text, for people."""
    marker = paths.run_marker(key, code_hash)
    directory = shlex.quote(str(paths.run_markers_dir))
    temporary = shlex.quote(f"{paths.run_markers_dir}/.{marker.name}.tmp")
    others = f"{shlex.quote(str(paths.run_markers_dir))}/{key}-*"
    return (f"set -e; mkdir -p {directory}; printf '%s\\n' {shlex.quote(about)} > {temporary}; "
            f"for old in {others}; do [ \"$old\" = {shlex.quote(str(marker))} ] || rm -f -- \"$old\"; done; "
            f"mv -f -- {temporary} {shlex.quote(str(marker))}")


def touch_run_command(paths: RunPaths, key: str, code_hash: str) -> str:
    """Refresh (or create) DAG run ``key``'s marker for ``code_hash``: the run is alive."""
    return (f"mkdir -p {shlex.quote(str(paths.run_markers_dir))} && "
            f"touch -- {shlex.quote(str(paths.run_marker(key, code_hash)))}")


def release_run_command(paths: RunPaths, key: str) -> str:
    """Remove DAG run ``key``'s marker(s): the run has ended and submits nothing more."""
    if not is_run_key(key):
        raise ValueError(f"run key {key!r} is not 16 hex digits")
    return f"rm -f -- {shlex.quote(str(paths.run_markers_dir))}/{key}-*"


def mark_run(runner: CommandRunner, paths: RunPaths, key: str, code_hash: str, about: str) -> None:
    run_checked(runner, mark_run_command(paths, key, code_hash, about),
                what=f"recording that DAG run {key} uses code {code_hash}")


def touch_run(runner: CommandRunner, paths: RunPaths, key: str, code_hash: str) -> None:
    run_checked(runner, touch_run_command(paths, key, code_hash), what=f"refreshing the marker of DAG run {key}")


def release_run(runner: CommandRunner, paths: RunPaths, key: str) -> None:
    run_checked(runner, release_run_command(paths, key), what=f"removing the marker of DAG run {key}")
