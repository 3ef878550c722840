"""Validating configuration: one builder and one check for the run config and every model section.

Frozen dataclasses are built from plain dicts (YAML sections) by :func:`build_config`: unknown keys
are rejected with the list of valid ones, nested dataclasses are built from their sections, scalars
are checked against their annotations (an int is accepted for a float, and a numeric string, as
PyYAML reads ``2e-4``), YAML lists become tuples (so configs stay hashable and frozen). Each
config's own ``__post_init__`` then checks its values with :func:`require` (the model sections'
checks do all of theirs that way), which names the field,
its value and what is allowed.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Mapping
from typing import Any, NoReturn, TypeVar

T = TypeVar("T")


class ConfigError(ValueError):
    """A configuration is missing, malformed, has an unknown key or an out-of-range value."""


ModelConfigError = ConfigError
"""The name the model sections' checks use; the same error."""


def fail(section: str, field: str, value: Any, allowed: str) -> NoReturn:
    raise ConfigError(f"{section}.{field}={value!r} is invalid (allowed: {allowed})")


def require(condition: bool, section: str, field: str, value: Any, allowed: str) -> None:
    """Raise a :class:`ConfigError` naming the field, its value and what is allowed."""
    if not condition:
        fail(section, field, value, allowed)


def require_positive_int(section: str, field: str, value: Any) -> None:
    require(isinstance(value, int) and not isinstance(value, bool) and value > 0,
            section, field, value, "an integer > 0")


def require_channels(section: str, field: str, value: Any, groups: int) -> None:
    """Channel widths must be divisible by the GroupNorm group count used throughout."""
    require_positive_int(section, field, value)
    require(value % groups == 0, section, field, value, f"a multiple of norm_groups={groups}")


def _coerce(section: str, name: str, value: Any, annotation: Any) -> Any:
    """Check a scalar against its annotation; accept ints for floats and numeric strings
    (PyYAML reads ``2e-4`` without a dot as a string); lists become tuples."""
    if annotation is bool:
        require(isinstance(value, bool), section, name, value, "true or false")
        return value
    if annotation is int:
        require(isinstance(value, int) and not isinstance(value, bool), section, name, value, "an integer")
        return value
    if annotation is float:
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                fail(section, name, value, "a number")
        require(isinstance(value, (int, float)) and not isinstance(value, bool), section, name, value,
                "a number")
        return float(value)
    if annotation is str:
        require(isinstance(value, str), section, name, value, "a string")
        return value
    return tuple(value) if isinstance(value, list) else value


def build_config(cls: type[T], raw: Any, section: str, *, check_scalars: bool = True) -> T:
    """The frozen dataclass ``cls`` from the mapping ``raw`` (``None``: all defaults), checked as the
    module's docstring says; ``section`` names it in errors (``""``: the top level).
    ``check_scalars=False``: the class checks every value itself (its ``__post_init__``, in words
    that say more than "an integer"); lists still become tuples."""
    if raw is None:
        raw = {}
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{section or 'config'}: expected a mapping, got {type(raw).__name__} {raw!r}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(raw) - set(fields))
    if unknown:
        where = section or "top level"
        raise ConfigError(
            f"{where}: unknown key(s) {', '.join(map(str, unknown))} (valid: {', '.join(fields)})"
        )
    kwargs: dict[str, Any] = {}
    for name, value in raw.items():
        annotation = hints[name]
        path = f"{section}.{name}" if section else name
        if dataclasses.is_dataclass(annotation):
            kwargs[name] = build_config(annotation, value, path, check_scalars=check_scalars)  # type: ignore[arg-type]
        elif check_scalars:
            kwargs[name] = _coerce(section or "config", name, value, annotation)
        else:
            kwargs[name] = tuple(value) if isinstance(value, list) else value
    try:
        return cls(**kwargs)
    except TypeError as exc:
        raise ConfigError(f"{section or 'config'}: {exc}") from exc
