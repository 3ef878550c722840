"""``scontrol show job`` (one job's full record, as ``Key=Value`` words), ``scontrol release`` (a held
job), ``scontrol show reservation``
(the site's announced maintenance windows), ``scontrol ping`` and ``scontrol show config`` (the
site's settings a workflow relies on)."""

from __future__ import annotations

import re

from slurm_provider.cli.values import TIME_FORMAT_ENV, SlurmOutputError, join_argv, output_lines
from slurm_provider.validation import validate_job_id


def build_scontrol_show_job(job_id: str | int) -> str:
    """``scontrol show job -o ID``: one ``Key=Value`` line per job (per element for arrays)."""
    return f"{TIME_FORMAT_ENV} " + join_argv(["scontrol", "show", "job", "-o", validate_job_id(job_id)])


_SCONTROL_KEY = re.compile(r"(?:^|\s)([A-Za-z][A-Za-z0-9_/:]*)=")


def parse_scontrol_show_job(stdout: str | None) -> list[dict[str, str]]:
    """``scontrol show job -o``: one dict per line (per array element), every ``Key=Value``.

    Values may contain spaces (``JobName=probe one``, ``StdOut=/path with space/x.out``); a value
    ends where the next `` Key=`` begins. Keys with a colon (``AllocNode:Sid``) are kept whole.
    """
    return [_key_values(line.strip(), "JobId=", "scontrol show job -o") for line in output_lines(stdout)]


def build_scontrol_release(job_id: str | int) -> str:
    """``scontrol release ID``: let a job its owner (or a site, as a user hold) held start again."""
    return join_argv(["scontrol", "release", validate_job_id(job_id)])


def build_scontrol_show_reservations() -> str:
    """``scontrol show reservation -o``: one ``Key=Value`` line per reservation, times in ISO form."""
    return f"{TIME_FORMAT_ENV} " + join_argv(["scontrol", "show", "reservation", "-o"])


NO_RESERVATIONS = "No reservations in the system"


def parse_scontrol_show_reservations(stdout: str | None) -> list[dict[str, str]]:
    """``scontrol show reservation -o``: one dict per reservation (``ReservationName``, ``StartTime``,
    ``EndTime``, ``Nodes``, ``Flags``, ...); none when Slurm says it has none."""
    return [_key_values(line.strip(), "ReservationName=", "scontrol show reservation -o")
            for line in output_lines(stdout) if line.strip() != NO_RESERVATIONS]


def _key_values(text: str, first: str, command: str) -> dict[str, str]:
    """The ``Key=Value`` words of one ``-o`` line that starts with ``first``."""
    matches = list(_SCONTROL_KEY.finditer(text))
    if not matches or not text.startswith(first):
        raise SlurmOutputError(f"not a '{command}' line: {text[:200]!r}")
    record: dict[str, str] = {}
    for i, match in enumerate(matches):
        end = matches[i + 1].start() if i + 1 < len(matches) else len(text)
        record[match.group(1)] = text[match.end() : end].strip()
    return record


def build_scontrol_ping() -> str:
    """``scontrol ping``: does a ``slurmctld`` answer the login node? (cheap: no job is read)."""
    return join_argv(["scontrol", "ping"])


_PING_LINE = re.compile(r"^Slurmctld\((?P<role>[^)]*)\) at (?P<host>\S+) is (?P<state>UP|DOWN)\b")


def parse_scontrol_ping(stdout: str | None) -> dict[str, str]:
    """``{"primary": "UP", "backup": "DOWN"}`` from ``scontrol ping`` (the role of each controller
    Slurm names); lines that are not a controller's state (the banner below a DOWN) are skipped."""
    states = {}
    for line in output_lines(stdout):
        match = _PING_LINE.match(line.strip())
        if match:
            states[match.group("role")] = match.group("state")
    if not states:
        raise SlurmOutputError(f"not a 'scontrol ping' answer: {(stdout or '').strip()[:200]!r}")
    return states


def build_scontrol_show_config() -> str:
    """``scontrol show config``: the controller's running settings, one ``Name = Value`` per line."""
    return join_argv(["scontrol", "show", "config"])


_CONFIG_LINE = re.compile(r"^(?P<name>[A-Za-z][A-Za-z0-9_]*)\s*=\s?(?P<value>.*)$")


def parse_scontrol_show_config(stdout: str | None) -> dict[str, str]:
    """``{"AccountingStoreFlags": "job_comment", "PrivateData": "none", ...}`` from ``scontrol show
    config``. The banner (``Configuration data as of ...``) and the sections of plugins, whose lines are
    indented or not ``Name = Value``, are skipped; the first value of a name is kept (a plugin's
    section may repeat a name of the main one)."""
    settings: dict[str, str] = {}
    for line in output_lines(stdout):
        if line[:1].isspace():
            continue
        match = _CONFIG_LINE.match(line.rstrip())
        if match:
            settings.setdefault(match.group("name"), match.group("value").strip())
    if "SLURM_VERSION" not in settings:
        raise SlurmOutputError(f"not a 'scontrol show config' answer: {(stdout or '').strip()[:200]!r}")
    return settings
