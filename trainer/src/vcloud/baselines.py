"""Reconstructions that need no training, scored with :mod:`vcloud.metrics` like every model.

* ``cloudy_input``: the target date's own cloudy observation (what doing nothing scores);
* ``least_cloudy``: the input date with the smallest cloud fraction;
* ``mean_mosaic`` / ``median_mosaic``: per-pixel mean / median over the dates that are clear there;
* ``nearest_clear``: per pixel, the clear date closest in time to the target date.

Pixels that no date sees clear fall back to the least cloudy date. A model that does not beat these on
the test split has learned nothing the archive did not already hold.

CLI: ``python -m vcloud.baselines --data PREPARED --split test [--json]``
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from collections.abc import Callable
from pathlib import Path

import torch

from vcloud.data.dataset import SeriesDataset
from vcloud.metrics import METRIC_NAMES, MetricTotals

Baseline = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, int], torch.Tensor]
"""(inputs [T,13,H,W], masks [T,1,H,W], days from the target date [T], target_index) -> [13,H,W]"""


def _least_cloudy_index(masks: torch.Tensor, days: torch.Tensor) -> int:
    cover = masks.flatten(1).mean(dim=1)
    order = sorted(range(len(cover)), key=lambda t: (float(cover[t]), abs(float(days[t])), t))
    return order[0]


def cloudy_input(inputs: torch.Tensor, masks: torch.Tensor, days: torch.Tensor,
                 target_index: int) -> torch.Tensor:
    return inputs[target_index].clone()


def least_cloudy(inputs: torch.Tensor, masks: torch.Tensor, days: torch.Tensor,
                 target_index: int) -> torch.Tensor:
    return inputs[_least_cloudy_index(masks, days)].clone()


def _clear_stack(inputs: torch.Tensor, masks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    clear = (masks < 0.5).expand_as(inputs)
    return torch.where(clear, inputs, torch.full_like(inputs, float("nan"))), clear.any(dim=0)


def _fill(mosaic: torch.Tensor, covered: torch.Tensor, inputs: torch.Tensor, masks: torch.Tensor,
          days: torch.Tensor) -> torch.Tensor:
    return torch.where(covered, mosaic, inputs[_least_cloudy_index(masks, days)])


def mean_mosaic(inputs: torch.Tensor, masks: torch.Tensor, days: torch.Tensor,
                target_index: int) -> torch.Tensor:
    stack, covered = _clear_stack(inputs, masks)
    return _fill(torch.nanmean(stack, dim=0), covered, inputs, masks, days)


def median_mosaic(inputs: torch.Tensor, masks: torch.Tensor, days: torch.Tensor,
                  target_index: int) -> torch.Tensor:
    stack, covered = _clear_stack(inputs, masks)
    median = torch.nanquantile(stack.double(), 0.5, dim=0).to(inputs.dtype)  # interpolates even counts
    return _fill(median, covered, inputs, masks, days)


def nearest_clear(inputs: torch.Tensor, masks: torch.Tensor, days: torch.Tensor,
                  target_index: int) -> torch.Tensor:
    """Per pixel, the clear date with the smallest |days from target| (earlier date among equals)."""
    t = inputs.shape[0]
    rank = torch.tensor(sorted(range(t), key=lambda i: (abs(float(days[i])), float(days[i]), i)))
    priority = torch.empty(t, dtype=torch.float32)
    priority[rank] = torch.arange(t, dtype=torch.float32)
    cost = torch.where(masks[:, 0] < 0.5, priority[:, None, None], torch.full_like(masks[:, 0], float("inf")))
    best = cost.argmin(dim=0)
    picked = torch.gather(inputs, 0, best[None, None].expand(1, inputs.shape[1], -1, -1))[0]
    return _fill(picked, torch.isfinite(cost.min(dim=0).values)[None], inputs, masks, days)


BASELINES: dict[str, Baseline] = {
    "cloudy_input": cloudy_input,
    "least_cloudy": least_cloudy,
    "mean_mosaic": mean_mosaic,
    "median_mosaic": median_mosaic,
    "nearest_clear": nearest_clear,
}


def days_from_target(input_dates: tuple[str, ...], target_date: str) -> torch.Tensor:
    target = dt.date.fromisoformat(target_date)
    return torch.tensor([(dt.date.fromisoformat(d) - target).days for d in input_dates], dtype=torch.float32)


def score_baselines(dataset: SeriesDataset, names: list[str] | None = None,
                    limit: int | None = None) -> dict[str, dict[str, float]]:
    """Mean per-sample metrics of each baseline over (the first ``limit`` samples of) a split."""
    names = names or list(BASELINES)
    unknown = sorted(set(names) - set(BASELINES))
    if unknown:
        raise ValueError(f"unknown baselines {unknown} (known: {', '.join(BASELINES)})")
    if len(dataset) == 0:
        raise ValueError(f"split {dataset.split!r} of {dataset.root} has no samples to score")
    totals = {name: MetricTotals() for name in names}
    for i in range(len(dataset) if limit is None else min(limit, len(dataset))):
        sample, meta = dataset[i], dataset.meta(i)
        days = days_from_target(meta.input_dates, meta.target_date)
        target = sample["target"][None]
        for name in names:
            pred = BASELINES[name](sample["inputs"], sample["masks"], days, int(sample["target_index"]))
            totals[name].update(pred[None], target)
    return {name: {**t.means(), "n": t.count} for name, t in totals.items()}


def format_table(scores: dict[str, dict[str, float]]) -> str:
    header = f"{'baseline':<15} {'n':>5} {'PSNR dB':>8} {'SSIM':>7} {'SAM deg':>8} {'MAE':>7} {'RMSE':>7}"
    lines = [header, "-" * len(header)]
    for name, s in scores.items():
        lines.append(f"{name:<15} {int(s['n']):>5} {s['psnr']:>8.2f} {s['ssim']:>7.4f} {s['sam']:>8.2f} "
                     f"{s['mae']:>7.4f} {s['rmse']:>7.4f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m vcloud.baselines", description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, required=True, help="prepared dataset root")
    parser.add_argument("--split", default="test", choices=["train", "val", "test"])
    parser.add_argument("--baseline", action="append", choices=sorted(BASELINES),
                        help="repeatable; default all")
    parser.add_argument("--limit", type=int, default=None, help="score only the first N samples")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = parser.parse_args(argv)
    try:
        scores = score_baselines(SeriesDataset(args.data, args.split), args.baseline, args.limit)
    except (ValueError, FileNotFoundError) as exc:
        print(f"baselines failed: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({"split": args.split, "data": str(args.data), "metrics": list(METRIC_NAMES),
                          "baselines": scores}, indent=1))
    else:
        print(f"baselines on {args.data} split={args.split}")
        print(format_table(scores))
    return 0


if __name__ == "__main__":
    sys.exit(main())
