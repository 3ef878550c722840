"""The run plan: decided once by the DAG's ``plan`` task, frozen, carried in XCom to every later step.

A :class:`RunPlan` holds the validated request, the profile as it was loaded when the run was
planned, and one :class:`PlannedJob` per label with the resources the job asks for. Every later
task and the job operator read this plan, never the profile file again: a profile edited while a
run trains changes the next run, not this one. The run's remote layout (:meth:`RunPlan.paths`) is a
pure function of the plan.

``sync_code`` renders each job's scripts once, with the real code hash, and records the SHA-256 of
each outer script next to it (:class:`SyncedCode`); the operator submits a script only if its digest
is the one recorded (:meth:`SyncedCode.script_for`), so a script changed in XCom afterwards is refused
before ``sbatch``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

import pydantic

from slurm_provider import job_name_for

from vcloud_pipeline.plan.jobspec import JobSpec, resolve_resources
from vcloud_pipeline.plan.layout import RunPaths, run_paths
from vcloud_pipeline.plan.preflight_proof import NEUTRAL_RUN, proof_key
from vcloud_pipeline.plan.request import TrainingRequest
from vcloud_pipeline.plan.labels import JobLabel
from vcloud_pipeline.profile import ClusterProfile
from vcloud_pipeline.provision.environment import JobEnvironment
from vcloud_pipeline.jobs.render import RenderedJob, render_job
from vcloud_pipeline.schema import Document
from vcloud_pipeline.plan.stages import StagePlan

_SHOWN = ("conn_id", "outputs_dir", "viewer_dir", "logs_dir")
"""Keys of a plan's XCom that are there for people (and the tests) to read; derived, not read back."""


class ScriptRefused(RuntimeError):
    """A job script is not the one rendered for the run's plan: it is not submitted."""


def script_sha256(script: str) -> str:
    return hashlib.sha256(script.encode()).hexdigest()


class PlannedJob(Document):
    """One job of the run: what it is and what it asks of Slurm."""

    label: JobLabel
    spec: JobSpec
    partition: str
    nodes: int
    gpus_per_node: int
    time_seconds: int

    @property
    def stage(self) -> int | None:
        return self.label.stage


class RunPlan(Document):
    """A validated request with its profile as loaded and its jobs (see the module's docstring)."""

    request: TrainingRequest
    profile: ClusterProfile
    jobs: dict[JobLabel, PlannedJob]
    without_work: dict[int, str] = {}
    """Selected stages decided at ``plan`` not to be submitted, with why
    (:func:`vcloud_pipeline.plan.stages.stages_without_work`); never decided again from a config
    file that may have changed since."""

    @pydantic.model_validator(mode="before")
    @classmethod
    def _drop_shown(cls, data: Any) -> Any:
        if isinstance(data, Mapping):
            return {key: value for key, value in data.items() if key not in _SHOWN}
        return data

    @classmethod
    def build(cls, request: TrainingRequest, profile: ClusterProfile,
              without_work: Mapping[int, str] | None = None) -> RunPlan:
        """Every job the run may submit, checked against the profile's partitions (a request its
        partition cannot serve fails here, before anything reaches the cluster); ``without_work``:
        the selected stages it will not submit, with why."""
        stage_plan = StagePlan.build(request, profile, without_work)
        jobs = {}
        for label, spec in stage_plan.job_specs().items():
            res = resolve_resources(profile, spec)
            jobs[label] = PlannedJob(label=label, spec=spec, partition=res.partition.name, nodes=res.nodes,
                                     gpus_per_node=res.gpus_per_node, time_seconds=res.time_seconds)
        return cls(request=request, profile=profile, jobs=jobs, without_work=dict(without_work or {}))

    @classmethod
    def from_xcom(cls, data: Mapping[str, Any]) -> RunPlan:
        return cls.model_validate(data)

    def to_xcom(self) -> dict[str, Any]:
        """The plan as JSON, with where the run's files are for a person reading the XCom."""
        paths = self.paths
        return {**self.model_dump(mode="json"), "conn_id": self.conn_id, "outputs_dir": str(paths.outputs_dir),
                "viewer_dir": str(paths.viewer_dir), "logs_dir": str(paths.logs_dir)}

    @property
    def run_name(self) -> str:
        assert self.request.run_name is not None, "a planned request has its run name"
        return self.request.run_name

    @property
    def conn_id(self) -> str:
        return self.profile.connection.conn_id

    @property
    def stage_plan(self) -> StagePlan:
        return StagePlan(request=self.request, synthetic_data=self.profile.synthetic_data,
                         without_work=self.without_work)

    @property
    def paths(self) -> RunPaths:
        return run_paths(self.profile, self.run_name, synthetic_preset=self.stage_plan.data_preset)

    def specs(self) -> dict[JobLabel, JobSpec]:
        return {label: job.spec for label, job in self.jobs.items()}

    def render(self, code_hash: str, environment: JobEnvironment | None = None,
               dag_run: tuple[str, str] | None = None) -> dict[JobLabel, RenderedJob]:
        """Both scripts of every job for code ``code_hash`` and the provisioned requirement set of
        ``environment`` (the checkout's pins and the profile's image when None), each named as the task
        of the DAG run ``dag_run`` (DAG id, run id) submits it (None: by its script stem). Pure (reads
        only the templates)."""
        paths = self.paths
        return {label: render_job(self.profile, job.spec, paths, code_hash, environment=environment,
                                  job_name=job_name_for(dag_run[0], label.task_id, dag_run[1]) if dag_run else None)
                for label, job in self.jobs.items()}

    def preflight_key(self, code_hash: str, environment: JobEnvironment) -> str | None:
        """The key of the question this run's preflight check answers (:mod:`~vcloud_pipeline.plan.preflight_proof`):
        its scripts as a neutral run would submit them for ``code_hash`` and ``environment``, and the
        image's identity. None: the run has no preflight job, or its image's identity is unknown."""
        job = self.jobs.get(JobLabel.PREFLIGHT)
        if job is None:
            return None
        neutral = render_job(self.profile, job.spec, run_paths(self.profile, NEUTRAL_RUN), code_hash,
                             environment=environment, job_name=NEUTRAL_RUN)
        return proof_key(neutral.outer, neutral.inner, environment.image_identity,
                         has_container=self.profile.container is not None)


class SyncedCode(Document):
    """What ``sync_code`` hands on: the code the run's jobs run, their outer scripts as submitted,
    and the SHA-256 of each script, recorded when it was rendered."""

    code_hash: str
    scripts: dict[JobLabel, str]
    script_sha256: dict[JobLabel, str]
    files: int = 0
    code_dir: str = ""
    manifest_path: str = ""
    code_seconds: float = 0.0
    code_sent: bool = False
    code_dirs_removed: list[str] | None = None
    requirements: list[str] = []
    """The runtime requirements (pins) the jobs were rendered for: the set the provisioning step installs."""
    job_names: dict[JobLabel, str] = {}
    """Each job's name in Slurm, as rendered into its script and submitted by its task."""
    requirements_hash: str = ""
    environment: JobEnvironment | None = None
    """The pins and the site image the jobs were rendered for: the provisioning step installs the set
    of this environment (its :attr:`JobEnvironment.key` names the directory on their ``PYTHONPATH``)."""
    preflight_key: str | None = None
    """What the run's preflight check asks (:meth:`RunPlan.preflight_key`); None: it is checked every time."""

    @classmethod
    def recording(cls, code_hash: str, scripts: Mapping[JobLabel, str], **facts: Any) -> SyncedCode:
        """The synced code with the digest of each script as it is now (when it has just been rendered)."""
        return cls(code_hash=code_hash, scripts=dict(scripts),
                   script_sha256={label: script_sha256(script) for label, script in scripts.items()}, **facts)

    def job_name(self, label: JobLabel) -> str:
        """The name ``label``'s job was rendered with, the one its task submits it with."""
        name = self.job_names.get(label)
        if name is None:
            raise ScriptRefused(f"{label}: no job name recorded with its script (rendered by an earlier version); "
                                "clear sync_code and this task to render it again")
        return name

    def script_for(self, label: JobLabel) -> str:
        """The outer script of ``label``, once its digest is the one recorded when it was rendered."""
        script = self.scripts.get(label)
        if script is None:
            raise ScriptRefused(f"{label}: no rendered script (rendered: {', '.join(sorted(self.scripts))})")
        recorded, found = self.script_sha256.get(label), script_sha256(script)
        if recorded != found:
            raise ScriptRefused(
                f"{label}: the script in XCom is not the one rendered for this run (sha256 {found}, rendered "
                f"{recorded}); it is not submitted. Clear sync_code and this task to render and submit it again")
        return script
