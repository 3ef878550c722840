"""Typed, frozen training configuration loaded from ``trainer/configs/model_*.yaml``.

The YAML has four top-level sections: ``data`` (loading and curriculum), ``train`` (optimisation,
cadences, per-stage epochs/batch size/lr), ``model`` (one free-form mapping per stage, validated by
the stage's own model config class) and ``memory`` (the five switches that made the full model fit
a 64 GB MI250X GCD). Every section is a frozen dataclass; unknown keys are rejected at load time
with the list of valid ones, and every value is checked against its allowed range, so a typo fails
in seconds on the login node rather than hours later in the queue.
"""

from __future__ import annotations

import copy
import dataclasses
import types
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from vcloud.config_fields import ConfigError, build_config, require
from vcloud.contract import METRIC_NAMES, ON_CODE_CHANGE_CHOICES, ON_CODE_CHANGE_DEFAULT, STAGES

LR_SCHEDULES = ("cosine", "constant")


@dataclass(frozen=True)
class CurriculumConfig:
    """Cloud-type curriculum of the draft model: ``thin_only`` -> ``mixed`` -> ``all``."""

    mixed_from_epoch: int = 30
    """First epoch that also trains on thick clouds (production: 30 of 100)."""
    all_from_epoch: int = 90
    """First epoch that trains on every cloud type, opaque included (production: 90 of 100)."""

    def __post_init__(self) -> None:
        s = "data.curriculum"
        require(self.mixed_from_epoch >= 0, s, "mixed_from_epoch", self.mixed_from_epoch, "an integer >= 0")
        require(self.all_from_epoch >= self.mixed_from_epoch, s, "all_from_epoch", self.all_from_epoch,
               f"an integer >= mixed_from_epoch={self.mixed_from_epoch}")


@dataclass(frozen=True)
class DataConfig:
    """How batches are loaded."""

    num_workers: int = 0
    """DataLoader worker processes per rank; 0 loads in the training process (debugging, CI)."""
    prefetch_factor: int = 2
    """Batches each worker loads ahead; only passed to the DataLoader when num_workers > 0."""
    curriculum: CurriculumConfig = field(default_factory=CurriculumConfig)
    """Epoch boundaries of the cloud-type curriculum (stages that use it)."""

    def __post_init__(self) -> None:
        require(self.num_workers >= 0, "data", "num_workers", self.num_workers, "an integer >= 0")
        require(self.prefetch_factor >= 1, "data", "prefetch_factor", self.prefetch_factor, "an integer >= 1")


OFF_BY_DEFAULT_NEVER: tuple[int, ...] = (0, 1)
"""Stages every later stage needs trained: ``run_by_default`` must stay true."""


@dataclass(frozen=True)
class StageTrainConfig:
    """Per-stage optimisation budget."""

    epochs: int = 1
    """Epochs the stage trains for; reaching it writes ``COMPLETE``."""
    batch_size: int = 1
    """Samples per step on each rank (global batch = batch_size x world size)."""
    lr: float = 2.0e-4
    """Peak learning rate of AdamW."""
    patience: int = 0
    """Validations in a row without a gain in ``train.best_metric`` after which the stage stops
    before its epoch count, hands on its ``best.pt`` and writes ``COMPLETE`` with the reason (its job
    then ends, releasing its GPUs); 0 = always train every epoch. A gain is what replaces
    ``best.pt`` (stages 1-3: beating the start by ``start_min_gain`` first). With a curriculum only
    validations after the current phase's first epoch count (:mod:`vcloud.training.early_stop`)."""
    run_by_default: bool = True
    """Whether the training pipeline submits the stage unless a run asks for it (``force_stages``).
    A stage that measured no gain over the model it starts from is off by default: a later stage
    then starts from the stage's untrained start (stage 3 without stage 2: stage 1's draft, which
    is what stage 2 hands on when it keeps its start; :func:`vcloud.models.stage_specs.stage2_teacher`)."""

    def validate(self, section: str) -> None:
        require(self.epochs >= 1, section, "epochs", self.epochs, "an integer >= 1")
        require(self.batch_size >= 1, section, "batch_size", self.batch_size, "an integer >= 1")
        require(0.0 < self.lr < 1.0, section, "lr", self.lr, "a float in (0, 1)")
        require(self.patience >= 0, section, "patience", self.patience,
                "an integer >= 0 (validations without a gain before the stage stops; 0 = never early)")


@dataclass(frozen=True)
class TrainConfig:
    """Optimisation, cadences and reproducibility, shared by all stages."""

    seed: int = 0
    """Seeds every RNG; the data order is a pure function of (seed, epoch)."""
    lr_schedule: str = "cosine"
    """``cosine`` decays to ``min_lr_ratio`` x lr over the stage's epochs; ``constant`` keeps lr."""
    warmup_steps: int = 0
    """Optimizer steps of linear warm-up from 0 to lr at the start of a stage."""
    min_lr_ratio: float = 0.1
    """Final learning rate of the cosine schedule as a fraction of lr."""
    weight_decay: float = 0.0
    """AdamW decoupled weight decay."""
    grad_clip_norm: float = 1.0
    """Clip the global gradient norm to this value; 0 disables clipping."""
    checkpoint_every_epochs: int = 1
    """Write ``latest.pt`` after every N-th epoch (and always after the last one)."""
    checkpoint_every_steps: int = 0
    """Also write ``latest.pt`` every N optimizer steps within an epoch; 0 only at epoch ends.
    Bounds the work lost to a node failure on long epochs (production: ~25 min each)."""
    eval_every_epochs: int = 1
    """Validate after every N-th epoch (and always after the last one)."""
    log_every_steps: int = 0
    """Print a step line (loss, lr, samples/s, ETAs) and append it to the stage's ``metrics.jsonl``
    and TensorBoard files every N optimizer steps; 0 = by time (``log_every_seconds``)."""
    log_every_seconds: float = 60.0
    """With ``log_every_steps: 0``: a step line at the first step that ends this many seconds after
    the previous line (at least one step per line), so a 25-minute production epoch prints about 25
    lines whatever its step time. Runs that must log the same steps every time (tests, tiny) set
    ``log_every_steps`` instead."""
    best_metric: str = "psnr"
    """Validation metric that selects ``best.pt``."""
    start_min_gain: float = 0.0
    """How much a stage that starts from its predecessor's answer (stages 1-3 score their starting
    model as epoch 0) must improve ``best_metric`` on validation, in that metric's units (dB for
    psnr), before trained weights replace the start as ``best.pt``. A fine-tuning stage whose gain
    is within the noise of the validation split then hands on the model it was given."""
    on_code_change: str = ON_CODE_CHANGE_DEFAULT
    """What a resume does when ``latest.pt`` was written by code whose optimizer layout differs (its
    groups, their parameters or their settings, e.g. a parameter moved into a group of its own):
    ``keep_weights`` resumes the weights with a fresh optimizer state at the saved epoch and step
    (and says so in the log), ``refuse`` stops with exit 88. Weights that no longer fit the model
    (a parameter added, removed or reshaped) are refused whatever this says."""
    stage0: StageTrainConfig = field(default_factory=StageTrainConfig)
    """Autoencoder."""
    stage1: StageTrainConfig = field(default_factory=StageTrainConfig)
    """Draft model (CFDT)."""
    stage2: StageTrainConfig = field(default_factory=StageTrainConfig)
    """Latent diffusion refiner."""
    stage3: StageTrainConfig = field(default_factory=StageTrainConfig)
    """Self-training."""

    def __post_init__(self) -> None:
        s = "train"
        require(self.lr_schedule in LR_SCHEDULES, s, "lr_schedule", self.lr_schedule, ", ".join(LR_SCHEDULES))
        require(self.warmup_steps >= 0, s, "warmup_steps", self.warmup_steps, "an integer >= 0")
        require(0.0 <= self.min_lr_ratio <= 1.0, s, "min_lr_ratio", self.min_lr_ratio, "a float in [0, 1]")
        require(self.weight_decay >= 0.0, s, "weight_decay", self.weight_decay, "a float >= 0")
        require(self.grad_clip_norm >= 0.0, s, "grad_clip_norm", self.grad_clip_norm, "a float >= 0")
        require(self.checkpoint_every_epochs >= 1, s, "checkpoint_every_epochs",
               self.checkpoint_every_epochs, "an integer >= 1")
        require(self.checkpoint_every_steps >= 0, s, "checkpoint_every_steps",
               self.checkpoint_every_steps, "an integer >= 0 (0 = only at epoch ends)")
        require(self.eval_every_epochs >= 1, s, "eval_every_epochs", self.eval_every_epochs, "an integer >= 1")
        require(self.log_every_steps >= 0, s, "log_every_steps", self.log_every_steps,
               "an integer >= 0 (0 = every log_every_seconds)")
        require(self.log_every_seconds > 0.0, s, "log_every_seconds", self.log_every_seconds, "a number > 0")
        require(self.best_metric in METRIC_NAMES, s, "best_metric", self.best_metric, ", ".join(METRIC_NAMES))
        require(self.start_min_gain >= 0.0, s, "start_min_gain", self.start_min_gain,
               f"a number >= 0, in the units of best_metric ({self.best_metric})")
        require(self.on_code_change in ON_CODE_CHANGE_CHOICES, s, "on_code_change", self.on_code_change,
               ", ".join(ON_CODE_CHANGE_CHOICES))
        for stage in STAGES:
            self.for_stage(stage).validate(f"train.stage{stage}")
        for stage in OFF_BY_DEFAULT_NEVER:
            require(self.for_stage(stage).run_by_default, f"train.stage{stage}", "run_by_default", False,
                    "true (every later stage builds on this stage's best.pt; only stages 2 and 3 may be off "
                    "by default)")

    def for_stage(self, stage: int) -> StageTrainConfig:
        """The epochs/batch size/lr of ``stage``."""
        return getattr(self, f"stage{stage}")


@dataclass(frozen=True)
class MemoryConfig:
    """The five memory optimizations (seed 000): only together do they fit 154M params in 64 GB."""

    bf16: bool = True
    """bfloat16 autocast on GPU (never with a GradScaler); CPU always trains in fp32."""
    grad_checkpointing: bool = True
    """Recompute per-date encoder and change-gate activations in backward (use_reentrant=False)."""
    gate_downsample: int = 64
    """Side length in pixels the O(T^2) change gate is computed at, then upsampled; 0 = full size."""
    target_only_pyramid: bool = True
    """Keep the full multi-scale pyramid for the target date only; other dates keep the coarsest."""
    pair_chunk_size: int = 64
    """Date pairs per change-gate convolution chunk; 0 processes all pairs at once."""

    def __post_init__(self) -> None:
        require(self.gate_downsample >= 0, "memory", "gate_downsample", self.gate_downsample,
               "an integer >= 0 (0 = full resolution)")
        require(self.pair_chunk_size >= 0, "memory", "pair_chunk_size", self.pair_chunk_size,
               "an integer >= 0 (0 = no chunking)")


@dataclass(frozen=True)
class ModelSections:
    """One mapping per stage, validated by that stage's model config class (``from_dict``).

    Kept as read-only mappings here so this module does not depend on the model code; use
    :meth:`section` to get a plain ``dict`` for ``XConfig.from_dict``.
    """

    stage0: Mapping[str, Any] = field(default_factory=dict)
    """Autoencoder (``vcloud.models.autoencoder.AutoencoderConfig``)."""
    stage1: Mapping[str, Any] = field(default_factory=dict)
    """Draft model (``vcloud.models.cfdt.CFDTConfig``)."""
    stage2: Mapping[str, Any] = field(default_factory=dict)
    """Refiner (``vcloud.models.latent_refiner.RefinerConfig``)."""
    stage3: Mapping[str, Any] = field(default_factory=dict)
    """Self-training (``vcloud.models.selftrain.SelfTrainConfig``)."""

    def __post_init__(self) -> None:
        for stage in STAGES:
            name = f"stage{stage}"
            value = getattr(self, name)
            require(isinstance(value, Mapping), "model", name, value, "a mapping of model settings")
            object.__setattr__(self, name, types.MappingProxyType(copy.deepcopy(dict(value))))

    def section(self, stage: int) -> dict[str, Any]:
        """A fresh, mutable deep copy of ``model.stage{stage}``."""
        return copy.deepcopy(dict(getattr(self, f"stage{stage}")))


@dataclass(frozen=True)
class VCloudConfig:
    """The whole training configuration of one model size (tiny, small, full)."""

    name: str = "unnamed"
    """Human-readable size name, printed at start and stored in checkpoints."""
    data: DataConfig = field(default_factory=DataConfig)
    """Data loading and curriculum."""
    train: TrainConfig = field(default_factory=TrainConfig)
    """Optimisation and cadences."""
    model: ModelSections = field(default_factory=ModelSections)
    """Per-stage model architecture."""
    memory: MemoryConfig = field(default_factory=MemoryConfig)
    """Memory switches."""

    def to_dict(self) -> dict[str, Any]:
        """Plain, YAML/JSON-safe dict; ``config_from_dict(to_dict())`` round-trips."""
        return _plain(self)


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def config_from_dict(raw: Mapping[str, Any]) -> VCloudConfig:
    """Validate and freeze a parsed YAML document."""
    return build_config(VCloudConfig, raw, "")


def apply_overrides(raw: Mapping[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """A copy of the parsed YAML ``raw`` with each ``section.key=value`` of ``overrides`` set.

    What ``python -m vcloud.train --set`` does, so one run can change a cadence or a learning rate
    without a copy of the YAML. A value is parsed as YAML (``3``, ``2e-4``, ``true``, ``cosine``,
    ``[1, 2]``); the dotted key may be as deep as the file (``train.stage1.lr``,
    ``data.curriculum.mixed_from_epoch``). Keys are not checked here: :func:`config_from_dict` refuses
    an unknown one with the list of valid ones, as it does for the file.
    """
    out = copy.deepcopy(dict(raw))
    for item in overrides:
        dotted, sep, text = item.partition("=")
        keys = [k.strip() for k in dotted.split(".")]
        if not sep or not all(keys):
            raise ConfigError(f"--set {item!r}: expected section.key=value (e.g. train.log_every_steps=10)")
        try:
            value = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ConfigError(f"--set {item!r}: the value is not valid YAML ({exc})") from None
        node = out
        for depth, key in enumerate(keys[:-1]):
            child = node.get(key)
            if child is None:
                child = {}
            elif not isinstance(child, Mapping):
                raise ConfigError(f"--set {item!r}: {'.'.join(keys[:depth + 1])} is a value "
                                  f"({child!r}), not a section with keys")
            node[key] = child = dict(child)
            node = child
        node[keys[-1]] = value
    return out


def load_config(path: str | Path, overrides: Sequence[str] = ()) -> VCloudConfig:
    """Read and validate ``path`` with ``overrides`` (``section.key=value``, see :func:`apply_overrides`)
    applied; raises :class:`ConfigError` naming the file (and the overrides) on any problem."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read config {path}: {exc.strerror}") from None
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"config {path} is not valid YAML: {exc}") from None
    if raw is not None and not isinstance(raw, Mapping):
        raise ConfigError(f"config {path}: expected a mapping of sections, got {type(raw).__name__}")
    raw = apply_overrides(raw or {}, overrides)
    try:
        return config_from_dict(raw)
    except ConfigError as exc:
        where = f"{path} with --set {' '.join(overrides)}" if overrides else str(path)
        raise ConfigError(f"{where}: {exc}") from None


def config_yaml(config: VCloudConfig) -> str:
    """The resolved configuration as YAML in the file's layout (``--print-config``); loading it
    again gives the same configuration."""
    return yaml.safe_dump(config.to_dict(), sort_keys=False, default_flow_style=None)
