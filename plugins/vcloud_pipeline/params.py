"""What a run of the training DAG is asked to do: the trigger form and its validation.

The form (:func:`dag_params`) catches wrong types and unknown choices in the UI; the DAG's first
task runs :func:`parse_request` over the resolved params again, because ``--dag-run-conf`` and the
REST API can send anything, and a bad value must fail before a single job is submitted, with a
message that names the field and the allowed values. Nothing in a request reaches a shell
unvalidated: names are matched against fixed patterns, the run name becomes a directory name.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Literal, get_args

import pydantic
from pydantic import BeforeValidator, ValidationInfo

from vcloud.contract import ON_CODE_CHANGE_CHOICES, ON_CODE_CHANGE_DEFAULT, STAGES

from vcloud_pipeline.layout import RunNameError, validate_run_name
from vcloud_pipeline.profiles import DEFAULT_PROFILE, available_profiles
from vcloud_pipeline.schema import Document, problems, refuse, slurm_seconds

ConfigName = Literal["tiny", "small", "full"]
CONFIGS: Mapping[str, str] = {
    "tiny": "trainer/configs/model_tiny.yaml",
    "small": "trainer/configs/model_small.yaml",
    "full": "trainer/configs/model_full.yaml",
}
"""Trainer config per size, relative to the synced code directory."""

SYNTHETIC_PRESETS: Mapping[str, str] = {"tiny": "tiny", "small": "small"}
"""The synthetic dataset preset that matches a config; ``full`` needs the real dataset."""

Mode = Literal["resume", "restart"]
MODES: tuple[str, ...] = get_args(Mode)
OnCodeChange = Literal[ON_CODE_CHANGE_CHOICES]  # type: ignore[valid-type]
"""What a resume from a ``latest.pt`` of other code does when only its optimizer layout differs
(the trainer's ``train.on_code_change``)."""
DEFAULT_MAX_RESUBMITS = 3
MAX_RESUBMITS_LIMIT = 50

_PROFILE = re.compile(r"^[a-z0-9][a-z0-9_-]*$")
_PARTITION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")
MAX_NODES = 1024
ADVANCED = "Advanced: resources, limits and resubmission"
"""The trigger form's section for what a run rarely changes (``Param(section=...)``); the rest is on top."""


class RequestError(ValueError):
    """A DAG run asked for something invalid; raised before anything reaches the cluster."""


@dataclass(frozen=True)
class TrainingRequest:
    """One validated DAG-run request."""

    profile: str
    """Cluster profile name (``include/profiles/<name>.yaml``)."""
    config: str
    """``tiny``, ``small`` or ``full``."""
    stages: tuple[int, ...]
    """Stages selected to run, ascending (after ``start_stage`` is applied)."""
    mode: str
    """``resume``: skip complete stages, continue from ``latest.pt``; ``restart``: move the selected
    stages' outputs aside and train them from scratch."""
    max_resubmits: int
    """Resubmissions per interrupting cause (time limit, node failure, preemption, boot failure)."""
    dry_run: bool
    """Sync, render and preflight only: no data, training or export job."""
    run_name: str
    export: bool
    """Run the viewer export job after stage 3."""
    time_limit: str | None = None
    """Slurm time limit for the training jobs; ``None``: the partition's default."""
    max_epochs: int | None = None
    """Overrides the config's epochs per stage (short smoke runs)."""
    partition: str | None = None
    """Partition of the training jobs; ``None``: the profile's default partition."""
    nodes: int = 1
    """Nodes per training job (more than one: torchrun across the nodes)."""
    gpus_per_node: int = 1
    """GPUs (GCDs on LUMI) per node of each training job; the profile's partition checks both."""
    on_code_change: str = ON_CODE_CHANGE_DEFAULT
    """A stage resumed from a ``latest.pt`` written by other code whose optimizer layout differs:
    ``keep_weights`` resumes the weights with a fresh optimizer state, ``refuse`` stops the job
    (exit 88). Weights that no longer fit are refused either way."""
    force_stages: tuple[int, ...] = ()
    """Stages to train even where the plan finds that the run's inputs give them nothing to do
    (:func:`vcloud_pipeline.stage_decisions.stages_without_work`: stage 3 without an unlabeled
    domain), when the run selects them (:attr:`stages`); one it does not select stays unselected."""

    @property
    def config_path(self) -> str:
        return CONFIGS[self.config]

    def selected(self, stage: int) -> bool:
        return stage in self.stages

    def forced(self, stage: int) -> bool:
        return stage in self.force_stages and self.selected(stage)

    def to_dict(self) -> dict[str, Any]:
        return {name: (list(v) if isinstance(v := getattr(self, name), tuple) else v) for name in (
            "profile", "config", "stages", "mode", "max_resubmits", "dry_run", "run_name", "export",
            "time_limit", "max_epochs", "partition", "nodes", "gpus_per_node", "on_code_change", "force_stages")}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "TrainingRequest":
        return cls(**{**data, "stages": tuple(data["stages"]), "force_stages": tuple(data.get("force_stages", ()))})


def _integer(low: int, high: int) -> Any:
    """An integer from ``low`` to ``high``; digits in a string count (``--conf`` and forms send text)."""

    def check(value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, str) and value.strip().isdigit():
                value = int(value.strip())
            else:
                refuse(f"must be an integer from {low} to {high}, got {value!r}")
        if not low <= value <= high:
            refuse(f"must be from {low} to {high}, got {value}")
        return value

    return Annotated[int, BeforeValidator(check)]


def _flag(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    refuse(f"must be true or false, got {value!r}")


def _stages(value: Any) -> tuple[int, ...]:
    if value is None or value == []:
        return STAGES
    return _stage_list(value)


def _force_stages(value: Any) -> tuple[int, ...]:
    if value is None or value == []:
        return ()
    return _stage_list(value)


def _stage_list(value: Any) -> tuple[int, ...]:
    if isinstance(value, (int, str)) and not isinstance(value, bool):
        value = [value]
    if not isinstance(value, (list, tuple)):
        refuse(f"must be a list of stage numbers (allowed: 0, 1, 2, 3), got {value!r}")
    stages = set()
    for entry in value:
        if isinstance(entry, bool) or not isinstance(entry, (int, str)) or not str(entry).strip().isdigit():
            refuse(f"entry must be an integer from 0 to 3, got {entry!r}")
        if not 0 <= int(entry) <= 3:
            refuse(f"entry must be from 0 to 3, got {entry}")
        stages.add(int(entry))
    return tuple(sorted(stages))


def _profile(value: Any, info: ValidationInfo) -> str:
    profiles = (info.context or {}).get("profiles") or available_profiles()
    if not isinstance(value, str) or not _PROFILE.match(value) or value not in profiles:
        refuse(f"profile {value!r} not known (known: {', '.join(profiles)})", whole=True)
    return value


def _time_limit(value: Any) -> str | None:
    if value in (None, ""):
        return None
    if not isinstance(value, str):
        refuse(f"must be a Slurm duration string, got {value!r}")
    slurm_seconds(value)
    return value


def _partition(value: Any) -> str | None:
    if value in (None, ""):
        return None
    if not isinstance(value, str) or not _PARTITION.match(value):
        refuse(f"must be a Slurm partition name (letters, digits, '-', '_'), got {value!r}")
    return value


def _run_name(value: Any) -> str | None:
    if value in (None, ""):
        return None
    try:
        return validate_run_name(value)
    except RunNameError as exc:
        refuse(str(exc), whole=True)


class RunConf(Document):
    """The params of one DAG run as sent (form, ``--dag-run-conf`` or REST API), before defaults that
    depend on the run (the run name) are filled in. Unknown params are refused."""

    profile: Annotated[str, BeforeValidator(_profile)] = pydantic.Field(DEFAULT_PROFILE,
                                                                        validate_default=True)
    config: ConfigName = "tiny"
    stages: Annotated[tuple[int, ...], BeforeValidator(_stages)] = STAGES
    start_stage: _integer(0, 3) | None = None
    mode: Mode = "resume"
    max_resubmits: _integer(0, MAX_RESUBMITS_LIMIT) = DEFAULT_MAX_RESUBMITS
    dry_run: Annotated[bool, BeforeValidator(_flag)] = False
    run_name: Annotated[str | None, BeforeValidator(_run_name)] = None
    export: Annotated[bool, BeforeValidator(_flag)] = True
    time_limit: Annotated[str | None, BeforeValidator(_time_limit)] = None
    max_epochs: _integer(1, 100000) | None = None
    partition: Annotated[str | None, BeforeValidator(_partition)] = None
    nodes: _integer(1, MAX_NODES) = 1
    gpus_per_node: _integer(1, 64) = 1
    on_code_change: OnCodeChange = ON_CODE_CHANGE_DEFAULT
    force_stages: Annotated[tuple[int, ...], BeforeValidator(_force_stages)] = ()


FIELDS: tuple[str, ...] = tuple(RunConf.model_fields)
"""The params a run accepts."""


def _unknown_params(where: str, unknown: list[str], known: list[str]) -> str:
    return f"unknown param(s) {', '.join(sorted(unknown))} (known: {', '.join(known)})"


def default_run_name(config: str, run_type: str | None, logical_date: Any) -> str:
    """The run's directory name when none is given.

    Manual triggers continue the config's run (``full``, like the seed's ``outputs_full``), so a
    re-trigger with ``start_stage=2`` resumes it; scheduled retraining and backfills get a run of
    their own per logical date (``full-20260301``).
    """
    if run_type in ("scheduled", "backfill") and logical_date is not None:
        return f"{config}-{logical_date.strftime('%Y%m%d')}"
    return config


def parse_request(conf: Mapping[str, Any], *, run_type: str | None = None, logical_date: Any = None,
                  known_profiles: tuple[str, ...] | None = None) -> TrainingRequest:
    """Validate the params of one DAG run; raises :class:`RequestError` naming the field."""
    profiles = known_profiles if known_profiles is not None else available_profiles()
    try:
        run = RunConf.model_validate(conf, context={"profiles": profiles})
    except pydantic.ValidationError as exc:
        raise RequestError("; ".join(problems(exc, RunConf, _unknown_params))) from None
    stages = run.stages
    if run.start_stage is not None:
        stages = tuple(s for s in stages if s >= run.start_stage)
        if not stages:
            raise RequestError(f"start_stage {run.start_stage} leaves none of the stages {list(run.stages)} "
                               "to run")
    run_name = run.run_name or default_run_name(run.config, run_type, logical_date)
    try:
        validate_run_name(run_name)
    except RunNameError as exc:
        raise RequestError(str(exc)) from None
    return TrainingRequest(profile=run.profile, config=run.config, stages=stages, mode=run.mode,
                           max_resubmits=run.max_resubmits, dry_run=run.dry_run, run_name=run_name,
                           export=run.export, time_limit=run.time_limit, max_epochs=run.max_epochs,
                           partition=run.partition, nodes=run.nodes, gpus_per_node=run.gpus_per_node,
                           on_code_change=run.on_code_change, force_stages=run.force_stages)


def dag_params(default_profile: str = DEFAULT_PROFILE,
               profiles: tuple[str, ...] | None = None) -> dict[str, Any]:
    """The trigger form: one ``Param`` per field, with the schema the UI validates against.

    ``profile`` is a drop-down of the installed profiles (``include/profiles/*.yaml`` when the DAG is
    parsed, or ``profiles``); what a run rarely changes sits in the collapsed :data:`ADVANCED`
    section (Airflow's ``section`` schema keyword).
    """
    from airflow.sdk import Param

    installed = list(profiles if profiles is not None else available_profiles())
    if default_profile not in installed:
        raise RequestError(f"default profile {default_profile!r} is not installed (installed: "
                           f"{', '.join(installed) or 'none'}); set VCLOUD_DEFAULT_PROFILE to one of them")
    return {
        "profile": Param(default_profile, type="string", enum=installed, title="Cluster profile",
                         description="One of include/profiles/<name>.yaml (its connection, partitions, paths "
                                     "and software environment)."),
        "config": Param("tiny", type="string", enum=list(CONFIGS), title="Model size",
                        description="Trainer config: tiny (smoke test), small, full (production)."),
        "stages": Param(list(STAGES), type="array", items={"type": "integer", "minimum": 0, "maximum": 3},
                        title="Stages",
                        description="Stages to run (0 autoencoder, 1 draft, 2 refiner, 3 self-training). "
                                    "Complete stages are skipped unless mode is restart, and so are stages the "
                                    "run's inputs give nothing to do (stage 3 without "
                                    "model.stage3.unlabeled_data) unless listed in force_stages."),
        "mode": Param("resume", type="string", enum=list(MODES), title="Resume or restart",
                      description="resume: skip complete stages and continue from latest.pt. restart: move "
                                  "the selected stages' outputs aside and train them from scratch."),
        "dry_run": Param(False, type="boolean", title="Dry run",
                         description="Sync the code, render the job scripts and run the preflight checks only."),
        "run_name": Param("", type="string", pattern=r"^$|^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$", title="Run name",
                          description="Directory name of the run's outputs. Empty: the config name for "
                                      "manual runs, <config>-<YYYYMMDD> for scheduled runs and backfills. "
                                      "Runs with other names train at the same time; a run given the name of "
                                      "one still training shares its jobs (watches them, skips complete "
                                      "stages) instead of submitting its own."),
        "export": Param(True, type="boolean", title="Export viewer data",
                        description="Run the viewer export job after stage 3."),
        "start_stage": Param(None, type=["null", "integer"], minimum=0, maximum=3, title="Start stage",
                             section=ADVANCED,
                             description="Like the job scripts' START_STAGE: skip every stage before it."),
        "max_resubmits": Param(DEFAULT_MAX_RESUBMITS, type="integer", minimum=0, maximum=MAX_RESUBMITS_LIMIT,
                               title="Resubmissions per cause", section=ADVANCED,
                               description="How often a stage job ended by its time limit, a node failure or "
                                           "a preemption is submitted again (only if it made progress)."),
        "time_limit": Param(None, type=["null", "string"], title="Training job time limit", section=ADVANCED,
                            description="Slurm duration (e.g. 3-00:00:00) for each training job. Empty: the "
                                        "partition's default. Jobs checkpoint and requeue before it."),
        "max_epochs": Param(None, type=["null", "integer"], minimum=1, title="Epochs per stage",
                            section=ADVANCED,
                            description="Override the config's epochs per stage (short test runs)."),
        "partition": Param(None, type=["null", "string"], title="Training partition", section=ADVANCED,
                           description="Partition of the training jobs (e.g. standard-g on LUMI for whole "
                                       "nodes). Empty: the profile's default partition."),
        "nodes": Param(1, type="integer", minimum=1, maximum=MAX_NODES, title="Nodes per training job",
                       section=ADVANCED,
                       description="More than one: torchrun across the nodes (the partition must allow it)."),
        "gpus_per_node": Param(1, type="integer", minimum=1, maximum=64, title="GPUs per node",
                               section=ADVANCED,
                               description="GPUs (GCDs on LUMI) per node of each training job; whole-node "
                                           "partitions need all of a node's."),
        "force_stages": Param([], type="array", items={"type": "integer", "minimum": 0, "maximum": 3},
                              title="Train anyway", section=ADVANCED,
                              description="Selected stages to train even where the plan finds nothing for them "
                                          "to do with the run's inputs, e.g. [3]: stage 3 without an unlabeled "
                                          "domain (model.stage3.unlabeled_data empty) pseudo-labels part of the "
                                          "labeled training split, and keeps stage 2's model unless it beats it."),
        "on_code_change": Param(ON_CODE_CHANGE_DEFAULT, type="string", enum=list(ON_CODE_CHANGE_CHOICES),
                                title="Resuming after a code change", section=ADVANCED,
                                description="A stage resumed from a latest.pt that other code wrote, whose "
                                            "optimizer layout differs: keep_weights resumes the weights with a "
                                            "fresh optimizer state, refuse stops the job (exit 88). Weights that "
                                            "no longer fit are refused either way: use mode restart, or the old "
                                            "code."),
    }
