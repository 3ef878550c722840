"""The four training stages, each a :class:`~vcloud.stage_spec.StageSpec` (listed by :mod:`vcloud.stage_registry`):

- stage 0, ``autoencoder``: L1 reconstruction of clean and cloudy scenes;
- stage 1, ``draft``: CFDT trained with L1 to the cloud-free target, on the cloud-type curriculum;
- stage 2, ``refiner``: latent diffusion refiner on top of the frozen stage-0 autoencoder and the
  frozen stage-1 draft model, both loaded from their ``best.pt``;
- stage 3, ``selftrain``: stage-2 model fine-tuned (refiner, scene adapter, optionally the draft
  model) on labeled series plus confidently pseudo-labelled ones. Its spec adds
  ``train_dataset``: the loop passes it the labeled training split and trains on what it returns.
"""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import ConcatDataset, Dataset, Subset

from vcloud.contract import BEST_CHECKPOINT, stage_dir_name
from vcloud.lineage import checkpoint_digest
from vcloud.data.dataset import SeriesDataset, dataset_len
from vcloud.durable import atomic_write_bytes, atomic_write_text
from vcloud.models.cfdt import CFDT, CFDTConfig
from vcloud.models.draft_and_refiner import DraftAndRefiner, run_draft
from vcloud.models.latent_refiner import LatentDiffusionRefiner, RefinerConfig
from vcloud.models.level import LevelCorrection
from vcloud.models.scene_adapter import SceneAdapter, reference_statistics
from vcloud.models.selftrain import (
    PseudoLabeledSeries,
    PseudoLabels,
    SelfTrainConfig,
    is_unlabeled,
    make_pseudo_labels,
)
from vcloud.stage_spec import Batch, BuildContext, StageSpec

log = logging.getLogger(__name__)

PSEUDO_LABELS_FILE = "pseudo_labels.pt"
PSEUDO_SUMMARY_FILE = "pseudo_labels.json"


# ---- stage 0: autoencoder ---------------------------------------------------------------------

def _build_autoencoder(cfg: Any, ctx: BuildContext) -> nn.Module:
    from vcloud.models.autoencoder import Autoencoder

    return Autoencoder(cfg)


def _parse_autoencoder(section: Mapping[str, Any]) -> Any:
    from vcloud.models.autoencoder import AutoencoderConfig

    return AutoencoderConfig.from_dict(dict(section))


def _autoencoder_loss(model: nn.Module, batch: Batch) -> torch.Tensor:
    """L1 reconstruction of the cloud-free scene and of the target date's cloudy observation.

    The stage-2 refiner encodes both (drafts and targets are clean, its condition is the cloudy
    observation), so the latent must represent clean and cloudy surfaces; L1 keeps edges sharper
    than MSE."""
    target, inputs = batch["target"], batch["inputs"]
    observed = inputs[torch.arange(inputs.shape[0], device=inputs.device), batch["target_index"]]
    images = torch.cat([target, observed])
    return F.l1_loss(model(images), images)


def _autoencoder_predict(model: nn.Module, batch: Batch) -> torch.Tensor:
    return model(batch["target"]).clamp(0.0, 1.0)


def least_cloudy_input(batch: Batch) -> torch.Tensor:
    """[B,13,H,W]: for each series the observation with the smallest cloud fraction."""
    cloud_fraction = batch["masks"].flatten(2).mean(dim=2)  # [B, T]
    best = cloud_fraction.argmin(dim=1)
    return batch["inputs"][torch.arange(best.shape[0], device=best.device), best]


def _autoencoder_restore(model: nn.Module, batch: Batch) -> torch.Tensor:
    """With only stage 0 trained, the best cloud-free guess is the clearest input, reconstructed."""
    return model(least_cloudy_input(batch)).clamp(0.0, 1.0)


STAGE0 = StageSpec(
    number=0,
    name="autoencoder",
    parse_model_config=_parse_autoencoder,
    build_model=_build_autoencoder,
    loss=_autoencoder_loss,
    predict=_autoencoder_predict,
    restore=_autoencoder_restore,
)


def _unwrap(model: nn.Module) -> nn.Module:
    return getattr(model, "module", model)


# ---- stage 1: draft model (CFDT) --------------------------------------------------------------

def _build_draft(cfg: CFDTConfig, ctx: BuildContext) -> nn.Module:
    return CFDT(cfg, memory=ctx.config.memory)


def _draft_loss(model: nn.Module, batch: Batch) -> torch.Tensor:
    s1 = batch.get("s1") if cast(CFDT, _unwrap(model)).cfg.use_s1 else None
    draft = model(batch["inputs"], batch["masks"], batch["target_index"], s1)
    return F.l1_loss(draft.float(), batch["target"])


@torch.no_grad()
def _draft_predict(model: nn.Module, batch: Batch) -> torch.Tensor:
    return run_draft(cast(CFDT, _unwrap(model)), batch).float().clamp(0.0, 1.0)


STAGE1 = StageSpec(
    number=1,
    name="draft",
    parse_model_config=lambda section: CFDTConfig.from_dict(dict(section)),
    build_model=_build_draft,
    loss=_draft_loss,
    predict=_draft_predict,
    uses_curriculum=True,
    validate_start=True,  # the untrained draft is the harmonised composite
)


# ---- stage 2: latent diffusion refiner --------------------------------------------------------

def _build_refiner(cfg: RefinerConfig, ctx: BuildContext) -> DraftAndRefiner:
    from vcloud.models.autoencoder import Autoencoder

    autoencoder = cast(Autoencoder, ctx.load_predecessor(0))
    draft_model = cast(CFDT, ctx.load_predecessor(1))
    return DraftAndRefiner(draft_model, LatentDiffusionRefiner(cfg, autoencoder), train_draft=False,
                           level=LevelCorrection() if cfg.level_correction else None)


def _refined_loss(model: nn.Module, batch: Batch) -> torch.Tensor:
    return model(batch)


def _refined_predict(model: nn.Module, batch: Batch) -> torch.Tensor:
    return cast(DraftAndRefiner, _unwrap(model)).refine(batch)


STAGE2 = StageSpec(
    number=2,
    name="refiner",
    parse_model_config=lambda section: RefinerConfig.from_dict(dict(section)),
    build_model=_build_refiner,
    loss=_refined_loss,
    predict=_refined_predict,
    requires=(0, 1),
    validate_start=True,  # the zero-initialised refiner returns the draft
)


# ---- stage 3: self-training -------------------------------------------------------------------

def stage2_skipped(ctx: BuildContext) -> bool:
    """Stage 3 starts without stage 2: stage 2 is off by default (``train.stage2.run_by_default``)
    and the run has no ``stage2/best.pt``."""
    return (not ctx.config.train.for_stage(2).run_by_default
            and not _stage2_best(ctx).is_file())


def _stage2_best(ctx: BuildContext) -> Path:
    return ctx.run_dir / stage_dir_name(2) / BEST_CHECKPOINT


def stage2_teacher(ctx: BuildContext) -> DraftAndRefiner:
    """The stage-2 model stage 3 starts from and pseudo-labels with: stage 2's ``best.pt``, or, where
    stage 2 is off by default and was not trained (:func:`stage2_skipped`), stage 2's untrained
    start built from stages 0 and 1: stage 1's draft with a refiner that returns it unchanged (and a
    zero level correction), which is what stage 2 hands on when training does not beat its start.
    Built under a fixed seed, so the teacher and the student's start are the same weights."""
    if not stage2_skipped(ctx):
        return cast(DraftAndRefiner, ctx.load_predecessor(2))
    cfg = RefinerConfig.from_dict(dict(ctx.config.model.section(2)))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(ctx.config.train.seed)
        model = _build_refiner(cfg, ctx)
    log.info("stage 3: no %s and stage 2 is off by default (train.stage2.run_by_default: false): starting "
             "from stage 2's untrained start, stage 1's draft", _stage2_best(ctx))
    return model.to(ctx.device).eval()


def stage2_teacher_id(ctx: BuildContext) -> str:
    """What the pseudo-label cache names as its teacher: the digest of stage 2's ``best.pt``, or of
    the stage 0 and 1 ``best.pt`` its untrained start is built from."""
    if not stage2_skipped(ctx):
        return checkpoint_digest(ctx.predecessor_checkpoint(2))
    return "stage2-start:" + ":".join(checkpoint_digest(ctx.predecessor_checkpoint(k)) for k in (0, 1))


def _build_selftrain(cfg: SelfTrainConfig, ctx: BuildContext) -> nn.Module:
    stage2 = stage2_teacher(ctx)
    adapter = None
    if cfg.scene_adapter:
        adapter = SceneAdapter(cfg.adapter_scale)
        if ctx.data_root is not None:  # training: the labeled reference; loading: the checkpoint's
            adapter.fit_reference(reference_statistics(SeriesDataset(ctx.data_root, "train")))
    return DraftAndRefiner(stage2.draft_model, stage2.refiner, train_draft=cfg.train_draft, adapter=adapter,
                           level=stage2.level, draft_loss_weight=cfg.draft_loss_weight,
                           refiner_loss_weight=cfg.refiner_loss_weight)


def _is_main_process() -> bool:
    return not (torch.distributed.is_available() and torch.distributed.is_initialized()) \
        or torch.distributed.get_rank() == 0


def _collate_to(batch: dict[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}


def pseudo_label_pool(labeled: Dataset, cfg: SelfTrainConfig) -> tuple[Dataset, list[int], Dataset]:
    """(labeled series actually trained on, indices of unlabeled series, dataset they index).

    With ``unlabeled_data`` every series of that dataset's ``unlabeled_split`` is in the pool and
    the labeled set stays whole. Otherwise ``unlabeled_fraction`` of the labeled dataset's
    ``unlabeled_split`` is; with ``unlabeled_split: train`` those series are removed from the
    labeled set, so the ground truth of a pseudo-labelled series is never used."""
    source: Dataset
    if cfg.unlabeled_data:
        root = Path(labeled.root) / cfg.unlabeled_data  # type: ignore[attr-defined]  # absolute stays absolute
        if not (root / "index.json").is_file():
            raise FileNotFoundError(
                f"model.stage3.unlabeled_data={cfg.unlabeled_data!r}: no prepared dataset at {root} (its index.json "
                "is missing). Prepare the unlabeled domain with python -m vcloud.data.prepare, or clear the setting")
        source = SeriesDataset(root, cfg.unlabeled_split)
        return labeled, list(range(len(source))), source
    if cfg.unlabeled_split == "train":
        source = labeled
    else:
        source = SeriesDataset(Path(labeled.root), cfg.unlabeled_split)  # type: ignore[attr-defined]
    records = getattr(source, "records", None)
    ids = ([r.series_id for r in records] if records is not None
           else [source[i]["series_id"] for i in range(dataset_len(source))])
    pool = [i for i, sid in enumerate(ids) if is_unlabeled(sid, cfg.unlabeled_fraction, cfg.seed)]
    if cfg.unlabeled_split == "train":
        keep = [i for i in range(dataset_len(labeled)) if i not in set(pool)]
        labeled = Subset(labeled, keep)
    return labeled, pool, source


def selftrain_dataset(labeled: Dataset, ctx: BuildContext, cfg: SelfTrainConfig | None = None) -> Dataset:
    """Training set of stage 3: labeled series plus kept pseudo-labelled ones (see
    :func:`pseudo_label_pool` for which series are pseudo-labelled).

    Pseudo-labels come from the stage-2 model (:func:`stage2_teacher`, not the model being fine-tuned) and are cached
    in ``stage3/pseudo_labels.pt`` on first use, so a resumed run trains on exactly the same set;
    the cache names the ``best.pt`` it came from (content digest) and the settings that shape the
    labels, and is remade when either changes (not for the student's veil, share or loss weights).
    Every rank computes or reads the same deterministic result; only rank 0 writes the cache."""
    if cfg is None:
        cfg = SelfTrainConfig.from_dict(ctx.config.model.section(3))
    labeled_part, pool, source = pseudo_label_pool(labeled, cfg)
    source_root = f"{getattr(source, 'root', '')}:{getattr(source, 'split', '')}"
    cache = ctx.run_dir / stage_dir_name(3) / PSEUDO_LABELS_FILE
    teacher = stage2_teacher_id(ctx)
    labels = None
    if cache.is_file():
        saved = torch.load(cache, map_location="cpu", weights_only=True)
        if (saved.get("pool") == pool and saved.get("config") == cfg.labelling_settings()
                and saved.get("teacher") == teacher and saved.get("source", source_root) == source_root):
            labels = PseudoLabels.from_state_dict(saved["labels"])
        else:
            log.info("stage 3: %s was made for another pool, source, config or stage-2 model; labelling again",
                     cache)
    if labels is None:
        stage2 = stage2_teacher(ctx)
        steps = cfg.sample_steps or None

        drafts: dict[str, Any] = {}

        def refine(batch: dict[str, torch.Tensor], generator: torch.Generator) -> torch.Tensor:
            # make_pseudo_labels samples the same batch object num_samples times: draft it once
            on_device = _collate_to(batch, ctx.device)
            if drafts.get("batch") is not batch:
                drafts.update(batch=batch, draft=stage2.draft(on_device))
            return stage2.refine(on_device, generator=generator, steps=steps, draft=drafts["draft"])

        labels = make_pseudo_labels(refine, source, pool, cfg,
                                    batch_size=ctx.config.train.for_stage(3).batch_size)
        del stage2
        if _is_main_process():
            buffer = io.BytesIO()
            torch.save({"pool": pool, "config": cfg.labelling_settings(), "teacher": teacher,
                        "source": source_root, "labels": labels.state_dict()}, buffer)
            atomic_write_bytes(cache, buffer.getvalue())
            atomic_write_text(cache.with_name(PSEUDO_SUMMARY_FILE), json.dumps(labels.summary(), indent=1) + "\n")
    summary = labels.summary()
    log.info("stage 3: kept %d of %d pseudo-labels (agreement threshold %.4g, median agreement %s); "
             "%d labeled series", summary["pseudo_labels_kept"], summary["pseudo_labels_considered"],
             cfg.agreement_threshold, summary["agreement_median"], dataset_len(labeled_part))
    if labels.kept == 0:
        return labeled_part
    repeats = cfg.pseudo_label_repeats(dataset_len(labeled_part), labels.kept)
    log.info("stage 3: each pseudo-labelled series %d time(s) per epoch, the student's inputs under an extra "
             "haze veil of optical depth up to %g", repeats, cfg.student_haze_depth)
    return ConcatDataset([labeled_part, PseudoLabeledSeries(source, labels, cfg.student_veil, repeats)])


STAGE3 = StageSpec(
    number=3,
    name="selftrain",
    parse_model_config=lambda section: SelfTrainConfig.from_dict(dict(section)),
    build_model=_build_selftrain,
    loss=_refined_loss,
    predict=_refined_predict,
    requires=(0, 1, 2),
    train_dataset=selftrain_dataset,
    validate_start=True,  # starts from stage 2's draft and refiner
    start_tolerance=lambda cfg: cfg.max_val_loss if cfg.unlabeled_data else None,
)

STAGE_SPECS: tuple[StageSpec, ...] = (STAGE0, STAGE1, STAGE2, STAGE3)
"""Every stage, in order."""
