"""A site's own allocation command, and the parsers of what it prints.

Some sites keep the real allocation outside Slurm. LUMI's billing page says so: its billing is not
what Slurm's accounting holds (``sshare``/``sreport`` give wrong numbers), and ``lumi-allocations``
(``Lumi-supercomputer/lumi-allocations``, shipped in the ``lumi-tools`` module) reports what each
project has used and has been granted. It prints a table refreshed periodically in the background::

    Data updated: 2026-11-27 23:10:04.551093
    Project             |                    CPU (used/allocated)|               GPU (used/allocated)|...
    --------------------------------------------------------------------------------------------------...
    project_465002500   |     1234/50000    (2.5%) core/hours|     8123.5/100000    (8.1%) gpu/hours|...

(``Data updated`` and a ``QPU`` column only in newer versions; a cell with no allocation reads
``N/A``, or ``used/0 (N/A) unit`` in newer versions). A profile names the command and its format
(``billing.allocation_command``); :func:`parse_site_allocation` picks the parser.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from vcloud_pipeline.profile import SiteCommand


class SiteOutputError(ValueError):
    """The command's output is not in the format the profile names."""


@dataclass(frozen=True)
class SiteAllocation:
    """The project's allocation and usage as the site's command reports them, in billing units."""

    limit: float | None
    """``None``: the site lists no allocation of this kind for the project."""
    used: float
    updated: str | None = None
    """When the site last refreshed its figures, as it prints it (``None``: it does not say)."""


_LUMI_CELL = re.compile(r"^(?P<used>-?\d+(?:\.\d+)?)/(?P<alloc>\d+(?:\.\d+)?)\s+\([^)]*\)\s+gpu/hours$")
_LUMI_GPU_HEADER = "GPU (used/allocated)"


def parse_lumi_allocations(text: str, account: str) -> SiteAllocation:
    """The GPU-hours of project ``account`` in ``lumi-allocations`` output (module doc)."""
    lines = [line.rstrip() for line in text.splitlines() if line.strip()]
    updated = next((line.split(":", 1)[1].strip() for line in lines if line.startswith("Data updated:")), None)
    header = next((line for line in lines if line.startswith("Project") and "|" in line), None)
    if header is None:
        raise SiteOutputError("lumi-allocations printed no table (no line starting with 'Project |'): "
                              f"{text.strip()[:200]!r}")
    columns = [cell.strip() for cell in header.split("|")]
    if _LUMI_GPU_HEADER not in columns:
        raise SiteOutputError(f"lumi-allocations' table has no column {_LUMI_GPU_HEADER!r} (columns: "
                              f"{', '.join(columns)})")
    gpu = columns.index(_LUMI_GPU_HEADER)
    rows = {cells[0].strip(): cells for line in lines if "|" in line and line is not header
            for cells in [line.split("|")]}
    if account not in rows:
        known = ", ".join(name for name in rows if name.startswith("project_")) or "none"
        raise SiteOutputError(f"lumi-allocations lists no project {account} (listed: {known}); "
                              "check the profile's account")
    cells = rows[account]
    if len(cells) <= gpu:
        raise SiteOutputError(f"lumi-allocations' line of {account} has no GPU column: {'|'.join(cells)!r}")
    cell = cells[gpu].strip()
    if cell == "N/A":
        return SiteAllocation(limit=None, used=0.0, updated=updated)
    match = _LUMI_CELL.match(cell)
    if match is None:
        raise SiteOutputError(f"lumi-allocations' GPU cell of {account} is not 'used/allocated (x%) gpu/hours': "
                              f"{cell!r}")
    alloc = float(match.group("alloc"))
    return SiteAllocation(limit=alloc if alloc > 0 else None, used=float(match.group("used")), updated=updated)


PARSERS: dict[str, Callable[[str, str], SiteAllocation]] = {
    "lumi-allocations": parse_lumi_allocations,
}
"""One parser per ``billing.allocation_command.format``."""


def parse_site_allocation(command: SiteCommand, text: str, account: str) -> SiteAllocation:
    """The allocation of ``account`` in ``text``, by the parser ``command.format`` names."""
    return PARSERS[command.format](text, account)


def command_script(command: SiteCommand) -> str:
    """The login-node script that runs the site's command (its account already filled in, quoted)."""
    return f"{command.run}\n"
