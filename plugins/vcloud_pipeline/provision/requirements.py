"""The trainer's runtime requirements as a pinned set, and the hash that names its install directory.

``trainer/requirements-runtime.txt`` pins every package a job imports (``name==version``). The set's
hash, with the image it is installed for, keys the directory in ``paths.pylibs`` that holds what the
site's container lacks of it (:attr:`vcloud_pipeline.provision.environment.JobEnvironment.key`,
:func:`vcloud_pipeline.plan.layout.pylibs_set`): jobs rendered for one set put that directory on
``PYTHONPATH``, and a changed set or image installs into a new directory, so two sets never mix.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

from packaging.requirements import InvalidRequirement
from packaging.requirements import Requirement as Pep508Requirement
from packaging.utils import canonicalize_name

from vcloud_pipeline.checkout import PROJECT_ROOT

RUNTIME_REQUIREMENTS = Path("trainer") / "requirements-runtime.txt"
"""The runtime requirements, relative to the project checkout (and to a synced code tree)."""

REQUIREMENTS_HASH = re.compile(r"^[0-9a-f]{16}$")
"""A requirement set's hash: 16 hex digits, also its directory's name in ``paths.pylibs``."""


class RequirementsError(ValueError):
    """A requirements file the job environment cannot be provisioned from."""


def canonical_name(name: str) -> str:
    """PEP 503's normalized project name: ``PyYAML`` and ``pyyaml``, ``a_b`` and ``a-b`` are one project."""
    return str(canonicalize_name(name))


NOT_A_PIN = "write name==version (exact versions only, no ranges, extras, URLs, markers or pip options)"


def parse_pin(line: str) -> Requirement:
    """One ``name==version`` line as PEP 508 and PEP 440 read it (``packaging``, as pip does), or
    :class:`RequirementsError` saying what is wrong with it."""
    try:
        parsed = Pep508Requirement(line)
    except InvalidRequirement:
        raise RequirementsError(f"{line!r} is not a pin; {NOT_A_PIN}") from None
    specifiers = list(parsed.specifier)
    if parsed.extras or parsed.url or parsed.marker or len(specifiers) != 1 or specifiers[0].operator != "==" \
            or specifiers[0].version.endswith(".*"):
        raise RequirementsError(f"{line!r} is not a pin; {NOT_A_PIN}")
    return Requirement(parsed.name, specifiers[0].version)  # a PEP 440 version: packaging refuses others


@dataclass(frozen=True, order=True)
class Requirement:
    """One pinned package: its name as written and the exact version."""

    name: str
    version: str

    @property
    def key(self) -> str:
        return canonical_name(self.name)

    @property
    def pin(self) -> str:
        return f"{self.name}=={self.version}"


@dataclass(frozen=True)
class RequirementSet:
    """Pinned requirements, sorted by canonical name; its :attr:`hash` does not depend on the file's
    comments, order or spelling of names."""

    requirements: tuple[Requirement, ...]

    @property
    def hash(self) -> str:
        canonical = "".join(f"{r.key}=={r.version}\n" for r in self.requirements)
        return hashlib.sha256(canonical.encode()).hexdigest()[:16]

    @property
    def pins(self) -> list[str]:
        return [r.pin for r in self.requirements]

    def __len__(self) -> int:
        return len(self.requirements)


def parse_requirements(text: str, *, source: str = str(RUNTIME_REQUIREMENTS)) -> RequirementSet:
    """The pinned set of a requirements file: one ``name==version`` per line, ``#`` comments and blank
    lines allowed. Anything else (ranges, extras, URLs, options, a name twice) is refused, naming the
    line: the environment must be the one the pins describe, installed without resolving."""
    found: dict[str, Requirement] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        try:
            requirement = parse_pin(line)
        except RequirementsError as exc:
            raise RequirementsError(f"{source}, line {number}: {exc}") from None
        if requirement.key in found:
            raise RequirementsError(f"{source}, line {number}: {requirement.name} is pinned twice; keep one line")
        found[requirement.key] = requirement
    if not found:
        raise RequirementsError(f"{source} pins no package; it lists what the jobs import, name==version per line")
    return RequirementSet(tuple(sorted(found.values(), key=lambda r: r.key)))


def runtime_requirements(project_root: Path = PROJECT_ROOT) -> RequirementSet:
    """The trainer's runtime requirements of the checkout at ``project_root`` (the code a run syncs)."""
    path = project_root / RUNTIME_REQUIREMENTS
    try:
        text = path.read_text()
    except OSError as exc:
        raise RequirementsError(f"cannot read {path} ({exc}); it pins what the jobs import") from None
    return parse_requirements(text, source=str(path))


def is_requirements_hash(value: object) -> bool:
    return isinstance(value, str) and bool(REQUIREMENTS_HASH.match(value))
