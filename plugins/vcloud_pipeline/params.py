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
from typing import Any

from vcloud.contract import STAGES

from vcloud_pipeline.layout import RunNameError, validate_run_name
from vcloud_pipeline.profiles import DEFAULT_PROFILE, ProfileError, available_profiles, parse_slurm_time

CONFIGS: Mapping[str, str] = {
    "tiny": "trainer/configs/model_tiny.yaml",
    "small": "trainer/configs/model_small.yaml",
    "full": "trainer/configs/model_full.yaml",
}
"""Trainer config per size, relative to the synced code directory."""

SYNTHETIC_PRESETS: Mapping[str, str] = {"tiny": "tiny", "small": "small"}
"""The synthetic dataset preset that matches a config; ``full`` needs the real dataset."""

MODES = ("resume", "restart")
DEFAULT_MAX_RESUBMITS = 3
MAX_RESUBMITS_LIMIT = 50

_PROFILE = re.compile(r"^[a-z0-9][a-z0-9_-]*$")
_PARTITION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")
FIELDS = ("profile", "config", "stages", "start_stage", "mode", "max_resubmits", "dry_run", "run_name",
          "export", "time_limit", "max_epochs", "partition", "nodes", "gpus_per_node")
MAX_NODES = 1024


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

    @property
    def config_path(self) -> str:
        return CONFIGS[self.config]

    def selected(self, stage: int) -> bool:
        return stage in self.stages

    def to_dict(self) -> dict[str, Any]:
        return {name: (list(v) if isinstance(v := getattr(self, name), tuple) else v) for name in (
            "profile", "config", "stages", "mode", "max_resubmits", "dry_run", "run_name", "export",
            "time_limit", "max_epochs", "partition", "nodes", "gpus_per_node")}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "TrainingRequest":
        return cls(**{**data, "stages": tuple(data["stages"])})


def _choice(field: str, value: Any, allowed: tuple[str, ...]) -> str:
    if not isinstance(value, str) or value not in allowed:
        raise RequestError(f"{field} {value!r} not allowed (allowed: {', '.join(allowed)})")
    return value


def _int(field: str, value: Any, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, str) and value.strip().isdigit():
            value = int(value.strip())
        else:
            raise RequestError(f"{field} must be an integer from {low} to {high}, got {value!r}")
    if not low <= value <= high:
        raise RequestError(f"{field} must be from {low} to {high}, got {value}")
    return value


def _bool(field: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    raise RequestError(f"{field} must be true or false, got {value!r}")


def _stages(value: Any) -> tuple[int, ...]:
    if value is None or value == []:
        return STAGES
    if isinstance(value, (int, str)) and not isinstance(value, bool):
        value = [value]
    if not isinstance(value, (list, tuple)):
        raise RequestError(f"stages must be a list of stage numbers (allowed: 0, 1, 2, 3), got {value!r}")
    stages = sorted({_int("stages entry", v, 0, 3) for v in value})
    return tuple(stages)


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
    unknown = sorted(set(conf) - set(FIELDS))
    if unknown:
        raise RequestError(f"unknown param(s) {', '.join(unknown)} (known: {', '.join(FIELDS)})")
    profiles = known_profiles if known_profiles is not None else available_profiles()
    profile = conf.get("profile", DEFAULT_PROFILE)
    if not isinstance(profile, str) or not _PROFILE.match(profile) or profile not in profiles:
        raise RequestError(f"profile {profile!r} not known (known: {', '.join(profiles)})")
    config = _choice("config", conf.get("config", "tiny"), tuple(CONFIGS))
    mode = _choice("mode", conf.get("mode", "resume"), MODES)

    stages = _stages(conf.get("stages"))
    start = conf.get("start_stage")
    if start is not None:
        start = _int("start_stage", start, 0, 3)
        stages = tuple(s for s in stages if s >= start)
        if not stages:
            raise RequestError(f"start_stage {start} leaves none of the stages {list(_stages(conf.get('stages')))} "
                               "to run")

    max_resubmits = _int("max_resubmits", conf.get("max_resubmits", DEFAULT_MAX_RESUBMITS), 0,
                         MAX_RESUBMITS_LIMIT)
    dry_run = _bool("dry_run", conf.get("dry_run", False))
    export = _bool("export", conf.get("export", True))

    run_name = conf.get("run_name") or default_run_name(config, run_type, logical_date)
    try:
        validate_run_name(run_name)
    except RunNameError as exc:
        raise RequestError(str(exc)) from None

    time_limit = conf.get("time_limit") or None
    if time_limit is not None:
        try:
            if not isinstance(time_limit, str):
                raise ValueError(f"time_limit must be a Slurm duration string, got {time_limit!r}")
            parse_slurm_time(time_limit)
        except (ValueError, ProfileError) as exc:
            raise RequestError(str(exc)) from None
    max_epochs = conf.get("max_epochs")
    if max_epochs is not None:
        max_epochs = _int("max_epochs", max_epochs, 1, 100000)

    partition = conf.get("partition") or None
    if partition is not None and (not isinstance(partition, str) or not _PARTITION.match(partition)):
        raise RequestError(f"partition must be a Slurm partition name (letters, digits, '-', '_'), got {partition!r}")
    nodes = _int("nodes", conf.get("nodes", 1), 1, MAX_NODES)
    gpus_per_node = _int("gpus_per_node", conf.get("gpus_per_node", 1), 1, 64)

    return TrainingRequest(profile=profile, config=config, stages=stages, mode=mode,
                           max_resubmits=max_resubmits, dry_run=dry_run, run_name=run_name, export=export,
                           time_limit=time_limit, max_epochs=max_epochs, partition=partition, nodes=nodes,
                           gpus_per_node=gpus_per_node)


def dag_params(default_profile: str = DEFAULT_PROFILE) -> dict[str, Any]:
    """The trigger form: one ``Param`` per field, with the schema the UI validates against."""
    from airflow.sdk import Param

    return {
        "profile": Param(default_profile, type="string", pattern=_PROFILE.pattern, title="Cluster profile",
                         description="Name of include/profiles/<name>.yaml: local, lumi, levante, cosmos."),
        "config": Param("tiny", type="string", enum=list(CONFIGS), title="Model size",
                        description="Trainer config: tiny (smoke test), small, full (production)."),
        "stages": Param([0, 1, 2, 3], type="array", items={"type": "integer", "minimum": 0, "maximum": 3},
                        title="Stages",
                        description="Stages to run (0 autoencoder, 1 draft, 2 refiner, 3 self-training). "
                                    "Complete stages are skipped unless mode is restart."),
        "start_stage": Param(None, type=["null", "integer"], minimum=0, maximum=3, title="Start stage",
                             description="Like the job scripts' START_STAGE: skip every stage before it."),
        "mode": Param("resume", type="string", enum=list(MODES), title="Resume or restart",
                      description="resume: skip complete stages and continue from latest.pt. restart: move "
                                  "the selected stages' outputs aside and train them from scratch."),
        "max_resubmits": Param(DEFAULT_MAX_RESUBMITS, type="integer", minimum=0, maximum=MAX_RESUBMITS_LIMIT,
                               title="Resubmissions per cause",
                               description="How often a stage job ended by its time limit, a node failure or "
                                           "a preemption is submitted again (only if it made progress)."),
        "dry_run": Param(False, type="boolean", title="Dry run",
                         description="Sync the code, render the job scripts and run the preflight checks only."),
        "run_name": Param("", type="string", pattern=r"^$|^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$", title="Run name",
                          description="Directory name of the run's outputs. Empty: the config name for "
                                      "manual runs, <config>-<YYYYMMDD> for scheduled runs and backfills."),
        "export": Param(True, type="boolean", title="Export viewer data",
                        description="Run the viewer export job after stage 3."),
        "time_limit": Param(None, type=["null", "string"], title="Training job time limit",
                            description="Slurm duration (e.g. 3-00:00:00) for each training job. Empty: the "
                                        "partition's default. Jobs checkpoint and requeue before it."),
        "max_epochs": Param(None, type=["null", "integer"], minimum=1, title="Epochs per stage",
                            description="Override the config's epochs per stage (short test runs)."),
        "partition": Param(None, type=["null", "string"], title="Training partition",
                           description="Partition of the training jobs (e.g. standard-g on LUMI for whole "
                                       "nodes). Empty: the profile's default partition."),
        "nodes": Param(1, type="integer", minimum=1, maximum=MAX_NODES, title="Nodes per training job",
                       description="More than one: torchrun across the nodes (the partition must allow it)."),
        "gpus_per_node": Param(1, type="integer", minimum=1, maximum=64, title="GPUs per node",
                               description="GPUs (GCDs on LUMI) per node of each training job; whole-node "
                                           "partitions need all of a node's."),
    }
