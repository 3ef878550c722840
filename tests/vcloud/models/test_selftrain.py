"""Stage-3 pseudo-label selection: deterministic unlabeled pool, agreement, threshold."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import Dataset

from vcloud.config_fields import ModelConfigError
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
    for field, value in (("student_haze_depth", -1), ("student_haze_probability", 2), ("pseudo_label_share", 1.0)):
        with pytest.raises(ModelConfigError, match=rf"model\.stage3\.{field}"):
            SelfTrainConfig.from_dict({field: value})


@pytest.mark.parametrize(("share", "labeled", "pseudo", "repeats"), [
    (0.0, 256, 40, 1),    # each once
    (0.5, 256, 40, 6),    # 240 pseudo-labelled beside 256 labeled
    (0.5, 10, 40, 1),     # never fewer than once
    (0.25, 300, 10, 10),  # 100 beside 300
    (0.5, 256, 0, 1),
])
def test_pseudo_labelled_series_repeat_up_to_their_share(share, labeled, pseudo, repeats):
    assert SelfTrainConfig(pseudo_label_share=share).pseudo_label_repeats(labeled, pseudo) == repeats


def test_the_student_sees_pseudo_labelled_series_through_a_fresh_veil():
    """Inputs hazier than the teacher's at every use, the pseudo-target untouched, repeats cycling."""
    labels = PseudoLabels((1, 4), torch.rand(2, 13, 4, 4), (0.0, 0.0), (1, 4), 0.1)
    cfg = SelfTrainConfig(student_haze_depth=1.0, student_haze_probability=1.0)
    ds = PseudoLabeledSeries(Series(6), labels, cfg.student_veil, repeats=3)
    assert len(ds) == 6
    assert [ds[i]["series_id"] for i in range(6)] == ["s1", "s4"] * 3
    torch.manual_seed(0)
    first, again = ds[1], ds[3]
    clean = Series(6)[4]["inputs"]
    assert not torch.equal(first["inputs"], clean) and not torch.equal(first["inputs"], again["inputs"])
    assert torch.equal(first["target"], labels.targets[1]) and torch.equal(first["masks"], Series(6)[4]["masks"])
    with pytest.raises(IndexError):
        ds[6]
    plain = PseudoLabeledSeries(Series(6), labels, SelfTrainConfig(student_haze_depth=0).student_veil)
    assert len(plain) == 2 and torch.equal(plain[1]["inputs"], clean)
