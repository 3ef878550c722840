"""Validation of every value that ends up on a remote Slurm command line.

Each check raises :class:`ValidationError` naming the field, the value and what is allowed,
*before* anything runs. Names (partitions, accounts, ...) must match Slurm's own character
sets, so an injection attempt such as ``small-g; touch /tmp/pwned`` is refused outright.
Paths may legally contain spaces and quotes: those are accepted and later quoted with
:func:`shlex.quote` by the command builders; only characters that would make Slurm's own
output ambiguous (newline, NUL, ``|``) are refused.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable, Mapping, Sequence

__all__ = [
    "PLUGIN_OWNED_SBATCH_FLAGS",
    "ValidationError",
    "duration_seconds",
    "format_time_limit",
    "parse_time_limit",
    "quote",
    "validate_account",
    "validate_begin_in",
    "validate_dependency",
    "validate_export_vars",
    "validate_extra_sbatch_options",
    "validate_job_id",
    "validate_job_ids",
    "validate_job_name",
    "validate_nodes",
    "validate_partition",
    "validate_qos",
    "validate_remote_path",
    "validate_reservation",
    "validate_signal",
    "validate_since",
    "validate_time_limit",
    "validate_user",
]


class ValidationError(ValueError):
    """A value that must not reach the cluster. ``field`` names the offending argument."""

    def __init__(self, field: str, message: str, value: object = None) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.problem = message
        self.value = value


def quote(value: str) -> str:
    """Quote one word for a POSIX shell (the remote login shell runs our command lines)."""
    return shlex.quote(value)


def _require_str(value: object, field: str) -> str:
    if not isinstance(value, str):
        raise ValidationError(field, f"expected text, got {type(value).__name__} {value!r}", value)
    if not value:
        raise ValidationError(field, "must not be empty", value)
    return value


# --- names -------------------------------------------------------------------------------------

_JOB_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.+=@:-]{0,199}$")
_SLURM_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$")
_USER = re.compile(r"^[a-z_][a-z0-9_.-]{0,31}$")


def validate_job_name(value: str, field: str = "job_name") -> str:
    """Letters, digits and ``_ . + = @ : -``, at most 200 characters, not starting with a dash.

    Spaces are legal in Slurm but make ``squeue --name`` lookups and log file names
    awkward, so the plugin refuses them.
    """
    value = _require_str(value, field)
    if not _JOB_NAME.match(value):
        raise ValidationError(
            field,
            f"{value!r} is not a valid job name (allowed: letters, digits and _ . + = @ : -, "
            "at most 200 characters, first character a letter, digit or _)",
            value,
        )
    return value


def _validate_slurm_name(value: str, field: str, what: str, allow_list: bool = False) -> str:
    value = _require_str(value, field)
    parts = value.split(",") if allow_list else [value]
    for part in parts:
        if not _SLURM_NAME.match(part):
            listing = " (a comma-separated list is allowed)" if allow_list else ""
            raise ValidationError(
                field,
                f"{value!r} is not a valid {what} name: use letters, digits, '_', '.' and '-' only, "
                f"at most 64 characters{listing}",
                value,
            )
    return value


def validate_partition(value: str, field: str = "partition") -> str:
    """A partition name such as ``small-g``, or a comma-separated list of them."""
    return _validate_slurm_name(value, field, "partition", allow_list=True)


def validate_account(value: str, field: str = "account") -> str:
    """An account (project) name such as ``project_123456``."""
    return _validate_slurm_name(value, field, "account")


def validate_qos(value: str, field: str = "qos") -> str:
    return _validate_slurm_name(value, field, "QOS")


def validate_reservation(value: str, field: str = "reservation") -> str:
    return _validate_slurm_name(value, field, "reservation", allow_list=True)


def validate_nodes(values: Iterable[str], field: str = "exclude") -> tuple[str, ...]:
    """Node names such as ``nid005001`` (not host lists): the nodes a job must not run on."""
    nodes = tuple(values) if not isinstance(values, str) else (values,)
    for node in nodes:
        _validate_slurm_name(node, field, "node")
    return nodes


def validate_begin_in(value: int, field: str = "begin_in") -> int:
    """Seconds from the submit before the job may start (``--begin=now+<seconds>``)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValidationError(field, f"{value!r} is not a number of seconds (an integer >= 0)", value)
    return value


def validate_user(value: str, field: str = "user") -> str:
    """A POSIX user name (lower case letters, digits, ``_ . -``)."""
    value = _require_str(value, field)
    if not _USER.match(value):
        raise ValidationError(field, f"{value!r} is not a valid user name", value)
    return value


# --- job ids -------------------------------------------------------------------------------------

_JOB_ID = re.compile(r"^[1-9][0-9]{0,11}(?:_[0-9]{1,7})?$")


def validate_job_id(value: str | int, field: str = "job_id") -> str:
    """A job id as Slurm prints it: ``123`` or an array element ``123_4``."""
    text = str(value).strip() if isinstance(value, (str, int)) and not isinstance(value, bool) else None
    if text is None or not _JOB_ID.match(text):
        raise ValidationError(
            field, f"{value!r} is not a Slurm job id (expected digits, optionally _<array index>)", value
        )
    return text


def validate_job_ids(values: Iterable[str | int], field: str = "job_ids") -> tuple[str, ...]:
    """Several job ids, de-duplicated in order; at least one."""
    if isinstance(values, (str, int)):
        values = [values]
    ids = tuple(dict.fromkeys(validate_job_id(v, field) for v in values))
    if not ids:
        raise ValidationError(field, "at least one job id is needed", values)
    return ids


# --- time ----------------------------------------------------------------------------------------

_TIME_FORMS = (
    re.compile(r"^(?P<m>\d+)$"),
    re.compile(r"^(?P<m>\d+):(?P<s>\d{1,2})$"),
    re.compile(r"^(?P<h>\d+):(?P<m>\d{1,2}):(?P<s>\d{1,2})$"),
    re.compile(r"^(?P<d>\d+)-(?P<h>\d{1,2})$"),
    re.compile(r"^(?P<d>\d+)-(?P<h>\d{1,2}):(?P<m>\d{1,2})$"),
    re.compile(r"^(?P<d>\d+)-(?P<h>\d{1,2}):(?P<m>\d{1,2}):(?P<s>\d{1,2})$"),
)
_TIME_HELP = (
    "use one of Slurm's forms: MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS (e.g. 3-00:00:00 or 0:30:00)"
)


def duration_seconds(text: str) -> int | None:
    """Seconds in a Slurm duration, or None if ``text`` is in none of Slurm's forms.

    The one reader of Slurm durations: ``--time`` values (:func:`parse_time_limit`), profiles and
    requests, and the times squeue/sacct/scontrol print (:func:`slurm_provider.cli.values.parse_duration`).
    A bare number means minutes, as in sbatch; zero is a duration here (an elapsed time may be zero).
    """
    for form in _TIME_FORMS:
        match = form.match(text.strip())
        if match:
            parts = {k: int(v) for k, v in match.groupdict().items() if v is not None}
            if ("h" in parts and "d" in parts and parts["h"] > 23) or parts.get("s", 0) > 59:
                return None
            if "h" in parts and parts.get("m", 0) > 59:
                return None
            return (
                parts.get("d", 0) * 86400
                + parts.get("h", 0) * 3600
                + parts.get("m", 0) * 60
                + parts.get("s", 0)
            )
    return None


def parse_time_limit(value: str | int, field: str = "time_limit") -> int:
    """Seconds in a Slurm ``--time`` value. A bare number means minutes, as in sbatch."""
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    text = _require_str(value, field).strip()
    seconds = duration_seconds(text)
    if seconds is None:
        raise ValidationError(field, f"{value!r} is not a Slurm time limit; {_TIME_HELP}", value)
    if seconds <= 0:
        raise ValidationError(field, f"{value!r} is zero; a job needs at least one minute", value)
    return seconds


def format_time_limit(seconds: int) -> str:
    """``D-HH:MM:SS`` for sbatch; Slurm rounds partial minutes up."""
    if seconds <= 0:
        raise ValidationError("time_limit", f"{seconds} seconds is not a positive duration", seconds)
    days, rest = divmod(int(seconds), 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{days}-{hours:02d}:{minutes:02d}:{secs:02d}"


def validate_time_limit(value: str | int, field: str = "time_limit", max_seconds: int | None = None) -> str:
    """Canonical ``D-HH:MM:SS`` form of a ``--time`` value, optionally capped (e.g. partition MaxTime)."""
    seconds = parse_time_limit(value, field)
    if max_seconds is not None and seconds > max_seconds:
        raise ValidationError(
            field,
            f"{value!r} is longer than the allowed maximum {format_time_limit(max_seconds)}",
            value,
        )
    return format_time_limit(seconds)


_SINCE = re.compile(
    r"^(?:now(?:[-+]\d+(?:seconds|minutes|hours|days|weeks)?)?"
    r"|today|midnight|noon|tomorrow"
    r"|\d{4}-\d{2}-\d{2}(?:T\d{2}:\d{2}(?::\d{2})?)?"
    r"|\d{2}:\d{2}(?::\d{2})?)$"
)


def validate_since(value: str, field: str = "since") -> str:
    """A sacct ``-S`` time: ``now-7days``, ``2026-02-01``, ``2026-02-01T08:00:00``, ``midnight`` ..."""
    value = _require_str(value, field)
    if not _SINCE.match(value):
        raise ValidationError(
            field,
            f"{value!r} is not a sacct start time (examples: now-7days, 2026-02-01, 2026-02-01T08:00:00)",
            value,
        )
    return value


# --- paths ---------------------------------------------------------------------------------------

_PATH_FORBIDDEN = {"\n": "a newline", "\r": "a carriage return", "\x00": "a NUL byte", "|": "'|'"}


def validate_remote_path(value: str, field: str = "path", *, absolute: bool = False) -> str:
    """A path on the cluster. Spaces, quotes, ``$`` and ``;`` are allowed (they get quoted).

    Refused: empty, a leading ``-`` (would read as an option), newline/CR/NUL (would split
    Slurm's one-line-per-job output) and ``|`` (our field separator in squeue/sacct output).
    Slurm filename patterns such as ``%j`` and ``%x`` are allowed.
    """
    value = _require_str(value, field)
    for char, name in _PATH_FORBIDDEN.items():
        if char in value:
            raise ValidationError(
                field, f"path {value!r} contains {name}, which the plugin cannot pass safely", value
            )
    if value.startswith("-"):
        raise ValidationError(
            field, f"path {value!r} starts with '-'; prefix it with ./ or use an absolute path", value
        )
    if absolute and not value.startswith("/"):
        raise ValidationError(field, f"path {value!r} must be absolute (start with /)", value)
    return value


# --- signals, dependencies, environment ----------------------------------------------------------

_SIGNALS = {
    "HUP", "INT", "QUIT", "ABRT", "KILL", "USR1", "USR2", "PIPE", "ALRM", "TERM", "CONT", "STOP", "TSTP",
    "TTIN", "TTOU", "URG", "XCPU", "XFSZ", "VTALRM", "PROF", "WINCH", "IO",
}  # fmt: skip


def validate_signal(value: str | int, field: str = "signal") -> str:
    """A signal for ``scancel --signal``: a name (``USR1``, ``SIGTERM``) or a number 1-64."""
    text = str(value).strip().upper()
    name = text[3:] if text.startswith("SIG") else text
    if name in _SIGNALS:
        return name
    if name.isdigit() and 1 <= int(name) <= 64:
        return name
    raise ValidationError(field, f"{value!r} is not a signal (e.g. USR1, TERM, KILL or a number 1-64)", value)


_DEPENDENCY_ITEM = re.compile(
    r"^(?:singleton|(?:after|afterany|afterburstbuffer|aftercorr|afternotok|afterok)"
    r"(?::[1-9][0-9]*(?:_[0-9]+)?(?:\+[0-9]+)?)+)$"
)


def validate_dependency(value: str, field: str = "dependency") -> str:
    """A ``--dependency`` value such as ``afterok:123:124`` or ``afterany:123,singleton`` (or ``?``)."""
    value = _require_str(value, field)
    separator = "?" if "?" in value else ","
    for item in value.split(separator):
        if not _DEPENDENCY_ITEM.match(item):
            raise ValidationError(
                field,
                f"{value!r} is not a Slurm dependency (e.g. afterok:123, afterany:123:124, singleton)",
                value,
            )
    return value


_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def validate_export_vars(values: Mapping[str, str], field: str = "export") -> dict[str, str]:
    """Variables for ``--export=ALL,NAME=value``. Slurm splits that list on commas, so values must not
    contain a comma; quotes and spaces are fine."""
    result: dict[str, str] = {}
    for name, raw in values.items():
        if not isinstance(name, str) or not _ENV_NAME.match(name):
            raise ValidationError(field, f"{name!r} is not a valid environment variable name", name)
        text = str(raw)
        for char, what in ((",", "a comma"), ("\n", "a newline"), ("\x00", "a NUL byte")):
            if char in text:
                raise ValidationError(
                    field,
                    f"value of {name} contains {what}, which sbatch --export cannot carry; "
                    "write it into the job script instead",
                    raw,
                )
        result[name] = text
    return result


# --- extra sbatch options ------------------------------------------------------------------------

PLUGIN_OWNED_SBATCH_FLAGS: dict[str, str] = {
    "--job-name": "the plugin names the job (argument job_name)",
    "--output": "the plugin sets the log path (argument output)",
    "--error": "the plugin sets the log path (argument error)",
    "--parsable": "the plugin parses sbatch's answer itself",
    "--comment": "the plugin stores its job tag (DAG, task, run, stage, attempt) in the comment",
    "--test-only": "use the operator's dry-run instead",
    "--wrap": "the plugin sends the job script itself",
    "--wait": "the plugin waits for the job without blocking (deferrable trigger)",
    "--chdir": "use the argument chdir",
    "--export": "use the argument export",
    "--dependency": "use the argument dependency",
}
_OWNED_SHORT = {
    "J": "--job-name",
    "o": "--output",
    "e": "--error",
    "W": "--wait",
    "D": "--chdir",
    "d": "--dependency",
}
# sbatch short options that take no argument, so more letters may follow them in one word (-vH).
_SHORT_NO_ARG = set("hHkOQsuvV")
_LONG_OPTION = re.compile(r"^--(?P<name>[A-Za-z][A-Za-z0-9-]*)(?:=(?P<value>.*))?$", re.DOTALL)


def validate_extra_sbatch_options(
    options: Sequence[str] | None, field: str = "extra_sbatch_options"
) -> tuple[str, ...]:
    """Extra sbatch options, one option per item: ``--gpus=8``, ``--mem=64G``, ``-N2``.

    Every item must be a single option with its value attached (``--name=value`` or ``-Xvalue``),
    so nothing can be mistaken for the script path. Flags the plugin owns are refused with the
    flag's name, including abbreviations sbatch would accept (``--job``, ``--out``).
    """
    if options is None:
        return ()
    if isinstance(options, str):
        raise ValidationError(
            field, f"expected a list of options such as ['--gpus=8', '--mem=64G'], got the string {options!r}"
        )
    result: list[str] = []
    for option in options:
        if not isinstance(option, str) or not option:
            raise ValidationError(field, f"each option must be non-empty text, got {option!r}", option)
        if "\n" in option or "\x00" in option:
            raise ValidationError(field, f"option {option!r} contains a newline or NUL byte", option)
        if option.startswith("--"):
            _check_long_option(option, field)
        elif option.startswith("-") and len(option) > 1:
            _check_short_option(option, field)
        else:
            raise ValidationError(
                field,
                f"{option!r} is not an option; write each as --name=value (e.g. '--time=1:00:00')",
                option,
            )
        result.append(option)
    return tuple(result)


def _check_long_option(option: str, field: str) -> None:
    match = _LONG_OPTION.match(option)
    if not match:
        raise ValidationError(field, f"{option!r} is not a valid long option", option)
    name = "--" + match.group("name")
    for owned, why in PLUGIN_OWNED_SBATCH_FLAGS.items():
        # getopt_long accepts unambiguous prefixes, so '--job' means '--job-name'.
        if owned.startswith(name) and len(name) >= 3:
            raise ValidationError(
                field, f"{owned} is set by the plugin and may not be passed ({option!r}): {why}", option
            )


def _check_short_option(option: str, field: str) -> None:
    for letter in option[1:]:
        if letter in _OWNED_SHORT:
            owned = _OWNED_SHORT[letter]
            raise ValidationError(
                field,
                f"-{letter} ({owned}) is set by the plugin and may not be passed ({option!r}): "
                f"{PLUGIN_OWNED_SBATCH_FLAGS[owned]}",
                option,
            )
        if letter not in _SHORT_NO_ARG:
            return  # the rest of the word is this option's value
