"""Viewer export: ``python -m vcloud.export --config CFG --data PREPARED --out RUN_DIR --dest VIEWER_DIR``.

For every series of the test split, with the most advanced trained stage (3 > 2 > 1 > 0, each
stage's ``best.pt``), writes to ``VIEWER_DIR``:

- ``quicklooks/{series}.png``: true-colour (B4, B3, B2) panels side by side: the cloudy
  observation of the target date, the prediction, the cloud-free target; one brightness stretch
  for all three so they compare honestly; for a refiner (stages 2 and 3) a fourth, grey panel: the
  per-pixel uncertainty (white: the samples' largest spread);
- ``geotiff/{series}.tif``: the 13-band prediction in Sentinel-2 L1C digital numbers
  (reflectance x 10000, uint16), with the CRS and affine transform of the input patch; a refiner's
  prediction is the mean of ``--samples`` samples (:mod:`vcloud.export_uncertainty`), and a 14th band
  holds their spread (per-pixel standard deviation averaged over the bands, same scale);
- ``metrics.json``: per-series and mean PSNR/SSIM/SAM/MAE/RMSE plus provenance; for a refiner also
  the samples drawn and, per series and on average, the mean uncertainty, its correlation with the
  mean's error and the spread-skill ratio (``uncertainty``);
- ``curves/stage{N}.png``: training loss and validation PSNR over the steps of every stage trained,
  from its ``metrics.jsonl`` (the curve the HPC view draws; per epoch from ``progress.json`` for a
  stage trained before that file existed);
- ``EXPORTED`` last, atomically (the default export only: every test series of the highest stage):
  the digest of the stage outputs it read (:func:`vcloud.contract.export_inputs_digest`), which the
  DAG's export task compares before it submits another export of the same outputs; then
  ``EXPORTED.<digest>`` (:func:`vcloud.contract.exported_done_name`), which the task's submit looks
  for under the viewer directory's lock. An export removes both first, so a viewer directory half
  rewritten never counts as done.

With only stage 0 trained, the "prediction" is the autoencoder's reconstruction of the least
cloudy input: a baseline that shows what the later stages add.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import sys
from pathlib import Path
from typing import Any, Protocol, cast

import numpy as np
import torch

from vcloud import exitcodes
from vcloud.config import ConfigError, VCloudConfig, load_config
from vcloud.contract import (
    CODE_HASH_ENV,
    EXPORT_DONE_PREFIX,
    EXPORT_METRICS_FILE,
    EXPORTED_FILE,
    LINEAGE_KEY,
    STAGES,
    STOP_PATIENCE,
    TrainingCurve,
    curve_png_name,
    export_input_names,
    export_inputs_digest,
    exported_done_name,
    exported_record,
    training_curve,
)
from vcloud.data.bands import S2_BANDS
from vcloud.export_uncertainty import EXPORT_SAMPLES, mean_scores, summarize_samples
from vcloud.models.draft_and_refiner import EVAL_SEED
from vcloud.stage_registry import StageError, build_context, get_stage, load_stage_model
from vcloud.training.markers import read_json, write_json
from vcloud.training.paths import StagePaths

log = logging.getLogger("vcloud.export")

RGB_BANDS = (3, 2, 1)
"""Indices of B4 (red), B3 (green), B2 (blue) among the 13 Sentinel-2 bands."""
PANELS = ("cloudy_input", "prediction", "target")
UNCERTAINTY_PANEL = "uncertainty"
UNCERTAINTY_BAND = "uncertainty"


class _Sampler(Protocol):
    """A model export draws several refinements of one draft from (stages 2 and 3's ``DraftAndRefiner``)."""

    def draft(self, batch: dict[str, Any]) -> torch.Tensor: ...

    def refine(self, batch: dict[str, Any], generator: torch.Generator | None = None,
               steps: int | None = None, draft: torch.Tensor | None = None) -> torch.Tensor: ...


def latest_trained_stage(run_dir: Path) -> int:
    """Highest stage with a ``best.pt`` (3 > 2 > 1 > 0)."""
    for stage in (3, 2, 1, 0):
        if StagePaths(run_dir, stage).best.is_file():
            return stage
    raise StageError(f"no stage{{0..3}}/best.pt under {run_dir}: train stage 0 first")


def input_stamps(run_dir: Path) -> dict[str, tuple[int, int]]:
    """(size, mtime in whole seconds) of each of the export's input files that exists, by its name
    relative to ``run_dir`` (:func:`vcloud.contract.export_input_names`)."""
    stamps = {}
    for name in export_input_names():
        try:
            st = (run_dir / name).stat()
        except FileNotFoundError:
            continue
        stamps[name] = (st.st_size, int(st.st_mtime))
    return stamps


def rgb_quicklook(cloudy: np.ndarray, prediction: np.ndarray, target: np.ndarray, gap: int = 2,
                  uncertainty: np.ndarray | None = None) -> np.ndarray:
    """[H, 3W + 2 gap, 3] uint8 mosaic of three [13, H, W] reflectance images (with ``uncertainty``
    [H, W], a fourth grey panel: [H, 4W + 3 gap, 3]).

    The stretch maps the target's 98th RGB percentile to white, shared by the three image panels;
    the uncertainty panel is stretched on its own (its 98th percentile white)."""
    rgb = [np.moveaxis(img[list(RGB_BANDS)], 0, -1) for img in (cloudy, prediction, target)]
    white = float(np.percentile(rgb[2], 98))
    gain = 1.0 / white if white > 1e-6 else 1.0
    height = rgb[0].shape[0]
    spacer = np.ones((height, gap, 3), dtype=np.float32)
    panels: list[np.ndarray] = [rgb[0] * gain, spacer, rgb[1] * gain, spacer, rgb[2] * gain]
    if uncertainty is not None:
        top = float(np.percentile(uncertainty, 98))
        grey = uncertainty / top if top > 1e-9 else np.zeros_like(uncertainty)
        panels += [spacer, np.repeat(grey[..., None], 3, axis=-1)]
    mosaic = np.concatenate(panels, axis=1)
    return (np.clip(mosaic, 0.0, 1.0) * 255.0 + 0.5).astype(np.uint8)


def to_digital_numbers(prediction: np.ndarray) -> np.ndarray:
    """Reflectance in [0, 1] -> uint16 L1C digital numbers, the encoding of the input patches."""
    from vcloud.data.bands import S2_DN_MAX

    return np.round(np.clip(prediction, 0.0, 1.0) * S2_DN_MAX).astype(np.uint16)


def stage_curve(run_dir: Path, stage: int) -> tuple[TrainingCurve, str]:
    """A stage's training curve and its x axis: from ``metrics.jsonl`` (per step, the curve the HPC
    view draws) or, for a stage trained before that file existed, ``progress.json``'s history (per
    epoch). An empty curve when neither has a point."""
    paths = StagePaths(run_dir, stage)
    try:
        curve = training_curve(paths.metrics.read_text(encoding="utf-8"))
    except FileNotFoundError:
        curve = TrainingCurve()
    if not curve.empty:
        return curve, "step"
    history = (read_json(paths.progress) or {}).get("history") or []

    def per_epoch(key: str) -> tuple[tuple[int, float], ...]:
        return tuple((int(h["epoch"]), float(h[key])) for h in history if h.get(key) is not None)

    return TrainingCurve(loss=per_epoch("train_loss"), val_psnr=per_epoch("val_psnr")), "epoch"


def curve_title(stage: int, progress: dict[str, Any] | None) -> str:
    """``stage 1: 3/100 epochs, best psnr 24.31 (epoch 2)`` from ``progress.json`` (``, stopped
    early`` where validation stopped improving)."""
    progress = progress or {}
    title = f"stage {stage}: {progress.get('epoch')}/{progress.get('epochs_total')} epochs"
    if (progress.get("stop") or {}).get("reason") == STOP_PATIENCE:
        title += ", stopped early"
    best = progress.get("best_metric") or {}
    if best:
        title += f", best {best['name']} {best['value']:.2f} (epoch {best['epoch']})"
    return title


def plot_training_curve(curve: TrainingCurve, title: str, path: Path, *,
                        x_label: str = "step") -> TrainingCurve:
    """Training loss and validation PSNR side by side, written to ``path`` (PNG); returns the
    series as the axes hold them, read back from the plotted lines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (loss_ax, psnr_ax) = plt.subplots(1, 2, figsize=(10, 4), dpi=100)
    drawn = []
    for ax, points, label, colour in ((loss_ax, curve.loss, "training loss", "tab:blue"),
                                      (psnr_ax, curve.val_psnr, "validation PSNR (dB)", "tab:red")):
        (line,) = ax.plot([s for s, _ in points], [v for _, v in points], color=colour,
                          marker="." if len(points) < 60 else None, linewidth=1.2)
        ax.set_xlabel(x_label)
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        if not points:
            ax.text(0.5, 0.5, "no point yet", ha="center", va="center", transform=ax.transAxes)
        drawn.append(tuple((int(x), float(y)) for x, y in line.get_xydata()))
    fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return TrainingCurve(loss=drawn[0], val_psnr=drawn[1])


def _safe_name(series_id: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", series_id)


def export_viewer(config: VCloudConfig, data_root: Path, run_dir: Path, dest: Path, *, stage: int | None = None,
                  split: str = "test", limit: int | None = None, device: torch.device | None = None,
                  samples: int = EXPORT_SAMPLES) -> dict[str, Any]:
    """Write quicklooks, GeoTIFFs, metrics and curves; returns the metrics summary written.

    ``samples``: how many samples a refiner draws per series (at least 2 for an uncertainty; 1
    exports one sample, as validation scores it); a point model (stages 0 and 1) ignores it."""
    import matplotlib.image

    from vcloud.data.dataset import SeriesDataset
    from vcloud.data.geotiff import GeoRef, write_geotiff
    from vcloud.metrics import METRIC_NAMES, per_sample
    from vcloud.training.precision import resolve_precision
    from vcloud.training.rng import seed_everything

    seed_everything(config.train.seed)  # diffusion sampling draws noise: same export on every run
    device = device or torch.device("cuda" if torch.cuda.is_available() else "cpu")
    marks_done = stage is None and split == "test" and limit is None  # the DAG's export, complete
    stamps = input_stamps(run_dir)
    for done in (dest / EXPORTED_FILE, *dest.glob(f"{EXPORT_DONE_PREFIX}*")):
        done.unlink(missing_ok=True)
    stage = latest_trained_stage(run_dir) if stage is None else stage
    best = StagePaths(run_dir, stage).best
    spec = get_stage(stage)
    model, checkpoint = load_stage_model(stage, best, build_context(config, run_dir, device))
    model.eval()
    if samples < 1:
        raise ValueError(f"--samples {samples}: export at least one sample")
    sampler = samples >= 2 and callable(getattr(model, "refine", None)) and callable(getattr(model, "draft", None))
    precision = resolve_precision(device.type, config.memory.bf16)
    dataset = SeriesDataset(data_root, split)
    count = len(dataset) if limit is None else min(limit, len(dataset))
    log.info("exporting %d %s series with stage %d (%s, epoch %s of %s) to %s", count, split, stage, spec.name,
             checkpoint.get("epoch"), best, dest)

    per_series: list[dict[str, Any]] = []
    for i in range(count):
        item = dataset[i]
        meta = dataset.meta(i)
        batch = {k: v.unsqueeze(0).to(device) if isinstance(v, torch.Tensor) else [v] for k, v in item.items()}
        stats = None
        with torch.no_grad(), precision.autocast():
            if sampler:  # the model has draft and refine: checked above
                drawer = cast(_Sampler, model)
                draft = drawer.draft(batch)
                drawn = torch.cat([
                    drawer.refine(batch, generator=torch.Generator().manual_seed(EVAL_SEED + k), draft=draft)
                    for k in range(samples)])
            else:
                prediction = spec.restore_batch(model, batch)
        if sampler:
            stats = summarize_samples(drawn.float().clamp(0.0, 1.0).cpu(), item["target"])
            prediction = stats.mean[None]
        prediction = prediction.float().clamp(0.0, 1.0).cpu()
        scores = {name: float(v[0]) for name, v in per_sample(prediction, item["target"][None]).items()}
        name = _safe_name(meta.series_id)
        cloudy = item["inputs"][int(item["target_index"])].numpy()
        pred = prediction[0].numpy()
        spread = stats.spread.numpy() if stats is not None else None
        quicklook = dest / "quicklooks" / f"{name}.png"
        quicklook.parent.mkdir(parents=True, exist_ok=True)
        matplotlib.image.imsave(quicklook, rgb_quicklook(cloudy, pred, item["target"].numpy(), uncertainty=spread))
        geotiff = dest / "geotiff" / f"{name}.tif"
        bands = pred if spread is None else np.concatenate([pred, spread[None]])
        write_geotiff(geotiff, to_digital_numbers(bands), GeoRef(crs=meta.crs, transform=meta.transform))
        per_series.append({"series_id": meta.series_id, "region": meta.region, "target_date": meta.target_date,
                           "quicklook": str(quicklook.relative_to(dest)), "geotiff": str(geotiff.relative_to(dest)),
                           **scores, **(stats.scores() if stats is not None else {})})

    mean = {name: float(np.mean([s[name] for s in per_series])) if per_series else float("nan")
            for name in METRIC_NAMES}
    curves = []
    for k in STAGES:
        curve, x_label = stage_curve(run_dir, k)
        if not curve.empty:
            plot_training_curve(curve, curve_title(k, read_json(StagePaths(run_dir, k).progress)),
                                dest / curve_png_name(k), x_label=x_label)
            curves.append(curve_png_name(k))
    summary: dict[str, Any] = {
        "stage": stage,
        "stage_name": spec.name,
        "checkpoint": str(best),
        "checkpoint_epoch": checkpoint.get("epoch"),
        "code_version": checkpoint.get("code_version"),
        "code_hash": checkpoint.get("code_hash"),
        "lineage": checkpoint.get(LINEAGE_KEY),
        "split": split,
        "series": len(per_series),
        "panels": list(PANELS) + ([UNCERTAINTY_PANEL] if sampler else []),
        "rgb_bands": ["B4", "B3", "B2"],
        "samples": samples if sampler else 1,
        "mean": mean,
        **({"uncertainty": mean_scores(per_series)} if sampler else {}),
        "per_series": per_series,
        "curves": curves,
        "geotiff_bands": list(S2_BANDS) + ([UNCERTAINTY_BAND] if sampler else []),
    }
    write_json(dest / EXPORT_METRICS_FILE, summary)
    if marks_done:
        inputs = export_inputs_digest(stamps)
        write_json(dest / EXPORTED_FILE, exported_record(
            inputs=inputs, stamps=stamps, stage=stage, checkpoint=str(best), series=len(per_series),
            code_hash=os.environ.get(CODE_HASH_ENV)))
        (dest / exported_done_name(inputs)).touch()
        log.info("exported from stage outputs %s: %s and %s written", inputs, dest / EXPORTED_FILE,
                 exported_done_name(inputs))
    log.info("stage %d on %d %s series: PSNR %.2f dB, SSIM %.3f, SAM %.2f deg", stage, len(per_series), split,
             mean["psnr"], mean["ssim"], mean["sam"])
    if sampler:
        told = summary["uncertainty"]
        log.info("stage %d, mean of %d samples: uncertainty %.4f (reflectance), its correlation with the error "
                 "%.2f, spread-skill ratio %.2f", stage, samples, told["uncertainty"],
                 told["uncertainty_error_corr"], told["spread_skill"])
    return summary


def main(argv: list[str] | None = None) -> int:
    from vcloud.train import configure_logging

    configure_logging()
    parser = argparse.ArgumentParser(prog="python -m vcloud.export", description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", type=Path, required=True)
    parser.add_argument("--data", type=Path, required=True, help="prepared dataset root")
    parser.add_argument("--out", type=Path, required=True, help="run output directory with stage{N}/best.pt")
    parser.add_argument("--dest", type=Path, required=True, help="viewer directory to write")
    parser.add_argument("--stage", type=int, choices=(0, 1, 2, 3), default=None,
                        help="stage to export (default: the highest with a best.pt)")
    parser.add_argument("--split", default="test", choices=("train", "val", "test"))
    parser.add_argument("--limit", type=int, default=None, help="export at most N series")
    parser.add_argument("--samples", type=int, default=EXPORT_SAMPLES,
                        help="samples a refiner (stages 2, 3) draws per series: their mean and spread are exported")
    args = parser.parse_args(argv)
    try:
        config = load_config(args.config)
    except ConfigError as exc:
        log.error("%s", exc)
        return exitcodes.BAD_CONFIG
    try:
        export_viewer(config, args.data, args.out, args.dest, stage=args.stage, split=args.split, limit=args.limit,
                      samples=args.samples)
    except (StageError, FileNotFoundError) as exc:
        log.error("export failed: %s", exc)
        return exitcodes.ERROR
    return 0


if __name__ == "__main__":
    sys.exit(main())
