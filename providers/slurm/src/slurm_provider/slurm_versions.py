"""Which Slurm a site runs, and whether this provider was tested against that release.

Every parser here (``squeue -O``, ``sacct --parsable2``, ``scontrol``, ``sbatch --test-only``'s sentence,
the state and reason vocabularies) was written against the releases in :data:`TESTED_RELEASES`. A site
on another release is used all the same: most fields are stable across releases, and refusing would
stop a team that upgraded before this provider did. What it gets instead is one sentence, said once
per connection and release in a process (:func:`note_site_version`), naming the release and the
tested ones, so that a misread state or an unmatched sentence later is traced to its cause.

Pure but for :func:`note_site_version`'s memory of what it said.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass

TESTED_RELEASES: tuple[str, ...] = ("22.05",)
"""Slurm releases (``major.minor``) the provider's tests run against on a real cluster."""

_VERSION = re.compile(r"(?<![\d.])(\d{2})\.(\d{2})(?:\.(\d+))?")


@dataclass(frozen=True)
class SlurmVersion:
    """A Slurm version as its commands print it (``sinfo --version``: ``slurm 22.05.8``)."""

    major: int
    minor: int
    micro: int | None = None

    @property
    def release(self) -> str:
        """``major.minor``: what SchedMD names a release by (``22.05``, ``24.11``)."""
        return f"{self.major:02d}.{self.minor:02d}"

    @property
    def tested(self) -> bool:
        return self.release in TESTED_RELEASES

    def __str__(self) -> str:
        return self.release if self.micro is None else f"{self.release}.{self.micro}"


def parse_slurm_version(text: str | None) -> SlurmVersion | None:
    """The version in ``sinfo --version``'s line (``slurm 22.05.8``, ``slurm-wlm 24.11.5``) or in
    ``scontrol show config``'s ``SLURM_VERSION`` (``22.05.8``); None where the text names none."""
    match = _VERSION.search(text or "")
    if match is None:
        return None
    major, minor, micro = match.groups()
    return SlurmVersion(int(major), int(minor), int(micro) if micro is not None else None)


def version_words(version: SlurmVersion | None, source: str) -> str:
    """One sentence on the site's Slurm for a log or the connection form: the version, and whether
    this provider was tested against its release. ``source``: the command or setting it came from."""
    tested = ", ".join(TESTED_RELEASES)
    if version is None:
        return f"Slurm's version could not be read from {source}; this provider is tested against Slurm {tested}"
    if version.tested:
        return f"Slurm {version} (a release this provider is tested against)"
    return (f"Slurm {version}: release {version.release} is not one this provider is tested against ({tested}); "
            "it is used all the same, and a state, field or message it reads differently from those releases "
            "may be misread: report it with this version")


_said: set[tuple[str, str]] = set()


def note_site_version(conn_id: str, text: str | None, source: str, log: logging.Logger) -> SlurmVersion | None:
    """Log the site's Slurm version on ``conn_id`` the first time this process reads it (a warning
    where its release is untested or it cannot be read), nothing at later reads of the same; returns it."""
    version = parse_slurm_version(text)
    key = (conn_id, str(version))
    if key not in _said:
        _said.add(key)
        (log.info if version is not None and version.tested else log.warning)(
            "%s: %s", conn_id, version_words(version, source))
    return version
