"""Baselines: exact behaviour on hand-made series, and the table on tiny prepared data."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from vcloud.baselines import (
    BASELINES, days_from_target, least_cloudy, main, mean_mosaic, median_mosaic, nearest_clear,
    score_baselines,
)
from vcloud.data.dataset import SeriesDataset
from vcloud.metrics import evaluate



def _series() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Four dates of a 2x2 patch whose value is the date number; masks chosen per pixel."""
    inputs = torch.stack([torch.full((13, 2, 2), float(v)) for v in (0.1, 0.2, 0.3, 0.4)])
    masks = torch.zeros(4, 1, 2, 2)
    masks[0, 0, 0, 0] = 1  # date 0 cloudy at (0,0)
    masks[1] = 1  # date 1 fully cloudy
    masks[2, 0, 0, :] = 1  # date 2 cloudy on the top row
    masks[:, 0, 1, 1] = 1  # no date sees (1,1)
    days = torch.tensor([-30.0, -5.0, 3.0, 40.0])
    return inputs, masks, days


def test_least_cloudy_picks_the_clearest_date() -> None:
    inputs, masks, days = _series()
    masks[3] = 1  # date 3 now cloudy everywhere
    out = least_cloudy(inputs, masks, days, 1)
    assert torch.allclose(out, torch.full((13, 2, 2), 0.1))  # date 0: 2 cloudy pixels, date 2: 3


def test_mosaics_use_only_clear_observations_with_fallback() -> None:
    inputs, masks, days = _series()
    mean = mean_mosaic(inputs, masks, days, 1)[0]
    median = median_mosaic(inputs, masks, days, 1)[0]
    # (0,0): clear on date 3 only; (0,1): dates 0, 3; (1,0): dates 0, 2, 3;
    # (1,1): no date -> the least cloudy date, 3 (one cloudy pixel)
    torch.testing.assert_close(mean, torch.tensor([[0.4, 0.25], [(0.1 + 0.3 + 0.4) / 3, 0.4]]))
    torch.testing.assert_close(median, torch.tensor([[0.4, 0.25], [0.3, 0.4]]))


def test_nearest_clear_prefers_the_closest_clear_date_per_pixel() -> None:
    inputs, masks, days = _series()
    out = nearest_clear(inputs, masks, days, 1)[0]
    # closest dates: 2 (+3 d), 1 (-5 d, cloudy), 0 (-30 d), 3 (+40 d)
    torch.testing.assert_close(out, torch.tensor([[0.4, 0.1], [0.3, 0.4]]))


def test_days_from_target() -> None:
    assert days_from_target(("2018-01-01", "2018-01-11"), "2018-01-06").tolist() == [-5.0, 5.0]


def test_baselines_beat_doing_nothing_on_tiny_data(tiny_prepared: Path) -> None:
    scores = score_baselines(SeriesDataset(tiny_prepared, "test"))
    assert set(scores) == set(BASELINES)
    assert all(s["n"] == 3 for s in scores.values())
    assert scores["nearest_clear"]["psnr"] > scores["cloudy_input"]["psnr"]
    assert scores["mean_mosaic"]["mae"] < scores["cloudy_input"]["mae"]


def test_scores_match_the_shared_metric_code(tiny_prepared: Path) -> None:
    ds = SeriesDataset(tiny_prepared, "val")
    scores = score_baselines(ds, ["cloudy_input"])
    per_sample = []
    for i in range(len(ds)):
        s = ds[i]
        per_sample.append(evaluate(s["inputs"][int(s["target_index"])][None], s["target"][None]))
    for metric in ("psnr", "ssim", "sam", "mae", "rmse"):
        expected = sum(p[metric] for p in per_sample) / len(per_sample)
        assert scores["cloudy_input"][metric] == pytest.approx(expected, rel=1e-9)


def test_cli_table_and_json(tiny_prepared: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["--data", str(tiny_prepared), "--split", "test"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[1].split()[:3] == ["baseline", "n", "PSNR"]
    assert [line.split()[0] for line in table[3:]] == list(BASELINES)
    args = ["--data", str(tiny_prepared), "--split", "test", "--json", "--baseline", "least_cloudy"]
    assert main(args) == 0
    body = json.loads(capsys.readouterr().out)
    assert list(body["baselines"]) == ["least_cloudy"] and body["baselines"]["least_cloudy"]["n"] == 3
    assert main(["--data", str(tiny_prepared / "nowhere")]) == 2
    assert "vcloud.data.prepare" in capsys.readouterr().err
