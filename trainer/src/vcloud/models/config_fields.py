"""Building frozen model configs from plain dicts (YAML sections).

One place for the rules every model config follows: unknown keys are rejected with the list of
valid ones, YAML lists become tuples (so configs stay hashable and frozen), and each config's own
``__post_init__`` validates values and names the offending field.
"""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

T = TypeVar("T")


class ModelConfigError(ValueError):
    """A model config section has an unknown key or a value outside its allowed range."""


def config_from_dict(cls: type[T], d: dict[str, Any] | None, *, section: str) -> T:
    """Instantiate the frozen dataclass ``cls`` from ``d``, rejecting keys it does not define."""
    if d is None:
        d = {}
    if not isinstance(d, dict):
        raise ModelConfigError(f"{section}: expected a mapping, got {type(d).__name__}")
    valid = [f.name for f in dataclasses.fields(cls)]  # type: ignore[arg-type]
    unknown = sorted(set(d) - set(valid))
    if unknown:
        raise ModelConfigError(
            f"{section}: unknown key(s) {', '.join(unknown)} (valid: {', '.join(valid)})"
        )
    kwargs = {k: tuple(v) if isinstance(v, list) else v for k, v in d.items()}
    try:
        return cls(**kwargs)
    except TypeError as exc:
        raise ModelConfigError(f"{section}: {exc}") from exc


def require(condition: bool, section: str, field: str, value: Any, allowed: str) -> None:
    """Raise a ``ModelConfigError`` naming the field, its value and what is allowed."""
    if not condition:
        raise ModelConfigError(f"{section}.{field}={value!r} is invalid (allowed: {allowed})")


def require_positive_int(section: str, field: str, value: Any) -> None:
    require(isinstance(value, int) and not isinstance(value, bool) and value > 0,
            section, field, value, "an integer > 0")


def require_channels(section: str, field: str, value: Any, groups: int) -> None:
    """Channel widths must be divisible by the GroupNorm group count used throughout."""
    require_positive_int(section, field, value)
    require(value % groups == 0, section, field, value, f"a multiple of norm_groups={groups}")
