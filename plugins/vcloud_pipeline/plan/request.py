"""What a run of the training DAG is asked to do: the trigger form and its validation.

The form (:func:`dag_params`) catches wrong types and unknown choices in the UI; the DAG's first
task runs :func:`parse_request` over the resolved params again, because ``--dag-run-conf`` and the
REST API can send anything, and a bad value must fail before a single job is submitted, with a
message that names the field and the allowed values. Nothing in a request reaches a shell
unvalidated: names are matched against fixed patterns, the run name becomes a directory name.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal, get_args

import pydantic
from pydantic import BeforeValidator, ValidationInfo

from slurm_provider import validate_partition, ValidationError as SlurmValueError
from vcloud.contract import ON_CODE_CHANGE_CHOICES, ON_CODE_CHANGE_DEFAULT, STAGES

from vcloud_pipeline.plan.layout import RUN_NAME, RunNameError, validate_run_name
from vcloud_pipeline.profile import DEFAULT_PROFILE, PROFILE_NAME, available_profiles
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

MAX_NODES = 1024
ADVANCED = "Advanced: resources, limits and resubmission"
"""The trigger form's section for what a run rarely changes (``Param(section=...)``); the rest is on top."""


class RequestError(ValueError):
    """A DAG run asked for something invalid; raised before anything reaches the cluster."""


def _integer(low: int, high: int) -> BeforeValidator:
    """Validates an integer from ``low`` to ``high``; digits in a string count (``--conf`` and forms
    send text)."""

    def check(value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, str) and value.strip().isdigit():
                value = int(value.strip())
            else:
                refuse(f"must be an integer from {low} to {high}, got {value!r}")
        if not low <= value <= high:
            refuse(f"must be from {low} to {high}, got {value}")
        return value

    return BeforeValidator(check)


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
    """A profile's name; one of the installed ones where the caller says which are (a request read
    back from a run's plan names the profile the plan carries, whatever is installed now)."""
    profiles = (info.context or {}).get("profiles")
    if not isinstance(value, str) or not PROFILE_NAME.match(value) or (profiles is not None and value not in profiles):
        refuse(f"profile {value!r} not known (known: {', '.join(profiles or available_profiles())})", whole=True)
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
    try:
        if not isinstance(value, str) or "," in value:
            raise SlurmValueError("partition", "one partition")
        validate_partition(value)
    except SlurmValueError:
        refuse(f"must be a Slurm partition name (letters, digits, '-', '_'), got {value!r}")
    return value


def _run_name(value: Any) -> str | None:
    if value in (None, ""):
        return None
    try:
        return validate_run_name(value)
    except RunNameError as exc:
        refuse(str(exc), whole=True)


ADVANCED_FIELD: dict[str, Any] = {"section": ADVANCED}
"""``json_schema_extra`` of a field in the form's :data:`ADVANCED` section."""


class TrainingRequest(Document):
    """One DAG run's request: the trigger form's fields, in the form's order (:func:`dag_params`
    builds the form from this model). Sent (form, ``--dag-run-conf`` or REST API) it is validated
    by :func:`parse_request`, which applies ``start_stage`` and fills in the run name; unknown
    params are refused."""

    profile: Annotated[str, BeforeValidator(_profile)] = pydantic.Field(
        DEFAULT_PROFILE, validate_default=True, title="Cluster profile",
        description="One of include/profiles/<name>.yaml (its connection, partitions, paths and software "
                    "environment).")
    config: ConfigName = pydantic.Field(
        "tiny", title="Model size", description="Trainer config: tiny (smoke test), small, full (production).")
    stages: Annotated[tuple[int, ...], BeforeValidator(_stages)] = pydantic.Field(
        STAGES, title="Stages",
        description="Stages to run (0 autoencoder, 1 draft, 2 refiner, 3 self-training). Complete stages are "
                    "skipped unless mode is restart, and so are stages the run's inputs give nothing to do "
                    "(stage 3 without model.stage3.unlabeled_data; a stage the config turns off with "
                    "train.stageN.run_by_default: false) unless listed in force_stages.",
        json_schema_extra={"items": {"type": "integer", "minimum": 0, "maximum": 3}})
    mode: Mode = pydantic.Field(
        "resume", title="Resume or restart",
        description="resume: skip complete stages and continue from latest.pt. restart: move the selected "
                    "stages' outputs aside and train them from scratch.")
    dry_run: Annotated[bool, BeforeValidator(_flag)] = pydantic.Field(
        False, title="Dry run", description="Sync the code, render the job scripts and run the preflight checks only.")
    run_name: Annotated[str | None, BeforeValidator(_run_name)] = pydantic.Field(
        None, title="Run name",
        description="Directory name of the run's outputs. Empty: the config name for manual runs, "
                    "<config>-<YYYYMMDD> for scheduled runs and backfills. Runs with other names train at "
                    "the same time; a run given the name of one still training shares its jobs (watches "
                    "them, skips complete stages) instead of submitting its own.",
        json_schema_extra={"form": {"default": "", "type": "string",
                                    "pattern": f"^$|{RUN_NAME.pattern}"}})
    export: Annotated[bool, BeforeValidator(_flag)] = pydantic.Field(
        True, title="Export viewer data", description="Run the viewer export job after stage 3.")
    start_stage: Annotated[int, _integer(0, 3), pydantic.Field(ge=0, le=3)] | None = pydantic.Field(
        None, title="Start stage", json_schema_extra=ADVANCED_FIELD,
        description="Like the job scripts' START_STAGE: skip every stage before it.")
    max_resubmits: Annotated[int, _integer(0, MAX_RESUBMITS_LIMIT), pydantic.Field(ge=0, le=MAX_RESUBMITS_LIMIT)] = \
        pydantic.Field(DEFAULT_MAX_RESUBMITS, title="Resubmissions per cause", json_schema_extra=ADVANCED_FIELD,
                       description="How often a stage job ended by its time limit, a node failure or a preemption "
                                   "is submitted again (only if it made progress).")
    """Resubmissions per interrupting cause (time limit, node failure, preemption, boot failure)."""
    time_limit: Annotated[str | None, BeforeValidator(_time_limit)] = pydantic.Field(
        None, title="Training job time limit", json_schema_extra=ADVANCED_FIELD,
        description="Slurm duration (e.g. 3-00:00:00) for each training job. Empty: the partition's default. "
                    "Jobs checkpoint and requeue before it.")
    max_epochs: Annotated[int, _integer(1, 100000), pydantic.Field(ge=1)] | None = pydantic.Field(
        None, title="Epochs per stage", json_schema_extra=ADVANCED_FIELD,
        description="Override the config's epochs per stage (short test runs).")
    partition: Annotated[str | None, BeforeValidator(_partition)] = pydantic.Field(
        None, title="Training partition", json_schema_extra=ADVANCED_FIELD,
        description="Partition of the training jobs (e.g. standard-g on LUMI for whole nodes). Empty: the "
                    "profile's default partition.")
    nodes: Annotated[int, _integer(1, MAX_NODES), pydantic.Field(ge=1, le=MAX_NODES)] = pydantic.Field(
        1, title="Nodes per training job", json_schema_extra=ADVANCED_FIELD,
        description="More than one: torchrun across the nodes (the partition must allow it).")
    gpus_per_node: Annotated[int, _integer(1, 64), pydantic.Field(ge=1, le=64)] = pydantic.Field(
        1, title="GPUs per node", json_schema_extra=ADVANCED_FIELD,
        description="GPUs (GCDs on LUMI) per node of each training job; whole-node partitions need all of a "
                    "node's.")
    on_code_change: OnCodeChange = pydantic.Field(
        ON_CODE_CHANGE_DEFAULT, title="Resuming after a code change", json_schema_extra=ADVANCED_FIELD,
        description="A stage resumed from a latest.pt that other code wrote, whose optimizer layout differs: "
                    "keep_weights resumes the weights with a fresh optimizer state, refuse stops the job "
                    "(exit 88). Weights that no longer fit are refused either way: use mode restart, or the "
                    "old code.")
    force_stages: Annotated[tuple[int, ...], BeforeValidator(_force_stages)] = pydantic.Field(
        (), title="Train anyway", json_schema_extra={**ADVANCED_FIELD, "items": {"type": "integer", "minimum": 0,
                                                                                  "maximum": 3}},
        description="Selected stages to train even where the plan finds nothing for them to do with the run's "
                    "inputs, e.g. [3]: stage 3 without an unlabeled domain (model.stage3.unlabeled_data empty) "
                    "pseudo-labels part of the labeled training split, and keeps its start unless it beats it; "
                    "[2]: stage 2 where the config turns it off by default (train.stage2.run_by_default).")
    """Stages to train even where the plan finds that the run's inputs give them nothing to do
    (:func:`vcloud_pipeline.plan.stages.stages_without_work`), when the run selects them
    (:attr:`stages`); one it does not select stays unselected."""

    @property
    def config_path(self) -> str:
        return CONFIGS[self.config]

    def selected(self, stage: int) -> bool:
        return stage in self.stages

    def forced(self, stage: int) -> bool:
        return stage in self.force_stages and self.selected(stage)


FIELDS: tuple[str, ...] = tuple(TrainingRequest.model_fields)
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
    """Validate the params of one DAG run; raises :class:`RequestError` naming the field. The request
    returned has ``start_stage`` applied to ``stages`` and its run name filled in."""
    profiles = known_profiles if known_profiles is not None else available_profiles()
    try:
        run = TrainingRequest.model_validate(conf, context={"profiles": profiles})
    except pydantic.ValidationError as exc:
        raise RequestError("; ".join(problems(exc, TrainingRequest, _unknown_params))) from None
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
    return run.model_copy(update={"stages": stages, "start_stage": None, "run_name": run_name})


_BOUNDS = {"minimum": "minimum", "maximum": "maximum", "ge": "minimum", "le": "maximum"}


def _bounds(schema: Mapping[str, Any]) -> dict[str, Any]:
    return {_BOUNDS[key]: value for key, value in schema.items() if key in _BOUNDS}


def _param_schema(field: Any, schema: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON schema Airflow's form validates one field against, from the model's own schema."""
    out: dict[str, Any] = {}
    extra = dict(field.json_schema_extra or {})
    if "anyOf" in schema:  # X | None: the form sends null for an empty field
        kinds = [part for part in schema["anyOf"] if part.get("type") != "null"]
        out["type"] = ["null", kinds[0]["type"]]
        out.update(_bounds(kinds[0]))
    else:
        out["type"] = schema["type"] if schema.get("type") != "array" or "enum" in schema else "array"
        out.update({key: value for key, value in schema.items() if key == "enum"})
        out.update(_bounds(schema))
        if "const" in schema:
            out["enum"] = [schema["const"]]
    out.update(extra.pop("form", {}))
    if "items" in extra:
        out["items"] = extra.pop("items")
    out.update(extra)
    out.pop("default", None)
    return out


def dag_params(default_profile: str = DEFAULT_PROFILE,
               profiles: tuple[str, ...] | None = None) -> dict[str, Any]:
    """The trigger form, built from :class:`TrainingRequest`: one ``Param`` per field, in its order,
    with its title, description and the schema the UI validates against.

    ``profile`` is a drop-down of the installed profiles (``include/profiles/*.yaml`` when the DAG is
    parsed, or ``profiles``); what a run rarely changes sits in the collapsed :data:`ADVANCED`
    section (Airflow's ``section`` schema keyword).
    """
    from airflow.sdk import Param

    installed = list(profiles if profiles is not None else available_profiles())
    if default_profile not in installed:
        raise RequestError(f"default profile {default_profile!r} is not installed (installed: "
                           f"{', '.join(installed) or 'none'}); set VCLOUD_DEFAULT_PROFILE to one of them")
    schemas = TrainingRequest.model_json_schema(mode="serialization")["properties"]
    params: dict[str, Any] = {}
    for name, field in TrainingRequest.model_fields.items():
        schema = _param_schema(field, schemas[name])
        default = (field.json_schema_extra or {}).get("form", {}).get("default", field.default)  # type: ignore[union-attr]
        if name == "profile":
            schema["enum"], default = installed, default_profile
        if isinstance(default, tuple):
            default = list(default)
        params[name] = Param(default, title=field.title, description=field.description, **schema)
    return params
