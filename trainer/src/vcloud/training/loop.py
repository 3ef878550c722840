"""The training loop of one stage, identical for all four stages.

Reads top to bottom: load the latest checkpoint; build model, data and optimizer (everything,
before DDP wraps the model); then loop over epochs and steps - train a step, print a step line now
and then (:mod:`vcloud.training.monitor`, which also writes ``metrics.jsonl`` and TensorBoard files),
checkpoint every ``checkpoint_every_steps`` or when a stop signal arrived, and at each epoch end
evaluate, keep ``best.pt``, checkpoint and print one progress line; finally, at the epoch count or
once validation has not improved for ``train.stage{N}.patience`` validations
(:mod:`vcloud.training.early_stop`), write ``COMPLETE`` with the reason.

Resuming is exact: the checkpoint stores the position inside the epoch, every RNG state and the
running epoch statistics, the data order is a pure function of (seed, epoch), and the learning
rate a pure function of the position, so an interrupted and resumed CPU run ends with the same
weights, bit for bit, as an uninterrupted one. A checkpoint that other code wrote is resumed as far
as its fingerprint allows (:mod:`vcloud.training.fingerprint`): as written, or its weights with a fresh
optimizer state (``train.on_code_change: keep_weights``), or not at all (exit 88, with the remedies).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import math
import shutil
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset

from vcloud import exitcodes, lineage
from vcloud.contract import STOP_EPOCHS
from vcloud.checkpoint import load_latest, remove_stale_temporaries, save_checkpoint
from vcloud.config import StageTrainConfig, VCloudConfig
from vcloud.optim import build_optimizer, set_learning_rate
from vcloud.stage_records import BestCheckpoint
from vcloud.stage_registry import Batch, BuildContext, StageError, StageSpec, build_context, get_stage
from vcloud.training import markers
from vcloud.training.best import improves, keeps_trained
from vcloud.training.distributed import DistContext, all_reduce_sum, barrier, gather_to_main, max_over_ranks
from vcloud.training.early_stop import StageStop, stage_stop
from vcloud.training.fingerprint import (
    ResumeDecision,
    ResumeOutcome,
    after_failed_optimizer_load,
    after_failed_weights_load,
    checkpoint_fingerprint,
    decide_resume,
    fingerprint_of,
    fresh_optimizer_line,
    refusal_message,
)
from vcloud.training.paths import StagePaths
from vcloud.training.precision import Precision, resolve_precision
from vcloud.training.provenance import code_hash, code_version
from vcloud.training.mirror import mirror_after_checkpoint
from vcloud.training.monitor import StageMonitor
from vcloud.training.rng import capture_rng_state, restore_rng_state, seed_everything
from vcloud.training.sampling import ResumableSampler, ShardSampler
from vcloud.training.schedule import lr_at, validates_after_epoch
from vcloud.training.step_log import LogCadence, StageSteps
from vcloud.training.signals import RequeuePolicy, StopRequest, request_requeue
from vcloud.training.workers import shield_loader_kwargs, shielded_batches

log = logging.getLogger("vcloud.train")


class TrainingError(RuntimeError):
    """Training cannot continue (diverged loss, too little data); the message says why."""


class ResumeRefused(RuntimeError):
    """``latest.pt`` cannot be resumed by this code as the run asked (see
    :mod:`vcloud.training.fingerprint`); the message names both code hashes and what to do."""


@dataclass(frozen=True)
class StageRun:
    """What to train and where: the resolved command line."""

    stage: int
    config: VCloudConfig
    data_root: Path
    run_dir: Path
    restart: bool = False
    max_epochs: int | None = None
    """Overrides ``train.stage{N}.epochs`` (the stage's total epoch count)."""
    requeue: RequeuePolicy = RequeuePolicy(job_id=None, allowed=False)


@dataclass
class TrainState:
    """Counters that move during training; all of it goes into ``latest.pt``."""

    epoch: int = 0
    """Epoch in progress (0-based); equals the number of completed epochs when batch_in_epoch is 0."""
    batch_in_epoch: int = 0
    """Batches of ``epoch`` already trained."""
    global_step: int = 0
    epoch_loss_sum: float = 0.0
    epoch_samples: int = 0
    epoch_seconds: float = 0.0
    best: dict[str, Any] | None = None
    """``{"name", "value", "epoch", "metrics"}`` of the best validation so far: the epoch whose
    weights are ``best.pt`` (0 = the starting model) and all its validation metrics."""
    last_metrics: dict[str, float] = field(default_factory=dict)
    history: list[dict[str, Any]] = field(default_factory=list)
    log_loss_sum: float = 0.0
    """Loss x samples since the last step line; checkpointed, so the first line after a resume
    averages the same steps as an uninterrupted run's (see :mod:`vcloud.training.monitor`)."""
    log_samples: int = 0

    def count_step(self, loss: float, batch_size: int) -> None:
        self.batch_in_epoch += 1
        self.global_step += 1
        self.epoch_loss_sum += loss * batch_size
        self.epoch_samples += batch_size

    def start_epoch(self) -> None:
        self.batch_in_epoch = 0
        self.epoch_loss_sum = 0.0
        self.epoch_samples = 0
        self.epoch_seconds = 0.0


@dataclass(frozen=True)
class PhaseData:
    """Training data of one curriculum phase: its loader and the sampler that positions it."""

    phase: str
    loader: DataLoader
    sampler: ResumableSampler


@dataclass(frozen=True)
class StageSession:
    """Everything the loop trains with, built once (and completely) before the first step."""

    run: StageRun
    spec: StageSpec
    paths: StagePaths
    budget: StageTrainConfig
    """Epochs, batch size and lr of this stage (epochs after ``--max-epochs``)."""
    ctx: DistContext
    version: str
    model_section: dict[str, Any]
    """The architecture actually built (from the checkpoint when resuming)."""
    model: nn.Module
    """The unwrapped model: what is saved, evaluated and exported."""
    optimizer: torch.optim.Optimizer
    precision: Precision
    phases: dict[str, PhaseData]
    val_loader: DataLoader
    start_tolerance: float | None = None
    """From the stage spec (see ``StageSpec.start_tolerance``): None = trained weights must beat the start."""
    built_from: dict[int, str] = field(default_factory=dict)
    """The digest of each predecessor ``best.pt`` the model was built from (:mod:`vcloud.lineage`)."""

    def phase(self, epoch: int) -> str:
        return _phase(self.run, self.spec, self.budget, min(epoch, self.budget.epochs - 1))


# ---- the loop ---------------------------------------------------------------------------------

def train_stage(run: StageRun, ctx: DistContext, stop: StopRequest) -> int:
    """Train ``run.stage`` to its epoch count or until its validation stops improving (exit 0), or
    until a stop signal (exit 85)."""
    paths = StagePaths(run.run_dir, run.stage)
    budget = _stage_budget(run)
    if run.restart and ctx.is_main:
        move_stage_aside(paths, "--restart")
    barrier(ctx)
    resumed = load_latest(paths.latest)
    checkpoint = resumed[0] if resumed else None
    if checkpoint is None and paths.best.exists():
        if ctx.is_main:
            move_stage_aside(paths, f"{paths.best.name} without a latest.pt to resume from")
        barrier(ctx)
    if checkpoint is not None and checkpoint["batch_in_epoch"] == 0:
        saved = TrainState(**checkpoint["train_state"])
        done = _stage_stop(run, get_stage(run.stage), budget, saved)
        if done is not None:  # a rerun with more epochs or patience trains on
            if ctx.is_main:
                built_from = lineage.recorded_lineage(checkpoint) if lineage.LINEAGE_KEY in checkpoint else None
                _finish(run, paths, budget, saved, done, already=True, built_from=built_from)
            return exitcodes.STAGE_COMPLETE

    session = _build_session(run, ctx, paths, budget, checkpoint)  # everything, before DDP (seed 002)
    state = _restore(session, resumed[0], resumed[1]) if resumed is not None else TrainState()
    train_model: nn.Module = session.model
    if ctx.distributed:
        train_model = DistributedDataParallel(
            session.model, device_ids=[ctx.device.index] if ctx.device.type == "cuda" else None)
    if ctx.is_main:
        paths.dir.mkdir(parents=True, exist_ok=True)
        remove_stale_temporaries(paths.dir)
        paths.complete.unlink(missing_ok=True)  # stale if the epoch count was raised since
        log.info("stage %d (%s): epoch %d/%d, step %d, precision %s, batch %d x %d rank(s), %s",
                 run.stage, session.spec.name, state.epoch, budget.epochs, state.global_step,
                 session.precision.name, budget.batch_size, ctx.world_size,
                 f"resumed from {resumed[1].name}" if resumed else "fresh start")
        _write_progress(session, state, markers.STATUS_RUNNING)
    monitor = _open_monitor(session, state.global_step if checkpoint is not None else None)

    if checkpoint is None and session.spec.validate_start:
        _validate_start(session, state)
        monitor.validation(state.global_step, 0, state.last_metrics)

    every = run.config.train.checkpoint_every_steps
    done = None
    while state.epoch < budget.epochs:
        data = session.phases[session.phase(state.epoch)]
        data.sampler.set_position(state.epoch, state.batch_in_epoch)
        data.loader.generator.manual_seed(_epoch_seed(run.config.train.seed, state.epoch))
        train_model.train()
        tick = time.perf_counter()
        with shielded_batches(data.loader) as batches:
            for batch in batches:
                lr = lr_at(run.config.train, budget, epoch=state.epoch, batch=state.batch_in_epoch,
                           batches_per_epoch=data.sampler.batches_per_epoch, global_step=state.global_step)
                loss = _train_step(session, train_model, _to_device(batch, ctx.device), lr)
                state.count_step(loss, budget.batch_size)
                monitor.step(state, loss, lr, budget.batch_size)
                stop_signal = max_over_ranks(ctx, stop.signal_number or 0)
                mid_epoch = state.batch_in_epoch < data.sampler.batches_per_epoch
                if stop_signal or (every and state.global_step % every == 0 and mid_epoch):
                    state.epoch_seconds += time.perf_counter() - tick
                    tick = time.perf_counter()
                    _save_latest(session, state)
                    if stop_signal:
                        monitor.close()
                        return _stop(session, state, stop_signal)
                    if ctx.is_main:
                        _write_progress(session, state, markers.STATUS_RUNNING)
        state.epoch_seconds += time.perf_counter() - tick

        evaluated = validates_after_epoch(run.config.train, budget.epochs, state.epoch)
        if evaluated:
            state.last_metrics = evaluate(session.spec, session.model, session.val_loader, session.precision, ctx)
            monitor.validation(state.global_step, state.epoch + 1, state.last_metrics)
        improved = evaluated and _update_best(run, state, tolerance=session.start_tolerance)
        record = _epoch_record(state, data, ctx, session.optimizer.param_groups[0]["lr"], evaluated)
        state.history.append(record)
        if improved:
            _save_best(session, state)
        state.epoch += 1
        state.start_epoch()
        done = _stage_stop(run, session.spec, budget, state)  # the same on every rank
        stop_signal = max_over_ranks(ctx, stop.signal_number or 0) if done is None else 0
        if done is not None or stop_signal or state.epoch % run.config.train.checkpoint_every_epochs == 0:
            _save_latest(session, state)
        if ctx.is_main:
            log.info(format_epoch_line(run.stage, budget.epochs, record, improved))
            _write_progress(session, state, markers.STATUS_RUNNING)
        if stop_signal:
            monitor.close()
            return _stop(session, state, stop_signal)
        if done is not None:
            break

    monitor.close()
    if ctx.is_main:
        done = done or _stage_stop(run, session.spec, budget, state) or StageStop(
            STOP_EPOCHS, f"trained its {budget.epochs} epochs", budget.epochs)
        _finish(run, paths, budget, state, done, already=False, built_from=session.built_from)
    barrier(ctx)
    return exitcodes.STAGE_COMPLETE


def _train_step(session: StageSession, model: nn.Module, batch: Batch, lr: float) -> float:
    """One optimizer step; ``model`` is the DDP wrapper under torchrun so gradients are averaged."""
    optimizer = session.optimizer
    set_learning_rate(optimizer, lr)
    with session.precision.autocast():
        loss = session.spec.loss(model, batch)
    if not torch.isfinite(loss):
        raise TrainingError(
            f"loss is {loss.item()} at lr {lr:.3g}: training diverged. Lower train.stage{session.run.stage}.lr, "
            "check the data for NaNs, or resume from latest.prev.pt"
        )
    loss.backward()  # outside autocast; bf16 needs no GradScaler (see vcloud.training.precision)
    clip_norm = session.run.config.train.grad_clip_norm
    if clip_norm > 0:
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip_norm)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return float(loss.detach())


def evaluate(spec: StageSpec, model: nn.Module, loader: DataLoader, precision: Precision,
             ctx: DistContext) -> dict[str, float]:
    """Per-sample means of the :mod:`vcloud.metrics` over the whole validation split (all ranks)."""
    from vcloud.metrics import METRIC_NAMES, MetricTotals

    was_training = model.training
    model.eval()
    totals = MetricTotals()
    with torch.no_grad(), shielded_batches(loader) as batches:
        for batch in batches:
            batch = _to_device(batch, ctx.device)
            with precision.autocast():
                prediction = spec.predict(model, batch)
            totals.update(prediction.float(), batch["target"].float())
    model.train(was_training)
    summed = all_reduce_sum(ctx, [float(totals.count)] + [totals.sums[k] for k in METRIC_NAMES])
    if summed[0] == 0:
        raise TrainingError("the validation split is empty: re-run vcloud.data.prepare with more locations")
    return {name: total / summed[0] for name, total in zip(METRIC_NAMES, summed[1:])}


def format_epoch_line(stage: int, epochs: int, record: dict[str, Any], improved: bool) -> str:
    """``stage 0 | epoch 3/50 | loss 0.0412 | PSNR 31.52 dB | lr 1.8e-04 | 95.1 s | 8.4 samples/s``."""
    psnr = record.get("val_psnr")
    parts = [
        f"stage {stage}",
        f"epoch {record['epoch']}/{epochs}",
        f"loss {record['train_loss']:.4f}",
        f"PSNR {psnr:.2f} dB" if psnr is not None else "PSNR -",
        f"lr {record['lr']:.1e}",
        f"{record['seconds']:.1f} s",
        f"{record['samples_per_s']:.1f} samples/s",
    ]
    if record.get("phase") and record["phase"] != "all":
        parts.append(f"phase {record['phase']}")
    if improved:
        parts.append("best")
    return " | ".join(parts)


# ---- building blocks --------------------------------------------------------------------------

def _build_session(run: StageRun, ctx: DistContext, paths: StagePaths, budget: StageTrainConfig,
                   checkpoint: dict[str, Any] | None) -> StageSession:
    """Model, datasets of every curriculum phase, loaders and optimizer, on every rank alike."""
    spec = get_stage(run.stage)
    seed_everything(run.config.train.seed + ctx.rank)
    build_ctx = build_context(run.config, run.run_dir, ctx.device, data_root=run.data_root)
    model_section = _model_section(run, checkpoint)
    model_config = _parse_model_config(run, spec, model_section, checkpoint, paths.latest)
    model = spec.build_model(model_config, build_ctx).to(ctx.device)
    optimizer = build_optimizer(model, budget.lr, run.config.train.weight_decay)
    return StageSession(
        run=run, spec=spec, paths=paths, budget=budget, ctx=ctx, version=code_version(),
        model_section=model_section, model=model, optimizer=optimizer,
        precision=resolve_precision(ctx.device.type, run.config.memory.bf16),
        phases=_build_train_data(run, spec, budget, ctx, build_ctx),
        val_loader=_build_val_loader(run, budget, ctx),
        start_tolerance=spec.start_tolerance(model_config) if spec.start_tolerance is not None else None,
        built_from=dict(build_ctx.built_from),
    )


def _parse_model_config(run: StageRun, spec: StageSpec, section: dict[str, Any],
                        checkpoint: dict[str, Any] | None, source: Path) -> Any:
    """The stage's model config; a checkpoint's architecture this code no longer accepts is a
    refused resume (its weights cannot fit a model this code cannot build), not a traceback."""
    if checkpoint is None:
        return spec.parse_model_config(section)
    try:
        return spec.parse_model_config(section)
    except ValueError as exc:
        decision = ResumeDecision(ResumeOutcome.REFUSE_WEIGHTS,
                                  weights=(f"this code cannot build the checkpoint's architecture ({exc})",))
        raise ResumeRefused(refusal_message(decision, stage=run.stage, source=str(source),
                                            saved_hash=checkpoint.get("code_hash"), running_hash=code_hash())) from None


def _open_monitor(session: StageSession, resumed_step: int | None) -> StageMonitor:
    """Step lines and curve files; ``resumed_step``: the checkpoint's global step (None: fresh start)."""
    run, budget, paths = session.run, session.budget, session.paths
    epochs = range(budget.epochs)
    steps = StageSteps(
        batches=tuple(session.phases[session.phase(e)].sampler.batches_per_epoch for e in epochs),
        validates=tuple(validates_after_epoch(run.config.train, budget.epochs, e) for e in epochs))
    return StageMonitor.open(
        stage=run.stage, stage_dir=paths.dir, metrics_path=paths.metrics, tensorboard_dir=paths.tensorboard,
        steps=steps, cadence=LogCadence(run.config.train.log_every_steps, run.config.train.log_every_seconds),
        world_size=session.ctx.world_size, is_main=session.ctx.is_main, resumed_step=resumed_step)


def _stage_budget(run: StageRun) -> StageTrainConfig:
    budget = run.config.train.for_stage(run.stage)
    if run.max_epochs is not None:
        budget = dataclasses.replace(budget, epochs=run.max_epochs)
    return budget


def _stage_stop(run: StageRun, spec: StageSpec, budget: StageTrainConfig, state: TrainState) -> StageStop | None:
    """Whether the stage stops after ``state.epoch`` epochs (:mod:`vcloud.training.early_stop`)."""
    metric = run.config.train.best_metric
    validated = [record["epoch"] for record in state.history if f"val_{metric}" in record]
    return stage_stop(epochs_done=state.epoch, epochs=budget.epochs, patience=budget.patience,
                      validated=validated, best_epoch=state.best["epoch"] if state.best else None,
                      phase_start=_phase_start(run, spec, budget, state.epoch), metric=metric)


def _phase_start(run: StageRun, spec: StageSpec, budget: StageTrainConfig, epoch: int) -> int:
    """The first epoch (0-based) of the curriculum phase of epoch ``epoch``; 0 without a curriculum."""
    if not spec.uses_curriculum or epoch >= budget.epochs:
        return 0
    phase = _phase(run, spec, budget, epoch)
    while epoch > 0 and _phase(run, spec, budget, epoch - 1) == phase:
        epoch -= 1
    return epoch


def _model_section(run: StageRun, checkpoint: dict[str, Any] | None) -> dict[str, Any]:
    """Architecture from the checkpoint when resuming; the YAML may have moved on since."""
    configured = run.config.model.section(run.stage)
    if checkpoint is None:
        return configured
    saved = dict(checkpoint["model_config"])
    if saved != configured:
        log.warning("model.stage%d in the config differs from the checkpoint; resuming with the "
                    "checkpoint's architecture %s (start over with --restart to use the new one)",
                    run.stage, saved)
    return saved


def _phase(run: StageRun, spec: StageSpec, budget: StageTrainConfig, epoch: int) -> str:
    from vcloud.data.curriculum import phase_for_epoch

    return phase_for_epoch(epoch, _curriculum(run, spec, budget))


def _curriculum(run: StageRun, spec: StageSpec, budget: StageTrainConfig) -> Any:
    from vcloud.data.curriculum import CurriculumSchedule

    if not spec.uses_curriculum:
        return None
    c = run.config.data.curriculum
    return CurriculumSchedule(total_epochs=budget.epochs, mixed_from=c.mixed_from_epoch,
                              all_from=c.all_from_epoch)


def _epoch_seed(seed: int, epoch: int) -> int:
    """Seed of the loader's generator (worker seeds) for ``epoch``: a pure function of both."""
    return (seed * 1_000_003 + epoch) % 2**63


def _loader_kwargs(run: StageRun, batch_size: int, ctx: DistContext) -> dict[str, Any]:
    from vcloud.data.loader import dataloader_kwargs

    return shield_loader_kwargs(dataloader_kwargs(
        batch_size, run.config.data.num_workers, shuffle=False, seed=run.config.train.seed,
        prefetch_factor=run.config.data.prefetch_factor, persistent_workers=False,
        pin_memory=ctx.device.type == "cuda", drop_last=False))


def _build_train_data(run: StageRun, spec: StageSpec, budget: StageTrainConfig, ctx: DistContext,
                      build_ctx: BuildContext) -> dict[str, PhaseData]:
    """One dataset, sampler and loader per curriculum phase the stage will visit, all built now."""
    from vcloud.data.curriculum import PHASE_CLOUD_TYPES
    from vcloud.data.dataset import SeriesDataset, dataset_len

    phases = sorted({_phase(run, spec, budget, e) for e in range(budget.epochs)}, key=list(PHASE_CLOUD_TYPES).index)
    out: dict[str, PhaseData] = {}
    for phase in phases:
        cloud_types = PHASE_CLOUD_TYPES[phase] if spec.uses_curriculum else None
        dataset: Dataset = SeriesDataset(run.data_root, "train", cloud_types)
        if spec.train_dataset is not None:
            dataset = spec.train_dataset(dataset, build_ctx)
        sampler = ResumableSampler(dataset, batch_size=budget.batch_size, seed=run.config.train.seed,
                                   world_size=ctx.world_size, rank=ctx.rank)
        if sampler.batches_per_epoch == 0:
            raise TrainingError(
                f"curriculum phase {phase!r} has {dataset_len(dataset)} training series under "
                f"{run.data_root}: fewer than batch_size {budget.batch_size} x {ctx.world_size} rank(s). Lower "
                f"train.stage{run.stage}.batch_size or prepare more data"
            )
        loader = DataLoader(dataset, sampler=sampler, **_loader_kwargs(run, budget.batch_size, ctx))
        out[phase] = PhaseData(phase=phase, loader=loader, sampler=sampler)
    return out


def _build_val_loader(run: StageRun, budget: StageTrainConfig, ctx: DistContext) -> DataLoader:
    from vcloud.data.dataset import SeriesDataset

    dataset = SeriesDataset(run.data_root, "val")
    sampler = ShardSampler(dataset, world_size=ctx.world_size, rank=ctx.rank)
    return DataLoader(dataset, sampler=sampler, **_loader_kwargs(run, budget.batch_size, ctx))


def _to_device(batch: Batch, device: torch.device) -> Batch:
    """The batch on ``device``; floating tensors in the parameters' dtype (``torch.get_default_dtype()``).

    Stacks load as float32, so this changes nothing in a normal run; a float64 reference run (default
    dtype set to float64 before the model is built, as the numerical parity tests do) needs no other
    change for its inputs to match its weights."""
    dtype = torch.get_default_dtype()
    return {k: (v.to(device, dtype=dtype, non_blocking=True) if v.is_floating_point()
                else v.to(device, non_blocking=True)) if isinstance(v, torch.Tensor) else v
            for k, v in batch.items()}


def _update_best(run: StageRun, state: TrainState, epoch: int | None = None,
                 tolerance: float | None = None) -> bool:
    """Record the last validation as the best if it beats it; ``epoch`` defaults to the one just done.

    While the best is still the stage's starting model (epoch 0), a trained epoch must beat it by
    ``train.start_min_gain``. With a ``tolerance`` (validation only guards the stage) the latest
    epoch that loses at most that much against the start is the best instead. Every best after a
    validated start carries the start's score (``start_value``: what the stage's gain is measured
    against, :attr:`vcloud.stage_records.CompleteRecord.validation_gain`)."""
    name = run.config.train.best_metric
    value = state.last_metrics.get(name)
    if value is None or math.isnan(value):
        return False
    best = state.best
    if best is None:
        better = True
    elif tolerance is not None:
        better = keeps_trained(name, value, best.get("start_value", best["value"]), tolerance=tolerance)
    elif best["epoch"] == 0:
        better = keeps_trained(name, value, best["value"], min_gain=run.config.train.start_min_gain)
    else:
        better = improves(name, value, best["value"])
    if better:
        record = {"name": name, "value": value, "epoch": state.epoch + 1 if epoch is None else epoch,
                  "metrics": dict(state.last_metrics)}
        # Each later best carries the start's score: what the stage's gain is measured against (and,
        # with a tolerance, what it may not lose more than against).
        if best is None:
            start = value if epoch == 0 or tolerance is not None else None
        else:
            start = best.get("start_value")
            if start is None and (tolerance is not None or best["epoch"] == 0):  # a checkpoint of older code
                start = best["value"]
        if start is not None:
            record["start_value"] = start
        state.best = record
    return better


def _validate_start(session: StageSession, state: TrainState) -> None:
    """Score the model before its first step and keep it as ``best.pt`` (epoch 0).

    For a stage that starts from its predecessor's answer (stage 2's untrained refiner returns
    the draft, stage 3 starts from stage 2), ``best.pt`` then never scores worse on validation
    than what the stage was given, however its training goes; training replaces it only by beating
    it by ``train.start_min_gain``.
    """
    run, ctx = session.run, session.ctx
    state.last_metrics = evaluate(session.spec, session.model, session.val_loader, session.precision, ctx)
    if _update_best(run, state, epoch=0, tolerance=session.start_tolerance):
        _save_best(session, state, epoch=0)
    if ctx.is_main:
        log.info("stage %d before training: %s", run.stage, _fmt_best(state.best))


def _epoch_record(state: TrainState, data: PhaseData, ctx: DistContext, lr: float,
                  evaluated: bool) -> dict[str, Any]:
    samples = state.epoch_samples * ctx.world_size
    seconds = state.epoch_seconds
    record: dict[str, Any] = {
        "epoch": state.epoch + 1,
        "step": state.global_step,
        "phase": data.phase,
        "train_loss": state.epoch_loss_sum / max(state.epoch_samples, 1),
        "lr": lr,
        "seconds": seconds,
        "samples_per_s": samples / seconds if seconds > 0 else 0.0,
    }
    if evaluated:
        record.update({f"val_{k}": v for k, v in state.last_metrics.items()})
    return record


# ---- checkpoints and markers ------------------------------------------------------------------

def _checkpoint_payload(session: StageSession, state: TrainState) -> dict[str, Any]:
    return {
        "stage": session.run.stage,
        "stage_name": session.spec.name,
        "model": session.model.state_dict(),
        "model_config": session.model_section,
        "config": session.run.config.to_dict(),
        "code_version": session.version,
        "code_hash": code_hash(),
        "fingerprint": fingerprint_of(session.model, session.optimizer).to_json(),
        lineage.LINEAGE_KEY: lineage.lineage_json(session.built_from),
        "epoch": state.epoch,
        "batch_in_epoch": state.batch_in_epoch,
        "global_step": state.global_step,
        "best_metric": state.best,
        "metrics": state.last_metrics,
        "saved_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
    }


def _save_latest(session: StageSession, state: TrainState) -> None:
    """Everything needed to continue exactly here. Collective (gathers every rank's RNG state);
    rank 0 writes."""
    rng_states = gather_to_main(session.ctx, capture_rng_state())
    if not session.ctx.is_main:
        return
    run, budget = session.run, session.budget
    payload = _checkpoint_payload(session, state)
    payload.update({
        "optimizer": session.optimizer.state_dict(),
        "lr_schedule": {"name": run.config.train.lr_schedule, "epochs": budget.epochs,
                        "lr": session.optimizer.param_groups[0]["lr"]},
        "train_state": dataclasses.asdict(state),
        "rng": rng_states,
        "world_size": session.ctx.world_size,
        "sampler": {"seed": run.config.train.seed, "epoch": state.epoch, "batch_in_epoch": state.batch_in_epoch,
                    "batch_size": budget.batch_size, "world_size": session.ctx.world_size},
        "curriculum_phase": session.phase(state.epoch),
    })
    save_checkpoint(session.paths.latest, payload, keep_previous=True)


def _save_best(session: StageSession, state: TrainState, epoch: int | None = None) -> None:
    """Inference checkpoint: model and provenance, no optimizer (later stages and export read it)."""
    if session.ctx.is_main:
        payload = _checkpoint_payload(session, state)
        payload.update(epoch=state.epoch + 1 if epoch is None else epoch, batch_in_epoch=0)
        save_checkpoint(session.paths.best, payload, keep_previous=False)


def _restore(session: StageSession, checkpoint: dict[str, Any], source: Path) -> TrainState:
    run, ctx = session.run, session.ctx
    if lineage.LINEAGE_KEY in checkpoint:  # checkpoints written before lineages were recorded resume as they are
        refused = lineage.resume_refusal(run.stage, source, lineage.recorded_lineage(checkpoint), session.built_from)
        if refused:
            raise StageError(refused)
    state = TrainState(**checkpoint["train_state"])
    fresh_optimizer = _load_checkpoint_state(session, checkpoint, source, state)
    saved_sampler = checkpoint["sampler"]
    now = {"seed": run.config.train.seed, "batch_size": session.budget.batch_size, "world_size": ctx.world_size}
    changed = {k: (saved_sampler[k], v) for k, v in now.items() if saved_sampler[k] != v}
    if changed and state.batch_in_epoch:
        log.warning("data order changed since the checkpoint (%s): epoch %d restarts from its first batch",
                    ", ".join(f"{k} {a} -> {b}" for k, (a, b) in changed.items()), state.epoch + 1)
        state.start_epoch()
    rng = checkpoint["rng"]
    if len(rng) == ctx.world_size:
        restore_rng_state(rng[ctx.rank])
    else:
        seed_everything(run.config.train.seed + ctx.rank + state.global_step)
    if ctx.is_main:
        log.info("resumed from %s: epoch %d, batch %d, step %d (written by %s, code %s)", source, state.epoch,
                 state.batch_in_epoch, state.global_step, checkpoint.get("code_version", "unknown code"),
                 checkpoint.get("code_hash") or "of unknown hash")
        if fresh_optimizer:
            log.warning("%s", fresh_optimizer)
        elif checkpoint.get("code_hash") and code_hash() and checkpoint["code_hash"] != code_hash():
            log.warning("the checkpoint was written by code %s; training goes on with code %s",
                        checkpoint["code_hash"], code_hash())
    return state


def _load_checkpoint_state(session: StageSession, checkpoint: dict[str, Any], source: Path,
                           state: TrainState) -> str | None:
    """Load the checkpoint's weights and optimizer state into the session as far as this code and
    ``train.on_code_change`` allow (:func:`~vcloud.training.fingerprint.decide_resume`); raises
    :class:`ResumeRefused` otherwise. Returns the log line that says why the optimizer starts
    fresh, or None when the checkpoint resumes as written.

    PyTorch checks an optimizer state's group sizes before it changes anything, so a refused
    ``load_state_dict`` leaves the optimizer as built: fresh."""
    run = session.run
    policy = run.config.train.on_code_change
    decision = decide_resume(checkpoint_fingerprint(checkpoint), fingerprint_of(session.model, session.optimizer),
                             policy)
    if not decision.refused:
        try:
            session.model.load_state_dict(checkpoint["model"])
        except (RuntimeError, ValueError, KeyError) as exc:
            decision = after_failed_weights_load(_first_line(exc))
    if decision.outcome is ResumeOutcome.RESUME:
        try:
            session.optimizer.load_state_dict(checkpoint["optimizer"])
        except (RuntimeError, ValueError, KeyError) as exc:
            decision = after_failed_optimizer_load(_first_line(exc), policy)
    saved_hash, running_hash = checkpoint.get("code_hash"), code_hash()
    if decision.refused:
        raise ResumeRefused(refusal_message(decision, stage=run.stage, source=str(source), saved_hash=saved_hash,
                                            running_hash=running_hash))
    if decision.outcome is ResumeOutcome.FRESH_OPTIMIZER:
        return fresh_optimizer_line(decision, stage=run.stage, source=str(source), saved_hash=saved_hash,
                                    running_hash=running_hash, epoch=state.epoch, step=state.global_step)
    return None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _write_progress(session: StageSession, state: TrainState, status: str) -> None:
    data = session.phases.get(session.phase(state.epoch))
    markers.write_json(session.paths.progress, markers.ProgressRecord(
        stage=session.run.stage, status=status, epoch=state.epoch, epochs_total=session.budget.epochs,
        step=state.global_step, batch_in_epoch=state.batch_in_epoch,
        batches_per_epoch=data.sampler.batches_per_epoch if data else 0, best=state.best,
        last_metrics=state.last_metrics or {}, history=tuple(state.history), world_size=session.ctx.world_size,
        device=session.ctx.device.type, code_hash=code_hash()).to_json())
    # Every checkpoint is followed by this marker: now both reach shared storage, when the job asked.
    mirror_after_checkpoint(session.paths.run_dir, session.paths.stage)


def _stop(session: StageSession, state: TrainState, stop_signal: int) -> int:
    """After the checkpoint: mark stopped, ask Slurm to requeue (rank 0), exit with the requeue code."""
    if session.ctx.is_main:
        _write_progress(session, state, markers.STATUS_STOPPED)
        log.info("stage %d stopped on %s at epoch %d, batch %d, step %d; checkpoint %s written",
                 session.run.stage, signal.Signals(stop_signal).name, state.epoch, state.batch_in_epoch,
                 state.global_step, session.paths.latest)
        request_requeue(session.run.requeue, stop_signal)
    barrier(session.ctx)
    return exitcodes.REQUEUE


def _finish(run: StageRun, paths: StagePaths, budget: StageTrainConfig, state: TrainState, done: StageStop, *,
            already: bool, built_from: dict[int, str] | None) -> None:
    """Write ``COMPLETE`` with why the stage stopped and what it was built from (and the final progress)."""
    final = state.history[-1] if state.history else {}
    final_metrics = {k[4:]: v for k, v in final.items() if k.startswith("val_")}
    if not paths.complete.exists():
        markers.write_json(paths.complete, markers.CompleteRecord(
            stage=run.stage, epochs=state.epoch, step=state.global_step, final_metrics=final_metrics,
            best=BestCheckpoint.from_json(state.best), code_version=code_version(), code_hash=code_hash(),
            stop=done.to_record(),
            lineage=lineage.lineage_json(built_from) if built_from is not None else None).to_json())
    written = markers.read_json(paths.progress)
    progress = (markers.ProgressRecord.from_json(written) if written is not None else
                markers.ProgressRecord(stage=run.stage, status=markers.STATUS_COMPLETE, epoch=state.epoch,
                                       epochs_total=budget.epochs, step=state.global_step))
    markers.write_json(paths.progress, progress.completed(
        epoch=state.epoch, epochs_total=budget.epochs, step=state.global_step, best=state.best,
        history=state.history, stop=done.to_record()).to_json())
    mirror_after_checkpoint(paths.run_dir, paths.stage)
    if already:
        log.info("stage %d already complete (%d/%d epochs, %s; best %s); nothing to do",
                 run.stage, state.epoch, budget.epochs, done.detail, _fmt_best(state.best))
    else:
        log.info("stage %d complete: %d epochs, %s; best %s", run.stage, state.epoch, done.detail,
                 _fmt_best(state.best))


def _fmt_best(best: dict[str, Any] | None) -> str:
    return f"{best['name']} {best['value']:.3f} at epoch {best['epoch']}" if best else "n/a"


def move_stage_aside(paths: StagePaths, reason: str) -> Path | None:
    """Rename the stage directory (best.pt included) to a timestamped sibling: nothing a run
    produced is deleted without a trace."""
    if not paths.dir.exists() or not any(paths.dir.iterdir()):
        return None
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    target = paths.dir.with_name(f"{paths.dir.name}.replaced-{stamp}")
    n = 1
    while target.exists():
        target = paths.dir.with_name(f"{paths.dir.name}.replaced-{stamp}-{n}")
        n += 1
    shutil.move(str(paths.dir), str(target))
    log.warning("%s: moved the previous stage %d outputs (best.pt included) to %s", reason, paths.stage, target)
    later = [p for p in paths.run_dir.glob("stage[0-9]") if p.name > paths.dir.name]
    if later:
        log.warning("later stages %s were trained on the replaced stage %d model; retrain them",
                    ", ".join(sorted(p.name for p in later)), paths.stage)
    return target
