"""Code sync for a run: render its job scripts, mirror the code tree, upload scripts and manifest.

One sync serves every job of a run. The manifest (content hash of exactly the files rsync sends)
is computed locally before the transfer and rendered into every job script. The code goes into
the directory of that hash (``<paths.code>/<hash>/``), which syncs of other code never write to and
syncs of the same code (two deployments, two members at the same moment) write one at a time: the
remote rsync holds the directory's lock (``.<hash>.sync-lock``). The manifest is uploaded only after
the code has arrived, so a job never sees a manifest that promises code that is not there yet, nor
another writer's temporary files next to it. Code already there is not sent again; a new hash is sent
against the newest code directory already there, so only changed files travel. Everything goes
through the caller's Slurm hook: its file verbs, and rsync over the hook's own ssh command, which logs
in exactly as the hook does (the connection's key and pinned host key, or its ssh_config alias and
ControlMaster socket for OTP logins such as LUMI's).
"""

from __future__ import annotations

import datetime as dt
import logging
import shlex
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from tenacity import RetryCallState, Retrying, retry_if_exception, stop_after_attempt, wait_incrementing

from slurm_provider import RemoteCommandError, SlurmVerbs, SSHCommand, TransportError

from vcloud_pipeline.plan.jobspec import JobSpec
from vcloud_pipeline.plan.labels import JobLabel
from vcloud_pipeline.code.retention import list_code_dirs, newest_complete
from vcloud_pipeline.plan.layout import CodePaths, RunPaths
from vcloud_pipeline.profile import ClusterProfile
from vcloud_pipeline.jobs.render import RenderedJob, render_job
from vcloud_pipeline.code.tree import (
    CodeManifest,
    CodeTree,
    build_manifest,
    code_sync_argv,
    refuse_unanchored_excludes,
    scripts_sync_argv,
)

log = logging.getLogger(__name__)

RSYNC_TIMEOUT = 1800.0


class SyncError(RuntimeError):
    """The code or the job scripts could not be transferred."""

    def __init__(self, message: str, returncode: int | None = None) -> None:
        super().__init__(message)
        self.returncode = returncode


CONCURRENT_WRITER_CODES = frozenset({23, 24})
"""rsync's "some files were not transferred" and "some source files vanished": what a sync meets when
another run (a project member's deployment, a second run triggered at the same moment) mirrors the
same code into the same hash's directory at the same time, each ``--delete`` removing the other's
temporary files. The contents are the same: a sync that runs again once the other has finished
leaves a complete mirror."""
CONCURRENT_WRITER_RETRIES = 3


def run_rsync(argv: Sequence[str], *, what: str, ssh: SSHCommand | None = None,
              timeout: float = RSYNC_TIMEOUT) -> str:
    """Run rsync; raise :class:`SyncError` with its stderr (rsync's exit codes say why).

    With ``ssh`` (the command in ``argv``'s ``-e``), a login that failed raises the transport's own
    error instead (wrong host key, lapsed ControlMaster ...), worded as the Slurm commands word it.
    """
    try:
        if ssh is not None:
            try:
                proc = ssh.run(argv, timeout=timeout)
            except TransportError as exc:
                exc.add_note(f"while {what} with rsync")
                raise
        else:
            proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired as exc:
        raise SyncError(f"{what}: rsync did not finish within {timeout:.0f} s") from exc
    except FileNotFoundError as exc:
        raise SyncError(f"{what}: rsync is not installed on the Airflow worker") from exc
    if proc.returncode != 0:
        raise SyncError(f"{what}: rsync exited {proc.returncode}: {proc.stderr.strip()[-2000:]}\n"
                        f"command: {shlex.join(argv)}", proc.returncode)
    return proc.stdout


def render_run_jobs(profile: ClusterProfile, specs: Mapping[JobLabel, JobSpec], paths: RunPaths,
                    code_hash: str) -> dict[JobLabel, RenderedJob]:
    """Every job script of the run, by label. Pure."""
    return {label: render_job(profile, spec, paths, code_hash) for label, spec in specs.items()}


def write_jobs(jobs: Mapping[JobLabel, RenderedJob], directory: Path) -> None:
    """Both scripts of every job into ``directory`` (flat, as in the run's jobs directory)."""
    directory.mkdir(parents=True, exist_ok=True)
    for job in jobs.values():
        (directory / job.outer_path.name).write_text(job.outer)
        inner = directory / job.inner_path.name
        inner.write_text(job.inner)
        inner.chmod(0o755)


@dataclass(frozen=True)
class SyncResult:
    manifest: CodeManifest
    code_seconds: float
    scripts_seconds: float
    code_sent: bool
    """False when the cluster already held exactly this code and the transfer was skipped."""


def code_is_current(hook: SlurmVerbs, code: CodePaths, manifest: CodeManifest) -> bool:
    """True when the cluster already holds exactly this code, so the transfer can be skipped.

    The manifest in the hash's directory must carry our hash, and nothing under that directory may
    have changed since it was written: an edit or a deletion on the cluster gives a file or
    directory a newer mtime, while rsync -a gives synced files their (older) source mtimes. When
    the code is current its manifest is touched: the manifest's mtime says when the code was last
    synced or reused, which keeps it among the newest for the cleanup. One command, no rsync.
    """
    found = hook.read_if_unchanged(code.manifest, code.dir, manifest.hash)
    if found is None:
        return False
    remote_manifest, unchanged = found
    try:
        same_hash = CodeManifest.from_json(remote_manifest).hash == manifest.hash
    except ValueError:
        return False
    return same_hash and unchanged


def sync_code_tree(paths: RunPaths, tree: CodeTree, manifest: CodeManifest, hook: SlurmVerbs) -> bool:
    """Mirror the code tree into its hash's directory unless the cluster already has it there;
    returns whether anything was sent.

    Unchanged files are copied on the cluster from the newest complete code directory instead of
    being sent. The manifest is uploaded only after the code has arrived (a job never sees a
    manifest that promises code that is not there yet), with an mtime newer than anything rsync wrote.
    Then the tree is made read-only for everyone, its owner included (the project directory is shared
    by the project's members: none may change the code another member's jobs run); the code root stays
    group-writable, so other hashes' directories are still added next to it. rsync's ssh is the hook's:
    it logs in exactly as the hook does.
    """
    code = paths.code(manifest.hash)
    if code_is_current(hook, code, manifest):
        return False
    refuse_unanchored_excludes(tree)
    basis = newest_complete(list_code_dirs(hook, paths).dirs, other_than=manifest.hash)
    # A directory of this hash that is there but not current was made read-only by an earlier sync of
    # ours that did not go through; one of another member's stays theirs (rsync then says so).
    hook.make_owner_writable([code.dir])
    with hook.ssh_command() as ssh:
        argv = code_sync_argv(tree, ssh.destination, code.dir, ssh.argv, basis=basis,
                              lock=paths.code_sync_lock(manifest.hash))
        def met_another_writer(exc: BaseException) -> bool:
            return isinstance(exc, SyncError) and exc.returncode in CONCURRENT_WRITER_CODES

        def said(state: RetryCallState) -> None:
            log.warning("Syncing %s to %s met another writer of the same code (%s); syncing again", tree.root,
                        code.dir, state.outcome.exception() if state.outcome else "?")

        for attempt in Retrying(stop=stop_after_attempt(CONCURRENT_WRITER_RETRIES), wait=wait_incrementing(2.0, 2.0),
                                retry=retry_if_exception(met_another_writer), before_sleep=said, reraise=True):
            with attempt:
                try:
                    run_rsync(argv, ssh=ssh, what=f"syncing {tree.root} to {code.dir}")
                except SyncError as exc:
                    if met_another_writer(exc) and code_is_current(hook, code, manifest):
                        return _frozen(hook, code)  # the other writer (another member, another deployment) finished it
                    raise
    # Another writer of the same code may have finished, and frozen, the directory while this sync
    # waited for its lock: its manifest then stands, and this sync writes none into it.
    if code_is_current(hook, code, manifest):
        return _frozen(hook, code)
    try:
        hook.write_file(code.manifest, manifest.to_json())
    except RemoteCommandError:
        if code_is_current(hook, code, manifest):
            return _frozen(hook, code)
        raise
    hook.make_read_only([code.dir])
    return True


def _frozen(hook: SlurmVerbs, code: CodePaths) -> bool:
    """A directory another writer finished: what this sync's rsync created in it meanwhile (its
    directories, say) is made read-only like the rest. True: this sync sent the code too."""
    hook.make_read_only([code.dir])
    return True


def sync_run(paths: RunPaths, tree: CodeTree, jobs: Mapping[JobLabel, RenderedJob], manifest: CodeManifest,
             hook: SlurmVerbs, staging_dir: Path) -> SyncResult:
    """Create the run's directories, mirror the code (unless already current), upload the scripts."""
    refuse_unanchored_excludes(tree)
    hook.make_dirs(list(paths.directories_to_create()), what="creating the run's directories")

    started = time.monotonic()
    sent = sync_code_tree(paths, tree, manifest, hook)
    code_seconds = time.monotonic() - started

    write_jobs(jobs, staging_dir)
    started = time.monotonic()
    with hook.ssh_command() as ssh:
        run_rsync(scripts_sync_argv(staging_dir, ssh.destination, paths.jobs_dir, ssh.argv), ssh=ssh,
                  what=f"uploading the job scripts to {paths.jobs_dir}")
    scripts_seconds = time.monotonic() - started
    return SyncResult(manifest=manifest, code_seconds=code_seconds, scripts_seconds=scripts_seconds, code_sent=sent)


def local_manifest(tree: CodeTree, now: dt.datetime | None = None) -> CodeManifest:
    refuse_unanchored_excludes(tree)
    return build_manifest(tree, now or dt.datetime.now(dt.timezone.utc))
