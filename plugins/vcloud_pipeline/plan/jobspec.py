"""What one job asks for, and the checks that catch a bad request before it reaches the queue.

A :class:`JobSpec` is cluster-neutral (a stage, a partition name, GPUs per node, a time limit);
:func:`resolve_resources` checks it against a :class:`~vcloud_pipeline.profile.ClusterProfile` and
fills in the profile's defaults. Every refusal names the limit and what to ask for instead, because
a request Slurm rejects at submit time costs a round trip, and one it rejects at ``srun`` time
costs a place in the queue.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum

from slurm_provider import parse_time_limit
from vcloud.contract import ON_CODE_CHANGE_CHOICES, STAGES

from vcloud_pipeline.plan.labels import JobLabel
from vcloud_pipeline.profile import ClusterProfile, PartitionSpec, ProfileError
_MEM = re.compile(r"^(\d+)([KMGT]?)$")


class JobSpecError(ValueError):
    """A job asks for resources its partition cannot give."""


class JobKind(str, Enum):
    """The jobs the pipeline submits; one template set renders all of them."""

    TRAIN = "train"
    EXPORT = "export"
    PREFLIGHT = "preflight"
    DATA = "data"
    """Generate a synthetic dataset and prepare it (clusters without the real one)."""


@dataclass(frozen=True)
class JobSpec:
    """One job request, independent of the cluster."""

    kind: JobKind
    partition: str | None = None
    """``None``: the profile's default partition (its debug partition for preflight jobs)."""
    stage: int | None = None
    """Training stage 0-3; only for :attr:`JobKind.TRAIN`."""
    nodes: int = 1
    gpus_per_node: int = 1
    time_limit: str | None = None
    """Slurm duration; ``None``: the partition's default (preflight/export: the profile's)."""
    cpus_per_task: int | None = None
    mem: str | None = None
    config: str = "trainer/configs/model_tiny.yaml"
    """Trainer config, relative to the synced code directory."""
    max_epochs: int | None = None
    restart: bool = False
    on_code_change: str | None = None
    """The trainer's ``train.on_code_change`` for this job (training jobs only); ``None``: the config's."""
    data_preset: str | None = None
    """Synthetic dataset preset (``tiny``, ``small``); only for :attr:`JobKind.DATA`."""

    def __post_init__(self) -> None:
        if not isinstance(self.kind, JobKind):
            object.__setattr__(self, "kind", JobKind(self.kind))
        if self.kind is JobKind.TRAIN:
            if self.stage not in STAGES:
                raise JobSpecError(f"stage {self.stage!r} not a training stage (known: 0, 1, 2, 3)")
        elif self.stage is not None:
            raise JobSpecError(f"{self.kind.value} jobs have no stage (got stage={self.stage})")
        if (self.kind is JobKind.DATA) != (self.data_preset is not None):
            raise JobSpecError("data_preset is required for data jobs and only for them "
                               f"(kind {self.kind.value}, data_preset {self.data_preset!r})")
        if self.data_preset is not None and not re.fullmatch(r"[a-z0-9_]+", self.data_preset):
            raise JobSpecError(f"data_preset {self.data_preset!r} is not a preset name (e.g. tiny, small)")
        for name in ("nodes", "gpus_per_node"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise JobSpecError(f"{name} must be a positive integer, got {value!r}")
        cpus = self.cpus_per_task
        if cpus is not None and (isinstance(cpus, bool) or not isinstance(cpus, int) or cpus < 1):
            raise JobSpecError(f"cpus_per_task must be a positive integer, got {self.cpus_per_task!r}")
        if self.on_code_change is not None and (self.kind is not JobKind.TRAIN
                                                or self.on_code_change not in ON_CODE_CHANGE_CHOICES):
            raise JobSpecError(f"on_code_change {self.on_code_change!r} is for training jobs only, one of "
                               f"{', '.join(ON_CODE_CHANGE_CHOICES)} (kind {self.kind.value})")
        if self.max_epochs is not None and (not isinstance(self.max_epochs, int) or self.max_epochs < 1):
            raise JobSpecError(f"max_epochs must be a positive integer, got {self.max_epochs!r}")
        if self.mem is not None and not _MEM.match(self.mem):
            raise JobSpecError(f"mem {self.mem!r} is not a Slurm memory size (e.g. 64G, 500M)")
        if self.config.startswith("/") or ".." in self.config.split("/") or not self.config.strip():
            raise JobSpecError(f"config {self.config!r} must be a path inside the code directory, "
                               "e.g. trainer/configs/model_full.yaml")
        if self.time_limit is not None:
            try:
                parse_time_limit(self.time_limit, "time_limit")
            except ValueError as exc:
                raise JobSpecError(str(exc)) from None

    @classmethod
    def train(cls, stage: int, **kwargs: object) -> "JobSpec":
        return cls(kind=JobKind.TRAIN, stage=stage, **kwargs)  # type: ignore[arg-type]

    @classmethod
    def export(cls, **kwargs: object) -> "JobSpec":
        return cls(kind=JobKind.EXPORT, **kwargs)  # type: ignore[arg-type]

    @classmethod
    def preflight(cls, **kwargs: object) -> "JobSpec":
        """A short import check on the debug partition, in the exact environment of the jobs."""
        return cls(kind=JobKind.PREFLIGHT, **kwargs)  # type: ignore[arg-type]

    @classmethod
    def data(cls, preset: str, **kwargs: object) -> "JobSpec":
        """A short job on the debug partition that writes the synthetic dataset ``preset``."""
        return cls(kind=JobKind.DATA, data_preset=preset, **kwargs)  # type: ignore[arg-type]

    @property
    def label(self) -> JobLabel:
        """The job's label, also its short name in job names and file names: ``stage1``, ``export``."""
        return JobLabel.of_stage(self.stage) if self.stage is not None else JobLabel(self.kind.value)


@dataclass(frozen=True)
class Resources:
    """A :class:`JobSpec` resolved against a profile: exactly what is asked of Slurm."""

    partition: PartitionSpec
    nodes: int
    gpus_per_node: int
    cpus_per_task: int
    mem: str | None
    time_seconds: int
    time_min_seconds: int | None = None
    """``--time-min`` (stage jobs of a profile with ``jobs.stage_time_min`` below their limit), else None."""


def _mem_parts(text: str) -> tuple[int, str]:
    match = _MEM.match(text)
    if match is None:
        raise JobSpecError(f"memory size {text!r} is not a Slurm size (e.g. 64G)")
    return int(match.group(1)), match.group(2)


def resolve_resources(profile: ClusterProfile, spec: JobSpec) -> Resources:
    """Check ``spec`` against the profile's partition limits and fill in the defaults."""
    if spec.partition is not None:
        name = spec.partition
    elif spec.kind in (JobKind.PREFLIGHT, JobKind.DATA):
        name = profile.debug_partition
    else:
        name = profile.default_partition
    try:
        part = profile.partition(name)
    except ProfileError as exc:
        raise JobSpecError(str(exc)) from None
    per_node = profile.accelerator.per_node
    where = f"partition {part.name} of profile {profile.name}"

    if spec.kind is not JobKind.TRAIN and (spec.nodes > 1 or spec.gpus_per_node > 1) and not part.full_node:
        raise JobSpecError(f"{spec.kind.value} jobs run one process on one {profile.accelerator.unit}; "
                           f"asked for {spec.nodes} node(s) x {spec.gpus_per_node}")
    if spec.nodes > part.max_nodes:
        raise JobSpecError(f"{where} allows at most {part.max_nodes} node(s) per job; asked for {spec.nodes}")
    gpus = spec.gpus_per_node
    if part.full_node and gpus != per_node:
        if spec.kind is JobKind.TRAIN:
            raise JobSpecError(
                f"{where} allocates whole nodes and bills all {per_node} {profile.accelerator.unit}s of "
                f"each; ask for gpus_per_node={per_node} (asked {gpus}) or use a shared partition "
                f"({', '.join(p.name for p in profile.partitions.values() if not p.full_node)})"
            )
    if gpus > part.max_gpus_per_node:
        raise JobSpecError(f"{where} allows {part.max_gpus_per_node} {profile.accelerator.unit}s per node; "
                           f"asked for {gpus}")
    if spec.nodes > 1 and gpus != per_node:
        raise JobSpecError(f"multi-node jobs use whole nodes ({per_node} {profile.accelerator.unit}s each) "
                           f"so that torchrun places {per_node} processes per node; asked for {gpus}")

    if spec.time_limit is not None:
        seconds = parse_time_limit(spec.time_limit, "time_limit")
    elif spec.kind is JobKind.PREFLIGHT:
        seconds = min(profile.jobs.preflight_time_seconds, part.max_time_seconds)
    elif spec.kind in (JobKind.EXPORT, JobKind.DATA):
        seconds = min(profile.jobs.export_time_seconds, part.max_time_seconds)
    else:
        seconds = part.default_time_seconds
    if seconds > part.max_time_seconds:
        raise JobSpecError(f"{where} allows at most {part.max_time_seconds / 3600:g} h; "
                           f"asked for {seconds / 3600:g} h ({spec.time_limit})")
    if seconds <= profile.jobs.signal_lead_seconds:
        raise JobSpecError(f"time limit {seconds} s is not longer than the pre-timeout signal lead "
                           f"({profile.jobs.signal_lead_seconds} s) of profile {profile.name}")

    cpus = spec.cpus_per_task
    if cpus is None:
        cpus = min(part.default_cpus_per_gpu * gpus, part.cpus_per_node)
    elif cpus > part.cpus_per_node:
        raise JobSpecError(
            f"{where} has {part.cpus_per_node} CPU cores per node; asked for {cpus}. Slurm would fail "
            "at launch with 'srun: error: Unable to create step for job: More processors requested "
            "than permitted' (GPU nodes have fewer cores than CPU nodes, seed 003): "
            f"ask for at most {part.cpus_per_node} cpus_per_task"
        )

    mem = spec.mem
    if mem is None and part.mem_per_gpu and not part.full_node:
        amount, unit = _mem_parts(part.mem_per_gpu)
        mem = f"{amount * gpus}{unit}"
    time_min = profile.jobs.stage_time_min if spec.kind is JobKind.TRAIN else None
    return Resources(partition=part, nodes=spec.nodes, gpus_per_node=gpus, cpus_per_task=cpus, mem=mem,
                     time_seconds=seconds,
                     time_min_seconds=time_min if time_min is not None and time_min < seconds else None)
