"""Cluster profiles: everything cluster-specific, as typed and validated data.

A profile (``include/profiles/<name>.yaml``) names the Airflow connection that reaches a cluster and
says which partitions and accelerators it has, how it bills, where the run's files live, and which
software environment a job runs in. How to log in (host, port, user, key, pinned host key, ssh_config
alias) lives in the Airflow connection only, the one place every SSH command and rsync read it from.
The DAG and the renderers only ever see a :class:`ClusterProfile`, so no cluster name appears in
pipeline code.

Loading is strict because a wrong profile costs queue time and GPU-hours, not seconds: the file is
read into :class:`ProfileDocument` (pydantic, :mod:`vcloud_pipeline.schema`), so unknown keys are
rejected with the list of known ones, every choice names its allowed values, and the lessons of
the user's field notes (``/work/shared/seeds``) are rules here, e.g. LUMI profiles that ask for
``singularity --rocm`` or ``module load`` are refused with the reason.

Values may use ``{user}`` and ``{account}`` (and ``{base}`` in paths); they are filled in at load
time, so an override of ``account`` moves every path with it. ``{user}`` is the login of the
profile's Airflow connection: pass it as ``load_profile(..., login=...)`` (a run reads it from the
connection); without it such values keep ``{user}`` and :meth:`ClusterProfile.require_complete`
refuses. ``{job_id}`` is allowed only where a value exists per job (node-local staging, the MIOpen
cache) and becomes ``${SLURM_JOB_ID}`` in the job script. Shell variables (``$USER``) are refused:
every value is shell-quoted when rendered.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, Literal, get_args

import pydantic
import yaml

from vcloud_pipeline.schema import (
    Document,
    Duration,
    Environment,
    Flag,
    Positive,
    Strings,
    Text,
    count,
    problems,
    refuse,
)
from vcloud_pipeline.site_facts import SiteFactsError, site_facts_for

PROFILES_DIR = Path(__file__).resolve().parents[2] / "include" / "profiles"
"""Where ``load_profile`` looks for ``<name>.yaml`` unless told otherwise."""

DEFAULT_PROFILE = "local"
"""The embedded default: the local Slurm cluster (namespaced nodes on one machine) that stands in for LUMI."""

OVERRIDES_ENV = "VCLOUD_PROFILE_OVERRIDES"
"""Environment variable holding a JSON object ``{profile name: {overrides}}``."""

PLACEHOLDER = "CHANGE_ME"
"""Marks a setting the user must supply (an account, a user name) before jobs can be rendered."""

RUNTIME_JOB_ID = "{job_id}"
"""Placeholder for the Slurm job id, expanded by the shell inside the job."""

NODE_LOCAL_ROOTS = ("/tmp", "/dev/shm", "/var/tmp")
"""Directories that are private to each compute node (plus a profile's staging directory)."""

Site = Literal["lumi", "levante", "cosmos", "local", "other"]
SITES: tuple[str, ...] = get_args(Site)
LOGIN_VARIABLE = "{user}"
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
AcceleratorKind = Literal["rocm", "cuda", "none"]
ACCELERATORS: tuple[str, ...] = get_args(AcceleratorKind)
GpuRequestStyle = Literal["gpus", "gres"]
GPU_REQUEST_STYLES: tuple[str, ...] = get_args(GpuRequestStyle)
ContainerRuntime = Literal["singularity", "apptainer", "charliecloud", "none"]
CONTAINER_RUNTIMES: tuple[str, ...] = get_args(ContainerRuntime)
"""``none`` runs the inner script directly in ``software.python``'s environment (a bare run)."""
SINGULARITY_RUNTIMES = ("singularity", "apptainer")
CHARLIECLOUD_SHARED = ("/tmp",)
"""Host paths ``ch-run`` shares with every container without a bind: the node's /tmp."""

MAX_HINT_CHARS = 600
"""Longest ``accelerator.missing_gpu_hint``: it is one paragraph of a failure message."""

_TRES_NAME = re.compile(r"^[a-z]+(?:/[A-Za-z0-9_.:-]+)?$")
"""A Slurm TRES name as sshare prints it: ``billing``, ``cpu``, ``gres/gpu``, ``gres/gpu:mi250``."""

_PATH_FORBIDDEN = {
    "%": "sbatch expands % in --output paths",
    "\\": "sbatch and the shell treat backslashes as escapes",
    "$": "use {user}, {account} or {job_id} instead of shell variables",
    "`": "backquotes would be command substitution in a shell",
    ":": "':' separates entries of PYTHONPATH and bind specifications",
    ",": "',' separates entries of SINGULARITY_BIND and SINGULARITY_CONTAINLIBS",
}
_TEMPLATE_VAR = re.compile(r"\{([^{}]*)\}")
_MODULE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+/-]*$")
_PROFILE_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]*$")
_MEM_SIZE = re.compile(r"^\d+[KMGT]?$")


DEFAULT_CODE_KEEP = 5
"""Code versions kept on the cluster by default: a few to go back to, without filling the quota."""


class ProfileError(ValueError):
    """A profile is missing, malformed, or asks for something the cluster is known to break on."""


# --------------------------------------------------------------------------- the profile types


@dataclass(frozen=True)
class ConnectionSpec:
    """Which Airflow connection reaches the cluster's login node.

    Everything about *how* (host, port, login, key, pinned host key, or an ssh_config alias with a
    ControlMaster for OTP logins) is that connection's: the Slurm commands and rsync both read it there.
    """

    conn_id: str


@dataclass(frozen=True)
class AcceleratorSpec:
    """The GPUs (or GCDs, APUs) of one node; the unit Slurm hands out and the cluster bills."""

    kind: str
    """``rocm``, ``cuda`` or ``none`` (CPU training; the local cluster emulates GRES). A real kind
    means GPUs are required: training and the preflight import job refuse to run on the CPU."""
    model: str
    per_node: int
    unit: str
    """What one billed unit is called in messages: ``GCD``, ``GPU``, ``APU``."""
    missing_gpu_hint: str | None = None
    """What to do on this cluster when PyTorch in a job sees fewer GPUs than the job was given (one
    paragraph; required for real accelerators). Printed by the job and shown in the task's failure."""

    @property
    def gpus_required(self) -> bool:
        return self.kind != "none"


@dataclass(frozen=True)
class GpuRequestSpec:
    """How a job asks Slurm for accelerators."""

    style: str
    """``gpus`` (``--gpus=N`` on one node, ``--gpus-per-node=N`` on several) or ``gres``
    (``--gres=gpu:<type>:N``, per node)."""
    gres_type: str | None = None


@dataclass(frozen=True)
class PartitionSpec:
    """One Slurm partition and the limits a job is checked against before it is submitted."""

    name: str
    description: str
    max_time_seconds: int
    default_time_seconds: int
    max_nodes: int
    max_gpus_per_node: int
    cpus_per_node: int
    default_cpus_per_gpu: int
    full_node: bool = False
    """Nodes are allocated (and billed) whole: every accelerator of every node counts."""
    mem_per_gpu: str | None = None
    debug: bool = False


@dataclass(frozen=True)
class BillingSpec:
    """How GPU time is charged: ``factor`` billing units per accelerator-hour.

    Where the site holds the allocation in Slurm (a ``GrpTRESMins`` limit on the account), the
    budget check reads it from there; ``slurm_tres`` and ``slurm_minutes_per_unit`` say how Slurm's
    TRES-minutes map to the units here (see :mod:`vcloud_pipeline.budget`, the one place that
    converts).
    """

    unit: str
    factor: float
    allocation: float | None
    """Units granted to the project, used when Slurm holds no limit; ``None``: not tracked here."""
    slurm_tres: str | None = "billing"
    """The TRES whose ``GrpTRESMins`` on the account is the allocation (``billing``, ``gres/gpu``);
    ``None`` (``none`` in YAML): do not read the allocation from Slurm."""
    slurm_minutes_per_unit: float = 60.0
    """TRES-minutes of ``slurm_tres`` that one unit costs: 60 x the TRES weight of one
    accelerator / ``factor``. 60 where ``TRESBillingWeights`` gives one accelerator the weight 1.0
    (``GRES/gpu=1.0``) and a unit is one accelerator-hour."""


@dataclass(frozen=True)
class PathsSpec:
    """Directories on the cluster. Run-specific paths are derived in :mod:`vcloud_pipeline.layout`."""

    base: str
    code: str
    """Holds one directory per synced code version (content hash)."""
    data: str
    """The prepared dataset (``train/``, ``val/``, ``test/`` and the index)."""
    outputs: str
    logs: str
    viewer: str
    jobs: str
    pylibs: str | None = None
    """Extra Python packages installed outside the container (``pip install --target``)."""
    fast_tmp: str | None = None
    code_keep: int = DEFAULT_CODE_KEEP
    """Code directories kept after a sync besides those live jobs use: the newest this many."""


@dataclass(frozen=True)
class ContainerSpec:
    """The container image the inner script runs in, and the runtime that starts it.

    ``singularity``/``apptainer`` run a SIF image (LUMI, Cosmos); ``charliecloud`` runs a directory
    image with ``ch-run``, which replaces itself with the inner script, so signals sent to the job
    step reach it directly. A profile with ``runtime: none`` has no ``ContainerSpec`` at all.
    """

    runtime: str
    image: str
    containlibs: tuple[str, ...] = ()
    """Host libraries injected via ``SINGULARITY_CONTAINLIBS`` (Singularity/Apptainer only)."""
    binds: tuple[str, ...] = ()
    """Host directories bound at the same path inside the container (``-B`` / ``-b``)."""
    bind_env: tuple[str, ...] = ()
    """Paths exported as ``SINGULARITY_BIND`` (the LUMI AI-bindings set, without ``--rocm``)."""
    rocm: bool = False
    exec_args: tuple[str, ...] = ()

    @property
    def visible_paths(self) -> tuple[str, ...]:
        shared = CHARLIECLOUD_SHARED if self.runtime == "charliecloud" else ()
        return self.binds + self.bind_env + shared


@dataclass(frozen=True)
class SoftwareSpec:
    """The job's software environment: interpreter, modules and environment variables."""

    python: str
    modules: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    miopen_cache_dir: str | None = None
    """Per-job, node-local MIOpen database and kernel cache (``{job_id}`` in the path)."""

    @property
    def env_dict(self) -> dict[str, str]:
        return dict(self.env)


@dataclass(frozen=True)
class StagingSpec:
    """Copy inputs to node-local disk at job start and results back to shared storage."""

    node_local_dir: str
    stage_data: bool = True
    stage_outputs: bool = True


@dataclass(frozen=True)
class JobDefaults:
    """Settings shared by every job script of the profile."""

    signal_lead_seconds: int
    """``--signal=B:USR2@<lead>``: time for the trainer to reach a step boundary and checkpoint."""
    master_port: int = 29500
    preflight_time_seconds: int = 600
    export_time_seconds: int = 7200


@dataclass(frozen=True)
class ClusterProfile:
    """One cluster, fully described. Build it with :func:`load_profile`."""

    name: str
    site: str
    description: str
    connection: ConnectionSpec
    account: str
    accelerator: AcceleratorSpec
    gpu_request: GpuRequestSpec
    partitions: tuple[PartitionSpec, ...]
    default_partition: str
    debug_partition: str
    billing: BillingSpec
    paths: PathsSpec
    software: SoftwareSpec
    jobs: JobDefaults
    container: ContainerSpec | None = None
    staging: StagingSpec | None = None
    synthetic_data: bool = False
    """The cluster has no real dataset: the pipeline generates and prepares a synthetic one (of
    the trainer config's size) in ``paths.data`` when it is missing. Real clusters: false."""
    placeholders: tuple[str, ...] = field(default=(), compare=False)
    """Fields still set to ``CHANGE_ME``; :meth:`require_complete` refuses to render jobs then."""
    login_fields: tuple[str, ...] = field(default=(), compare=False)
    """Fields that use ``{user}`` while no login was given: load again with the connection's login."""

    @property
    def partition_names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.partitions)

    def partition(self, name: str) -> PartitionSpec:
        for spec in self.partitions:
            if spec.name == name:
                return spec
        raise ProfileError(
            f"partition {name!r} not in profile {self.name} (known: {', '.join(self.partition_names)})"
        )

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


# --------------------------------------------------------------------------- loading


def available_profiles(profiles_dir: Path | None = None) -> tuple[str, ...]:
    directory = profiles_dir or PROFILES_DIR
    return tuple(sorted(p.stem for p in directory.glob("*.yaml")))


def load_profile(
    name: str = DEFAULT_PROFILE,
    overrides: Mapping[str, Any] | None = None,
    *,
    profiles_dir: Path | None = None,
    login: str | None = None,
) -> ClusterProfile:
    """Read ``<profiles_dir>/<name>.yaml``, apply ``overrides`` and validate the result.

    ``overrides`` is a nested dict merged into the YAML (mappings merge, everything else replaces);
    dotted keys are accepted too: ``{"paths.base": "/scratch/other"}``. The DAG passes the entry of
    an Airflow Variable or of :data:`OVERRIDES_ENV` for this profile (see :func:`overrides_for`).
    ``login``: the user the connection logs in as, for values that use ``{user}``.
    """
    directory = profiles_dir or PROFILES_DIR
    if not isinstance(name, str) or not _PROFILE_NAME.match(name):
        raise ProfileError(f"profile name {name!r} is not allowed: "
                           "use lowercase letters, digits, '-' and '_'")
    path = directory / f"{name}.yaml"
    if not path.is_file():
        known = ", ".join(available_profiles(directory)) or "none"
        raise ProfileError(f"no cluster profile {name!r} in {directory} (known: {known})")
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ProfileError(f"profile {name}: {path} is not valid YAML: {exc}") from exc
    if not isinstance(raw, dict):
        raise ProfileError(f"profile {name}: {path} must hold a mapping at the top level")
    if overrides:
        raw = merge_overrides(raw, overrides)
    return profile_from_dict(name, raw, login=login)


def overrides_for(name: str, source: Mapping[str, Any] | str | None) -> dict[str, Any]:
    """The overrides for profile ``name`` out of ``{profile: overrides}`` (a dict or its JSON).

    Source of the mapping is the caller's choice: an Airflow Variable, or ``os.environ`` under
    :data:`OVERRIDES_ENV` via :func:`overrides_from_environ`.
    """
    if source is None or source == "":
        return {}
    if isinstance(source, str):
        try:
            source = json.loads(source)
        except json.JSONDecodeError as exc:
            raise ProfileError(f"profile overrides are not valid JSON ({exc}); expected "
                               f'{{"{name}": {{"account": "..."}}}}') from exc
    if not isinstance(source, Mapping):
        raise ProfileError(f"profile overrides must be a mapping of profile name to overrides, "
                           f"got {type(source).__name__}")
    selected = source.get(name, {})
    if not isinstance(selected, Mapping):
        raise ProfileError(f"profile overrides for {name!r} must be a mapping, got {type(selected).__name__}")
    return dict(selected)


def overrides_from_environ(name: str, environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The site facts of the file :data:`vcloud_pipeline.site_facts.SITE_FACTS_ENV` names (a real
    site's profile run elsewhere), then the deployment's :data:`OVERRIDES_ENV` on top."""
    env = os.environ if environ is None else environ
    try:
        facts = site_facts_for(name, env)
    except SiteFactsError as exc:
        raise ProfileError(str(exc)) from exc
    return {**facts, **overrides_for(name, env.get(OVERRIDES_ENV))}


def merge_overrides(base: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """Deep-merge ``overrides`` into a copy of ``base``; dotted keys address nested mappings."""
    merged = copy.deepcopy(dict(base))
    for key, value in overrides.items():
        parts = str(key).split(".")
        target = merged
        for part in parts[:-1]:
            child = target.get(part)
            if not isinstance(child, dict):
                child = {}
                target[part] = child
            target = child
        leaf = parts[-1]
        if isinstance(value, Mapping) and isinstance(target.get(leaf), dict):
            target[leaf] = merge_overrides(target[leaf], value)
        else:
            target[leaf] = copy.deepcopy(value)
    return merged


# --------------------------------------------------------------------------- the profile file


class _ConnectionDoc(Document):
    conn_id: Text

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


class _AcceleratorDoc(Document):
    kind: AcceleratorKind
    model: Text
    per_node: count()
    unit: Text
    missing_gpu_hint: Text | None = None


class _GpuRequestDoc(Document):
    style: GpuRequestStyle
    gres_type: Text | None = None


class _PartitionDoc(Document):
    description: Text = ""
    max_time: Duration
    default_time: Duration | None = None
    max_nodes: count()
    max_gpus_per_node: count()
    cpus_per_node: count()
    default_cpus_per_gpu: count()
    full_node: Flag = False
    mem_per_gpu: Text | None = None
    debug: Flag = False


class _BillingDoc(Document):
    unit: Text
    factor: Positive
    allocation: Positive | None = None
    slurm_tres: Text = "billing"
    slurm_minutes_per_unit: Positive = 60.0


class _PathsDoc(Document):
    base: Text
    code: Text
    data: Text
    outputs: Text
    logs: Text
    viewer: Text
    jobs: Text
    pylibs: Text | None = None
    fast_tmp: Text | None = None
    code_keep: count() = DEFAULT_CODE_KEEP


class _ContainerDoc(Document):
    runtime: ContainerRuntime
    image: Text
    containlibs: Strings = ()
    binds: Strings = ()
    bind_env: Strings = ()
    rocm: Flag = False
    exec_args: Strings = ()


class _SoftwareDoc(Document):
    python: Text
    modules: Strings = ()
    env: Environment = {}
    miopen_cache_dir: Text | None = None


class _StagingDoc(Document):
    node_local_dir: Text
    stage_data: Flag = True
    stage_outputs: Flag = True


class _JobsDoc(Document):
    signal_lead_seconds: count(30)
    master_port: count(1024) = 29500
    preflight_time: Duration = 600
    export_time: Duration = 7200


class ProfileDocument(Document):
    """``include/profiles/<name>.yaml`` as written (after overrides), before ``{user}``-style values are
    filled in and the rules run: the keys, their types and their allowed values."""

    site: Site
    description: Text = ""
    account: Text
    connection: _ConnectionDoc
    accelerator: _AcceleratorDoc
    gpu_request: _GpuRequestDoc
    partitions: dict[str, _PartitionDoc]
    default_partition: Text
    debug_partition: Text
    billing: _BillingDoc
    paths: _PathsDoc
    container: _ContainerDoc | None = None
    software: _SoftwareDoc
    staging: _StagingDoc | None = None
    jobs: _JobsDoc
    synthetic_data: Flag = False


def _placeholder_fields(doc: pydantic.BaseModel, where: str = "") -> list[str]:
    """Dotted names of the text fields still set to :data:`PLACEHOLDER`."""
    found: list[str] = []
    for name in type(doc).model_fields:
        value, dotted_name = getattr(doc, name), f"{where}{name}"
        if isinstance(value, str) and PLACEHOLDER in value:
            found.append(dotted_name)
        elif isinstance(value, pydantic.BaseModel):
            found += _placeholder_fields(value, f"{dotted_name}.")
        elif isinstance(value, dict):
            for key, item in value.items():
                if isinstance(item, pydantic.BaseModel):
                    found += _placeholder_fields(item, f"{dotted_name}.{key}.")
    return found


def read_document(name: str, raw: Any) -> ProfileDocument:
    """Validate the keys, types and choices of a profile mapping; every problem in one message."""
    if not isinstance(raw, Mapping):
        raise ProfileError(f"profile {name}: the top level must be a mapping, got {type(raw).__name__}")
    try:
        return ProfileDocument.model_validate(raw)
    except pydantic.ValidationError as exc:
        raise ProfileError("; ".join(f"profile {name}: {problem}"
                                     for problem in problems(exc, ProfileDocument))) from None


def _none_word(value: str) -> str | None:
    """``none`` switches a feature off where ``null`` would mean "use the default"."""
    return None if value.strip().lower() == "none" else value


def _expand(profile: str, field_name: str, value: str, variables: Mapping[str, str], *,
            runtime_ok: bool = False) -> str:
    """Fill ``{user}``-style variables; keep ``{job_id}`` where it is allowed."""
    if "$" in value:
        raise ProfileError(
            f"profile {profile}: {field_name} {value!r} uses a shell variable; write {{user}}, "
            f"{{account}} or {{job_id}} instead (values are shell-quoted in job scripts)"
        )

    def substitute(match: re.Match[str]) -> str:
        var = match.group(1)
        if var in variables:
            return variables[var]
        if var == "job_id" and runtime_ok:
            return RUNTIME_JOB_ID
        known = sorted(variables) + (["job_id"] if runtime_ok else [])
        raise ProfileError(f"profile {profile}: {field_name} uses {{{var}}} (known here: "
                           f"{', '.join('{' + k + '}' for k in known)})")

    return _TEMPLATE_VAR.sub(substitute, value)


def _check_path(profile: str, field_name: str, value: str) -> str:
    if not value.startswith("/"):
        raise ProfileError(f"profile {profile}: {field_name} {value!r} must be an absolute path")
    for char in value:
        if ord(char) < 32 or ord(char) == 127:
            raise ProfileError(f"profile {profile}: {field_name} {value!r} contains a control character")
        if char in _PATH_FORBIDDEN:
            raise ProfileError(f"profile {profile}: {field_name} {value!r} contains {char!r}: "
                               f"{_PATH_FORBIDDEN[char]}")
    return str(PurePosixPath(value))


def profile_from_dict(name: str, raw: Mapping[str, Any], *, login: str | None = None) -> ClusterProfile:
    """Validate a profile mapping (already merged with overrides) into a :class:`ClusterProfile`."""
    doc = read_document(name, raw)
    placeholders = _placeholder_fields(doc)
    if login is not None and (not isinstance(login, str) or not login.strip() or "/" in login):
        raise ProfileError(f"profile {name}: login {login!r} is not a user name")
    variables = {"user": login if login is not None else LOGIN_VARIABLE, "account": doc.account}

    acc = doc.accelerator
    accelerator = AcceleratorSpec(
        kind=acc.kind, model=acc.model, per_node=acc.per_node, unit=acc.unit,
        # one line in a log
        missing_gpu_hint=" ".join(acc.missing_gpu_hint.split()) if acc.missing_gpu_hint is not None else None,
    )
    if accelerator.gpus_required and accelerator.missing_gpu_hint is None:
        raise ProfileError(
            f"profile {name}: accelerator.missing_gpu_hint is required when accelerator.kind is "
            f"{accelerator.kind!r}: say what makes PyTorch see the GPUs in a job on this cluster (the "
            "container bindings, the modules, the partition); jobs that see fewer GPUs than they were "
            "given stop and show it"
        )
    if accelerator.missing_gpu_hint is not None and len(accelerator.missing_gpu_hint) > MAX_HINT_CHARS:
        raise ProfileError(f"profile {name}: accelerator.missing_gpu_hint is longer than {MAX_HINT_CHARS} "
                           "characters; it is read in a failure message, keep it to the fix")

    gpu_request = GpuRequestSpec(style=doc.gpu_request.style, gres_type=doc.gpu_request.gres_type)
    if gpu_request.style == "gres" and not gpu_request.gres_type:
        raise ProfileError(f"profile {name}: gpu_request.gres_type is required with style 'gres' "
                           f"(e.g. a100_80 for --gres=gpu:a100_80:N)")

    partitions = []
    for pname, p in doc.partitions.items():
        spec = PartitionSpec(
            name=pname, description=p.description, max_time_seconds=p.max_time,
            default_time_seconds=p.default_time if p.default_time is not None else p.max_time,
            max_nodes=p.max_nodes, max_gpus_per_node=p.max_gpus_per_node, cpus_per_node=p.cpus_per_node,
            default_cpus_per_gpu=p.default_cpus_per_gpu, full_node=p.full_node, mem_per_gpu=p.mem_per_gpu,
            debug=p.debug,
        )
        if spec.mem_per_gpu is not None and not _MEM_SIZE.match(spec.mem_per_gpu):
            raise ProfileError(f"profile {name}: partitions.{pname}.mem_per_gpu {spec.mem_per_gpu!r} is not "
                               "a Slurm memory size (e.g. 64G)")
        if spec.default_time_seconds > spec.max_time_seconds:
            raise ProfileError(f"profile {name}: partitions.{pname}.default_time is longer than its max_time")
        if spec.max_gpus_per_node > accelerator.per_node:
            raise ProfileError(f"profile {name}: partitions.{pname}.max_gpus_per_node "
                               f"{spec.max_gpus_per_node} exceeds accelerator.per_node "
                               f"{accelerator.per_node}")
        partitions.append(spec)
    if not partitions:
        raise ProfileError(f"profile {name}: partitions must name at least one partition")
    names = [p.name for p in partitions]
    for key in ("default_partition", "debug_partition"):
        if getattr(doc, key) not in names:
            raise ProfileError(f"profile {name}: {key} {getattr(doc, key)!r} not allowed "
                               f"(allowed: {', '.join(names)})")

    bill = doc.billing
    billing = BillingSpec(unit=bill.unit, factor=bill.factor, allocation=bill.allocation,
                          slurm_tres=_none_word(bill.slurm_tres),
                          slurm_minutes_per_unit=bill.slurm_minutes_per_unit)
    if billing.slurm_tres is not None and not _TRES_NAME.match(billing.slurm_tres):
        raise ProfileError(f"profile {name}: billing.slurm_tres {billing.slurm_tres!r} is not a TRES name "
                           "(e.g. billing, gres/gpu)")

    def path(key: str, value: str | None, extra: Mapping[str, str]) -> str | None:
        if value is None:
            return None
        return _check_path(name, f"paths.{key}", _expand(name, f"paths.{key}", value, {**variables, **extra}))

    ps = doc.paths
    base = path("base", ps.base, {})
    assert base is not None
    with_base = {"base": base}
    paths = PathsSpec(
        base=base,
        code=path("code", ps.code, with_base),  # type: ignore[arg-type]
        data=path("data", ps.data, with_base),  # type: ignore[arg-type]
        outputs=path("outputs", ps.outputs, with_base),  # type: ignore[arg-type]
        logs=path("logs", ps.logs, with_base),  # type: ignore[arg-type]
        viewer=path("viewer", ps.viewer, with_base),  # type: ignore[arg-type]
        jobs=path("jobs", ps.jobs, with_base),  # type: ignore[arg-type]
        pylibs=path("pylibs", ps.pylibs, with_base),
        fast_tmp=path("fast_tmp", ps.fast_tmp, with_base),
        code_keep=ps.code_keep,
    )
    path_vars = {**variables, "base": base}

    container = None
    cs = doc.container
    if cs is not None:
        def cpaths(key: str, values: tuple[str, ...]) -> tuple[str, ...]:
            field_name = f"container.{key}"
            return tuple(_check_path(name, f"{field_name}[{i}]", _expand(name, field_name, v, path_vars))
                         for i, v in enumerate(values))

        spec = ContainerSpec(
            runtime=cs.runtime,
            image=_check_path(name, "container.image", _expand(name, "container.image", cs.image, path_vars)),
            containlibs=cpaths("containlibs", cs.containlibs),
            binds=cpaths("binds", cs.binds),
            bind_env=cpaths("bind_env", cs.bind_env),
            rocm=cs.rocm,
            exec_args=cs.exec_args,
        )
        if spec.runtime == "charliecloud":
            singularity_only = [key for key, value in (("containlibs", spec.containlibs),
                                                       ("bind_env", spec.bind_env), ("rocm", spec.rocm))
                                if value]
            if singularity_only:
                raise ProfileError(
                    f"profile {name}: container.{', container.'.join(singularity_only)} only exist for "
                    f"Singularity/Apptainer, not for runtime {spec.runtime!r}; bind host paths with "
                    "container.binds instead"
                )
        # runtime none keeps the other container keys, so one override switches a bare run on and off.
        container = None if spec.runtime == "none" else spec

    sw = doc.software
    python = _expand(name, "software.python", sw.python, path_vars)
    if "/" in python:
        python = _check_path(name, "software.python", python)
    for module in sw.modules:
        if not _MODULE_NAME.match(module):
            raise ProfileError(f"profile {name}: software.modules entry {module!r} is not a module name")
    env = {k: _expand(name, f"software.env.{k}", v, path_vars, runtime_ok=True) for k, v in sw.env.items()}
    miopen = sw.miopen_cache_dir
    if miopen is not None:
        miopen = _check_path(name, "software.miopen_cache_dir",
                             _expand(name, "software.miopen_cache_dir", miopen, path_vars, runtime_ok=True))
    software = SoftwareSpec(python=python, modules=sw.modules, env=tuple(env.items()),
                            miopen_cache_dir=miopen)

    staging = None
    if doc.staging is not None:
        st = doc.staging
        node_local = _expand(name, "staging.node_local_dir", st.node_local_dir, path_vars, runtime_ok=True)
        staging = StagingSpec(node_local_dir=_check_path(name, "staging.node_local_dir", node_local),
                              stage_data=st.stage_data, stage_outputs=st.stage_outputs)

    jb = doc.jobs
    jobs = JobDefaults(signal_lead_seconds=jb.signal_lead_seconds, master_port=jb.master_port,
                       preflight_time_seconds=jb.preflight_time, export_time_seconds=jb.export_time)

    profile = ClusterProfile(
        name=name, site=doc.site, description=doc.description,
        connection=ConnectionSpec(doc.connection.conn_id), account=doc.account, accelerator=accelerator,
        gpu_request=gpu_request, partitions=tuple(partitions),
        default_partition=doc.default_partition, debug_partition=doc.debug_partition, billing=billing,
        paths=paths, software=software, jobs=jobs, container=container, staging=staging,
        synthetic_data=doc.synthetic_data, placeholders=tuple(dict.fromkeys(placeholders)),
    )
    if login is None:
        profile = dataclasses.replace(profile, login_fields=_fields_using(profile, LOGIN_VARIABLE))
    for rule in GENERAL_RULES + SITE_RULES.get(profile.site, ()):
        rule(profile)
    return profile


def _fields_using(value: Any, text: str, where: str = "") -> tuple[str, ...]:
    """Dotted names of the string fields (in dataclasses, tuples, pairs) that contain ``text``."""
    if isinstance(value, str):
        return (where,) if text in value else ()
    found: tuple[str, ...] = ()
    if dataclasses.is_dataclass(value):
        for f in dataclasses.fields(value):
            if f.compare:
                found += _fields_using(getattr(value, f.name), text, f"{where}.{f.name}".lstrip("."))
    elif isinstance(value, tuple):
        if len(value) == 2 and all(isinstance(v, str) for v in value) and where.endswith(".env"):
            return _fields_using(value[1], text, f"{where}.{value[0]}")
        for item in value:
            found += _fields_using(item, text, where)
    return tuple(dict.fromkeys(found))


# --------------------------------------------------------------------------- rules from the field notes


def _under(path: str, parent: str) -> bool:
    return path == parent or path.startswith(parent.rstrip("/") + "/")


def _static_prefix(path: str) -> str:
    """The part of a path before its first per-job placeholder."""
    return path.split(RUNTIME_JOB_ID, 1)[0].rsplit("/", 1)[0] or "/" if RUNTIME_JOB_ID in path else path


def _rule_no_miopen_disable(profile: ClusterProfile) -> None:
    if "MIOPEN_DISABLE_CACHE" in profile.software.env_dict:
        raise ProfileError(
            f"profile {profile.name}: software.env sets MIOPEN_DISABLE_CACHE; with the cache disabled "
            "MIOpen cannot keep compiled kernels and fails with 'No suitable algorithm was found to "
            "execute the required convolution' (seed 002). Use software.miopen_cache_dir "
            "(per job, node-local, e.g. /tmp/miopen_cache_{job_id}) instead"
        )


def _rule_miopen_cache_node_local(profile: ClusterProfile) -> None:
    cache = profile.software.miopen_cache_dir
    if profile.accelerator.kind == "rocm" and cache is None:
        raise ProfileError(
            f"profile {profile.name}: software.miopen_cache_dir is required for ROCm accelerators: "
            "MIOpen compiles kernels on first use and needs a writable per-job cache "
            "(e.g. /tmp/miopen_cache_{job_id}; seed 002)"
        )
    if cache is None:
        return
    if RUNTIME_JOB_ID not in cache:
        raise ProfileError(f"profile {profile.name}: software.miopen_cache_dir {cache!r} must contain "
                           "{job_id} so that jobs never share an MIOpen database (seed 002)")
    local_roots = NODE_LOCAL_ROOTS
    if profile.staging:
        local_roots += (_static_prefix(profile.staging.node_local_dir),)
    if not any(_under(cache, root) for root in local_roots):
        raise ProfileError(
            f"profile {profile.name}: software.miopen_cache_dir {cache!r} is not on node-local disk "
            f"({', '.join(local_roots)}); on a shared file system the nodes writing one MIOpen SQLite "
            "database lock each other out (seed 002). Use e.g. /tmp/miopen_cache_{job_id}"
        )


def _rule_container_sees_job_paths(profile: ClusterProfile) -> None:
    """Every directory the inner script touches must be bound into the container."""
    if profile.container is None:
        return
    p = profile.paths
    needed = {"paths.code": p.code, "paths.data": p.data, "paths.outputs": p.outputs,
              "paths.viewer": p.viewer, "paths.jobs": p.jobs}
    if p.pylibs:
        needed["paths.pylibs"] = p.pylibs
    if profile.staging:
        needed["staging.node_local_dir"] = _static_prefix(profile.staging.node_local_dir)
    visible = profile.container.visible_paths
    for field_name, path in needed.items():
        if not any(_under(path, v) for v in visible):
            raise ProfileError(
                f"profile {profile.name}: {field_name} {path} is not visible inside the container; "
                f"add it (or a parent) to container.binds or container.bind_env "
                f"(visible now: {', '.join(visible) or 'nothing'})"
            )


def _lumi_no_rocm_flag(profile: ClusterProfile) -> None:
    c = profile.container
    if c is not None and (c.rocm or "--rocm" in c.exec_args):
        raise ProfileError(
            f"profile {profile.name}: container.rocm / '--rocm' is refused on LUMI: "
            "'singularity exec --rocm' injects the host's libdrm.so, built against GLIBC 2.33, into a "
            "container that ships GLIBC 2.31, and the job crashes before Python starts (seed 001). "
            "Keep rocm: false and make host paths visible with container.bind_env (SINGULARITY_BIND) "
            "and container.containlibs instead"
        )


def _lumi_no_modules(profile: ClusterProfile) -> None:
    if profile.software.modules:
        raise ProfileError(
            f"profile {profile.name}: software.modules must be empty on LUMI "
            f"(got {', '.join(profile.software.modules)}): 'module load' does not work on LUMI compute "
            "nodes (lua5.3 is missing there), so the job would fail at its first line (seed 001). "
            "Everything the job needs comes from the container, SINGULARITY_BIND and SINGULARITY_CONTAINLIBS"
        )


def _lumi_container_gpu_bindings(profile: ClusterProfile) -> None:
    c = profile.container
    if c is None:
        raise ProfileError(f"profile {profile.name}: LUMI jobs run in the CSC PyTorch container; "
                           "container is required (seed 000)")
    for lib in ("/usr/lib64/libcxi.so.1", "/opt/rocm/lib/librocm_smi64.so.7"):
        if lib not in c.containlibs:
            raise ProfileError(
                f"profile {profile.name}: container.containlibs must include {lib}; without "
                "libcxi.so.1 and librocm_smi64.so.7 PyTorch finds no GPU inside the container "
                "('RuntimeError: No HIP GPUs available', seed 000)"
            )
    if not any(_under("/opt/cray/libfabric", v) for v in c.visible_paths):
        raise ProfileError(
            f"profile {profile.name}: /opt/cray/libfabric must be bound into the container "
            "(container.binds or container.bind_env); without it jobs fail with libfabric/CXI errors, "
            "even on one node (seed 000)"
        )


def _lumi_gpu_hint(profile: ClusterProfile) -> None:
    """The advice for invisible GCDs is seed 000's error no. 1 fix, and never ``--rocm`` (seed 001)."""
    hint = profile.accelerator.missing_gpu_hint or ""
    c = profile.container
    needed = ["SINGULARITY_CONTAINLIBS", *(c.containlibs if c else ()), "/opt/cray/libfabric"]
    missing = [item for item in needed if item not in hint]
    if missing:
        raise ProfileError(
            f"profile {profile.name}: accelerator.missing_gpu_hint must name {', '.join(missing)}: on LUMI "
            "PyTorch sees no GCD without SINGULARITY_CONTAINLIBS=/usr/lib64/libcxi.so.1,"
            "/opt/rocm/lib/librocm_smi64.so.7 and the -B /opt/cray/libfabric bind (seed 000)"
        )
    for match in re.finditer(r"--rocm\b", hint):
        before = hint[max(0, match.start() - 40):match.start()].lower()
        if not any(word in before for word in ("never", "not ", "without", "no ")):
            raise ProfileError(
                f"profile {profile.name}: accelerator.missing_gpu_hint suggests '--rocm', which crashes "
                "jobs on LUMI (the host's libdrm needs GLIBC 2.33, the container has 2.31; seed 001); "
                "say 'never --rocm' or leave it out"
            )


def _lumi_env(profile: ClusterProfile) -> None:
    env = profile.software.env_dict
    if "expandable_segments:True" not in env.get("PYTORCH_HIP_ALLOC_CONF", ""):
        raise ProfileError(
            f"profile {profile.name}: software.env.PYTORCH_HIP_ALLOC_CONF must contain "
            "expandable_segments:True; without it the allocator fragments and jobs run out of memory "
            "at ~40 GB of the 64 GB per GCD (seed 000)"
        )
    if env.get("WANDB_MODE") != "disabled":
        raise ProfileError(
            f"profile {profile.name}: software.env.WANDB_MODE must be 'disabled'; WandB hangs for 30+ "
            "minutes inside Singularity on LUMI trying to reach the network (seeds 000, 001)"
        )


Rule = Callable[[ClusterProfile], None]

GENERAL_RULES: tuple[Rule, ...] = (
    _rule_no_miopen_disable,
    _rule_miopen_cache_node_local,
    _rule_container_sees_job_paths,
)
SITE_RULES: dict[str, tuple[Rule, ...]] = {
    "lumi": (_lumi_no_rocm_flag, _lumi_no_modules, _lumi_container_gpu_bindings, _lumi_gpu_hint, _lumi_env),
}
