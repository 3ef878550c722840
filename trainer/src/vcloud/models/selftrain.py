"""Stage 3: self-training on series without a usable cloud-free target.

The stage-2 model refines each unlabeled series several times with different DDIM seeds. Where
those samples agree (mean per-pixel standard deviation across samples below a threshold) the
refiner is confident, and the mean sample becomes a pseudo-target; the rest are dropped. The
refiner and the scene adapter (:mod:`vcloud.models.scene_adapter`: a per-band correction of the
draft from the scene's statistics), and with ``train_draft`` the draft model itself, are then
fine-tuned on labeled series plus the kept pseudo-labeled ones.

The student is noisy (as in Noisy Student training): it sees each pseudo-labelled series through
an extra haze veil (:mod:`vcloud.data.haze_veil`) the teacher did not see, so reproducing the
pseudo-label means removing more haze than the teacher had to, instead of repeating the teacher's
own output. And the pseudo-labelled series are repeated up to ``pseudo_label_share`` of each epoch:
a new domain of a few dozen series beside a labeled set of hundreds would otherwise barely be seen.

Which series are "unlabeled" is a pure function of the series id (a salted hash), so the split is
the same on every rank and after every restart, and their ground truth is never read.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping

import torch
from torch.utils.data import Dataset

from vcloud.data.haze_veil import HazeVeil
from vcloud.config_fields import build_config, require, require_positive_int

SECTION = "model.stage3"


@dataclass(frozen=True)
class SelfTrainConfig:
    """How pseudo-labels are made and how the fine-tuning loss is weighted."""

    num_samples: int = 3
    """DDIM samples (different seeds) per unlabeled series; agreement is measured across them."""
    agreement_threshold: float = 0.02
    """Keep a pseudo-label only if the mean per-pixel std across samples (reflectance units) is
    at most this."""
    sample_steps: int = 0
    """DDIM steps for pseudo-labelling; 0 uses the refiner's ``sample_steps``."""
    unlabeled_data: str = ""
    """A prepared dataset of another domain (a new region or season) whose ``unlabeled_split``
    series are all pseudo-labelled, their targets never read, beside the whole labeled training
    split; a relative path is taken from the labeled dataset's directory. Empty: the unlabeled
    series are ``unlabeled_fraction`` of the labeled dataset's ``unlabeled_split``."""
    unlabeled_split: str = "train"
    """Split whose series may be treated as unlabeled (their targets hidden)."""
    unlabeled_fraction: float = 0.3
    """Without ``unlabeled_data``: fraction of ``unlabeled_split`` series (chosen by series id)
    treated as unlabeled. With the training split, those series are removed from the labeled set."""
    max_val_loss: float = 0.1
    """With ``unlabeled_data``: the labeled validation split cannot show what adapting to another
    domain gains, only what it costs, so the latest validated weights that lose at most this much
    (in ``train.best_metric`` units, dB for psnr) against stage 2's become ``best.pt``."""
    seed: int = 0
    """Salt of the unlabeled selection and base seed of the DDIM samples."""
    train_draft: bool = True
    """Fine-tune the draft model itself. Off in the shipped configs: on another domain's
    pseudo-labels it learned one per-band offset for every scene, which cost labeled locations
    (see :mod:`vcloud.models.scene_adapter`); the scene adapter learns that correction per scene."""
    scene_adapter: bool = False
    """Correct the draft per band from the scene's statistics, zero for a scene typical of the
    labeled training split (:mod:`vcloud.models.scene_adapter`). On in the shipped configs."""
    adapter_scale: float = 0.2
    """Reflectance per unit of the adapter's output. Adam moves each weight by about the learning
    rate per step, so ``lr * adapter_scale`` sets how fast the correction can grow: 0.2 lets it
    reach a few thousandths of reflectance (a hazier atmosphere's offset) in tens of steps at
    ``lr`` 5e-5."""
    draft_loss_weight: float = 1.0
    """Weight of the L1 loss of the draft (with the adapter's correction) in the fine-tuning
    objective; it is what trains the draft model and the adapter."""
    refiner_loss_weight: float = 1.0
    """Weight of the refiner's noise-prediction loss in the fine-tuning objective."""
    student_haze_depth: float = 0.3
    """Largest optical depth (at 490 nm) of the extra haze veil over each input date of a
    pseudo-labelled series, drawn per date and per use; 0 = the student sees what the teacher saw."""
    student_haze_probability: float = 0.9
    """Chance that an input date of a pseudo-labelled series gets the extra veil."""
    pseudo_label_share: float = 0.5
    """Share of each epoch that pseudo-labelled series make up, by repeating them (never by
    dropping labeled ones); 0 = each once."""

    def __post_init__(self) -> None:
        require_positive_int(SECTION, "num_samples", self.num_samples)
        require(self.num_samples >= 2, SECTION, "num_samples", self.num_samples,
                "an integer >= 2 (agreement needs at least two samples)")
        require(isinstance(self.agreement_threshold, (int, float)) and self.agreement_threshold > 0,
                SECTION, "agreement_threshold", self.agreement_threshold, "a number > 0")
        require(isinstance(self.sample_steps, int) and self.sample_steps >= 0, SECTION, "sample_steps",
                self.sample_steps, "an integer >= 0 (0 = the refiner's sample_steps)")
        require(self.unlabeled_split in ("train", "val", "test"), SECTION, "unlabeled_split",
                self.unlabeled_split, "train, val, test")
        require(isinstance(self.unlabeled_fraction, (int, float)) and 0 < self.unlabeled_fraction <= 1,
                SECTION, "unlabeled_fraction", self.unlabeled_fraction, "a number in (0, 1]")
        require(isinstance(self.seed, int), SECTION, "seed", self.seed, "an integer")
        require(isinstance(self.student_haze_depth, (int, float)) and 0 <= self.student_haze_depth <= 3,
                SECTION, "student_haze_depth", self.student_haze_depth, "a number in [0, 3] (0 = no veil)")
        require(isinstance(self.student_haze_probability, (int, float)) and 0 <= self.student_haze_probability <= 1,
                SECTION, "student_haze_probability", self.student_haze_probability, "a number in [0, 1]")
        require(isinstance(self.pseudo_label_share, (int, float)) and 0 <= self.pseudo_label_share < 1,
                SECTION, "pseudo_label_share", self.pseudo_label_share, "a number in [0, 1) (0 = each series once)")
        require(isinstance(self.unlabeled_data, str), SECTION, "unlabeled_data", self.unlabeled_data,
                "a path to a prepared dataset, or empty")
        require(isinstance(self.max_val_loss, (int, float)) and self.max_val_loss >= 0, SECTION, "max_val_loss",
                self.max_val_loss, "a number >= 0")
        for name in ("train_draft", "scene_adapter"):
            value = getattr(self, name)
            require(isinstance(value, bool), SECTION, name, value, "true or false")
        require(isinstance(self.adapter_scale, (int, float)) and not isinstance(self.adapter_scale, bool)
                and self.adapter_scale > 0, SECTION, "adapter_scale", self.adapter_scale, "a number > 0")
        for name in ("draft_loss_weight", "refiner_loss_weight"):
            value = getattr(self, name)
            require(isinstance(value, (int, float)) and value >= 0, SECTION, name, value, "a number >= 0")

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> "SelfTrainConfig":
        return build_config(cls, d, SECTION, check_scalars=False)

    def labelling_settings(self) -> dict[str, Any]:
        """The settings the pseudo-labels depend on (the cache key); the student's do not count."""
        names = ("num_samples", "agreement_threshold", "sample_steps", "seed", "unlabeled_data", "unlabeled_split",
                 "unlabeled_fraction")
        return {name: getattr(self, name) for name in names}

    @property
    def student_veil(self) -> HazeVeil:
        return HazeVeil(max_depth=float(self.student_haze_depth), probability=float(self.student_haze_probability))

    def pseudo_label_repeats(self, labeled: int, pseudo: int) -> int:
        """How often each pseudo-labelled series appears per epoch for ``pseudo_label_share``."""
        if pseudo == 0 or self.pseudo_label_share == 0:
            return 1
        wanted = self.pseudo_label_share / (1 - self.pseudo_label_share) * labeled
        return max(1, round(wanted / pseudo))


def is_unlabeled(series_id: str, fraction: float, seed: int) -> bool:
    """Deterministic membership of a series in the unlabeled pool (stable across processes,
    unlike Python's salted ``hash``)."""
    digest = hashlib.sha256(f"{seed}:{series_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < fraction


def sample_agreement(samples: torch.Tensor) -> torch.Tensor:
    """[K, B, C, H, W] samples -> [B] mean over pixels and bands of the std across the K samples."""
    if samples.ndim != 5 or samples.shape[0] < 2:
        raise ValueError(f"need [K>=2, B, C, H, W] samples, got {list(samples.shape)}")
    return samples.float().std(dim=0, unbiased=False).mean(dim=(1, 2, 3))


@dataclass(frozen=True)
class PseudoLabels:
    """Pseudo-targets kept for fine-tuning, with the statistics to report."""

    indices: tuple[int, ...]
    """Dataset indices of the kept series."""
    targets: torch.Tensor
    """[N_kept, 13, H, W] mean of the agreeing samples."""
    agreement: tuple[float, ...]
    """Agreement score of every considered series (kept or not), in ``considered`` order."""
    considered: tuple[int, ...]
    """Dataset indices of every unlabeled series that was pseudo-labelled."""
    threshold: float

    @property
    def kept(self) -> int:
        return len(self.indices)

    def summary(self) -> dict[str, Any]:
        return {"pseudo_labels_considered": len(self.considered), "pseudo_labels_kept": self.kept,
                "agreement_threshold": self.threshold,
                "agreement_median": float(torch.tensor(self.agreement).median()) if self.agreement else None}

    def state_dict(self) -> dict[str, Any]:
        return {"indices": list(self.indices), "targets": self.targets, "agreement": list(self.agreement),
                "considered": list(self.considered), "threshold": self.threshold}

    @classmethod
    def from_state_dict(cls, d: Mapping[str, Any]) -> "PseudoLabels":
        return cls(tuple(d["indices"]), d["targets"], tuple(d["agreement"]), tuple(d["considered"]),
                   float(d["threshold"]))


def make_pseudo_labels(
    refine: Callable[[dict[str, torch.Tensor], torch.Generator], torch.Tensor],
    dataset: Dataset,
    indices: Iterable[int],
    cfg: SelfTrainConfig,
    batch_size: int = 1,
) -> PseudoLabels:
    """Refine each series ``num_samples`` times and keep those whose samples agree.

    ``refine(batch, generator)`` returns [B, 13, H, W]; only ``inputs``, ``masks``, ``s1`` and
    ``target_index`` of the batch are meant to be read (the target stays hidden)."""
    indices = list(indices)
    kept_idx: list[int] = []
    kept_targets: list[torch.Tensor] = []
    scores: list[float] = []
    for start in range(0, len(indices), batch_size):
        chunk = indices[start:start + batch_size]
        items = [dataset[i] for i in chunk]
        batch = {k: torch.stack([it[k] for it in items]) for k in ("inputs", "masks", "s1", "target_index")
                 if k in items[0]}
        samples = []
        for k in range(cfg.num_samples):
            g = torch.Generator().manual_seed(cfg.seed * 1_000_003 + k)
            samples.append(refine(batch, g).float().cpu())
        stacked = torch.stack(samples)
        agreement = sample_agreement(stacked)
        mean = stacked.mean(0)
        for j, idx in enumerate(chunk):
            scores.append(float(agreement[j]))
            if agreement[j] <= cfg.agreement_threshold:
                kept_idx.append(idx)
                kept_targets.append(mean[j].clamp(0, 1))
    targets = torch.stack(kept_targets) if kept_targets else torch.empty(0)
    return PseudoLabels(tuple(kept_idx), targets, tuple(scores), tuple(indices), float(cfg.agreement_threshold))


class PseudoLabeledSeries(Dataset):
    """The kept unlabeled series with their pseudo-targets in place of the hidden ground truth,
    each ``repeats`` times, the student's inputs under a fresh ``veil`` at every use.

    The veil draws from torch's default generator: the DataLoader seeds it in each worker from the
    epoch's seed, so an epoch's veils are the same on a rerun."""

    def __init__(self, base: Dataset, labels: PseudoLabels, veil: HazeVeil | None = None, repeats: int = 1) -> None:
        if repeats < 1:
            raise ValueError(f"repeats must be >= 1, got {repeats}")
        self.base = base
        self.labels = labels
        self.veil = veil if veil is not None and veil.enabled else None
        self.repeats = repeats

    def __len__(self) -> int:
        return self.labels.kept * self.repeats

    def __getitem__(self, i: int) -> dict[str, Any]:
        if not 0 <= i < len(self):
            raise IndexError(i)
        kept = i % self.labels.kept
        item = dict(self.base[self.labels.indices[kept]])
        item["target"] = self.labels.targets[kept]
        if self.veil is not None:
            item["inputs"] = self.veil.apply(item["inputs"])
        return item
