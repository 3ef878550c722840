"""Reconstruction quality of stages 0-3 against the no-training baselines, on one held-out split.

Generates the ``small`` synthetic dataset (split by location, so test locations are never seen in
training), trains every stage through the stage registry (the same build / loss / predict code the
trainer runs; stage 3 trains on its ``train_dataset``: labeled plus pseudo-labelled series) and
scores the baselines and stages 1-3 on the same test series.

The run is held to about ``--budget-minutes`` of wall time. After data generation and the
baselines, the rest is split across the stages (``STAGE_SHARES``, minus a reserve for scoring);
each stage stops after its configured epochs or its time, whichever comes first (time it leaves
goes to the next stage), and its last weights become its ``best.pt`` for the next stage. Scoring
on the test splits is not taken from the next stage's time: where it needs more than the reserve
(with the shifted domain, DDIM sampling on one thread), the run ends that much later
(``wall_minutes``).

The model is ``trainer/configs/model_small.yaml`` unchanged. The short CPU run differs from the
trainer's in ways that do not touch the model code:

* ``memory.grad_checkpointing`` is off (same maths, ~30% less compute; CPU has the memory);
* the learning rate follows the config's warmup + cosine schedule over the stage's *time* budget
  instead of its epoch count: the warmup takes the same fraction of the stage as
  ``warmup_steps`` takes of the configured epochs, and the rate still decays to ``min_lr_ratio``
  by the end;
* stage 1 trains on every cloud type from the start: the cloud-type curriculum is paced in epochs
  (``thin_only`` until epoch 6) and a bounded run sees only a few;
* validation runs only where it decides something: a stage that starts from its predecessor's
  answer (``validate_start`` in the stage registry: stages 1-3) is scored on the validation split
  before and after its bounded training, and the trained weights become its ``best.pt`` only if
  they beat the start by ``train.start_min_gain`` (stage 3 with an unlabeled domain: only if they
  lose at most ``model.stage3.max_val_loss``), as the trainer's best-checkpoint rule
  (:func:`vcloud.training.best.keeps_trained`) chooses. Stage 0 keeps its last weights.

Stage 3 adapts to a domain without labels: with ``--shift hazier`` (the default) a second dataset,
the ``small-hazier`` preset (another atmosphere, new locations: data seed 1), is generated; its
training split is stage 3's unlabeled pool (``model.stage3.unlabeled_data``: every series
pseudo-labelled, ground truth never read, the labeled training split kept whole) and every method is scored on its test split as well
("shifted" rows and ``*_shifted_*`` keys). ``--shift none`` pseudo-labels part of the labeled
training split instead (``model.stage3.unlabeled_split``), as the trainer does.

``--seed`` seeds the models (initialisation, batch order, diffusion noise); the data stay those of
seed 0, so runs with different seeds compare on the same series.

``--device cuda`` trains and scores on a GPU, in float32 like the CPU run, so the same budget in
minutes buys far more steps: with a few minutes every stage reaches its configured epochs, which
measures what the configured budget gives where the CPU run stops early.

    nice -n 10 .venv/bin/python benchmarks/quality.py [--budget-minutes 20] [--work DIR] [--threads 2] [--seed 0]
        [--device cuda]
        [--from-stage N]   # after a change to stage N: retrain N.. on the earlier stages' weights in --work
        [--set model.stage2.level_correction=false ...]   # a key of model_small.yaml, as the trainer's --set

Stages 2 and 3 are also scored on the draft they hand their refiner ("its draft, unrefined":
stage 1's draft with stage 2's level correction and stage 3's scene adapter), so a gain shows where
it comes from: the corrected draft or the diffusion refinement.

Sampler metrics (:mod:`vcloud.sampler_metrics`): stage 1's draft, a point forecast, and stage 2's
refiner, ``--samples K`` DDIM samples (default 4, seeds 0..K-1; the first is the sample scored
above) of the draft it refines, are scored on the test split and the shifted one: PSNR/SSIM/SAM of
one sample and of the ensemble mean, the refiner's change to its draft and the samples' spread,
high-frequency power and gradient distance under the clouds and in clear pixels, CRPS, the
spread-skill ratio and rank histogram under the clouds, and NDVI error under the clouds. Each is
reported for all series and per bin of the cloud cover of the series' clearest input date
(:data:`vcloud.sampler_metrics.COVER_EDGES`). Stage 2's K samples cost K times its scoring
(DDIM on the CPU), taken after the training budget like the rest of the scoring; ``--samples 0``
skips the sampler metrics. Where stage 2's trained weights lost to its start on the validation
split (its start, the identity on the draft, is then its ``best.pt``: spread and change 0), the
trained weights ("trained, not kept", ``trained.pt``) get the sampler metrics as well, under
``stage2_trained`` keys, so that what the refiner learned is measured all the same. Band means go
into the last line (``sampler_metrics``: stage, weights and split, e.g. ``stage2``,
``stage2_trained_shifted``, then bin, then metric); ``sampler_metrics.json`` in ``--work`` holds
them per band as well.

Each printed sampler line is one stage, weights and split, over all its series:

    [shifted ]stage N sampler[ (trained, not kept)], K=k: CRPS under clouds c, high-frequency power
        under clouds p, r x the target's t[ (ill-conditioned: ...)], NDVI error under clouds n
        [, spread s, spread-skill q, change to the draft d (p95 e)]

* ``shifted``: the shifted domain's test split (otherwise the labeled test split); ``stage 1``:
  stage 1's draft, a point forecast (K = 1); ``stage 2``: its refiner's K samples;
  ``(trained, not kept)``: the weights training reached, not those handed on.
* CRPS under clouds: the fair ensemble CRPS over the target date's cloudy pixels, band mean, in
  reflectance (the mean absolute error for K = 1); lower is better.
* High-frequency power under clouds: ``p`` the samples' power above 0.25 cycles per pixel in
  16-pixel windows under the clouds (band mean), ``t`` the target's, ``r`` the ratio of the two
  pooled over bands (1: the target's texture; below: smoother; above: noisier). The synthetic
  targets are clean scenes, smooth and without the inputs' sensor noise; where less than 1% of the
  target's power lies that high (:data:`vcloud.sampler_metrics.HIGH_FREQUENCY_MIN_SHARE`) the line
  says "ill-conditioned" with the share, and ``r`` then mostly measures the noise a prediction
  keeps, not its texture.
* NDVI error under clouds: mean |NDVI(prediction) - NDVI(target)| of the mean of the K samples.
* Refiners only (K >= 2): ``spread`` the mean per-pixel standard deviation across the samples,
  ``spread-skill`` its calibration under the clouds (1 calibrated, below 1 overconfident, 0
  collapsed), and the mean and 95th percentile of |sample - draft| (0: the refiner returns its
  draft).

Last line: JSON with best_baseline_psnr, stage1_psnr, stage2_psnr, stage3_psnr (and SSIM/SAM; with
a shift also best_baseline_shifted_psnr and stageN_shifted_psnr), stageN_draft_psnr, and what each
stage cost (stageN_steps, stageN_epochs, stageN_seconds).
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import math
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "trainer" / "src"))

import torch  # noqa: E402
from torch.utils.data import DataLoader, Dataset, Subset, default_collate  # noqa: E402

from vcloud.baselines import score_baselines  # noqa: E402
from vcloud.checkpoint import save_checkpoint  # noqa: E402
from vcloud.config import VCloudConfig, config_from_dict, load_config  # noqa: E402
from vcloud.data.dataset import SeriesDataset  # noqa: E402
from vcloud.data.prepare import PrepareSettings, prepare_dataset  # noqa: E402
from vcloud.data.selection import SplitFractions  # noqa: E402
from vcloud.data.synthetic import generate_raw  # noqa: E402
from vcloud.metrics import MetricTotals, per_sample  # noqa: E402
from vcloud.models.draft_and_refiner import EVAL_SEED, target_observation  # noqa: E402
from vcloud.optim import build_optimizer, set_learning_rate  # noqa: E402
from vcloud.sampler_metrics import HIGH_FREQUENCY_CUTOFF, clearest_cover, stratified_report  # noqa: E402
from vcloud.stage_registry import BuildContext, build_context, get_stage, load_stage_model  # noqa: E402
from vcloud.training.best import keeps_trained  # noqa: E402

STAGE_SHARES = {0: 0.12, 1: 0.43, 2: 0.17, 3: 0.28}
"""Fraction of the training time each stage gets (stage 3's includes pseudo-labelling)."""
SCORING_RESERVE = 0.08
"""Fraction of the budget kept back for scoring stages 1-3 on the test split."""
SHIFTED_PRESET, SHIFTED_SEED = "small-hazier", 1
SHIFTED_SPLITS = SplitFractions(train=0.5, val=0.1, test=0.4)
"""Half the shifted locations are the unlabeled pool, most of the rest its test split."""
SAMPLER_STAGES = (1, 2)
"""Stages whose ``best.pt`` gets the sampler metrics: the draft (a point forecast) and the refiner;
a refiner's ``trained.pt`` gets them too when it was not kept (:func:`unkept_trained`)."""
TRAINED_NOT_KEPT = "trained, not kept"
"""How a stage's trained weights are labelled where its start weights were kept instead."""


def benchmark_config(path: Path, seed: int = 0, unlabeled_data: Path | None = None,
                     epochs: dict[int, int] | None = None, overrides: list[str] | None = None) -> VCloudConfig:
    """The model config with ``overrides`` (``section.key=value``, as the trainer's ``--set``),
    gradient checkpointing off (see the module docstring), ``seed``, stage 3's unlabeled domain
    (``model.stage3.unlabeled_data``) when there is one, and ``epochs`` instead of the configured
    epochs of those stages."""
    raw = load_config(path, overrides or []).to_dict()
    raw["memory"]["grad_checkpointing"] = False
    raw["train"]["seed"] = seed
    for stage, count in (epochs or {}).items():
        raw["train"][f"stage{stage}"]["epochs"] = count
    if unlabeled_data is not None:
        raw["model"]["stage3"].update(unlabeled_data=str(unlabeled_data), unlabeled_split="train")
    return config_from_dict(raw)


def finite_or_none(value: Any) -> Any:
    """``value`` with every NaN or infinity (a metric undefined on its data, e.g. no spectrum window
    under the clouds) replaced by None, in nested dicts and lists."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: finite_or_none(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_or_none(item) for item in value]
    return value


def strict_json(value: Any, **kwargs: Any) -> str:
    """JSON that any reader accepts: undefined figures are ``null``, never ``NaN``."""
    return json.dumps(finite_or_none(value), allow_nan=False, **kwargs)


def parse_epochs(text: str) -> dict[int, int]:
    """``"0=60,2=30"`` -> ``{0: 60, 2: 30}``."""
    epochs = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        stage, _, count = item.partition("=")
        if stage not in ("0", "1", "2", "3") or not count.isdigit() or int(count) < 1:
            raise SystemExit(f"--epochs {text!r}: expected STAGE=N items such as 0=60,2=30 "
                             "(stages 0-3, N >= 1)")
        epochs[int(stage)] = int(count)
    return epochs


def lr_factor(cfg: VCloudConfig, progress: float, warmup_fraction: float) -> float:
    """The trainer's warmup + cosine factor, with progress measured in time instead of epochs."""
    progress = min(max(progress, 0.0), 1.0)
    factor = 1.0
    if cfg.train.lr_schedule == "cosine":
        factor = cfg.train.min_lr_ratio + (1.0 - cfg.train.min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))
    if progress < warmup_fraction:
        factor *= max(progress / warmup_fraction, 0.01)
    return factor


def train_bounded(stage: int, ctx: BuildContext, data: Path, seconds: float,
                  start_score: float | None = None, curve_every: int = 0) -> dict:
    """Train one stage for at most its configured epochs and ``seconds``; save it as ``best.pt``.

    ``start_score``: the validation score of the model the stage starts from, when it is known
    already: the untrained refiner returns stage 1's draft bit for bit and stage 3 starts from stage
    2's kept weights, so their starts score what the previous stage kept (stage 2's start alone
    would otherwise cost ~100 s of DDIM sampling on one CPU thread).

    ``curve_every``: score the validation split every that many steps and print it (0 = never),
    for the budget a stage needs to gain over its start."""
    started = time.monotonic()
    cfg = ctx.config
    (ctx.run_dir / f"stage{stage}" / "trained.pt").unlink(missing_ok=True)  # an earlier run's
    budget = cfg.train.for_stage(stage)
    spec = get_stage(stage)
    model_config = spec.parse_model_config(cfg.model.section(stage))
    model = spec.build_model(model_config, ctx).to(ctx.device).train()
    tolerance = spec.start_tolerance(model_config) if spec.start_tolerance is not None else None
    train: Dataset = SeriesDataset(data, "train")
    if spec.train_dataset is not None:
        train = spec.train_dataset(train, ctx)
    prep = time.monotonic() - started
    loader = DataLoader(train, batch_size=budget.batch_size, shuffle=True, drop_last=True,
                        generator=torch.Generator().manual_seed(cfg.train.seed + stage))
    warmup_fraction = min(cfg.train.warmup_steps / max(budget.epochs * len(loader), 1), 1.0)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = build_optimizer(model, budget.lr, cfg.train.weight_decay)
    torch.manual_seed(cfg.train.seed + stage)
    steps, epochs, losses = 0, 0, []
    deadline = started + seconds
    val = SeriesDataset(data, "val")
    metric = cfg.train.best_metric
    start = None
    if spec.validate_start:
        known = start_score is not None
        start = (copy.deepcopy(model.state_dict()), start_score if known else score_model(spec, model, val)[metric])
        save_checkpoint(ctx.run_dir / f"stage{stage}" / "start.pt",
                        {"stage": stage, "model": start[0], "model_config": cfg.model.section(stage)})
        model.train()
    train_start = time.monotonic()
    while epochs < budget.epochs and time.monotonic() < deadline:
        for batch in loader:
            batch = on_device(batch, ctx.device)
            progress = (time.monotonic() - train_start) / max(deadline - train_start, 1e-9)
            set_learning_rate(opt, budget.lr * lr_factor(cfg, progress, warmup_fraction))
            loss = spec.loss(model, batch)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            if cfg.train.grad_clip_norm > 0:
                torch.nn.utils.clip_grad_norm_(params, cfg.train.grad_clip_norm)
            opt.step()
            steps += 1
            losses.append(loss.item())
            if curve_every and steps % curve_every == 0:
                now = score_model(spec, model, val)[metric]
                model.train()
                gain = f" ({now - start[1]:+.3f} over the start)" if start is not None else ""
                print(f"  stage {stage} step {steps}: validation {metric} {now:.3f}{gain}", flush=True)
            if time.monotonic() >= deadline:
                break
        else:
            epochs += 1
    kept = "trained"
    val_scores: dict[str, float] = {}
    if start is not None:
        trained = score_model(spec, model, val)[metric] if steps else start[1]
        val_scores = {"start": start[1], "trained": trained, "kept": trained}
        if not keeps_trained(metric, trained, start[1], min_gain=cfg.train.start_min_gain, tolerance=tolerance):
            if steps:  # scored too: what training reached, though the start is handed on
                save_checkpoint(ctx.run_dir / f"stage{stage}" / "trained.pt",
                                {"stage": stage, "model": model.state_dict(), "model_config": cfg.model.section(stage)})
            model.load_state_dict(start[0])
            kept = "start"
            val_scores["kept"] = start[1]
    save_checkpoint(ctx.run_dir / f"stage{stage}" / "best.pt",
                    {"stage": stage, "model": model.state_dict(), "model_config": cfg.model.section(stage)})
    window = max(1, min(20, len(losses) // 4))
    tail = losses[-window:] or [float("nan")]
    head = losses[:window] or [float("nan")]
    return {"steps": steps, "epochs": steps / max(len(loader), 1),
            "first_loss": sum(head) / len(head), "last_loss": sum(tail) / len(tail),
            "train_series": len(train), "prep_seconds": prep, "seconds": time.monotonic() - started,
            "kept": kept, "val": val_scores}


@torch.no_grad()
def score_model(spec: Any, model: torch.nn.Module, data: Dataset, batch_size: int = 4,
                predictions: list[torch.Tensor] | None = None) -> dict[str, float]:
    """Mean per-series metrics of ``model``'s predictions on ``data`` (eval mode); the predictions
    are appended to ``predictions`` (on the CPU) when it is given."""
    model.eval()
    device = next(model.parameters()).device
    totals = MetricTotals()
    for begin in range(0, len(data), batch_size):
        batch = default_collate([data[i] for i in range(begin, min(begin + batch_size, len(data)))])
        batch = on_device(batch, device)
        predicted = spec.predict(model, batch)
        totals.update(predicted, batch["target"])
        if predictions is not None:
            predictions.append(predicted.float().cpu())
    return totals.means()


@torch.no_grad()
def offset_decomposition(before: torch.Tensor, after: torch.Tensor, target: torch.Tensor) -> dict[str, Any]:
    """How much of the PSNR change from ``before`` to ``after`` (predictions [N, 13, H, W] of two
    stages on one split) one per-band offset gives: ``before`` plus the mean per-band difference.

    A fine-tuning that mostly moves each band's level by the same amount everywhere (a radiometric
    offset, such as a haze correction applied to every series) helps the series whose bands were
    off in that direction and hurts the others, so its gain depends on which locations a split has."""
    offset = (after - before).mean(dim=(0, 2, 3), keepdim=True)

    def psnr(predicted: torch.Tensor) -> float:
        return float(per_sample(predicted.clamp(0.0, 1.0), target)["psnr"].mean())

    return {"gain_db": psnr(after) - psnr(before), "offset_gain_db": psnr(before + offset) - psnr(before),
            "offset": [round(v, 5) for v in offset.flatten().tolist()]}


def on_device(batch: dict[str, Any], device: torch.device) -> dict[str, Any]:
    """A collated batch with its tensors on ``device``."""
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}


Draw = Callable[[dict[str, Any]], tuple[torch.Tensor, torch.Tensor | None]]
"""A batch -> (its samples [B, K, 13, H, W], the draft they refine [B, 13, H, W] or None)."""


def point_draw(spec: Any, model: torch.nn.Module) -> Draw:
    """A point forecast (stage 1's draft) as an ensemble of one, with no draft of its own."""
    return lambda batch: (spec.predict(model, batch).unsqueeze(1), None)


def sampler_draw(model: Any, samples: int) -> Draw:
    """``samples`` refinements of one draft by a refiner (stages 2-3), from DDIM seeds
    ``EVAL_SEED``, ``EVAL_SEED + 1``, ...: the first is the prediction :func:`score` scores."""
    if samples < 1:
        raise ValueError(f"--samples {samples}: a refiner needs at least 1 sample")

    def draw(batch: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor | None]:
        draft = model.draft(batch)
        refined = [model.refine(batch, generator=torch.Generator().manual_seed(EVAL_SEED + k), draft=draft)
                   for k in range(samples)]
        return torch.stack(refined, dim=1), draft

    return draw


@torch.no_grad()
def sampler_scores(draw: Draw, data: Dataset | Sequence[dict[str, Any]], device: torch.device,
                   batch_size: int = 4) -> dict[str, dict[str, Any]]:
    """:func:`vcloud.sampler_metrics.stratified_report` of ``draw``'s samples on ``data``: under the
    target date's cloud mask, binned by the clearest input date's cover. The samples of the whole
    split are held on the CPU (float32), since percentiles and distribution distances pool over it."""
    parts: dict[str, list[torch.Tensor]] = {"samples": [], "draft": [], "target": [], "cloud_mask": [], "cover": []}
    for begin in range(0, len(data), batch_size):
        batch = default_collate([data[i] for i in range(begin, min(begin + batch_size, len(data)))])
        batch = on_device(batch, device)
        samples, draft = draw(batch)
        parts["samples"].append(samples.float().cpu())
        if draft is not None:
            parts["draft"].append(draft.float().cpu())
        parts["target"].append(batch["target"].float().cpu())
        parts["cloud_mask"].append(target_observation(batch)[1].float().cpu())
        parts["cover"].append(clearest_cover(batch["masks"]).cpu())
    if not parts["samples"]:
        raise ValueError("sampler metrics need at least one series, got an empty split")
    return stratified_report(torch.cat(parts["samples"]), torch.cat(parts["target"]),
                             torch.cat(parts["cloud_mask"]), torch.cat(parts["cover"]),
                             draft=torch.cat(parts["draft"]) if parts["draft"] else None)


def sampler_summary(reports: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The band means of :func:`sampler_scores` (``*_band`` lists left out), rounded, for the last line."""
    def rounded(value: Any) -> Any:
        if isinstance(value, float):
            return round(value, 5)
        if isinstance(value, list):
            return [rounded(v) for v in value]
        return value

    return {stratum: {name: rounded(v) for name, v in report.items() if not name.endswith("_band")}
            for stratum, report in reports.items()}


def unkept_trained(stage: int, run_dir: Path, kept: str) -> bool:
    """Whether ``stage`` (2-3) left trained weights that lost to its start: :func:`train_bounded`
    kept the start weights (``kept == "start"``) and wrote what training reached as ``trained.pt``.
    Those weights are scored as well (``stageN_trained`` keys), since the kept start of a refiner is
    the identity on its draft and its scores say nothing about what the refiner learned."""
    return stage >= 2 and kept == "start" and (run_dir / f"stage{stage}" / "trained.pt").is_file()


def sampler_line(name: str, every: dict[str, Any]) -> str:
    """The printed line of one sampler report (the ``all`` stratum of :func:`sampler_scores`)."""
    line = f"{name}, K={every['samples']}: CRPS under clouds {every['crps_cloudy']:.4f}, "
    ratio = every["hf_power_ratio_cloudy"]
    line += (f"high-frequency power under clouds {every['hf_power_cloudy']:.3g}, "
             f"{ratio:.3g} x the target's {every['hf_power_target_cloudy']:.3g}")
    if not every["hf_power_ratio_cloudy_conditioned"]:
        share = 100 * every["hf_share_target_cloudy"]
        line += (f" (ill-conditioned: only {share:.2g}% of the target's power lies above "
                 f"{HIGH_FREQUENCY_CUTOFF:g} cycles/pixel)")
    line += f", NDVI error under clouds {every['ndvi_error_cloudy_mean']:.4f}"
    if "spread" in every:
        line += (f", spread {every['spread']:.4f}, spread-skill {every['spread_skill_cloudy']:.3f}, "
                 f"change to the draft {every['change_mean']:.4f} (p95 {every['change_p95']:.4f})")
    return line


def report_sampler(stage: int, ctx: BuildContext, splits: dict[str, Dataset | None], samples: int,
                   results: dict[str, Any], details: dict[str, dict[str, dict[str, Any]]], work: Path,
                   weights: str = "best.pt") -> None:
    """Sampler metrics of ``stage``'s ``weights`` (``best.pt``, or ``trained.pt``: the trained
    weights that were not kept) on each of ``splits`` (key suffix -> split; None: not scored):
    print a line each, put the band means into ``results["sampler_metrics"]`` and the reports into
    ``details``, written to ``work / "sampler_metrics.json"``. Keys are ``stageN`` or
    ``stageN_trained``, then the split's suffix (``""``, ``"_shifted"``)."""
    if samples == 0 or stage not in SAMPLER_STAGES:
        return
    trained = weights == "trained.pt"
    loading = dataclasses.replace(ctx, data_root=None)
    model, _ = load_stage_model(stage, ctx.run_dir / f"stage{stage}" / weights, loading)
    model.eval()
    draw = point_draw(get_stage(stage), model) if stage == 1 else sampler_draw(model, samples)
    for suffix, split in splits.items():
        if split is None:
            continue
        t0 = time.monotonic()
        reports = sampler_scores(draw, split, ctx.device)
        key = f"stage{stage}{'_trained' if trained else ''}{suffix}"
        details[key] = reports
        results.setdefault("sampler_metrics", {})[key] = sampler_summary(reports)
        weights_label = f" ({TRAINED_NOT_KEPT})" if trained else ""
        name = f"{'shifted ' if suffix else ''}stage {stage} sampler{weights_label}"
        print(f"{sampler_line(name, reports['all'])} (scored in {time.monotonic() - t0:.0f} s)", flush=True)
    (work / "sampler_metrics.json").write_text(strict_json(details, indent=1) + "\n")


class DraftOnly:
    """Scores the draft a stage-2/3 model hands its refiner (stage 1's, with stage 2's level
    correction and stage 3's scene adapter where the model has them), not the refinement."""

    @staticmethod
    def predict(model: torch.nn.Module, batch: dict[str, Any]) -> torch.Tensor:
        return model.draft(batch)


def score(stage: int, ctx: BuildContext, test: Dataset, weights: str = "best.pt",
          predictions: list[torch.Tensor] | None = None, draft_only: bool = False) -> dict[str, float]:
    """Mean per-series metrics of a stage's ``best.pt`` (or ``start.pt``) predictions on ``test``;
    ``draft_only``: of the draft it hands its refiner (stages 2-3)."""
    loading = dataclasses.replace(ctx, data_root=None)  # the weights carry stage 3's adapter reference
    model, _ = load_stage_model(stage, ctx.run_dir / f"stage{stage}" / weights, loading)
    spec = DraftOnly if draft_only else get_stage(stage)
    return score_model(spec, model, test, predictions=predictions)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--budget-minutes", type=float, default=20.0, help="total wall time of the run")
    parser.add_argument("--work", type=Path, default=None, help="working directory (default: a temp dir); "
                        "a prepared dataset already there is reused")
    parser.add_argument("--test-limit", type=int, default=0, help="score only the first N test series (0 = all)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", default="cpu", help="cpu, or cuda to train and score on a GPU (float32)")
    parser.add_argument("--epochs", default="", metavar="STAGE=N,...",
                        help="override the config's epochs of some stages, e.g. 0=60,2=30 (a budget study)")
    parser.add_argument("--last-stage", type=int, choices=(1, 2, 3), default=3,
                        help="stop after this stage; the time shares are spread over the stages trained")
    parser.add_argument("--curve-every", type=int, default=0, metavar="STEPS",
                        help="score the validation split every STEPS steps of stages 1-3 and print it")
    parser.add_argument("--seed", type=int, default=0, help="seed of the models (the data stay seed 0's)")
    parser.add_argument("--from-stage", type=int, choices=(0, 1, 2, 3), default=0,
                        help="train from this stage on, with the earlier stages' best.pt of a previous run in "
                        "--work (same seed); each stage still gets its share of --budget-minutes")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="override a key of model_small.yaml, as the trainer's --set "
                        "(e.g. model.stage2.level_correction=false); repeatable")
    parser.add_argument("--samples", type=int, default=4, metavar="K",
                        help="DDIM samples of stage 2's refiner for the sampler metrics (CRPS, spread, rank "
                        "histogram; at least 2 for those); 0 skips the sampler metrics")
    parser.add_argument("--shift", choices=("hazier", "none"), default="hazier",
                        help="stage 3's unlabeled domain: the hazier preset's series, or none (part of "
                        "the labeled training split)")
    args = parser.parse_args(argv)
    if args.samples < 0:
        parser.error(f"--samples {args.samples}: expected 0 (no sampler metrics) or a number of samples")
    started = time.monotonic()
    deadline = started + args.budget_minutes * 60
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    work = args.work or Path(tempfile.mkdtemp(prefix="vcloud_quality_"))
    config_path = ROOT / "trainer" / "configs" / "model_small.yaml"
    raw, data = work / "raw", work / "prepared"
    if not (data / "index.json").exists():
        generate_raw(raw, preset="small", seed=0)
        prepare_dataset(raw, data)
    unlabeled: Dataset | None = None
    shifted_test: Dataset | None = None
    shifted: Path | None = None
    if args.shift == "hazier":
        shifted = work / "shifted" / "prepared"
        if not (shifted / "index.json").exists():
            generate_raw(work / "shifted" / "raw", preset=SHIFTED_PRESET, seed=SHIFTED_SEED)
            prepare_dataset(work / "shifted" / "raw", shifted, PrepareSettings(fractions=SHIFTED_SPLITS))
        unlabeled = SeriesDataset(shifted, "train")
        shifted_full = SeriesDataset(shifted, "test")
        n_shifted = len(shifted_full) if args.test_limit <= 0 else min(args.test_limit, len(shifted_full))
        shifted_test = Subset(shifted_full, range(n_shifted))
    cfg = benchmark_config(config_path, args.seed, unlabeled_data=shifted, epochs=parse_epochs(args.epochs),
                           overrides=args.overrides)
    test_full = SeriesDataset(data, "test")
    n_test = len(test_full) if args.test_limit <= 0 else min(args.test_limit, len(test_full))
    test = Subset(test_full, range(n_test))
    print(f"data {data}: train {len(SeriesDataset(data, 'train'))}, val {len(SeriesDataset(data, 'val'))}, "
          f"test {len(test_full)} series (scoring {n_test}); config {config_path.name} "
          f"(grad_checkpointing off); budget {args.budget_minutes:g} min, {args.threads} threads, "
          f"seed {args.seed}, device {args.device}", flush=True)
    if shifted_test is not None:
        print(f"shifted domain {SHIFTED_PRESET} (data seed {SHIFTED_SEED}): {len(unlabeled)} unlabeled series "
              f"for stage 3, scoring {len(shifted_test)} test series", flush=True)

    baselines = score_baselines(test_full, limit=n_test)
    print(f"{'method':<22} {'PSNR dB':>8} {'SSIM':>7} {'SAM deg':>8}")
    for name, s in baselines.items():
        print(f"baseline {name:<13} {s['psnr']:8.2f} {s['ssim']:7.4f} {s['sam']:8.2f}", flush=True)
    ranked = {k: v for k, v in baselines.items() if k != "cloudy_input"}
    best_name = max(ranked, key=lambda k: ranked[k]["psnr"])
    best_baseline = ranked[best_name]["psnr"]
    shifted_best: tuple[str, float] | None = None
    if shifted_test is not None:
        shifted_baselines = score_baselines(shifted_test.dataset, limit=len(shifted_test))
        for name, s in shifted_baselines.items():
            print(f"shifted {name:<14} {s['psnr']:8.2f} {s['ssim']:7.4f} {s['sam']:8.2f}", flush=True)
        ranked = {k: v for k, v in shifted_baselines.items() if k != "cloudy_input"}
        name = max(ranked, key=lambda k: ranked[k]["psnr"])
        shifted_best = (name, ranked[name]["psnr"])

    ctx = build_context(cfg, work / "run", torch.device(args.device), data_root=data)
    results: dict[str, Any] = {"seed": args.seed, "device": args.device, "best_baseline": best_name,
                               "best_baseline_psnr": round(best_baseline, 3)}
    if shifted_best is not None:
        results.update(best_baseline_shifted=shifted_best[0], best_baseline_shifted_psnr=round(shifted_best[1], 3))

    kept_predictions: dict[str, torch.Tensor] = {}  # stages 2-3, for the offset decomposition

    def report(stage: int, label: str, weights: str, key: str, draft_only: bool = False) -> None:
        """Score ``weights`` of ``stage`` on the test split (and the shifted one), print, record."""
        for suffix, split in (("", test), ("_shifted", shifted_test)):
            if split is None:
                continue
            t0 = time.monotonic()
            predicted: list[torch.Tensor] | None = [] if stage >= 2 and not draft_only else None
            s = score(stage, ctx, split, weights, predictions=predicted, draft_only=draft_only)
            if predicted:
                kept_predictions[f"{key}{suffix}"] = torch.cat(predicted)
            name = f"{'shifted ' if suffix else ''}stage {stage} {label}"
            print(f"{name:<22} {s['psnr']:8.2f} {s['ssim']:7.4f} {s['sam']:8.2f}   "
                  f"(scored in {time.monotonic() - t0:.0f} s)", flush=True)
            results.update({f"{key}{suffix}_psnr": round(s["psnr"], 3), f"{key}{suffix}_ssim": round(s["ssim"], 4),
                            f"{key}{suffix}_sam": round(s["sam"], 3)})

    sampler_details: dict[str, dict[str, dict[str, Any]]] = {}

    def sampler(stage: int, weights: str = "best.pt") -> None:
        splits = {"": test, "_shifted": shifted_test}
        report_sampler(stage, ctx, splits, args.samples, results, sampler_details, work, weights)

    training = (deadline - time.monotonic()) * (1 - SCORING_RESERVE)
    kept_score: float | None = None
    unused = 0.0  # seconds a stage that reached its epochs early left to the next
    stages = range(args.last_stage + 1)
    shares = {stage: STAGE_SHARES[stage] / sum(STAGE_SHARES[s] for s in stages) for stage in stages}
    for stage in stages:
        if stage < args.from_stage:  # an earlier run's weights, scored again below
            kept = ctx.run_dir / f"stage{stage}" / "best.pt"
            if not kept.is_file():
                parser.error(f"--from-stage {args.from_stage}: no {kept} from an earlier run in --work")
            print(f"stage {stage}: {kept} of an earlier run, not trained again", flush=True)
            if stage == 1 and (ctx.run_dir / "stage1" / "start.pt").is_file():
                report(1, "untrained draft", "start.pt", "stage1_start")
            report(stage, "autoencoder (target reconstructed)" if stage == 0 else get_stage(stage).name,
                   "best.pt", f"stage{stage}")
            sampler(stage)
            continue
        allotted = training * shares[stage] + unused
        info = train_bounded(stage, ctx, data, allotted, start_score=kept_score if stage >= 2 else None,
                             curve_every=args.curve_every if stage >= 1 else 0)
        unused = max(allotted - info["seconds"], 0.0)
        kept_score = info["val"].get("kept")
        results.update({f"stage{stage}_steps": info["steps"], f"stage{stage}_epochs": round(info["epochs"], 2),
                        f"stage{stage}_seconds": round(info["seconds"], 1)})
        line = (f"stage {stage} trained {info['seconds']:.0f} s: {info['steps']} steps, "
                f"{info['epochs']:.2f} epochs over {info['train_series']} series, "
                f"loss {info['first_loss']:.4f} -> {info['last_loss']:.4f}")
        if info["val"]:
            line += (f"; validation {cfg.train.best_metric} before {info['val']['start']:.2f}, after "
                     f"{info['val']['trained']:.2f}: kept the {info['kept']} weights")
            results[f"stage{stage}_kept"] = info["kept"]
        if stage == 3:
            summary = json.loads((ctx.run_dir / "stage3" / "pseudo_labels.json").read_text())
            line += (f"; pseudo-labels kept {summary['pseudo_labels_kept']} of "
                     f"{summary['pseudo_labels_considered']} ({info['prep_seconds']:.0f} s)")
            results["stage3_pseudo_labels_kept"] = summary["pseudo_labels_kept"]
        print(line, flush=True)
        if stage == 1:  # the untrained draft (the composite) is a method of its own
            report(1, "untrained draft", "start.pt", "stage1_start")
        report(stage, "autoencoder (target reconstructed)" if stage == 0 else get_stage(stage).name,
               "best.pt", f"stage{stage}")
        sampler(stage)
        if stage >= 2:  # where the gain comes from: the draft it corrects, or the refinement
            report(stage, "its draft, unrefined", "best.pt", f"stage{stage}_draft", draft_only=True)
        if unkept_trained(stage, ctx.run_dir, info["kept"]):
            report(stage, TRAINED_NOT_KEPT, "trained.pt", f"stage{stage}_trained")
            sampler(stage, "trained.pt")
    trained3 = "stage3_trained" if "stage3_trained" in kept_predictions else "stage3"
    for suffix, split in (("", test), ("_shifted", shifted_test)):
        before, after = kept_predictions.get(f"stage2{suffix}"), kept_predictions.get(f"{trained3}{suffix}")
        if split is None or before is None or after is None:
            continue
        target = torch.stack([split[i]["target"] for i in range(len(split))])
        parts = offset_decomposition(before, after, target)
        offset = " ".join(f"{v * 1e3:+.1f}" for v in parts["offset"])
        print(f"{'shifted ' if suffix else ''}stage 3 trained against stage 2: {parts['gain_db']:+.3f} dB, "
              f"of which one per-band offset alone gives {parts['offset_gain_db']:+.3f} dB "
              f"(offset x1e-3: {offset})", flush=True)
        results[f"stage3_trained{suffix}_offset_only_gain_db"] = round(parts["offset_gain_db"], 3)
    s1 = float(results["stage1_psnr"])
    results["stage1_gain_over_best_baseline_db"] = round(s1 - best_baseline, 3)
    results["stage1_gain_over_start_db"] = round(s1 - float(results["stage1_start_psnr"]), 3)
    if "stage2_psnr" in results:
        results["stage2_gain_over_stage1_db"] = round(float(results["stage2_psnr"]) - s1, 3)
        if "stage2_trained_psnr" in results:
            trained2 = float(results["stage2_trained_psnr"])
            results["stage2_trained_gain_over_stage1_db"] = round(trained2 - s1, 3)
    if "stage3_psnr" in results:
        if shifted_test is not None:
            results["stage3_shifted_gain_over_stage2_db"] = round(
                float(results["stage3_shifted_psnr"]) - float(results["stage2_shifted_psnr"]), 3)
        results["stage3_gain_over_stage2_db"] = round(
            float(results["stage3_psnr"]) - float(results["stage2_psnr"]), 3)
    results["wall_minutes"] = round((time.monotonic() - started) / 60, 2)
    print(strict_json(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
