"""Stage-3 pseudo-label selection: deterministic unlabeled pool, agreement, threshold."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import Dataset

from vcloud.models.config_fields import ModelConfigError
from vcloud.models.selftrain import (
    PseudoLabeledSeries,
    PseudoLabels,
    SelfTrainConfig,
    is_unlabeled,
    make_pseudo_labels,
    sample_agreement,
)


class Series(Dataset):
    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict:
        return {"inputs": torch.full((2, 13, 4, 4), float(i) / 10), "masks": torch.zeros(2, 1, 4, 4),
                "s1": torch.zeros(2, 2, 4, 4), "target_index": torch.tensor(0),
                "target": torch.full((13, 4, 4), 0.5), "series_id": f"s{i}"}


def test_unlabeled_pool_is_deterministic_and_close_to_fraction():
    ids = [f"ROI{i:04d}_p{j}" for i in range(50) for j in range(20)]
    picked = [sid for sid in ids if is_unlabeled(sid, 0.3, seed=0)]
    assert picked == [sid for sid in ids if is_unlabeled(sid, 0.3, seed=0)]
    assert 0.25 < len(picked) / len(ids) < 0.35
    assert picked != [sid for sid in ids if is_unlabeled(sid, 0.3, seed=1)]


def test_sample_agreement_is_mean_std_across_samples():
    a = torch.zeros(1, 13, 4, 4)
    samples = torch.stack([torch.cat([a, a + 0.2]), torch.cat([a, a + 0.6])])  # K=2, B=2
    torch.testing.assert_close(sample_agreement(samples), torch.tensor([0.0, 0.2]))
    with pytest.raises(ValueError, match="K>=2"):
        sample_agreement(samples[:1])


def test_keeps_only_series_whose_samples_agree():
    """Series i is refined with seed-dependent noise of amplitude i/10 (sample std ~0.08 i):
    with a threshold of 0.12 only series 0 and 1 agree."""
    cfg = SelfTrainConfig(num_samples=3, agreement_threshold=0.12)
    seen_keys = set()

    def refine(batch, generator):
        seen_keys.update(batch)
        amp = batch["inputs"][:, 0, 0, 0, 0:1]  # i / 10
        noise = torch.randn(batch["inputs"].shape[0], 13, 4, 4, generator=generator)
        return 0.5 + amp[:, :, None, None] * noise

    labels = make_pseudo_labels(refine, Series(6), [0, 1, 2, 3, 4, 5], cfg, batch_size=4)
    assert "target" not in seen_keys  # the hidden ground truth is never handed to the refiner
    assert labels.considered == (0, 1, 2, 3, 4, 5)
    assert labels.indices == (0, 1)
    assert labels.targets.shape == (2, 13, 4, 4)
    assert labels.summary()["pseudo_labels_kept"] == 2
    restored = PseudoLabels.from_state_dict(labels.state_dict())
    assert restored.indices == labels.indices and torch.equal(restored.targets, labels.targets)
    ds = PseudoLabeledSeries(Series(6), labels)
    assert len(ds) == 2 and ds[1]["series_id"] == "s1"
    torch.testing.assert_close(ds[0]["target"], labels.targets[0])


def test_config_validation():
    with pytest.raises(ModelConfigError, match=r"model\.stage3\.num_samples=1.*at least two"):
        SelfTrainConfig.from_dict({"num_samples": 1})
    with pytest.raises(ModelConfigError, match=r"unlabeled_split='holdout'.*train, val, test"):
        SelfTrainConfig.from_dict({"unlabeled_split": "holdout"})
