"""The quality benchmark's sampler metrics on a tiny synthetic split, with stand-in models (no training)."""

from __future__ import annotations

import json

import math
from typing import Any

import pytest
import torch

from benchmarks import quality
from benchmarks.quality import point_draw, sampler_draw, sampler_line, sampler_scores, sampler_summary, strict_json
from vcloud.models.draft_and_refiner import EVAL_SEED
from vcloud.models.stage_specs import least_cloudy_input
from vcloud.stage_spec import BuildContext


class StandInRefiner(torch.nn.Module):
    """The draft/refine interface of a stage-2 model: the clearest input as the draft, refined by
    adding seeded noise."""

    def __init__(self) -> None:
        super().__init__()
        self.noise = torch.nn.Parameter(torch.tensor(0.03))

    def draft(self, batch: dict[str, Any]) -> torch.Tensor:
        return least_cloudy_input(batch).clamp(0.0, 1.0)

    def refine(self, batch: dict[str, Any], generator: torch.Generator | None = None, steps: int | None = None,
               draft: torch.Tensor | None = None) -> torch.Tensor:
        if generator is None:
            generator = torch.Generator().manual_seed(EVAL_SEED)
        if draft is None:
            draft = self.draft(batch)
        return (draft + self.noise * torch.randn(draft.shape, generator=generator)).clamp(0.0, 1.0)


class DraftSpec:
    @staticmethod
    def predict(model: Any, batch: dict[str, Any]) -> torch.Tensor:
        return model.draft(batch)


def _series(index: int, clear_date: bool) -> dict[str, Any]:
    """T = 3 dates of 32 x 32; the target date (index 1) is cloudy in its left half; with
    ``clear_date`` date 0 is clear, otherwise every date is half cloudy (clearest cover 50%)."""
    g = torch.Generator().manual_seed(index)
    target = (0.3 + 0.2 * torch.rand(13, 32, 32, generator=g)).clamp(0.0, 1.0)
    masks = torch.zeros(3, 1, 32, 32)
    masks[1, :, :, :16] = 1.0
    masks[2, :, 16:, :] = 1.0
    if not clear_date:
        masks[0, :, :, 16:] = 1.0
    inputs = (target.unsqueeze(0) + 0.5 * masks).clamp(0.0, 1.0)
    return {"inputs": inputs, "masks": masks, "target": target, "target_index": torch.tensor(1),
            "s1": torch.zeros(3, 2, 32, 32), "series_id": f"s{index}"}


def _finite(value: Any) -> bool:
    if isinstance(value, list):
        return all(_finite(v) for v in value)
    return math.isfinite(value)


@pytest.fixture(scope="module")
def split() -> list[dict[str, Any]]:
    return [_series(i, clear_date=i % 2 == 0) for i in range(5)]


def test_refiner_samples_give_every_sampler_field_per_cover_bin(split: list[dict[str, Any]]) -> None:
    reports = sampler_scores(sampler_draw(StandInRefiner(), 4), split, torch.device("cpu"), batch_size=2)
    assert list(reports) == ["all", "clearest 0-5%", "clearest 50-100%"]
    assert [r["series"] for r in reports.values()] == [5, 3, 2]
    summary = sampler_summary(reports)
    for stratum in summary.values():
        for name in ("psnr_sample", "psnr_mean", "ssim_sample", "ssim_mean", "sam_sample", "sam_mean",
                     "change_mean", "change_p95", "change_mean_cloudy", "spread", "spread_cloudy",
                     "hf_power_ratio_cloudy", "hf_power_ratio_clear", "hf_power_cloudy", "hf_power_target_cloudy",
                     "hf_share_target_cloudy", "gradient_w1_cloudy", "gradient_w1_clear",
                     "crps", "crps_cloudy", "spread_skill_cloudy", "rank_histogram_cloudy",
                     "ndvi_error_cloudy_sample", "ndvi_error_cloudy_mean"):
            assert _finite(stratum[name]), name
        assert stratum["samples"] == 4 and len(stratum["rank_histogram_cloudy"]) == 5
        assert not any(name.endswith("_band") for name in stratum)
    assert len(reports["all"]["crps_band"]) == 13
    assert reports["all"]["spread"] > 0.0 and reports["all"]["change_mean"] > 0.0


def test_the_first_sample_is_the_scored_prediction(split: list[dict[str, Any]]) -> None:
    model = StandInRefiner()
    batch = {k: torch.stack([s[k] for s in split[:2]]) for k in ("inputs", "masks", "target", "target_index")}
    samples, draft = sampler_draw(model, 4)(batch)
    assert samples.shape == (2, 4, 13, 32, 32) and draft is not None
    assert torch.equal(samples[:, 0], model.refine(batch))
    assert not torch.equal(samples[:, 0], samples[:, 1])


def test_a_point_forecast_gets_the_deterministic_fields_only(split: list[dict[str, Any]]) -> None:
    reports = sampler_scores(point_draw(DraftSpec, StandInRefiner()), split, torch.device("cpu"))
    every = sampler_summary(reports)["all"]
    assert every["samples"] == 1
    for name in ("psnr_sample", "ssim_mean", "sam_mean", "crps", "crps_cloudy", "hf_power_ratio_cloudy",
                 "gradient_w1_clear", "ndvi_error_cloudy_mean"):
        assert _finite(every[name]), name
    assert not {"spread", "spread_skill_cloudy", "rank_histogram_cloudy", "change_mean"} & set(every)


def test_sampler_draw_needs_a_sample() -> None:
    with pytest.raises(ValueError, match="at least 1 sample"):
        sampler_draw(StandInRefiner(), 0)


def test_a_negative_sample_count_is_refused_before_any_work() -> None:
    from benchmarks.quality import main

    with pytest.raises(SystemExit):
        main(["--samples", "-1"])


def test_the_real_stage_models_plug_in_and_an_untrained_refiner_reads_as_collapsed(
        split: list[dict[str, Any]]) -> None:
    """Untrained stage-1 and stage-2 models (the refiner starts as the identity on its draft): the
    stage specs' predictions go through the draws, and the refiner's change and spread are 0."""
    from vcloud.models.autoencoder import Autoencoder, AutoencoderConfig
    from vcloud.models.cfdt import CFDT, CFDTConfig
    from vcloud.models.draft_and_refiner import DraftAndRefiner
    from vcloud.models.latent_refiner import LatentDiffusionRefiner, RefinerConfig
    from vcloud.stage_registry import get_stage

    torch.manual_seed(0)
    draft_model = CFDT(CFDTConfig(max_dates=3)).eval()
    autoencoder = Autoencoder(AutoencoderConfig(base_channels=8, channel_mult=(1, 2), num_res_blocks=1,
                                                latent_channels=4, norm_groups=4))
    refiner = LatentDiffusionRefiner(RefinerConfig.from_dict(
        {"base_channels": 16, "channel_mult": [1, 2], "num_res_blocks": 1, "attention_heads": 2,
         "sample_steps": 2, "norm_groups": 4}), autoencoder)
    model = DraftAndRefiner(draft_model, refiner, train_draft=False).eval()
    data = split[:2]

    point = sampler_summary(sampler_scores(point_draw(get_stage(1), draft_model), data, torch.device("cpu")))
    assert point["all"]["samples"] == 1 and _finite(point["all"]["crps_cloudy"])

    batch = {k: torch.stack([s[k] for s in data]) for k in ("inputs", "masks", "target", "target_index", "s1")}
    samples, _ = sampler_draw(model, 2)(batch)
    assert torch.equal(samples[:, 0], get_stage(2).predict(model, batch))
    refined = sampler_scores(sampler_draw(model, 2), data, torch.device("cpu"))["all"]
    assert refined["change_mean"] == pytest.approx(0.0, abs=1e-6)
    assert refined["spread"] == pytest.approx(0.0, abs=1e-6)
    assert refined["crps"] == pytest.approx(point["all"]["crps"], abs=1e-5)  # the draft itself, K times


def test_undefined_figures_are_written_as_null_never_nan() -> None:
    """A bin without a spectrum window under the clouds has no high-frequency ratio: the report says
    null there, which every JSON reader accepts."""
    report = {"stage2": {"all": {"hf_power_ratio_cloudy": float("nan"), "crps_cloudy": 0.25,
                                 "spread_skill": [float("inf"), 1.0]}}, "samples": 4}
    assert json.loads(strict_json(report)) == {
        "stage2": {"all": {"hf_power_ratio_cloudy": None, "crps_cloudy": 0.25, "spread_skill": [None, 1.0]}},
        "samples": 4}


def test_unkept_trained_weights_are_those_a_refiner_wrote_and_did_not_keep(tmp_path) -> None:
    (tmp_path / "stage2").mkdir()
    assert not quality.unkept_trained(2, tmp_path, "start")  # no trained.pt: training made no step
    (tmp_path / "stage2" / "trained.pt").touch()
    assert quality.unkept_trained(2, tmp_path, "start")
    assert not quality.unkept_trained(2, tmp_path, "trained")
    assert not quality.unkept_trained(1, tmp_path, "start")


def test_a_refiner_whose_trained_weights_were_not_kept_is_scored_under_both_weights(
        split: list[dict[str, Any]], tmp_path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Stage 2 kept its start (``best.pt``: the identity on its draft) over its trained weights
    (``trained.pt``: a refiner that moves the draft): both get sampler metrics, printed, in the
    results and in sampler_metrics.json, the trained ones labelled as not kept."""
    run = tmp_path / "run"
    (run / "stage2").mkdir(parents=True)

    def load_stage_model(stage: int, path: Any, ctx: BuildContext) -> tuple[torch.nn.Module, dict[str, Any]]:
        assert stage == 2 and path.parent == run / "stage2"
        model = StandInRefiner()
        if path.name == "best.pt":
            with torch.no_grad():
                model.noise.zero_()
        return model, {}

    monkeypatch.setattr(quality, "load_stage_model", load_stage_model)
    ctx = BuildContext(config=None, run_dir=run, device=torch.device("cpu"))  # type: ignore[arg-type]
    splits = {"": split, "_shifted": split[:3]}
    results: dict[str, Any] = {}
    details: dict[str, Any] = {}
    quality.report_sampler(2, ctx, splits, 2, results, details, tmp_path)
    quality.report_sampler(2, ctx, splits, 2, results, details, tmp_path, "trained.pt")

    keys = ["stage2", "stage2_shifted", "stage2_trained", "stage2_trained_shifted"]
    assert list(results["sampler_metrics"]) == keys
    kept, trained = (results["sampler_metrics"][key]["all"] for key in ("stage2", "stage2_trained"))
    assert kept["spread"] == 0.0 and kept["change_mean"] == 0.0
    assert trained["spread"] > 0.0 and trained["change_mean"] > 0.0
    assert results["sampler_metrics"]["stage2_trained_shifted"]["all"]["series"] == 3
    written = json.loads((tmp_path / "sampler_metrics.json").read_text())
    assert list(written) == keys and "crps_band" in written["stage2_trained"]["all"]
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(", K=")[0] for line in lines] == [
        "stage 2 sampler", "shifted stage 2 sampler", "stage 2 sampler (trained, not kept)",
        "shifted stage 2 sampler (trained, not kept)"]
    assert "change to the draft 0.0000" in lines[0] and "change to the draft 0.0000" not in lines[2]


def test_the_printed_line_says_when_the_high_frequency_ratio_is_ill_conditioned() -> None:
    every = {"samples": 1, "crps_cloudy": 0.0113, "hf_power_cloudy": 1.8e-4, "hf_power_target_cloudy": 2.9e-6,
             "hf_power_ratio_cloudy": 64.8, "hf_share_target_cloudy": 0.0013,
             "hf_power_ratio_cloudy_conditioned": False, "ndvi_error_cloudy_mean": 0.078}
    line = sampler_line("stage 1 sampler", every)
    assert line == ("stage 1 sampler, K=1: CRPS under clouds 0.0113, high-frequency power under clouds 0.00018, "
                    "64.8 x the target's 2.9e-06 (ill-conditioned: only 0.13% of the target's power lies above "
                    "0.25 cycles/pixel), NDVI error under clouds 0.0780")
    every.update(hf_share_target_cloudy=0.08, hf_power_ratio_cloudy_conditioned=True)
    assert "ill-conditioned" not in sampler_line("stage 1 sampler", every)
