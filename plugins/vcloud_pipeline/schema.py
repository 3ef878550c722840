"""Validation with pydantic, in the project's own words.

Profiles and run requests are pydantic models with ``extra="forbid"``: pydantic finds unknown keys,
missing ones, wrong types and choices outside a ``Literal``; :func:`problems` turns its errors into
the sentences our users read, naming the field by its dotted path and listing the valid keys or
values: ``unknown key 'rocmm' in container (known: runtime, image, ...)``, ``site 'saga' not allowed
(allowed: lumi, levante, ...)``. The field types here (:data:`Text`, :func:`count`, :data:`Duration`,
...) refuse what YAML or a JSON request would otherwise coerce silently (``"3"`` for a count, ``yes``
for a flag, an unquoted ``24:00:00``, which YAML reads as 86400).
"""

from __future__ import annotations

import re
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from typing import Annotated, Any, NoReturn

from pydantic import BaseModel, BeforeValidator, ConfigDict, ValidationError, model_validator
from pydantic_core import PydanticCustomError

from slurm_provider import parse_time_limit, ValidationError as SlurmValueError

PROBLEM = "vcloud_problem"
"""Error type of a problem stated by our own validators: ``<dotted field> <problem>``."""
WHOLE = "vcloud_whole"
"""Error type of a problem whose text names its fields itself."""

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def refuse(problem: str, *, whole: bool = False) -> NoReturn:
    """Fail validation with ``problem`` as the user reads it (after the field's dotted name)."""
    raise PydanticCustomError(WHOLE if whole else PROBLEM, "{problem}", {"problem": problem})


class Document(BaseModel):
    """A mapping read from YAML or JSON: unknown keys refused, and ``null`` the same as leaving a key out
    (an override of ``null`` puts the default back)."""

    model_config = ConfigDict(extra="forbid", frozen=True, hide_input_in_errors=False)

    @model_validator(mode="before")
    @classmethod
    def _null_is_absent(cls, data: Any) -> Any:
        if isinstance(data, Mapping):
            return {key: value for key, value in data.items() if value is not None}
        return data


# --------------------------------------------------------------------------- field types


def _text(value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        refuse(f"must be a non-empty string, got {value!r}")
    return value


def _integer(value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        refuse(f"must be an integer, got {value!r}")
    if value < minimum:
        refuse(f"must be at least {minimum}, got {value}")
    return value


def _positive(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        refuse(f"must be a positive number, got {value!r}")
    return float(value)


def _flag(value: Any) -> bool:
    if not isinstance(value, bool):
        refuse(f"must be true or false, got {value!r}")
    return value


def _duration(value: Any) -> int:
    if not isinstance(value, str):
        refuse(f"must be a quoted Slurm duration such as '24:00:00' (got {value!r}; YAML reads an unquoted "
               "24:00:00 as the number 86400)")
    return slurm_seconds(value)


def slurm_seconds(value: str) -> int:
    """Seconds in a Slurm duration (:func:`slurm_provider.validation.parse_time_limit`, the one parser),
    as a validation problem of the field being validated."""
    try:
        return parse_time_limit(value)
    except SlurmValueError as exc:
        refuse(exc.problem)


_SLURM_SIZE = re.compile(r"^(\d+(?:\.\d+)?)([KMGT]?)$")
_MIB_PER_UNIT = {"K": 1 / 1024, "M": 1.0, "": 1.0, "G": 1024.0, "T": 1024.0 ** 2}


def slurm_mib(text: str) -> float | None:
    """MiB in a Slurm memory size (``64G``, ``500M``, ``1T``; no suffix is MiB, as ``--mem`` reads it),
    ``None`` when ``text`` is not one: the one reading of memory sizes that billing rules and the
    ledger (sacct's ``mem=`` in AllocTRES) share."""
    match = _SLURM_SIZE.match(text.strip())
    if match is None:
        return None
    return float(match.group(1)) * _MIB_PER_UNIT[match.group(2)]


def _memory(value: Any) -> str:
    if not isinstance(value, str) or slurm_mib(value) is None or not slurm_mib(value):
        refuse(f"must be a positive Slurm memory size such as '64G' or '500M', got {value!r}")
    return value


def _strings(value: Any) -> tuple[str, ...]:
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) and v for v in value):
        refuse(f"must be a list of non-empty strings, got {value!r}")
    return tuple(value)


def _environment(value: Any) -> dict[str, str]:
    if not isinstance(value, Mapping):
        refuse(f"must be a mapping of names to strings, got {value!r}")
    out: dict[str, str] = {}
    for name, item in value.items():
        if not isinstance(name, str) or not _ENV_NAME.match(name):
            refuse(f"has an invalid variable name {name!r}")
        if isinstance(item, bool) or not isinstance(item, (str, int, float)):
            refuse(f"entry {name} must be a string or number, got {item!r}")
        out[name] = str(item)
    return out


Text = Annotated[str, BeforeValidator(_text)]
"""A non-empty string (no numbers or lists in its place)."""
Positive = Annotated[float, BeforeValidator(_positive)]
Flag = Annotated[bool, BeforeValidator(_flag)]
"""``true`` or ``false`` only, not ``yes``, ``1`` or ``"true"``."""
Duration = Annotated[int, BeforeValidator(_duration)]
"""A quoted Slurm duration (``'3-00:00:00'``, ``'30'`` minutes), as seconds."""
Strings = Annotated[tuple[str, ...], BeforeValidator(_strings)]
Memory = Annotated[str, BeforeValidator(_memory)]
"""A positive Slurm memory size (``64G``), kept as written; :func:`slurm_mib` reads it."""
Environment = Annotated[dict[str, str], BeforeValidator(_environment)]
"""Environment variables: valid names, string or number values (kept as text)."""


def at_least(minimum: int) -> BeforeValidator:
    """Validates an integer of at least ``minimum`` (not a bool, a float or a numeric string):
    ``Annotated[int, at_least(30)]``."""
    return BeforeValidator(lambda value: _integer(value, minimum))


Count = Annotated[int, at_least(1)]
"""A positive integer (not a bool, a float or a numeric string)."""


def count(minimum: int = 1) -> Any:
    """``Annotated[int, at_least(minimum)]`` as a value, for models built at run time."""
    return Annotated[int, at_least(minimum)]


# --------------------------------------------------------------------------- errors as sentences


def dotted(loc: Sequence[Any]) -> str:
    return ".".join(str(part) for part in loc)


def known_keys(root: type[BaseModel], loc: Sequence[Any]) -> list[str]:
    """The keys the model at ``loc`` (below ``root``) accepts, in declaration order."""
    model: Any = root
    for part in loc:
        if _is_model(model):
            field = model.model_fields.get(str(part))
            model = _unwrap(field.annotation) if field is not None else None
        elif typing.get_origin(model) in (dict, Mapping):
            model = _unwrap(typing.get_args(model)[1])
        else:
            return []
    return list(model.model_fields) if _is_model(model) else []


def _is_model(value: Any) -> bool:
    return isinstance(value, type) and issubclass(value, BaseModel)


def _unwrap(annotation: Any) -> Any:
    """``X`` out of ``X | None``, ``Optional[X]`` and ``Annotated[X, ...]``."""
    while True:
        origin = typing.get_origin(annotation)
        if origin is Annotated:
            annotation = typing.get_args(annotation)[0]
        elif origin in (typing.Union, types.UnionType):
            args = [a for a in typing.get_args(annotation) if a is not type(None)]
            if len(args) != 1:
                return annotation
            annotation = args[0]
        else:
            return annotation


UnknownKeys = Callable[[str, list[str], list[str]], str]
"""``(dotted parent, unknown keys, known keys) -> sentence``."""


def unknown_keys_sentence(where: str, unknown: list[str], known: list[str]) -> str:
    in_where = f" in {where}" if where else ""
    return f"unknown key {', '.join(repr(k) for k in unknown)}{in_where} (known: {', '.join(known)})"


def problems(exc: ValidationError, root: type[BaseModel],
             unknown: UnknownKeys = unknown_keys_sentence) -> list[str]:
    """One sentence per problem pydantic found (unknown keys of one mapping together, first)."""
    unknown_at: dict[tuple[Any, ...], list[str]] = {}
    found: list[str] = []
    for error in exc.errors(include_url=False):
        loc, kind = tuple(error["loc"]), error["type"]
        where = dotted(loc)
        if kind == "extra_forbidden":
            unknown_at.setdefault(loc[:-1], []).append(str(loc[-1]))
        elif kind == WHOLE:
            found.append(error["msg"])
        elif kind == PROBLEM:
            found.append(f"{where} {error['msg']}")
        elif kind == "missing":
            found.append(f"{where} is required")
        elif kind == "literal_error":
            allowed = re.findall(r"'([^']*)'", error["ctx"]["expected"])
            found.append(f"{where} {error['input']!r} not allowed (allowed: {', '.join(allowed)})")
        elif kind in ("model_type", "model_attributes_type", "dict_type"):
            found.append(f"{where or 'the top level'} must be a mapping, got {type(error['input']).__name__}")
        else:
            found.append(f"{where} {error['msg']}: {error['input']!r}")
    sentences = [unknown(dotted(parent), keys, known_keys(root, parent))
                 for parent, keys in unknown_at.items()]
    return sentences + found
