"""Which code directories on the cluster may go, and removing them after a sync.

Every content hash has a directory of its own under ``paths.code`` (:mod:`vcloud_pipeline.plan.layout`)
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
:func:`plan_retention` decides, from facts only (unit-tested); the rest is three verbs of the Slurm
hook (``dir_inventory``, ``account_jobs``, ``remove_dirs``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any

from slurm_provider import parse_state, SlurmState, SlurmVerbs
from slurm_provider.cli.files import DirInventory, build_dir_inventory, build_remove_dirs, parse_dir_inventory
from slurm_provider.cli.squeue import SqueueRow

from vcloud_pipeline.plan.layout import MANIFEST_NAME, REMOVING_SUFFIX, RUN_MARKERS, RunPaths, is_code_hash, is_run_key
from vcloud_pipeline.profile import ClusterProfile

INCOMPLETE_GRACE_S = 24 * 3600.0
"""A directory without its manifest this long after its last change is a dead transfer, not a
running one (rsync gives up after ``vcloud_pipeline.code.upload.RSYNC_TIMEOUT``)."""

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


# --------------------------------------------------------------------------- listing, removing, the runs' markers


def list_code_dirs_command(code_root: PurePosixPath | str) -> str:
    """The login node's clock, every directory under ``code_root`` with its ctime, every manifest with
    its mtime and every run marker with its mtime (the hook's ``dir_inventory``)."""
    return build_dir_inventory(code_root, MANIFEST_NAME, f"{code_root}/{RUN_MARKERS}")


@dataclass(frozen=True)
class CodeDirListing:
    dirs: list[CodeDir]
    now: float
    """The login node's clock when it listed them."""
    runs: list[RunMarker] = field(default_factory=list)
    """The markers of the DAG runs that recorded their code."""


def code_dirs_of(inventory: DirInventory) -> CodeDirListing:
    """The code directories and run markers in a listing of ``paths.code``; other entries are ignored."""
    changed: dict[str, tuple[float, bool]] = {}
    for name, when in inventory.dirs.items():
        removing = name.startswith(".") and name.endswith(REMOVING_SUFFIX)
        code = name[1:-len(REMOVING_SUFFIX)] if removing else name
        if is_code_hash(code):
            changed[code] = (when, removing)
    synced = {code: when for code, when in inventory.marked.items() if is_code_hash(code)}
    runs = []
    for name, when in inventory.records.items():
        key, _, code = name.partition("-")
        if is_run_key(key) and is_code_hash(code):
            runs.append(RunMarker(key=key, hash=code, touched_at=when))
    return CodeDirListing(
        dirs=[CodeDir(hash=h, synced_at=None if removing else synced.get(h), changed_at=when, removing=removing)
              for h, (when, removing) in sorted(changed.items())],
        now=inventory.now, runs=runs)


def parse_code_dirs(stdout: str) -> CodeDirListing:
    """The code directories in :func:`list_code_dirs_command`'s output."""
    return code_dirs_of(parse_dir_inventory(stdout))


def list_code_dirs(hook: SlurmVerbs, paths: RunPaths) -> CodeDirListing:
    return code_dirs_of(hook.dir_inventory(paths.code_root, MANIFEST_NAME, paths.run_markers_dir))


def _removals(paths: RunPaths, plan: RetentionPlan) -> dict[str, Any]:
    return {"renames": [(paths.code(code).dir, paths.code_being_removed(code)) for code in plan.remove],
            # The proofs of the preflight checks that passed for a removed code go with it.
            "leftovers": [*(paths.code_being_removed(code) for code in plan.leftovers),
                          *(paths.preflight_proofs(code) for code in plan.remove)],
            "record_files": [*(paths.run_marker(m.key, m.hash) for m in plan.expired_runs),
                             *(paths.code_sync_lock(code) for code in plan.remove)]}


def removal_command(paths: RunPaths, plan: RetentionPlan) -> str | None:
    """The command :func:`remove_code_dirs` runs (None when nothing goes)."""
    return build_remove_dirs(**_removals(paths, plan))


def remove_code_dirs(hook: SlurmVerbs, paths: RunPaths, plan: RetentionPlan) -> bool:
    """Rename each directory to go to its hidden name, then delete it; delete the expired run markers.
    False when nothing goes."""
    return hook.remove_dirs(**_removals(paths, plan), what=f"removing unused code directories in {paths.code_root}")


def remove_unused_code_dirs(profile: ClusterProfile, paths: RunPaths, hook: SlurmVerbs,
                            current: str) -> RetentionPlan:
    """Remove the code directories :func:`plan_retention` lets go; returns the plan it carried out.

    A job submitted after the queue was read belongs to a run that has just synced its code (or
    found it there, refreshing its manifest), so its directory is among the newest and stays.
    """
    listing = list_code_dirs(hook, paths)
    rows = hook.account_jobs(profile.account)
    plan = plan_retention(listing.dirs, in_use=hashes_in_use(rows), current=current,
                          keep=profile.paths.code_keep, now=listing.now, runs=listing.runs)
    remove_code_dirs(hook, paths, plan)
    return plan


def mark_run(hook: SlurmVerbs, paths: RunPaths, key: str, code_hash: str, about: str) -> None:
    """Record that DAG run ``key`` uses ``code_hash``: its marker (written whole, then renamed into
    place), replacing a marker of other code the run used before. ``about`` (the DAG run, the run
    name) is the marker's text, for people."""
    marker = paths.run_marker(key, code_hash)
    hook.replace_record(paths.run_markers_dir, marker.name, about, prefix=f"{key}-")


def touch_run(hook: SlurmVerbs, paths: RunPaths, key: str, code_hash: str) -> None:
    """Refresh (or create) DAG run ``key``'s marker for ``code_hash``: the run is alive."""
    hook.touch_record(paths.run_markers_dir, paths.run_marker(key, code_hash).name)


def release_run(hook: SlurmVerbs, paths: RunPaths, key: str) -> None:
    """Remove DAG run ``key``'s marker(s): the run has ended and submits nothing more."""
    if not is_run_key(key):
        raise ValueError(f"run key {key!r} is not 16 hex digits")
    hook.remove_records(paths.run_markers_dir, f"{key}-")
