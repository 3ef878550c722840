"""Pure rules of the prepare step: which date is the target, which dates are inputs, cloud masks for
series that come without them, and the split of locations.
"""

from __future__ import annotations

import datetime as dt
import hashlib
from dataclasses import dataclass

import numpy as np

from vcloud.data.bands import CLOUD_CODES

# Brightness (mean of B2, B3, B4 reflectance) thresholds of the fallback cloud test. Land surfaces stay
# below ~0.15 in the visible bands; clouds are brighter the thicker they are.
THIN_BRIGHTNESS = 0.18
THICK_BRIGHTNESS = 0.30
OPAQUE_BRIGHTNESS = 0.65


def detect_clouds(s2: np.ndarray) -> np.ndarray:
    """Per-pixel cloud class codes [H, W] from a scaled S2 patch [13, H, W], for data without masks.

    A visible-brightness test: cheap and good enough to rank dates by cloudiness and to tell thin from
    opaque clouds. It does not find shadows and flags snow as cloud; supply ``CLD`` masks (for example
    from s2cloudless) for anything finer.
    """
    brightness = s2[1:4].mean(axis=0)
    codes = np.zeros(brightness.shape, np.uint8)
    codes[brightness >= THIN_BRIGHTNESS] = CLOUD_CODES["thin"]
    codes[brightness >= THICK_BRIGHTNESS] = CLOUD_CODES["thick"]
    codes[brightness >= OPAQUE_BRIGHTNESS] = CLOUD_CODES["opaque"]
    return codes


def clearest_index(cloud_cover: list[float]) -> int:
    """Index of the least cloudy date (the earliest among equals)."""
    if not cloud_cover:
        raise ValueError("no dates to choose a target from")
    return int(np.argmin(np.asarray(cloud_cover)))


def nearest_dates(dates: list[dt.date], target: dt.date, n: int) -> list[int]:
    """Indices of the ``n`` dates closest to ``target`` (earlier first among equals), in date order."""
    if n > len(dates):
        raise ValueError(f"{n} input dates requested but only {len(dates)} available")
    order = sorted(range(len(dates)), key=lambda i: (abs((dates[i] - target).days), dates[i], i))
    return sorted(order[:n], key=lambda i: (dates[i], i))


def reference_index(dates: list[dt.date], target: dt.date) -> int:
    """Position of the input closest in time to the target date (the target's own cloudy observation
    when it exists)."""
    return min(range(len(dates)), key=lambda i: (abs((dates[i] - target).days), i))


SPLITS: tuple[str, ...] = ("train", "val", "test")


@dataclass(frozen=True)
class SplitFractions:
    """Share of locations per split; every split gets at least one location when there are three."""

    train: float = 0.8
    val: float = 0.1
    test: float = 0.1

    def __post_init__(self) -> None:
        for name in SPLITS:
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"split fraction {name}={value} must lie in [0, 1]")
        if abs(self.train + self.val + self.test - 1.0) > 1e-6:
            raise ValueError(
                f"split fractions must sum to 1, got train={self.train} val={self.val} test={self.test}"
            )


def assign_splits(regions: list[str], fractions: SplitFractions = SplitFractions(),
                  seed: int = 0) -> dict[str, str]:
    """Map each location (region) to a split. Patches of one location always share a split, so no
    neighbouring, overlapping-in-content patch leaks from train into evaluation.

    The order is a hash of ``(seed, region)``: adding locations later does not move existing ones
    between splits more than the changed counts require.
    """
    unique = sorted(set(regions))
    n = len(unique)
    if n < 3:
        raise ValueError(f"need at least 3 locations to split into train/val/test, found {n}: {unique}")
    n_val = max(1, round(n * fractions.val)) if fractions.val > 0 else 0
    n_test = max(1, round(n * fractions.test)) if fractions.test > 0 else 0
    if n_val + n_test >= n:
        raise ValueError(f"{n} locations leave none for training with fractions {fractions}")
    ranked = sorted(unique, key=lambda r: hashlib.sha256(f"{seed}:{r}".encode()).hexdigest())
    out = {r: "test" for r in ranked[:n_test]}
    out.update({r: "val" for r in ranked[n_test:n_test + n_val]})
    out.update({r: "train" for r in ranked[n_test + n_val:]})
    return out
