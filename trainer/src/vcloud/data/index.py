"""The prepared dataset's index: one JSON file describing every series and where its stack lives.

The index is written once by prepare and only read afterwards: every rank and every worker reads the
same file at construction time, so nothing has to be discovered lazily after distributed training has
started (the lazy-cache-on-rank-0 deadlock of the field notes cannot happen).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from vcloud.contract import DATA_INDEX
from vcloud.data.bands import N_S1, N_S2, QUANT
from vcloud.durable import atomic_write_text

INDEX_NAME = DATA_INDEX
FORMAT = "vcloud-prepared"
FORMAT_VERSION = 1


@dataclass(frozen=True)
class StackLayout:
    """Plane ranges inside one prepared uint16 stack [planes, H, W] of a series with T inputs.

    Order: T x 13 S2 inputs, 13 target bands, T x 2 S1 bands, T cloud class planes.
    """

    n_inputs: int

    @property
    def inputs(self) -> slice:
        return slice(0, self.n_inputs * N_S2)

    @property
    def target(self) -> slice:
        return slice(self.inputs.stop, self.inputs.stop + N_S2)

    @property
    def s1(self) -> slice:
        return slice(self.target.stop, self.target.stop + self.n_inputs * N_S1)

    @property
    def masks(self) -> slice:
        return slice(self.s1.stop, self.s1.stop + self.n_inputs)

    @property
    def planes(self) -> int:
        return self.masks.stop


@dataclass(frozen=True)
class RawSources:
    """Raw GeoTIFFs (relative to the raw root) a prepared series was built from."""

    s2: tuple[str, ...]
    s1: tuple[str, ...]
    """One per input: prepare skips a series whose chosen inputs lack one."""
    cloud_masks: tuple[str | None, ...]
    target: str
    """The ``S2CLEAR`` file of synthetic data, or the cloud-free ``S2`` date of real data."""


@dataclass(frozen=True)
class SeriesRecord:
    """One prepared patch series."""

    series_id: str
    region: str
    split: str
    file: str
    """Stack path relative to the prepared root, e.g. ``train/ROIs1158_106_patch_7.tif``."""
    height: int
    width: int
    input_dates: tuple[str, ...]
    target_date: str
    target_index: int
    """Which input is the target date's cloudy observation (or the input closest to the target date)."""
    cloud_types: tuple[str, ...]
    """Per input: clear, thin, thick or opaque (most severe cloud present)."""
    cloud_cover: tuple[float, ...]
    crs: str
    transform: tuple[float, float, float, float, float, float]
    has_ground_truth: bool
    """True for synthetic series whose target is the known clean scene of a cloudy date."""
    raw: RawSources

    @classmethod
    def from_dict(cls, d: dict) -> SeriesRecord:
        d = dict(d)
        raw = d.pop("raw")
        return cls(**_lists_as_tuples(d), raw=RawSources(**_lists_as_tuples(raw)))


def _lists_as_tuples(d: Mapping[str, Any]) -> dict[str, Any]:
    """A record's fields as read from JSON, its lists back to the tuples the dataclasses hold."""
    return {k: tuple(v) if isinstance(v, list) else v for k, v in d.items()}


@dataclass(frozen=True)
class PreparedIndex:
    """Everything prepare wrote: settings, the region-to-split map and the series."""

    n_inputs: int
    series: tuple[SeriesRecord, ...]
    regions: dict[str, str]
    source: dict = field(default_factory=dict)
    skipped: tuple[dict, ...] = ()
    quant: int = QUANT

    @property
    def layout(self) -> StackLayout:
        return StackLayout(self.n_inputs)

    def split(self, name: str) -> list[SeriesRecord]:
        return [s for s in self.series if s.split == name]

    def to_json(self) -> str:
        body = {
            "format": FORMAT,
            "version": FORMAT_VERSION,
            "n_inputs": self.n_inputs,
            "quant": self.quant,
            "source": self.source,
            "regions": self.regions,
            "skipped": list(self.skipped),
            "series": [asdict(s) for s in self.series],
        }
        return json.dumps(body, indent=1, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str, origin: str = "index") -> PreparedIndex:
        body = json.loads(text)
        if body.get("format") != FORMAT or body.get("version") != FORMAT_VERSION:
            raise ValueError(
                f"{origin} is not a {FORMAT} v{FORMAT_VERSION} index (found format={body.get('format')!r} "
                f"version={body.get('version')!r}); re-run 'python -m vcloud.data.prepare'"
            )
        return cls(
            n_inputs=int(body["n_inputs"]),
            quant=int(body["quant"]),
            source=body["source"],
            regions=dict(body["regions"]),
            skipped=tuple(body["skipped"]),
            series=tuple(SeriesRecord.from_dict(s) for s in body["series"]),
        )


def load_index(prepared_root: Path) -> PreparedIndex:
    path = Path(prepared_root) / INDEX_NAME
    if not path.is_file():
        raise FileNotFoundError(
            f"no {INDEX_NAME} in {prepared_root}: not a prepared dataset (or prepare did not finish); "
            "run 'python -m vcloud.data.prepare --raw RAW --out PREPARED'"
        )
    return PreparedIndex.from_json(path.read_text(), origin=str(path))


def write_index(prepared_root: Path, index: PreparedIndex) -> Path:
    """Write the index atomically (temp file, fsync, rename) with the umask's mode, so the project's
    other members can read it: its presence marks a finished prepare."""
    path = Path(prepared_root) / INDEX_NAME
    atomic_write_text(path, index.to_json())
    return path
