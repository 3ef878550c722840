"""The stage plan of a run and the decision, per job, to submit it or skip it.

The seed's manual workflow (``sbatch --export=ALL,START_STAGE=2 ...``) skips stages that are
done; here that is :func:`decide`: a pure function of what was asked (:class:`StagePlan`) and what
is on the cluster (:class:`StageFiles`), so it is tested without a cluster and the DAG only
gathers the facts. A stage is complete when its ``COMPLETE`` marker and ``best.pt`` both exist;
a stage after 0 needs its predecessor's ``best.pt`` in the same run. A stage that the run's inputs
give nothing to do (:func:`stages_without_work`) is decided at ``plan`` and never submitted.
"""

from __future__ import annotations

import types
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum

from vcloud.config import VCloudConfig
from vcloud.contract import DATA_INDEX, STAGES, export_inputs_digest, exported_inputs

from vcloud_pipeline.plan.jobspec import JobSpec
from vcloud_pipeline.plan.labels import JobLabel
from vcloud_pipeline.plan.layout import RunPaths
from vcloud_pipeline.plan.request import SYNTHETIC_PRESETS, TrainingRequest
from vcloud_pipeline.profile import ClusterProfile

EXPORT, DATA, PREFLIGHT = JobLabel.EXPORT, JobLabel.DATA, JobLabel.PREFLIGHT


class StageDecisionError(RuntimeError):
    """A stage cannot run: its input is missing. Says which file and how to produce it."""


class Action(str, Enum):
    SUBMIT = "submit"
    SKIP = "skip"


@dataclass(frozen=True)
class Decision:
    action: Action
    reason: str
    restart: bool = False
    """Move the stage's old outputs aside before submitting (mode ``restart``)."""

    @property
    def submit(self) -> bool:
        return self.action is Action.SUBMIT


@dataclass(frozen=True)
class StageFiles:
    """What exists of one stage on the cluster (byte sizes; ``None``: missing)."""

    complete: int | None
    best: int | None
    predecessor_best: int | None = None
    """``best.pt`` of the stage it starts from (:meth:`StagePlan.predecessor`; stage 0: not needed)."""

    @property
    def is_complete(self) -> bool:
        return self.complete is not None and bool(self.best)


def stages_without_work(request: TrainingRequest, config: VCloudConfig) -> dict[int, str]:
    """The selected stages that the run's inputs give nothing to do, each with why: submitted, they
    would spend their GPU-hours and hand on the model they started from. A stage in the request's
    ``force_stages`` is trained anyway.

    A stage the config turns off by default (``train.stage{N}.run_by_default: false``: stage 2,
    whose refiner measured no gain over the draft it starts from) is not submitted; stage 3 then
    starts from stage 1's draft (the trainer builds stage 2's untrained start from stages 0 and 1).
    Stage 3 adapts to an unlabeled domain (``model.stage3.unlabeled_data``); without one it
    pseudo-labels part of the labeled training split, where its student cannot learn what the
    labels do not already teach, and keeps the model it started from."""
    out: dict[int, str] = {}
    for stage in STAGES:
        if request.selected(stage) and not request.forced(stage) and not config.train.for_stage(stage).run_by_default:
            out[stage] = (f"stage {stage} not submitted: train.stage{stage}.run_by_default is false in "
                          f"{request.config_path} (it measured no validation gain over the model it starts "
                          f"from, see docs/training-dag.md); train it anyway with force_stages [{stage}]")
    if 3 not in out and request.selected(3) and not request.forced(3) \
            and not config.model.section(3).get("unlabeled_data"):
        out[3] = (f"stage 3 not submitted: model.stage3.unlabeled_data is empty in {request.config_path}, so it has "
                  "no unlabeled domain to adapt to and would hand on the model it starts from after spending its "
                  "GPU-hours "
                  "(name the new domain's prepared series there, or train it anyway with force_stages [3])")
    return out


@dataclass(frozen=True)
class StagePlan:
    """Which jobs a run submits, from a validated request and the cluster profile."""

    request: TrainingRequest
    synthetic_data: bool
    without_work: Mapping[int, str] = field(default_factory=dict)
    """Selected stages decided at ``plan`` not to be submitted (:func:`stages_without_work`), with why."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "without_work", types.MappingProxyType(dict(self.without_work)))

    @classmethod
    def build(cls, request: TrainingRequest, profile: ClusterProfile,
              without_work: Mapping[int, str] | None = None) -> "StagePlan":
        if profile.synthetic_data and request.config not in SYNTHETIC_PRESETS:
            raise StageDecisionError(
                f"config {request.config} needs the real dataset, but profile {profile.name} has only "
                f"synthetic data (configs with a synthetic preset: {', '.join(SYNTHETIC_PRESETS)})"
            )
        return cls(request=request, synthetic_data=profile.synthetic_data, without_work=without_work or {})

    @property
    def stages(self) -> tuple[int, ...]:
        """The selected stages the run may submit (those without work left out)."""
        return tuple(s for s in self.request.stages if s not in self.without_work)

    def predecessor(self, stage: int) -> int:
        """The stage whose ``best.pt`` ``stage`` starts from: the one before it, or, where that one is
        not submitted (:attr:`without_work`), the one before that (stage 3 without stage 2: stage 1,
        the draft stage 2's untrained start hands on)."""
        before = stage - 1
        while before > 1 and before in self.without_work:
            before -= 1
        return before

    @property
    def data_preset(self) -> str | None:
        return SYNTHETIC_PRESETS[self.request.config] if self.synthetic_data else None

    def job_specs(self) -> dict[JobLabel, JobSpec]:
        """Every job this run may submit, by label (``preflight``, ``data``, ``stage0``.. , ``export``)."""
        r = self.request
        specs: dict[JobLabel, JobSpec] = {PREFLIGHT: JobSpec.preflight(config=r.config_path)}
        if self.data_preset is not None:
            specs[DATA] = JobSpec.data(self.data_preset, config=r.config_path)
        for stage in STAGES:
            specs[JobLabel.of_stage(stage)] = JobSpec.train(stage, config=r.config_path, time_limit=r.time_limit,
                                                   max_epochs=r.max_epochs, partition=r.partition,
                                                   nodes=r.nodes, gpus_per_node=r.gpus_per_node,
                                                   on_code_change=r.on_code_change)
        specs[EXPORT] = JobSpec.export(config=r.config_path)
        return specs

    def training_labels(self) -> list[JobLabel]:
        """Labels of the jobs that spend training time, for the preflight checks."""
        labels = [JobLabel.of_stage(s) for s in self.stages]
        return labels + ([EXPORT] if self.request.export else [])


def decide(plan: StagePlan, stage: int, files: StageFiles, paths: RunPaths) -> Decision:
    """Submit or skip training stage ``stage``; raise when it would run without its input."""
    r = plan.request
    if not r.selected(stage):
        return Decision(Action.SKIP, f"stage {stage} not selected (stages {list(r.stages)})")
    if stage in plan.without_work:
        return Decision(Action.SKIP, plan.without_work[stage])
    if r.dry_run:
        return Decision(Action.SKIP, f"dry run: stage {stage} rendered and checked, not submitted")
    restart = r.mode == "restart"
    if files.is_complete and not restart:
        return Decision(Action.SKIP, f"stage {stage} is complete ({paths.complete_path(stage)} and "
                                     f"{paths.best_checkpoint(stage)} exist); mode restart trains it again")
    if stage > 0 and not files.predecessor_best:
        before = plan.predecessor(stage)
        raise StageDecisionError(
            f"stage {stage} reads stage {before}'s best.pt, but {paths.best_checkpoint(before)} does not "
            f"exist; run stage {before} first (e.g. stages=[{before}, {stage}])"
        )
    why = "mode restart" if restart else ("resuming from latest.pt" if files.complete is None and files.best
                                          else "not complete")
    return Decision(Action.SUBMIT, f"stage {stage}: {why}", restart=restart)


def decide_data(plan: StagePlan, index_size: int | None) -> Decision:
    """The synthetic dataset job: only where the profile has no real data and none is prepared yet."""
    if plan.data_preset is None:
        return Decision(Action.SKIP, "the profile's prepared dataset is provided by the cluster")
    if plan.request.dry_run:
        return Decision(Action.SKIP, "dry run: no data job")
    if index_size:
        return Decision(Action.SKIP, f"the prepared dataset exists ({DATA_INDEX} found)")
    return Decision(Action.SUBMIT, f"no prepared dataset: generating the {plan.data_preset} synthetic one")


@dataclass(frozen=True)
class ExportFiles:
    """What the export task finds on the cluster before it submits."""

    marker: str | None
    """The text of the viewer directory's ``EXPORTED`` (None: missing)."""
    stamps: Mapping[str, tuple[int, int]]
    """(size, mtime) of each export input that exists, by name (:func:`vcloud.contract.export_input_names`)."""


def decide_export(plan: StagePlan, files: ExportFiles | None, paths: RunPaths) -> Decision:
    """Submit the export unless its marker names the stage outputs there are now: clearing or
    re-running an exported run exports again only when a stage's outputs changed since. ``files``
    None: not looked at (a run that exports nothing or submits nothing reads no file)."""
    r = plan.request
    if not r.export:
        return Decision(Action.SKIP, "export not requested")
    if r.dry_run:
        return Decision(Action.SKIP, "dry run: no export job")
    if files is None:
        return Decision(Action.SUBMIT, "exporting the viewer data of the best stage")
    now = export_inputs_digest(files.stamps)
    before = exported_inputs(files.marker)
    if before == now:
        return Decision(Action.SKIP, f"already exported from these stage outputs (inputs {now}, "
                                     f"{paths.exported_marker}); a stage's new outputs export again")
    if files.marker is None:
        why = f"not exported yet ({paths.exported_marker} missing)"
    elif before is None:
        why = f"{paths.exported_marker} unreadable"
    else:
        why = f"the stage outputs changed since the last export (inputs {before}, now {now})"
    return Decision(Action.SUBMIT, f"exporting the viewer data of the best stage: {why}")

