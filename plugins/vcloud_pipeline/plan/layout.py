"""The remote directory layout of a training run, computed in exactly one place.

Every task that touches the cluster (sync, submit, poll, collect) asks :func:`run_paths` where
things are, so the layout can change here without hunting through the DAG and the templates::

    <paths.code>/<hash>/                  one synced code tree (trainer/ ...) per content hash,
                                          read-only once complete: a job's scripts point at
                                          their hash's directory, so a later sync of other code
                                          cannot change what a queued or requeued job runs, and
                                          the job checks that its files still hash to <hash>
    <paths.code>/<hash>/.vcloud_manifest.json
                                          written last: the tree is complete and carries <hash>
                                          (see code/tree.py); directories no live job and no
                                          unfinished DAG run uses are removed beyond the newest
                                          paths.code_keep (code/retention.py)
    <paths.code>/.<hash>.sync-lock       held (flock) by the rsync that writes <hash>/: one writer
                                          of a code directory at a time
    <paths.code>/.runs/<run key>-<hash>   one marker per unfinished DAG run: the code it uses
                                          (written by its sync, refreshed when it submits a job,
                                          removed when the run ends)
    <paths.code>/.preflight/<hash>/<key>.json
                                          a passed preflight import check: the code, environment
                                          and job shape its key names need not be checked again
                                          for a while (plan/preflight_proof.py); removed with <hash>
    <paths.data>/                         prepared dataset, shared by all runs
    <paths.data>/../synthetic-<preset>/   clusters without the real dataset: one synthetic dataset
                                          per preset (raw/ and prepared/), so a tiny run and a
                                          small run never train on each other's data
    <paths.outputs>/<run>/stage{N}/       latest.pt, best.pt, progress.json, COMPLETE, metrics.jsonl
                                          (the names are vcloud.contract's, which the trainer writes)
    <paths.logs>/<run>/                   Slurm .out/.err of every job of the run
    <paths.logs>/<run>/.<job>.<id>.exits/ a torchrun job's exit records of its ranks (one start's:
                                          emptied before each start, removed after it)
    <paths.viewer>/<run>/                 exported viewer images; curves/stage{N}.png, the training
                                          curves the run summary points at; EXPORTED, written last,
                                          names the stage outputs exported (vcloud.contract)
    <paths.jobs>/<run>/                   rendered job scripts (read-only once uploaded)
    <paths.pylibs>/<set key>/             what the site's container lacks of one set of runtime
                                          requirements (pip --target), keyed by the pins and the
                                          image it is built for (provision/environment.py); a job's
                                          PYTHONPATH names the set it was rendered for
    <paths.pylibs>/<hash>/.vcloud_requirements
                                          the set, its image and what was installed; the directory is renamed
                                          into place with it, so it is complete when it exists;
                                          read-only from then on
    <paths.pylibs>/.vcloud-provision.lock one installer at a time (the submit lock's kind)
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import PurePosixPath

from vcloud import code_digest, contract
from vcloud.contract import STAGES

from vcloud_pipeline.profile import RUNTIME_JOB_ID, ClusterProfile
from vcloud_pipeline.provision.requirements import is_requirements_hash

MANIFEST_NAME = code_digest.MANIFEST_NAME
"""Written into the synced code directory (and left alone by ``rsync --delete``, see code/tree.py)."""

CODE_HASH = re.compile(r"^[0-9a-f]{64}$")
"""A content hash (sha256 hex, :func:`vcloud_pipeline.code.tree.code_hash`): also a code directory's name."""

REMOVING_SUFFIX = ".removing"
SYNC_LOCK_SUFFIX = ".sync-lock"

RUN_MARKERS = ".runs"
"""Directory under ``paths.code`` with one marker per unfinished DAG run (:meth:`RunPaths.run_marker`)."""

PREFLIGHT_PROOFS = ".preflight"
"""Directory under ``paths.code`` with one proof per passed preflight check (:meth:`RunPaths.preflight_proof`)."""

_RUN_KEY = re.compile(r"^[0-9a-f]{16}$")

RUN_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
"""A run name: a directory name and part of the Slurm job name (the trigger form checks the same)."""


class RunNameError(ValueError):
    """A run name that is unsafe as a directory name and a Slurm job name."""


def validate_run_name(run: str) -> str:
    """Letters, digits, ``.``, ``_`` and ``-``, at most 64, not starting with a dot or dash."""
    if not isinstance(run, str) or not RUN_NAME.match(run) or run.endswith("."):
        raise RunNameError(
            f"run name {run!r} is not allowed: use 1-64 letters, digits, '.', '_' or '-', starting "
            "with a letter or digit (it becomes a directory name and part of the Slurm job name)"
        )
    return run


def is_code_hash(value: object) -> bool:
    return isinstance(value, str) and bool(CODE_HASH.match(value))


def run_key(dag_id: str, run_id: str) -> str:
    """A DAG run's identity as a file name: 16 hex digits of its DAG id and run id (Airflow run ids
    hold ``:`` and ``+``, and one run name can have many DAG runs)."""
    return hashlib.sha1(f"{dag_id}\0{run_id}".encode()).hexdigest()[:16]


def is_run_key(value: object) -> bool:
    return isinstance(value, str) and bool(_RUN_KEY.match(value))


@dataclass(frozen=True)
class CodePaths:
    """One synced code tree: the directory of one content hash."""

    hash: str
    dir: PurePosixPath

    @property
    def manifest(self) -> PurePosixPath:
        return self.dir / MANIFEST_NAME

    @property
    def pythonpath_dir(self) -> PurePosixPath:
        """The trainer package's source root inside the synced code."""
        return self.dir / "trainer" / "src"


@dataclass(frozen=True)
class RunPaths:
    """Where everything of one run lives on the cluster."""

    run: str
    code_root: PurePosixPath
    """Holds one directory per content hash (:meth:`code`); shared by every run of the profile."""
    data_dir: PurePosixPath
    """The prepared dataset the jobs read."""
    outputs_dir: PurePosixPath
    logs_dir: PurePosixPath
    viewer_dir: PurePosixPath
    jobs_dir: PurePosixPath

    def code_being_removed(self, code_hash: str) -> PurePosixPath:
        """Where a code directory is renamed before it is deleted, so that nothing ever sees it half gone."""
        return self.code_root / f".{self.code(code_hash).hash}{REMOVING_SUFFIX}"

    @property
    def run_markers_dir(self) -> PurePosixPath:
        """Where each unfinished DAG run of the profile records the code it uses."""
        return self.code_root / RUN_MARKERS

    def run_marker(self, key: str, code_hash: str) -> PurePosixPath:
        """The marker saying that DAG run ``key`` (:func:`run_key`) uses code ``code_hash``."""
        if not is_run_key(key):
            raise ValueError(f"run key {key!r} is not 16 hex digits; make it with vcloud_pipeline.plan.layout.run_key")
        return self.run_markers_dir / f"{key}-{self.code(code_hash).hash}"

    def code_sync_lock(self, code_hash: str) -> PurePosixPath:
        """The lock a sync of ``code_hash`` holds while it writes that directory (one writer at a time)."""
        return self.code_root / f".{self.code(code_hash).hash}{SYNC_LOCK_SUFFIX}"

    def preflight_proofs(self, code_hash: str) -> PurePosixPath:
        """The proofs of the preflight checks that passed for ``code_hash``: removed with its code directory."""
        return self.code_root / PREFLIGHT_PROOFS / self.code(code_hash).hash

    def preflight_proof(self, code_hash: str, key: str) -> PurePosixPath:
        """The proof that the preflight check of ``key`` (:mod:`vcloud_pipeline.plan.preflight_proof`)
        passed for ``code_hash``."""
        if not CODE_HASH.match(key):
            raise ValueError(f"preflight key {key!r} is not a sha256 hex digest; make it with "
                             "vcloud_pipeline.plan.preflight_proof.proof_key")
        return self.preflight_proofs(code_hash) / f"{key[:16]}.json"

    def code(self, code_hash: str) -> CodePaths:
        """The code directory of ``code_hash``: what a job rendered for that hash runs."""
        if not is_code_hash(code_hash):
            raise ValueError(f"code hash {code_hash!r} is not a sha256 hex digest; compute it with "
                             "vcloud_pipeline.code.tree.code_hash over the synced tree")
        return CodePaths(hash=code_hash, dir=self.code_root / code_hash)

    @property
    def raw_data_dir(self) -> PurePosixPath:
        """Where a synthetic raw dataset is generated before it is prepared into ``data_dir``."""
        return self.data_dir.parent / "raw"

    @property
    def data_index(self) -> PurePosixPath:
        """Written last by ``vcloud.data.prepare``: the prepared dataset is complete when it exists."""
        return self.data_dir / contract.DATA_INDEX

    def stage_dir(self, stage: int) -> PurePosixPath:
        if stage not in STAGES:
            raise ValueError(f"stage {stage!r} not a training stage (known: {', '.join(map(str, STAGES))})")
        return self.outputs_dir / contract.stage_dir_name(stage)

    def progress_path(self, stage: int) -> PurePosixPath:
        return self.stage_dir(stage) / contract.PROGRESS_FILE

    def complete_path(self, stage: int) -> PurePosixPath:
        return self.stage_dir(stage) / contract.COMPLETE_FILE

    def metrics_path(self, stage: int) -> PurePosixPath:
        """The stage's ``metrics.jsonl``, appended to while it trains (the HPC view draws it)."""
        return self.stage_dir(stage) / contract.METRICS_FILE

    def latest_checkpoint(self, stage: int) -> PurePosixPath:
        return self.stage_dir(stage) / contract.LATEST_CHECKPOINT

    def best_checkpoint(self, stage: int) -> PurePosixPath:
        return self.stage_dir(stage) / contract.BEST_CHECKPOINT

    @property
    def exported_marker(self) -> PurePosixPath:
        """Written last by the export: the digest of the stage outputs it exported from."""
        return self.viewer_dir / contract.EXPORTED_FILE

    @property
    def export_metrics(self) -> PurePosixPath:
        """The export's scores (``metrics.json``), which the run's summary reports."""
        return self.viewer_dir / contract.EXPORT_METRICS_FILE

    def export_inputs(self) -> dict[str, PurePosixPath]:
        """The files the export reads, by their name relative to the output directory
        (:func:`vcloud.contract.export_input_names`, the names the export's marker digests)."""
        return {name: self.outputs_dir / name for name in contract.export_input_names()}

    def curve_png(self, stage: int) -> PurePosixPath:
        """The export's plot of a stage's training curve (from its ``metrics.jsonl``)."""
        self.stage_dir(stage)  # the same check of the stage number
        return self.viewer_dir / contract.curve_png_name(stage)

    def exit_records_dir(self, job_name: str) -> PurePosixPath:
        """Where the ranks of a torchrun job record their exit codes (``RANK_EXITS_DIR_ENV`` of
        :mod:`vcloud.contract`): per job (``{job_id}`` expands in the job), on the shared storage that
        every node of the job sees."""
        return self.logs_dir / f".{job_name}.{RUNTIME_JOB_ID}.exits"

    def job_script(self, job_name: str) -> PurePosixPath:
        """The outer script as submitted (Slurm keeps its own copy of it from the submission on)."""
        return self.jobs_dir / f"{job_name}.sbatch"

    def inner_script(self, job_name: str, sha256: str) -> PurePosixPath:
        """The inner script of a job, named by its content: a job reads it when it starts (hours after
        submission on a busy site, again after each requeue), and a later trigger of the run name with
        other code, settings or GPUs writes a script of another name instead of changing this one."""
        return self.jobs_dir / f"{job_name}.inner.{sha256[:INNER_DIGEST_CHARS]}.sh"

    def directories_to_create(self) -> tuple[PurePosixPath, ...]:
        """``mkdir -p`` these before submitting: sbatch does not create the log directory."""
        return (self.code_root, self.outputs_dir, self.logs_dir, self.viewer_dir, self.jobs_dir)


INNER_DIGEST_CHARS = 16
"""Hex digits of an inner script's sha256 in its file name; the outer script checks all of them."""

PYLIBS_MARKER = ".vcloud_requirements"
"""Inside a requirement set's directory in ``paths.pylibs``: the set's pins and what was installed."""

PROVISION_LOCK = ".vcloud-provision.lock"


@dataclass(frozen=True)
class PylibsPaths:
    """One requirement set's install directory in ``paths.pylibs``."""

    root: PurePosixPath
    hash: str
    """The set's key (:attr:`vcloud_pipeline.provision.environment.JobEnvironment.key`)."""

    @property
    def dir(self) -> PurePosixPath:
        """What a job rendered for this set puts on ``PYTHONPATH``."""
        return self.root / self.hash

    @property
    def marker(self) -> PurePosixPath:
        return self.dir / PYLIBS_MARKER

    @property
    def building(self) -> PurePosixPath:
        """Where the set is installed before it is renamed to :attr:`dir`."""
        return self.root / f".{self.hash}.building"

    @property
    def lock(self) -> PurePosixPath:
        return self.root / PROVISION_LOCK


def pylibs_set(profile: ClusterProfile, set_key: str) -> PylibsPaths | None:
    """The directory of the requirement set ``set_key`` in the profile's ``paths.pylibs``; None when
    the profile has no ``pylibs`` (its environment has every package)."""
    if not is_requirements_hash(set_key):
        raise ValueError(f"requirement set key {set_key!r} is not 16 hex digits; compute it with "
                         "vcloud_pipeline.provision.environment.JobEnvironment.key")
    if not profile.paths.pylibs:
        return None
    return PylibsPaths(root=PurePosixPath(profile.paths.pylibs), hash=set_key)


def run_paths(profile: ClusterProfile, run: str, synthetic_preset: str | None = None) -> RunPaths:
    """The layout of run ``run`` on the cluster of ``profile``.

    ``synthetic_preset`` (profiles without the real dataset): the run reads, and if need be
    generates, the synthetic dataset of that preset in a directory of its own.
    """
    validate_run_name(run)
    p = profile.paths
    data_dir = PurePosixPath(p.data)
    if synthetic_preset is not None:
        if not RUN_NAME.match(synthetic_preset):
            raise RunNameError(f"synthetic preset {synthetic_preset!r} cannot be a directory name")
        data_dir = data_dir.parent / f"synthetic-{synthetic_preset}" / "prepared"
    return RunPaths(
        run=run,
        code_root=PurePosixPath(p.code),
        data_dir=data_dir,
        outputs_dir=PurePosixPath(p.outputs) / run,
        logs_dir=PurePosixPath(p.logs) / run,
        viewer_dir=PurePosixPath(p.viewer) / run,
        jobs_dir=PurePosixPath(p.jobs) / run,
    )
