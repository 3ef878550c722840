"""The SEN12MS-CR-TS directory layout: file names, parsing, and discovery of patch series.

Real layout (per region of interest, per acquisition index, one GeoTIFF per modality and patch)::

    ROOT/ROIs1158/106/S2/0/s2_ROIs1158_106_ImgNo_0_2018-01-03_patch_7.tif
    ROOT/ROIs1158/106/S1/0/s1_ROIs1158_106_ImgNo_0_2018-01-01_patch_7.tif

Synthetic data adds two sidecar modalities with the same naming, which the real dataset lacks:
``CLD`` (per-pixel cloud class codes, see :data:`vcloud.data.bands.CLOUD_CODES`) and ``S2CLEAR``
(the cloud-free scene, written only for the target date). Pure functions plus one directory scan.
"""

from __future__ import annotations

import datetime as dt
import re
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

MODALITIES: tuple[str, ...] = ("S2", "S1", "CLD", "S2CLEAR")

FILENAME_RE = re.compile(
    r"^(?P<modality>s1|s2|cld|s2clear)"
    r"_ROIs(?P<collection>\d+)"
    r"_(?P<roi>\d+)"
    r"_ImgNo_(?P<index>\d+)"
    r"_(?P<date>\d{4}-\d{2}-\d{2})"
    r"_patch_(?P<patch>\d+)\.tiff?$",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class PatchFile:
    """One GeoTIFF of the raw layout, identified by its name."""

    modality: str
    collection: str
    roi: str
    index: int
    date: dt.date
    patch: int

    @property
    def region(self) -> str:
        """The location a patch belongs to; splits are made by region, never by patch."""
        return region_id(self.collection, self.roi)

    @property
    def series_id(self) -> str:
        return series_id(self.collection, self.roi, self.patch)


def region_id(collection: str, roi: str) -> str:
    return f"ROIs{collection}_{roi}"


def series_id(collection: str, roi: str, patch: int) -> str:
    return f"ROIs{collection}_{roi}_patch_{patch}"


def patch_filename(modality: str, collection: str, roi: str, index: int, date: dt.date, patch: int) -> str:
    """File name in the SEN12MS-CR-TS convention, e.g. ``s2_ROIs1158_106_ImgNo_0_2018-01-03_patch_7.tif``."""
    if modality.upper() not in MODALITIES:
        raise ValueError(f"modality {modality!r} unknown (known: {', '.join(MODALITIES)})")
    return f"{modality.lower()}_ROIs{collection}_{roi}_ImgNo_{index}_{date.isoformat()}_patch_{patch}.tif"


def patch_relpath(modality: str, collection: str, roi: str, index: int, date: dt.date, patch: int) -> Path:
    """Path relative to the raw root: ``ROIs<collection>/<roi>/<MODALITY>/<index>/<file name>``."""
    name = patch_filename(modality, collection, roi, index, date, patch)
    return Path(f"ROIs{collection}") / roi / modality.upper() / str(index) / name


def parse_filename(name: str) -> PatchFile:
    """Parse a raw file name; raise ``ValueError`` naming the expected pattern when it does not match."""
    m = FILENAME_RE.match(name)
    if m is None:
        raise ValueError(
            f"file name {name!r} does not follow the SEN12MS-CR-TS pattern "
            "'<s1|s2|cld|s2clear>_ROIs<collection>_<roi>_ImgNo_<index>_<YYYY-MM-DD>_patch_<n>.tif'"
        )
    return PatchFile(
        modality=m["modality"].upper(),
        collection=m["collection"],
        roi=m["roi"],
        index=int(m["index"]),
        date=dt.date.fromisoformat(m["date"]),
        patch=int(m["patch"]),
    )


@dataclass(frozen=True)
class RawObservation:
    """Everything the raw layout holds for one patch at one acquisition index (paths relative to root)."""

    index: int
    date: dt.date
    s2: str
    s1: str | None = None
    cloud_mask: str | None = None
    clear: str | None = None


@dataclass(frozen=True)
class RawSeries:
    """All acquisitions of one patch, in acquisition order."""

    collection: str
    roi: str
    patch: int
    observations: tuple[RawObservation, ...]

    @property
    def region(self) -> str:
        return region_id(self.collection, self.roi)

    @property
    def series_id(self) -> str:
        return series_id(self.collection, self.roi, self.patch)

    @property
    def has_ground_truth(self) -> bool:
        """Synthetic series carry the clean target scene; real series do not."""
        return any(o.clear is not None for o in self.observations)


def group_series(relpaths: list[str]) -> list[RawSeries]:
    """Group raw file paths (relative to the root) into patch series; pure, for testing without files.

    A Sentinel-2 file defines an observation; S1, CLD and S2CLEAR files attach to it by acquisition index.
    """
    files: dict[tuple[str, str, int], dict[int, dict[str, str]]] = defaultdict(dict)
    s2_dates: dict[tuple[str, str, int, int], dt.date] = {}
    for rel in relpaths:
        f = parse_filename(Path(rel).name)
        slot = files[(f.collection, f.roi, f.patch)].setdefault(f.index, {})
        if f.modality in slot:
            raise ValueError(
                f"two {f.modality} files for {f.series_id} index {f.index}: {slot[f.modality]} and {rel}"
            )
        slot[f.modality] = rel
        if f.modality == "S2":
            s2_dates[(f.collection, f.roi, f.patch, f.index)] = f.date
    series: list[RawSeries] = []
    for (collection, roi, patch), slots in sorted(files.items(), key=lambda kv: _sort_key(kv[0])):
        observations = []
        for index in sorted(slots):
            slot = slots[index]
            if "S2" not in slot:
                raise ValueError(
                    f"{series_id(collection, roi, patch)} index {index} has {sorted(slot)} files but no S2 "
                    "file; every acquisition needs its Sentinel-2 GeoTIFF"
                )
            observations.append(RawObservation(
                index=index, date=s2_dates[(collection, roi, patch, index)], s2=slot["S2"], s1=slot.get("S1"),
                cloud_mask=slot.get("CLD"), clear=slot.get("S2CLEAR"),
            ))
        series.append(RawSeries(collection, roi, patch, tuple(observations)))
    return series


def _sort_key(key: tuple[str, str, int]) -> tuple[int, int, int]:
    collection, roi, patch = key
    return int(collection), int(roi), patch


def scan_raw(root: Path) -> list[RawSeries]:
    """Find every patch series under a raw SEN12MS-CR-TS root."""
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"raw data root {root} does not exist; generate it with "
                                "'python -m vcloud.data.synthetic --out DIR' or point to SEN12MS-CR-TS")
    rels = [p.relative_to(root).as_posix() for p in root.glob("ROIs*/*/*/*/*.tif")]
    if not rels:
        raise FileNotFoundError(
            f"no GeoTIFFs under {root} in the layout ROIs<collection>/<roi>/<S1|S2>/<index>/*.tif"
        )
    return group_series(rels)
