"""A cluster profile as frozen pydantic models: the file's keys, types and choices, and the values a run uses.

One model per section of ``include/profiles/<name>.yaml``. The loader (:mod:`.loading`) validates
the file (after overrides) into these models, fills in ``{user}``-style variables and runs the rules
(:mod:`.rules`); what it returns is the very type a run carries in its plan. A model dumped to JSON
(``model_dump(mode="json")``) validates back into an equal one: durations are written back as Slurm
durations, ``billing.slurm_tres: none`` as ``none``.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import Annotated, Any, Literal, get_args

import pydantic
from pydantic import AfterValidator, BeforeValidator, PlainSerializer, PrivateAttr

from slurm_provider import format_time_limit
from vcloud_pipeline.schema import (
    Count,
    Document,
    Duration,
    Environment,
    Flag,
    Memory,
    Positive,
    Strings,
    Text,
    at_least,
    refuse,
)

PLACEHOLDER = "CHANGE_ME"
"""Marks a setting the user must supply (an account, a user name) before jobs can be rendered."""

OVERRIDES_ENV = "VCLOUD_PROFILE_OVERRIDES"
"""Environment variable holding a JSON object ``{profile name: {overrides}}``."""

RUNTIME_JOB_ID = "{job_id}"
"""Placeholder for the Slurm job id, expanded by the shell inside the job."""

LOGIN_VARIABLE = "{user}"

DEFAULT_CODE_KEEP = 5
"""Code versions kept on the cluster by default: a few to go back to, without filling the quota."""

MAX_HINT_CHARS = 600
"""Longest ``accelerator.missing_gpu_hint``: it is one paragraph of a failure message."""

CHARLIECLOUD_SHARED = ("/tmp",)
"""Host paths ``ch-run`` shares with every container without a bind: the node's /tmp."""

Site = Literal["lumi", "levante", "cosmos", "local", "other"]
SITES: tuple[str, ...] = get_args(Site)
AcceleratorKind = Literal["rocm", "cuda", "none"]
ACCELERATORS: tuple[str, ...] = get_args(AcceleratorKind)
GpuRequestStyle = Literal["gpus", "gres"]
GPU_REQUEST_STYLES: tuple[str, ...] = get_args(GpuRequestStyle)
ContainerRuntime = Literal["singularity", "apptainer", "charliecloud", "none"]
CONTAINER_RUNTIMES: tuple[str, ...] = get_args(ContainerRuntime)
"""``none`` runs the inner script directly in ``software.python``'s environment (a bare run)."""
SINGULARITY_RUNTIMES = ("singularity", "apptainer")
BillingKind = Literal["gpu", "node", "resources"]
BILLING_KINDS: tuple[str, ...] = get_args(BillingKind)
"""How a partition bills a job per hour: ``gpu`` (``billing.factor`` per accelerator, every one of the
node on full-node partitions), ``node`` (``per_node`` per node), ``resources`` (the largest of cores,
memory and accelerators in slices, ``rate`` per slice)."""
AllocationSource = Literal["slurm", "profile", "command"]
ALLOCATION_SOURCES: tuple[str, ...] = get_args(AllocationSource)
"""Where the budget check reads the allocation: ``slurm`` (the account's ``GrpTRESMins`` with
``sshare``), ``profile`` (``billing.allocation`` against the ledger), ``command`` (a site command)."""
SiteCommandFormat = Literal["lumi-allocations"]
SITE_COMMAND_FORMATS: tuple[str, ...] = get_args(SiteCommandFormat)
ProvisionWhere = Literal["login", "job"]
PROVISION_PLACES: tuple[str, ...] = get_args(ProvisionWhere)

MOVED_TO_CONNECTION = {
    "host": "its Host",
    "port": "its Port",
    "user": "its Login (paths using {user} follow it)",
    "transport": 'its extra "transport" ("openssh" for an ssh_config alias; key logins need none)',
    "ssh_alias": 'its extra "ssh_alias"',
    "ssh_config_file": 'its extra "ssh_config_file"',
    "control_path": "the ssh_config alias (ControlMaster, ControlPath, ControlPersist)",
}
"""Settings older profiles carried in ``connection:``, and where in the Airflow connection they live now."""


class ProfileError(ValueError):
    """A profile is missing, malformed, or asks for something the cluster is known to break on."""


def _one_line(value: str | None) -> str | None:
    return " ".join(value.split()) if value is not None else None


def _none_word(value: str) -> str | None:
    """``none`` switches a feature off where ``null`` would mean "use the default"."""
    return None if value.strip().lower() == "none" else value


SlurmDuration = Annotated[Duration, PlainSerializer(format_time_limit, return_type=str)]
"""A duration in seconds, written back as the Slurm duration it was read from."""


def _tres_or_none(value: Any) -> str | None:
    if not isinstance(value, str) or not value.strip():
        refuse(f"must be a non-empty string, got {value!r}")
    return _none_word(value)


OptionalTres = Annotated[str | None, BeforeValidator(_tres_or_none),
                         PlainSerializer(lambda value: "none" if value is None else value, return_type=str)]
"""A TRES name, or ``none`` (kept as None)."""


class ConnectionSpec(Document):
    """Which Airflow connection reaches the cluster's login node.

    Everything about *how* (host, port, login, key, pinned host key, or an ssh_config alias with a
    ControlMaster for OTP logins) is that connection's: the Slurm commands and rsync both read it there.
    """

    conn_id: Text
    queue: Text | None = None
    """The Airflow queue of every task that runs this cluster's commands, and so of their triggers
    (with ``[triggerer] queues_enabled``): the Celery queue that only the workers on the host holding
    the connection's ControlMaster socket consume (``airflow celery worker --queues``), and the
    triggerer queue of the triggerer there (``airflow triggerer --queues``). None: the default queue,
    for logins any worker can make (a key). The DAG file reads it when it is parsed, from the default
    profile; see docs/operations.md, "Several workers and triggerers"."""

    @pydantic.model_validator(mode="before")
    @classmethod
    def _refuse_moved_keys(cls, data: Any) -> Any:
        """Login settings older profiles carried: say where they live now instead of "unknown key"."""
        if isinstance(data, Mapping):
            moved = [key for key in data if key in MOVED_TO_CONNECTION]
            if moved:
                where = "; ".join(f"{key}: {MOVED_TO_CONNECTION[key]}" for key in moved)
                keys = ", ".join("connection." + key for key in moved)
                refuse(f"{keys} no longer belong in a profile: how to log in lives in the Airflow "
                       f"connection {data.get('conn_id')!r} only ({where}). Keep only connection.conn_id in "
                       "the profile", whole=True)
        return data


class AcceleratorSpec(Document):
    """The GPUs (or GCDs, APUs) of one node; the unit Slurm hands out and the cluster bills."""

    kind: AcceleratorKind
    """``rocm``, ``cuda`` or ``none`` (CPU training; the local cluster emulates GRES). A real kind
    means GPUs are required: training and the preflight import job refuse to run on the CPU."""
    model: Text
    per_node: Count
    unit: Text
    """What one billed unit is called in messages: ``GCD``, ``GPU``, ``APU``."""
    missing_gpu_hint: Annotated[Text | None, AfterValidator(_one_line)] = None
    """What to do on this cluster when PyTorch in a job sees fewer GPUs than the job was given (one
    paragraph, kept as one line; required for real accelerators). Printed by the job and shown in the
    task's failure."""

    @property
    def gpus_required(self) -> bool:
        return self.kind != "none"


class GpuRequestSpec(Document):
    """How a job asks Slurm for accelerators: ``gpus`` (``--gpus=N`` on one node,
    ``--gpus-per-node=N`` on several) or ``gres`` (``--gres=gpu:<type>:N``, per node)."""

    style: GpuRequestStyle
    gres_type: Text | None = None


_BILLING_FIELDS: dict[str, tuple[str, ...]] = {
    "gpu": (),
    "node": ("per_node",),
    "resources": ("rate", "cores_per_slice", "mem_per_slice"),
}
"""The fields each billing kind needs (``slices_per_gpu`` has a default); the others are refused."""


class PartitionBilling(Document):
    """What one hour of a job on this partition costs, as the site's billing page states it.

    ``gpu``: ``billing.factor`` per accelerator (all of each node's on ``full_node`` partitions), the
    rule of a profile that says nothing. ``node``: ``per_node`` units per node (LUMI ``standard-g``: 4
    GPU-hours per node-hour). ``resources``: ``rate x max(ceil(cores / cores_per_slice),
    ceil(memory / mem_per_slice), accelerators x slices_per_gpu)`` (LUMI ``small-g``, ``dev-g``: 0.5
    per GCD, 8 cores or 64 GB).
    """

    kind: BillingKind
    per_node: Positive | None = None
    """``node``: units per node-hour."""
    rate: Positive | None = None
    """``resources``: units per slice-hour."""
    cores_per_slice: Count | None = None
    mem_per_slice: Memory | None = None
    slices_per_gpu: Positive = 1.0
    """``resources``: slices one accelerator counts for (1: each GCD is one slice)."""

    @pydantic.model_validator(mode="after")
    def _fields_of_the_kind(self) -> PartitionBilling:
        needed = _BILLING_FIELDS[self.kind]
        missing = [name for name in needed if getattr(self, name) is None]
        others = [name for names in _BILLING_FIELDS.values() for name in names
                  if name not in needed and getattr(self, name) is not None]
        if missing:
            refuse(f"kind {self.kind} needs {', '.join(missing)} "
                   f"(kind {self.kind} reads {', '.join(needed)})")
        if others:
            refuse(f"kind {self.kind} does not read {', '.join(others)}: remove "
                   f"{'it' if len(others) == 1 else 'them'} or choose the kind that does "
                   f"(node: per_node; resources: rate, cores_per_slice, mem_per_slice)")
        return self


FLAT_BILLING = PartitionBilling(kind="gpu")
"""The rule of a partition whose profile names none: ``billing.factor`` per accelerator-hour."""


class PartitionSpec(Document):
    """One Slurm partition and the limits a job is checked against before it is submitted. Its name
    is its key in the profile's ``partitions``."""

    description: Text = ""
    max_time: SlurmDuration
    default_time: SlurmDuration | None = None
    """``None``: the partition's ``max_time``."""
    max_nodes: Count
    max_gpus_per_node: Count
    cpus_per_node: Count
    default_cpus_per_gpu: Count
    full_node: Flag = False
    """Nodes are allocated (and billed) whole: every accelerator of every node counts."""
    mem_per_gpu: Text | None = None
    debug: Flag = False
    billing: PartitionBilling = FLAT_BILLING
    """How an hour of a job here is billed; the default is ``billing.factor`` per accelerator."""
    _name: str = PrivateAttr("")

    @pydantic.model_validator(mode="after")
    def _billing_fits_the_partition(self) -> PartitionSpec:
        if self.billing.kind == "node" and not self.full_node:
            refuse("billing of kind node bills whole nodes: set full_node: true on this partition, or bill "
                   "it by kind gpu or resources")
        if self.billing.kind == "resources" and self.mem_per_gpu is None:
            refuse("billing of kind resources counts the job's memory: set mem_per_gpu (what a job asks per "
                   "accelerator) so that the worst case before submitting knows it")
        return self

    @property
    def name(self) -> str:
        return self._name

    @property
    def max_time_seconds(self) -> int:
        return self.max_time

    @property
    def default_time_seconds(self) -> int:
        return self.default_time if self.default_time is not None else self.max_time


class SiteCommand(Document):
    """A site's own command that prints the project's allocation, run on the login node, and the
    format its output is parsed in (:mod:`vcloud_pipeline.budget.site_allocation`)."""

    run: Text
    """The command line; ``{account}`` is the profile's account (``lumi-allocations --project {account}``)."""
    format: SiteCommandFormat


class BillingSpec(Document):
    """How GPU time is charged: ``factor`` billing units per accelerator-hour.

    Where the site holds the allocation in Slurm (a ``GrpTRESMins`` limit on the account), the
    budget check reads it from there; ``slurm_tres`` and ``slurm_minutes_per_unit`` say how Slurm's
    TRES-minutes map to the units here (see :mod:`vcloud_pipeline.budget.billing`, the one place
    that converts).
    """

    unit: Text
    factor: Positive
    allocation: Positive | None = None
    """Units granted to the project, used when Slurm holds no limit; ``None``: not tracked here."""
    slurm_tres: OptionalTres = "billing"
    """The TRES whose ``GrpTRESMins`` on the account is the allocation (``billing``, ``gres/gpu``);
    ``None`` (``none`` in YAML): do not read the allocation from Slurm."""
    slurm_minutes_per_unit: Positive = 60.0
    """TRES-minutes of ``slurm_tres`` that one unit costs: 60 x the TRES weight of one
    accelerator / ``factor``. 60 where ``TRESBillingWeights`` gives one accelerator the weight 1.0
    (``GRES/gpu=1.0``) and a unit is one accelerator-hour."""
    allocation_source: AllocationSource | None = None
    """Where the allocation is read: ``slurm``, ``profile`` or ``command``; not set: ``slurm`` when
    ``slurm_tres`` names a TRES, else ``profile`` (the choice before this setting existed)."""
    allocation_command: SiteCommand | None = None
    """``allocation_source: command``: the site command and the format of its output."""
    allocation_ends: datetime.date | None = None
    """The last day of the allocation's period (``2027-03-31``): the burn rate is paced against it
    (:mod:`vcloud_pipeline.budget.pacing`; Slurm holds no end date). None: the pace is not judged."""
    pace_margin_percent: Annotated[int, at_least(0)] = 20
    """How far the burn rate may stray from the rate that spends what is left by ``allocation_ends``
    before the report and the HPC view call it over- or under-spending."""
    incremental_ledger: Flag = False
    """Keep the project's runs that ended on each worker host and ask ``sacct`` only for what is new
    since the last read (:mod:`vcloud_pipeline.budget.ledger_cache`), instead of a year of accounting at
    every budget check. False: every read reads the year."""

    @pydantic.model_validator(mode="after")
    def _source_has_what_it_reads(self) -> BillingSpec:
        source = self.source
        if source == "slurm" and self.slurm_tres is None:
            refuse("billing.allocation_source slurm reads GrpTRESMins of billing.slurm_tres, which is none: "
                   "set slurm_tres (e.g. billing) or choose allocation_source profile or command", whole=True)
        if source == "command" and self.allocation_command is None:
            refuse("billing.allocation_source command needs billing.allocation_command (run: the command, "
                   f"format: one of {', '.join(SITE_COMMAND_FORMATS)})", whole=True)
        if source != "command" and self.allocation_command is not None:
            refuse(f"billing.allocation_command is read only with allocation_source command (it is {source}): "
                   "remove it or set allocation_source: command", whole=True)
        return self

    @property
    def source(self) -> AllocationSource:
        """The allocation source this profile uses (``allocation_source``, or the default it implies)."""
        if self.allocation_source is not None:
            return self.allocation_source
        return "slurm" if self.slurm_tres is not None else "profile"


class PathsSpec(Document):
    """Directories on the cluster. Run-specific paths are derived in :mod:`vcloud_pipeline.plan.layout`."""

    base: Text
    code: Text
    """Holds one directory per synced code version (content hash)."""
    data: Text
    """The prepared dataset (``train/``, ``val/``, ``test/`` and the index)."""
    outputs: Text
    logs: Text
    viewer: Text
    jobs: Text
    pylibs: Text | None = None
    """Extra Python packages installed outside the container (``pip install --target``)."""
    fast_tmp: Text | None = None
    code_keep: Count = DEFAULT_CODE_KEEP
    """Code directories kept after a sync besides those live jobs use: the newest this many."""


class ContainerSpec(Document):
    """The container image the inner script runs in, and the runtime that starts it.

    ``singularity``/``apptainer`` run a SIF image (LUMI, Cosmos); ``charliecloud`` runs a directory
    image with ``ch-run``, which replaces itself with the inner script, so signals sent to the job
    step reach it directly. A loaded profile with ``runtime: none`` has no ``container`` at all.
    """

    runtime: ContainerRuntime
    image: Text
    containlibs: Strings = ()
    """Host libraries injected via ``SINGULARITY_CONTAINLIBS`` (Singularity/Apptainer only)."""
    binds: Strings = ()
    """Host directories bound at the same path inside the container (``-B`` / ``-b``)."""
    bind_env: Strings = ()
    """Paths exported as ``SINGULARITY_BIND`` (the LUMI AI-bindings set, without ``--rocm``)."""
    rocm: Flag = False
    exec_args: Strings = ()

    @property
    def visible_paths(self) -> tuple[str, ...]:
        shared = CHARLIECLOUD_SHARED if self.runtime == "charliecloud" else ()
        return self.binds + self.bind_env + shared


class SoftwareSpec(Document):
    """The job's software environment: interpreter, modules and environment variables."""

    python: Text
    modules: Strings = ()
    env: Environment = {}
    miopen_cache_dir: Text | None = None
    """Per-job, node-local MIOpen database and kernel cache (``{job_id}`` in the path)."""

    @property
    def env_dict(self) -> dict[str, str]:
        return dict(self.env)


class StagingSpec(Document):
    """Copy inputs to node-local disk at job start and results back to shared storage."""

    node_local_dir: Text
    stage_data: Flag = True
    stage_outputs: Flag = True


class ProvisionSpec(Document):
    """Installing what the container lacks of the trainer's runtime requirements into
    ``paths.pylibs/<set key>`` (one per requirement set and image, :mod:`vcloud_pipeline.provision`),
    with the container's own ``pip``, before the run's first job.

    Where ``pip`` reaches the package index decides ``where``: ``login`` runs one command on the login
    node (LUMI's login nodes reach PyPI, its compute nodes do not); ``job`` runs the same in a short job
    on ``partition`` (sites whose compute nodes have the network and whose login nodes may not run
    containers).
    """

    where: ProvisionWhere = "login"
    runtime: Text | None = None
    """The container runtime's command where the step runs; None: ``container.runtime`` as on the
    compute nodes (a path where the login node does not have it on its PATH)."""
    binds: Strings = ()
    """Host paths bound into the container for ``pip`` only (a site's CA bundle, its pip configuration)."""
    partition: Text | None = None
    """``where: job``: the partition of the job; None: the profile's debug partition."""
    time: SlurmDuration = 900
    """``where: job``: the job's time limit."""
    hint: Annotated[Text | None, AfterValidator(_one_line)] = None
    """What to do on this site when a package cannot be installed (one paragraph), shown in the failure."""


class JobDefaults(Document):
    """Settings shared by every job script of the profile."""

    signal_lead_seconds: Annotated[int, at_least(30)]
    """``--signal=B:USR2@<lead>``: time for the trainer to reach a step boundary and checkpoint."""
    master_port: Annotated[int, at_least(1024)] = 29500
    """First torchrun rendezvous port. A job's port is ``master_port + job id % master_port_range``
    (the next free one on its first node when that is taken): nodes of shared partitions run other
    jobs' rendezvous too, this deployment's own included, and a fixed port would collide."""
    master_port_range: Annotated[int, at_least(1)] = 1000
    """How many ports from ``master_port`` on the rendezvous may use."""
    preflight_time: SlurmDuration = 600
    preflight_reuse_hours: Annotated[int, at_least(0)] = 24
    """How long a passed preflight import check answers for later runs that ask exactly the same
    (the same code, requirement set, image, software set-up, partition and resources:
    :mod:`vcloud_pipeline.plan.preflight_proof`): those skip their preflight job instead of queueing
    one. 0: every run checks."""
    export_time: SlurmDuration = 7200
    stage_time_min: SlurmDuration | None = None
    """``--time-min`` of the stage jobs: Slurm may start one with its time limit lowered as far as this
    when that lets it start sooner, above all to end before an announced maintenance reservation
    instead of waiting the window out; it checkpoints at the signal and requeues, and its next start
    resumes from ``latest.pt``. The cost: Slurm's backfill scheduler (22.05 to 25.05) starts such a job
    with exactly this limit whenever it is the one that starts it, maintenance or not, so the job
    requeues every ``stage_time_min``. None: stage jobs start only with their whole time limit."""

    release_held: Flag = False
    """Release a job of the run that is put on user hold (``JobHeldUser``), once per watch, as LUMI puts
    queued GPU jobs after a maintenance break; the task log says so. False: the task log and the HPC
    view say that the job waits for a release and how to give it."""

    bad_node_hours: Annotated[int, at_least(0)] = 0
    """How long a node where the project's jobs just failed for the node's fault (``NODE_FAIL``,
    ``BOOT_FAIL``, the container runtime not starting, the GPUs missing) is left out of the run's
    submissions (``--exclude``); such a job is resubmitted to other nodes within ``max_resubmits``.
    0: never (a job that found its node at fault then fails its task)."""
    node_fault_first_retry_seconds: Annotated[int, at_least(0)] = 60
    """How long the first resubmission after a node's fault waits in the queue before it may start
    (``--begin``), doubling with each further one (at most 30 minutes)."""

    @pydantic.model_validator(mode="after")
    def _time_min_leaves_time_to_train(self) -> JobDefaults:
        if self.stage_time_min is not None and self.stage_time_min < 2 * self.signal_lead_seconds:
            refuse(f"stage_time_min {self.stage_time_min} s leaves a stage job started with it less time to train "
                   f"than the {self.signal_lead_seconds} s before its checkpoint signal (signal_lead_seconds): "
                   f"set it to at least {2 * self.signal_lead_seconds} s, or remove it", whole=True)
        return self

    @pydantic.model_validator(mode="after")
    def _ports_exist(self) -> JobDefaults:
        last = self.master_port + self.master_port_range - 1
        if last > 65535:
            refuse(f"master_port {self.master_port} + master_port_range {self.master_port_range} reaches port "
                   f"{last}; ports end at 65535: lower either", whole=True)
        return self

    @property
    def preflight_time_seconds(self) -> int:
        return self.preflight_time

    @property
    def export_time_seconds(self) -> int:
        return self.export_time


class ClusterProfile(Document):
    """One cluster, fully described: ``include/profiles/<name>.yaml``. Build it with
    :func:`vcloud_pipeline.profile.load_profile`, which fills in ``{user}``-style values and runs
    the rules; a run's plan carries it as loaded."""

    site: Site
    description: Text = ""
    account: Text
    connection: ConnectionSpec
    accelerator: AcceleratorSpec
    gpu_request: GpuRequestSpec
    partitions: dict[str, PartitionSpec]
    default_partition: Text
    debug_partition: Text
    billing: BillingSpec
    paths: PathsSpec
    container: ContainerSpec | None = None
    software: SoftwareSpec
    staging: StagingSpec | None = None
    provision: ProvisionSpec | None = None
    """Install what the container lacks of the runtime requirements before the first job; None: the
    environment has everything (the profile has no ``paths.pylibs``, or it is kept by hand)."""
    jobs: JobDefaults
    synthetic_data: Flag = False
    """The cluster has no real dataset: the pipeline generates and prepares a synthetic one (of
    the trainer config's size) in ``paths.data`` when it is missing. Real clusters: false."""
    name: Text = "unnamed"
    """The file's name (set by the loader, not written in the file)."""
    _placeholders: tuple[str, ...] = PrivateAttr(())
    _login_fields: tuple[str, ...] = PrivateAttr(())

    @pydantic.model_validator(mode="after")
    def _name_partitions(self) -> ClusterProfile:
        for key, spec in self.partitions.items():
            spec._name = key
        return self

    @pydantic.model_validator(mode="after")
    def _provision_needs_pylibs(self) -> ClusterProfile:
        if self.provision is not None and not self.paths.pylibs:
            refuse("provision installs into paths.pylibs: set paths.pylibs (e.g. /projappl/{account}/pylibs) "
                   "or remove provision", whole=True)
        if self.provision is not None and self.provision.partition is not None:
            self.partition(self.provision.partition)
        return self

    @property
    def placeholders(self) -> tuple[str, ...]:
        """Fields still set to ``CHANGE_ME``; :meth:`require_complete` refuses to render jobs then."""
        return self._placeholders

    @property
    def login_fields(self) -> tuple[str, ...]:
        """Fields that use ``{user}`` while no login was given: load again with the connection's login."""
        return self._login_fields

    @property
    def partition_names(self) -> tuple[str, ...]:
        return tuple(self.partitions)

    def partition(self, name: str) -> PartitionSpec:
        spec = self.partitions.get(name)
        if spec is None:
            raise ProfileError(
                f"partition {name!r} not in profile {self.name} (known: {', '.join(self.partition_names)})"
            )
        return spec

    def require_complete(self) -> None:
        """Raise unless every ``CHANGE_ME`` setting has been overridden and ``{user}`` is filled in."""
        if self.placeholders:
            fields = ", ".join(self.placeholders)
            raise ProfileError(
                f"profile {self.name}: {fields} still set to {PLACEHOLDER}; set them with overrides, "
                f"e.g. load_profile({self.name!r}, overrides={{'account': ...}}) or the "
                f"{OVERRIDES_ENV} JSON {{\"{self.name}\": {{...}}}}"
            )
        if self.login_fields:
            more = len(self.login_fields) - 2
            fields = ", ".join(self.login_fields[:2]) + (f" and {more} more" if more > 0 else "")
            raise ProfileError(
                f"profile {self.name}: {fields} use {LOGIN_VARIABLE}, the login of the Airflow connection "
                f"{self.connection.conn_id!r}: load the profile with login=... (a DAG run reads it from the "
                "connection)"
            )
