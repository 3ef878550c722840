"""Cloud curriculum: which cloud types training sees at each epoch.

``thin_only`` -> ``mixed`` (thin + thick) -> ``all`` (thin + thick + opaque). The production schedule of
100 epochs is 0-29 / 30-89 / 90-99. Boundaries are epochs (int) or fractions of the run (float in
[0, 1]), so one schedule serves tiny and full configs. Pure functions of the epoch: resuming at any
epoch gives the same phase.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

PHASES: tuple[str, ...] = ("thin_only", "mixed", "all")

PHASE_CLOUD_TYPES: dict[str, frozenset[str]] = {
    "thin_only": frozenset({"thin"}),
    "mixed": frozenset({"thin", "thick"}),
    "all": frozenset({"thin", "thick", "opaque"}),
}


@dataclass(frozen=True)
class CurriculumSchedule:
    """Epochs at which the curriculum moves on."""

    total_epochs: int
    """Length of the run; fractions are taken of this."""
    mixed_from: int | float = 0.3
    """First epoch of ``mixed`` (int) or its fraction of ``total_epochs`` (float)."""
    all_from: int | float = 0.9
    """First epoch of ``all`` (int) or its fraction of ``total_epochs`` (float)."""

    def __post_init__(self) -> None:
        if self.total_epochs < 1:
            raise ValueError(f"curriculum total_epochs must be >= 1, got {self.total_epochs}")
        for name in ("mixed_from", "all_from"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValueError(
                    f"curriculum {name} must be an epoch (int) or a fraction (float), got {value!r}"
                )
            if isinstance(value, float) and not 0.0 <= value <= 1.0:
                raise ValueError(f"curriculum {name}={value} is a fraction and must lie in [0, 1]")
            if isinstance(value, int) and value < 0:
                raise ValueError(f"curriculum {name}={value} must be >= 0")
        if self.mixed_epoch > self.all_epoch:
            raise ValueError(
                f"curriculum mixed_from (epoch {self.mixed_epoch}) must not come after all_from "
                f"(epoch {self.all_epoch})"
            )

    @property
    def mixed_epoch(self) -> int:
        return _to_epoch(self.mixed_from, self.total_epochs)

    @property
    def all_epoch(self) -> int:
        return _to_epoch(self.all_from, self.total_epochs)

    @classmethod
    def from_dict(cls, d: dict) -> CurriculumSchedule:
        valid = [f.name for f in fields(cls)]
        unknown = sorted(set(d) - set(valid))
        if unknown:
            raise ValueError(f"unknown curriculum keys {unknown} (valid: {', '.join(valid)})")
        return cls(**d)


def _to_epoch(boundary: int | float, total_epochs: int) -> int:
    if isinstance(boundary, float):
        return int(round(boundary * total_epochs))
    return boundary


def phase_for_epoch(epoch: int, schedule: CurriculumSchedule | dict | None) -> str:
    """Curriculum phase of a (0-based) epoch; without a schedule every epoch is ``all``."""
    if epoch < 0:
        raise ValueError(f"epoch must be >= 0, got {epoch}")
    if schedule is None:
        return "all"
    if isinstance(schedule, dict):
        schedule = CurriculumSchedule.from_dict(schedule)
    if epoch >= schedule.all_epoch:
        return "all"
    if epoch >= schedule.mixed_epoch:
        return "mixed"
    return "thin_only"


def cloud_types_for_epoch(epoch: int, schedule: CurriculumSchedule | dict | None) -> frozenset[str]:
    """Cloud types training may see at ``epoch`` (clear dates are always allowed)."""
    return PHASE_CLOUD_TYPES[phase_for_epoch(epoch, schedule)]
