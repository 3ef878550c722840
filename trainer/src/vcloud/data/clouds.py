"""Synthetic clouds with known masks: seeded fractal noise, thin / thick / opaque layers and shadows.

Pure numpy so that the same seed gives the same bytes on every machine. A cloud layer is an opacity
map ``alpha`` in [0, 1]; the observed reflectance is ``scene * (1 - alpha) + cloud * alpha`` per band,
thin clouds less opaque in the longer wavelengths (:data:`SPECTRAL_OPACITY`). Thick and opaque
clouds cast a displaced, darkening shadow on the ground.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from vcloud.data.bands import CLOUD_CODES, CLOUD_TYPES, S2_WAVELENGTH_NM

CLOUD_REFLECTANCE: dict[str, np.ndarray] = {
    # B1..B12 top-of-atmosphere reflectance of the cloud body; cirrus (thin) is bright in B10.
    name: np.asarray(values, np.float32)
    for name, values in {
        "thin": [0.42, 0.43, 0.43, 0.43, 0.43, 0.43, 0.43, 0.42, 0.42, 0.25, 0.30, 0.33, 0.26],
        "thick": [0.62, 0.64, 0.64, 0.64, 0.64, 0.64, 0.63, 0.62, 0.62, 0.38, 0.10, 0.46, 0.36],
        "opaque": [0.78, 0.80, 0.80, 0.80, 0.80, 0.80, 0.79, 0.78, 0.78, 0.47, 0.12, 0.56, 0.42],
    }.items()
}

SPECTRAL_OPACITY: dict[str, np.ndarray] = {
    # Thin cirrus and haze scatter short wavelengths more: their opacity falls from the visible
    # bands to the SWIR ones ((wavelength / 560 nm) ** -0.7, at most 1). Thick clouds hide every band.
    "thin": np.minimum(1.0, (np.asarray(S2_WAVELENGTH_NM, np.float32) / 560.0) ** -0.7).astype(np.float32),
    "thick": np.ones(len(S2_WAVELENGTH_NM), np.float32),
    "opaque": np.ones(len(S2_WAVELENGTH_NM), np.float32),
}

_COVERAGE = {"thin": (0.25, 0.7), "thick": (0.15, 0.5), "opaque": (0.1, 0.4)}
_PEAK_ALPHA = {"thin": (0.3, 0.5), "thick": (0.65, 0.85), "opaque": (0.97, 1.0)}
_EDGE_SOFTNESS = {"thin": 0.3, "thick": 0.12, "opaque": 0.04}
_MASK_ALPHA = 0.02
"""Opacity above which a pixel counts as cloudy in the mask (2% of a cloud's brightness is visible)."""
_MASK_SHADOW = 0.05


def fractal_noise(rng: np.random.Generator, shape: tuple[int, int], base_cells: int = 3, octaves: int = 5,
                  persistence: float = 0.5) -> np.ndarray:
    """Perlin-like value noise in [0, 1]: octaves of smoothly interpolated random lattices."""
    height, width = shape
    out = np.zeros(shape, np.float64)
    amplitude, total = 1.0, 0.0
    for octave in range(octaves):
        cells = base_cells * 2**octave
        lattice = rng.random((cells + 1, cells + 1))
        out += amplitude * _smooth_upsample(lattice, height, width)
        total += amplitude
        amplitude *= persistence
    out /= total
    lo, hi = out.min(), out.max()
    return ((out - lo) / max(hi - lo, 1e-12)).astype(np.float32)


def _smooth_upsample(lattice: np.ndarray, height: int, width: int) -> np.ndarray:
    cells = lattice.shape[0] - 1
    y = np.linspace(0.0, cells, height, endpoint=False) + 0.5 * cells / height
    x = np.linspace(0.0, cells, width, endpoint=False) + 0.5 * cells / width
    y0, x0 = np.floor(y).astype(int), np.floor(x).astype(int)
    fy, fx = y - y0, x - x0
    fy, fx = fy * fy * (3 - 2 * fy), fx * fx * (3 - 2 * fx)
    y1, x1 = np.minimum(y0 + 1, cells), np.minimum(x0 + 1, cells)
    top = lattice[y0][:, x0] * (1 - fx) + lattice[y0][:, x1] * fx
    bottom = lattice[y1][:, x0] * (1 - fx) + lattice[y1][:, x1] * fx
    return top * (1 - fy)[:, None] + bottom * fy[:, None]


@dataclass(frozen=True)
class CloudLayer:
    """One cloud deck over a patch: its type, opacity and the shadow it casts."""

    kind: str
    alpha: np.ndarray
    shadow: np.ndarray


def cloud_layer(rng: np.random.Generator, kind: str, shape: tuple[int, int], *, coverage: float | None = None,
                shadow_offset: tuple[int, int] | None = None) -> CloudLayer:
    """A random cloud deck of ``kind`` (thin, thick or opaque) with a displaced shadow for thick ones.

    ``coverage`` (fraction of the patch) and ``shadow_offset`` (dy, dx in pixels) default to draws
    from the type's own ranges.
    """
    if kind not in CLOUD_TYPES:
        raise ValueError(f"cloud kind {kind!r} unknown (known: {', '.join(CLOUD_TYPES)})")
    if coverage is None:
        coverage = rng.uniform(*_COVERAGE[kind])
    noise = fractal_noise(rng, shape, base_cells=int(rng.integers(2, 5)), octaves=5,
                          persistence=0.6 if kind == "thin" else 0.5)
    threshold = np.quantile(noise, 1.0 - coverage)
    ramp = np.clip((noise - threshold) / _EDGE_SOFTNESS[kind], 0.0, 1.0)
    alpha = (ramp * rng.uniform(*_PEAK_ALPHA[kind])).astype(np.float32)
    shadow = np.zeros(shape, np.float32)
    if kind != "thin":
        if shadow_offset is None:
            oy, ox = rng.integers(-shape[0] // 6, shape[0] // 6 + 1, size=2)
            shadow_offset = (int(oy), int(ox))
        dy, dx = shadow_offset
        shadow = _shift(ramp, dy, dx) * np.float32(rng.uniform(0.45, 0.65))
    return CloudLayer(kind, alpha, shadow.astype(np.float32))


def _shift(a: np.ndarray, dy: int, dx: int) -> np.ndarray:
    out = np.zeros_like(a)
    h, w = a.shape
    ys, yd = (slice(0, h - dy), slice(dy, h)) if dy >= 0 else (slice(-dy, h), slice(0, h + dy))
    xs, xd = (slice(0, w - dx), slice(dx, w)) if dx >= 0 else (slice(-dx, w), slice(0, w + dx))
    out[yd, xd] = a[ys, xs]
    return out


def layers_for_type(rng: np.random.Generator, obs_type: str, shape: tuple[int, int], *,
                    coverage: float | None = None, shadow_offset: tuple[int, int] | None = None) -> list[CloudLayer]:
    """Cloud decks for an observation whose most severe cloud is ``obs_type`` (``clear``: none).

    Severe decks are sometimes accompanied by lighter ones, as in real scenes; ``coverage`` and
    ``shadow_offset`` apply to the severe deck (see :func:`cloud_layer`).
    """
    if obs_type == "clear":
        return []
    layers = [cloud_layer(rng, obs_type, shape, coverage=coverage, shadow_offset=shadow_offset)]
    for lighter in CLOUD_TYPES[: CLOUD_TYPES.index(obs_type)]:
        if rng.random() < 0.3:
            layers.append(cloud_layer(rng, lighter, shape, shadow_offset=shadow_offset))
    return layers


def apply_clouds(scene: np.ndarray, layers: list[CloudLayer]) -> tuple[np.ndarray, np.ndarray]:
    """Cloudy reflectance [13, H, W] and per-pixel class codes [H, W] (uint8) for a clean scene.

    Codes: the most severe cloud type with visible opacity; ``shadow`` where only a shadow falls.
    """
    out = scene.astype(np.float32, copy=True)
    codes = np.zeros(scene.shape[1:], np.uint8)
    if not layers:
        return out, codes
    shadow = np.max(np.stack([layer.shadow for layer in layers]), axis=0)
    out *= 1.0 - shadow[None]
    codes[shadow > _MASK_SHADOW] = CLOUD_CODES["shadow"]
    severity = np.full(codes.shape, -1, np.int8)
    for layer in sorted(layers, key=lambda l: CLOUD_TYPES.index(l.kind), reverse=True):
        alpha = layer.alpha[None] * SPECTRAL_OPACITY[layer.kind][:, None, None]
        out = out * (1.0 - alpha) + CLOUD_REFLECTANCE[layer.kind][:, None, None] * alpha
    for layer in layers:
        rank = CLOUD_TYPES.index(layer.kind)
        hit = (layer.alpha > _MASK_ALPHA) & (rank > severity)
        severity[hit] = rank
        codes[hit] = CLOUD_CODES[layer.kind]
    return out, codes
