"""What a checkpoint holds, in names and shapes, and what a resume by other code may do with it.

A stage trains for days, and the code may change before it resumes from ``latest.pt``: a parameter
moved into an optimizer group of its own (CFDT's date decay), a module added (stage 3's scene
adapter). Loading such a checkpoint strictly fails in ``load_state_dict`` with a traceback; loading
an optimizer state whose groups hold other parameters in the same counts silently pairs moments with
the wrong weights. So every checkpoint records a :class:`Fingerprint` of what it holds - the model's
state-dict names and shapes, the optimizer's groups (their parameters' names and shapes, in order,
and their setting keys) - and a resume compares it with the running code's before loading anything
(:func:`decide_resume`). A checkpoint written before fingerprints existed gets one derived from its
own state dicts (:func:`checkpoint_fingerprint`): names and shapes of the weights, and of the
optimizer its group sizes, setting keys and, where the optimizer has stepped, its moments' shapes.

Pure: no I/O, no logging; the training loop acts on the decision and prints the messages.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

from vcloud.contract import ON_CODE_CHANGE_KEEP_WEIGHTS, ON_CODE_CHANGE_REFUSE, ON_CODE_CHANGE_SETTING

FINGERPRINT_VERSION = 1
"""Format of :meth:`Fingerprint.to_json`; a checkpoint with another version is compared as one
written before fingerprints existed."""

MAX_LISTED = 6
"""Differences a message names one by one; the rest are counted."""

Shape = tuple[int, ...]
Entry = tuple[str | None, Shape | None]
"""A parameter as an optimizer group holds it: (name, shape); None where an older checkpoint cannot
tell (it records neither names nor, before the first step, shapes)."""

_NOT_SETTINGS = frozenset({"params", "param_names"})


@dataclass(frozen=True)
class GroupLayout:
    """One optimizer group: its parameters in order (the optimizer's state is matched by position)
    and the names of its settings (``lr``, ``weight_decay``, ``lr_scale``, ...)."""

    params: tuple[Entry, ...]
    keys: tuple[str, ...]


@dataclass(frozen=True)
class Fingerprint:
    """The layout of a model and its optimizer: enough to tell whether their state dicts fit."""

    model: tuple[tuple[str, Shape], ...]
    """Every state-dict entry of the model (parameters and buffers), in state-dict order."""
    optimizer: tuple[GroupLayout, ...] | None
    """The optimizer's groups; None when the checkpoint holds no optimizer state."""
    optimizer_type: str | None = None
    """The optimizer's class name; None where an older checkpoint does not say."""
    default_keys: tuple[str, ...] | None = None
    """The settings the optimizer class itself fills in for a group that lacks them (its
    ``defaults``); a difference in those alone is PyTorch's, not ours. None where unknown."""

    def to_json(self) -> dict[str, Any]:
        """Plain lists, strings and ints: small, deterministic, loadable with ``weights_only=True``."""
        return {
            "version": FINGERPRINT_VERSION,
            "model": [[name, list(shape)] for name, shape in self.model],
            "optimizer": None if self.optimizer is None else {
                "type": self.optimizer_type,
                "default_keys": None if self.default_keys is None else list(self.default_keys),
                "groups": [{"params": [[name, None if shape is None else list(shape)] for name, shape in g.params],
                            "keys": list(g.keys)} for g in self.optimizer],
            },
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "Fingerprint":
        optimizer = data.get("optimizer")
        groups = None if optimizer is None else tuple(
            GroupLayout(params=tuple((name, None if shape is None else tuple(shape)) for name, shape in g["params"]),
                        keys=tuple(g["keys"]))
            for g in optimizer["groups"])
        return cls(
            model=tuple((name, tuple(shape)) for name, shape in data["model"]),
            optimizer=groups,
            optimizer_type=None if optimizer is None else optimizer.get("type"),
            default_keys=None if optimizer is None or optimizer.get("default_keys") is None
            else tuple(optimizer["default_keys"]),
        )


# --------------------------------------------------------------------------- taking fingerprints


def _shape(tensor: Any) -> Shape:
    return tuple(int(d) for d in tensor.shape)


def _settings(group: Mapping[str, Any]) -> tuple[str, ...]:
    return tuple(sorted(k for k in group if k not in _NOT_SETTINGS))


def fingerprint_of(model: Any, optimizer: Any) -> Fingerprint:
    """The fingerprint of a built model (an ``nn.Module``, unwrapped) and its optimizer."""
    names = {id(p): name for name, p in model.named_parameters()}
    groups = tuple(
        GroupLayout(params=tuple((names.get(id(p)), _shape(p)) for p in group["params"]), keys=_settings(group))
        for group in optimizer.param_groups)
    return Fingerprint(
        model=tuple((name, _shape(t)) for name, t in model.state_dict().items()),
        optimizer=groups,
        optimizer_type=type(optimizer).__name__,
        default_keys=tuple(sorted(optimizer.defaults)),
    )


def _moment_shape(state: Mapping[str, Any] | None) -> Shape | None:
    """A parameter's shape from its optimizer state (its moments have the parameter's shape)."""
    moments: Mapping[str, Any] = state or {}
    for key in sorted(moments):
        value = moments[key]
        if key != "step" and hasattr(value, "shape"):
            return _shape(value)
    return None


def _derived_optimizer(state_dict: Mapping[str, Any]) -> tuple[GroupLayout, ...]:
    state = state_dict.get("state") or {}
    return tuple(
        GroupLayout(params=tuple((None, _moment_shape(state.get(index))) for index in group["params"]),
                    keys=_settings(group))
        for group in state_dict["param_groups"])


def checkpoint_fingerprint(checkpoint: Mapping[str, Any]) -> Fingerprint:
    """The fingerprint a checkpoint records, or, for one written before fingerprints existed (or in
    another format), what its state dicts tell: the weights' names and shapes, the optimizer's
    group sizes and setting keys, and its moments' shapes where it has any."""
    recorded = checkpoint.get("fingerprint")
    if isinstance(recorded, Mapping) and recorded.get("version") == FINGERPRINT_VERSION:
        return Fingerprint.from_json(recorded)
    optimizer = checkpoint.get("optimizer")
    return Fingerprint(
        model=tuple((name, _shape(t)) for name, t in checkpoint["model"].items()),
        optimizer=None if optimizer is None else _derived_optimizer(optimizer),
    )


# --------------------------------------------------------------------------- comparing them


def describe_shape(shape: Shape | None) -> str:
    """``1x8x3x3``; ``scalar`` for a 0-d tensor; ``?`` where unknown."""
    if shape is None:
        return "?"
    return "x".join(str(d) for d in shape) if shape else "scalar"


def _listed(items: Sequence[str]) -> list[str]:
    if len(items) <= MAX_LISTED:
        return list(items)
    return list(items[:MAX_LISTED]) + [f"and {len(items) - MAX_LISTED} more"]


def weight_differences(saved: Fingerprint, current: Fingerprint) -> tuple[str, ...]:
    """What keeps the checkpoint's weights from loading into the current model: entries only the
    current model has (``+``), only the checkpoint has (``-``), or whose shape changed."""
    before, after = dict(saved.model), dict(current.model)
    out = [f"+{name} {describe_shape(shape)}" for name, shape in current.model if name not in before]
    out += [f"-{name} {describe_shape(shape)}" for name, shape in saved.model if name not in after]
    out += [f"{name} {describe_shape(before[name])} -> {describe_shape(shape)}"
            for name, shape in current.model if name in before and before[name] != shape]
    return tuple(out)


def _group_differences(index: int, saved: GroupLayout, current: GroupLayout) -> list[str]:
    where = f"group {index}"
    out: list[str] = []
    named = all(name is not None for name, _ in saved.params) and all(name is not None for name, _ in current.params)
    if named:
        if saved.params != current.params:
            before, after = dict(saved.params), dict(current.params)
            changes = [f"+{name} {describe_shape(shape)}" for name, shape in current.params if name not in before]
            changes += [f"-{name} {describe_shape(shape)}" for name, shape in saved.params if name not in after]
            changes += [f"{name} {describe_shape(before[name])} -> {describe_shape(shape)}"
                        for name, shape in current.params if name in before and before[name] != shape]
            out.append(f"{where}: " + ", ".join(_listed(changes) or ["the same parameters in another order"]))
    elif len(saved.params) != len(current.params):
        out.append(f"{where}: {len(saved.params)} parameters -> {len(current.params)}")
    else:
        moved = [f"parameter {k} {describe_shape(a)} -> {describe_shape(b)}"
                 for k, ((_, a), (_, b)) in enumerate(zip(saved.params, current.params))
                 if a is not None and b is not None and a != b]
        if moved:
            out.append(f"{where}: " + ", ".join(_listed(moved)))
    return out


def optimizer_differences(saved: Fingerprint, current: Fingerprint) -> tuple[str, ...]:
    """What keeps the checkpoint's optimizer state from matching the current optimizer: the number
    of groups, the parameters of each group (names and shapes, in order; counts and moment shapes
    for a checkpoint that recorded no names) and the groups' own setting keys (those the optimizer
    class fills in itself are left out: PyTorch restores them)."""
    if saved.optimizer is None:
        return ("the checkpoint holds no optimizer state",)
    assert current.optimizer is not None
    out: list[str] = []
    if saved.optimizer_type is not None and saved.optimizer_type != current.optimizer_type:
        out.append(f"optimizer {saved.optimizer_type} -> {current.optimizer_type}")
    if len(saved.optimizer) != len(current.optimizer):
        out.append(f"groups {len(saved.optimizer)} -> {len(current.optimizer)}")
    builtin = set(saved.default_keys or ()) | set(current.default_keys or ())
    for index in range(max(len(saved.optimizer), len(current.optimizer))):
        if index >= len(saved.optimizer):
            group = current.optimizer[index]
            names = [f"+{name} {describe_shape(shape)}" for name, shape in group.params]
            out.append(f"group {index} (new): " + ", ".join(_listed(names)))
            continue
        if index >= len(current.optimizer):
            out.append(f"group {index} (gone): {len(saved.optimizer[index].params)} parameters")
            continue
        before, after = saved.optimizer[index], current.optimizer[index]
        out += _group_differences(index, before, after)
        added = sorted(set(after.keys) - set(before.keys) - builtin)
        removed = sorted(set(before.keys) - set(after.keys) - builtin)
        if added or removed:
            out.append(f"group {index} settings: " + ", ".join([f"+{k}" for k in added] + [f"-{k}" for k in removed]))
    return tuple(out)


# --------------------------------------------------------------------------- the decision


class ResumeOutcome(str, Enum):
    """What a resume does with a checkpoint."""

    RESUME = "resume"
    """Same layout: weights and optimizer state, as written."""
    FRESH_OPTIMIZER = "fresh_optimizer"
    """The weights fit, the optimizer layout does not: the weights with a fresh optimizer state."""
    REFUSE_WEIGHTS = "refuse_weights"
    """The weights no longer fit the model: nothing to resume, whatever the run asked."""
    REFUSE_OPTIMIZER = "refuse_optimizer"
    """The optimizer layout differs and the run asked to refuse then."""


@dataclass(frozen=True)
class ResumeDecision:
    outcome: ResumeOutcome
    weights: tuple[str, ...] = ()
    """What differs in the model's state dict (empty: the weights fit)."""
    optimizer: tuple[str, ...] = ()
    """What differs in the optimizer's layout (empty: the optimizer state fits)."""

    @property
    def refused(self) -> bool:
        return self.outcome in (ResumeOutcome.REFUSE_WEIGHTS, ResumeOutcome.REFUSE_OPTIMIZER)


def _on_optimizer_change(on_code_change: str, differences: tuple[str, ...]) -> ResumeDecision:
    if on_code_change == ON_CODE_CHANGE_REFUSE:
        return ResumeDecision(ResumeOutcome.REFUSE_OPTIMIZER, optimizer=differences)
    if on_code_change != ON_CODE_CHANGE_KEEP_WEIGHTS:
        raise ValueError(f"{ON_CODE_CHANGE_SETTING}={on_code_change!r} is invalid "
                         f"(allowed: {ON_CODE_CHANGE_KEEP_WEIGHTS}, {ON_CODE_CHANGE_REFUSE})")
    return ResumeDecision(ResumeOutcome.FRESH_OPTIMIZER, optimizer=differences)


def decide_resume(saved: Fingerprint, current: Fingerprint, on_code_change: str) -> ResumeDecision:
    """Resume, resume the weights with a fresh optimizer, or refuse (see :class:`ResumeOutcome`)."""
    weights = weight_differences(saved, current)
    if weights:
        return ResumeDecision(ResumeOutcome.REFUSE_WEIGHTS, weights=weights, optimizer=optimizer_differences(saved, current))
    optimizer = optimizer_differences(saved, current)
    if optimizer:
        return _on_optimizer_change(on_code_change, optimizer)
    return ResumeDecision(ResumeOutcome.RESUME)


def after_failed_optimizer_load(error: str, on_code_change: str) -> ResumeDecision:
    """The layouts matched, yet PyTorch refused the optimizer state: an optimizer change all the same."""
    return _on_optimizer_change(on_code_change, (f"loading its state failed: {error}",))


def after_failed_weights_load(error: str) -> ResumeDecision:
    """The layouts matched, yet PyTorch refused the weights: they do not fit after all."""
    return ResumeDecision(ResumeOutcome.REFUSE_WEIGHTS, weights=(f"loading them failed: {error}",))


# --------------------------------------------------------------------------- the messages


def describe_code(code_hash: str | None) -> str:
    return f"code {code_hash}" if code_hash else "code of unknown hash"


def _joined(items: Iterable[str]) -> str:
    return "; ".join(_listed(list(items)))


def fresh_optimizer_line(decision: ResumeDecision, *, stage: int, source: str, saved_hash: str | None,
                         running_hash: str | None, epoch: int, step: int) -> str:
    """The job log's one line for :attr:`ResumeOutcome.FRESH_OPTIMIZER`."""
    return (f"stage {stage}: {source} was written by {describe_code(saved_hash)}, this is "
            f"{describe_code(running_hash)}, and the optimizer's layout differs ({_joined(decision.optimizer)}); "
            f"the weights fit: resuming them at epoch {epoch}, step {step} with a fresh optimizer state "
            f"({ON_CODE_CHANGE_SETTING}: {ON_CODE_CHANGE_KEEP_WEIGHTS})")


def refusal_message(decision: ResumeDecision, *, stage: int, source: str, saved_hash: str | None,
                    running_hash: str | None) -> str:
    """Why the resume was refused, naming both codes, and what to do instead."""
    written = (f"cannot resume stage {stage} from {source}: it was written by {describe_code(saved_hash)}, "
               f"this job runs {describe_code(running_hash)}")
    old_code = (f"finish the stage with {describe_code(saved_hash) if saved_hash else 'the code that wrote it'}: "
                "deploy that code version and trigger the same run name (a code directory stays on the "
                "cluster while a job uses it and while it is among the newest paths.code_keep)")
    restart = (f"train stage {stage} again from the start with mode: restart for this stage (DAG run params "
               f'{{"stages": [{stage}], "mode": "restart"}}; python -m vcloud.train --restart), which moves '
               "its outputs aside")
    if decision.outcome is ResumeOutcome.REFUSE_WEIGHTS:
        return (f"{written}, and its weights no longer fit the model: {_joined(decision.weights)}. Nothing was "
                f"trained. Either {restart}, or {old_code}.")
    return (f"{written}, and the optimizer's layout differs ({_joined(decision.optimizer)}); the weights fit, "
            f"but {ON_CODE_CHANGE_SETTING} is {ON_CODE_CHANGE_REFUSE}. Nothing was trained. Resume the weights "
            f"with a fresh optimizer state (on_code_change: {ON_CODE_CHANGE_KEEP_WEIGHTS} in the DAG run's "
            f"params; --set {ON_CODE_CHANGE_SETTING}={ON_CODE_CHANGE_KEEP_WEIGHTS}), {restart}, or {old_code}.")
