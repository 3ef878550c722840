"""``sbatch``: the submit command line, the job comment it attaches, and what sbatch answers.

The job script is never written to a file by the user: :func:`build_sbatch_submit` makes sbatch
read it from standard input, and the hook sends the script text as the command's stdin (or, for
transports without stdin, wraps it with :func:`with_stdin_heredoc`). The exclusive submit, which holds
a lock in the job's directory, is :mod:`slurm_provider.cli.exclusive_submit`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from slurm_provider.cli.values import FIELD_SEPARATOR, join_argv, parse_slurm_time
from slurm_provider.validation import (
    ValidationError,
    parse_time_limit,
    validate_account,
    validate_begin_in,
    validate_dependency,
    validate_export_vars,
    validate_extra_sbatch_options,
    validate_job_name,
    validate_nodes,
    validate_partition,
    validate_qos,
    validate_remote_path,
    validate_reservation,
    validate_time_limit,
)

MAX_HEREDOC_BYTES = 100_000
"""A heredoc travels inside the SSH exec request; Linux caps one argument at 128 KiB."""


DEFAULT_PROJECT_TAG = "airflow"
"""The job comment's ``project`` unless the operator is given its own ``project_tag``."""


@dataclass(frozen=True)
class JobComment:
    """Who submitted a job, stored in Slurm's ``--comment`` as compact JSON.

    It lets the operator recognise its own job after a worker restart (find by name, then
    check the comment) and lets people see in ``squeue`` which DAG run a job belongs to.
    """

    dag: str
    task: str
    run: str
    attempt: int
    stage: str | None = None
    project: str = DEFAULT_PROJECT_TAG
    clear: int = 0
    """The DAG run's clear count: after a clear, the task's earlier jobs are no longer its own."""
    place: str | None = None
    """Digest of where the job writes its log: the same run id in another Airflow deployment or
    project directory is another job."""
    code: str | None = None
    """The version of the code the job runs (e.g. a content hash): lets a cleanup on the cluster
    keep every code version a queued, running or requeued job still needs, and a live job of
    another version in the same exclusive directory is never adopted."""
    xdir: str | None = None
    """Digest of the directory the job writes exclusively (``exclusive_dir_marker``): at most one live
    job per directory, whoever submitted it."""
    by: str | None = None
    """The submitting task's own token, kept in its task state store across tries and clears: two
    Airflow deployments running the same DAG run id (scheduled runs) never take each other's job for
    their own."""

    def to_json(self) -> str:
        """Compact JSON without spaces and with ``|`` escaped, so it never breaks our output parsing.

        ``clear``, ``place`` and ``code`` are left out at their defaults, keeping comments short.
        """
        data = asdict(self)
        for key, default in _OMITTED_AT_DEFAULT.items():
            if data[key] == default:
                del data[key]
        text = json.dumps(data, separators=(",", ":"), sort_keys=True, ensure_ascii=True)
        return text.replace("|", "\\u007c")

    def same_task(self, other: JobComment | None) -> bool:
        """True when ``other`` is the same task of the same DAG run, clear and place (any attempt), and
        of the same submitter where both carry one."""
        return (other is not None and self._identity() == other._identity()
                and (self.by is None or other.by is None or self.by == other.by))

    def _identity(self) -> tuple:
        return (self.project, self.dag, self.task, self.run, self.stage, self.clear, self.place)


_OMITTED_AT_DEFAULT = {"clear": 0, "place": None, "code": None, "xdir": None, "by": None}


def parse_job_comment(text: str | None) -> JobComment | None:
    """The :class:`JobComment` in a Slurm comment, or None for anything else (foreign jobs)."""
    if not text or not text.lstrip().startswith("{"):
        return None
    try:
        data = json.loads(text)
        return JobComment(
            dag=str(data["dag"]),
            task=str(data["task"]),
            run=str(data["run"]),
            attempt=int(data["attempt"]),
            stage=None if data.get("stage") is None else str(data["stage"]),
            project=str(data.get("project", DEFAULT_PROJECT_TAG)),
            clear=int(data.get("clear", 0)),
            place=None if data.get("place") is None else str(data["place"]),
            code=None if data.get("code") is None else str(data["code"]),
            xdir=None if data.get("xdir") is None else str(data["xdir"]),
            by=None if data.get("by") is None else str(data["by"]),
        )
    except (ValueError, KeyError, TypeError):
        return None


@dataclass(frozen=True)
class SubmitOptions:
    """Everything sbatch is told besides the script: the one definition of the options that
    :func:`build_sbatch_submit`, :func:`build_sbatch_test_only` and the hooks' ``submit`` take."""

    job_name: str
    output: str
    error: str | None = None
    comment: JobComment | str | None = None
    chdir: str | None = None
    export: Mapping[str, str] | None = None
    export_all: bool = True
    dependency: str | None = None
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    reservation: str | None = None
    time_limit: str | None = None
    time_min: str | None = None
    """``--time-min``: Slurm may start the job with its time limit lowered as far as this when that lets
    it start sooner, e.g. to end before a maintenance reservation (for jobs that checkpoint and requeue)."""
    exclude: Sequence[str] | None = None
    """``--exclude``: nodes the job must not run on (e.g. nodes where jobs just failed for the node's fault)."""
    begin_in: int | None = None
    """``--begin=now+<seconds>``: the job is queued now and may start only that much later (a back-off
    that keeps the job in Slurm's queue, not in a sleeping worker)."""
    extra_options: Sequence[str] | None = None

    def as_kwargs(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def of(cls, options: SubmitOptions | None = None, **given: Any) -> SubmitOptions:
        """``options`` with ``given`` on top (or ``given`` alone); unknown names are refused."""
        valid = [f.name for f in fields(cls)]
        if options is None:
            try:
                return cls(**given)
            except TypeError as exc:
                raise ValidationError("options", f"{exc}; valid fields: {', '.join(valid)}") from None
        unknown = sorted(set(given) - set(valid))
        if unknown:
            raise ValidationError("options", f"unknown submit options {unknown} (valid: {', '.join(valid)})")
        return replace(options, **given)


def _sbatch_argv(options: SubmitOptions) -> list[str]:
    (job_name, output, error, comment, chdir, export, export_all, dependency, partition, account, qos,
     reservation, time_limit, time_min, exclude, begin_in, extra_options) = (getattr(options, f.name)
                                                                            for f in fields(options))
    argv = ["sbatch", f"--job-name={validate_job_name(job_name)}"]
    argv.append(f"--output={validate_remote_path(output, 'output')}")
    if error is not None:
        argv.append(f"--error={validate_remote_path(error, 'error')}")
    if comment is not None:
        text = comment.to_json() if isinstance(comment, JobComment) else comment
        if "\n" in text or FIELD_SEPARATOR in text:
            raise ValidationError(
                "comment", "must not contain a newline or '|' (they break squeue/sacct parsing)"
            )
        argv.append(f"--comment={text}")
    if chdir is not None:
        argv.append(f"--chdir={validate_remote_path(chdir, 'chdir')}")
    if export is not None or not export_all:
        items = ["ALL"] if export_all else ["NONE"]
        items += [f"{k}={v}" for k, v in validate_export_vars(export or {}).items()]
        argv.append(f"--export={','.join(items)}")
    if dependency is not None:
        argv.append(f"--dependency={validate_dependency(dependency)}")
    if partition is not None:
        argv.append(f"--partition={validate_partition(partition)}")
    if account is not None:
        argv.append(f"--account={validate_account(account)}")
    if qos is not None:
        argv.append(f"--qos={validate_qos(qos)}")
    if reservation is not None:
        argv.append(f"--reservation={validate_reservation(reservation)}")
    if time_limit is not None:
        argv.append(f"--time={validate_time_limit(time_limit)}")
    if time_min is not None:
        longest = parse_time_limit(time_limit, "time_limit") if time_limit is not None else None
        argv.append(f"--time-min={validate_time_limit(time_min, 'time_min', longest)}")
    if exclude:
        argv.append(f"--exclude={','.join(validate_nodes(exclude))}")
    if begin_in:
        argv.append(f"--begin=now+{validate_begin_in(begin_in)}")
    argv.extend(validate_extra_sbatch_options(extra_options))
    return argv


def build_sbatch_submit(options: SubmitOptions | None = None, /, **given: Any) -> str:
    """``sbatch --parsable ...`` that reads the job script from stdin.

    Options given here override ``#SBATCH`` lines in the script. Output is ``<id>`` or
    ``<id>;<cluster>`` (read it with ``slurm_provider.cli.sbatch.parse_sbatch_parsable``). ``export`` adds
    variables on top of the submitting environment (``--export=ALL,START_STAGE=2``).
    """
    argv = _sbatch_argv(SubmitOptions.of(options, **given))
    argv.insert(1, "--parsable")
    return join_argv(argv)


_SCRIPT_ACCOUNT = re.compile(r"^#SBATCH\s+(?:--account(?:=|\s+)|-A\s*)(?P<account>\S+)")


def script_account(script: str) -> str | None:
    """The account an ``#SBATCH --account``/``-A`` line of the script charges, if it names one.

    Only the directive block counts: sbatch stops reading directives at the first command.
    """
    for line in script.splitlines()[1:]:
        stripped = line.strip()
        if not stripped or (stripped.startswith("#") and not stripped.startswith("#SBATCH")):
            continue
        if not stripped.startswith("#SBATCH"):
            return None
        match = _SCRIPT_ACCOUNT.match(stripped)
        if match:
            return match.group("account").strip("'\"")
    return None


def build_sbatch_test_only(options: SubmitOptions | None = None, /, **given: Any) -> str:
    """``sbatch --test-only ...`` (script on stdin): validates the request and estimates a start
    time without submitting. The answer is on **stderr** (``slurm_provider.cli.sbatch.parse_sbatch_test_only``)."""
    argv = _sbatch_argv(SubmitOptions.of(options, **given))
    argv.insert(1, "--test-only")
    return join_argv(argv)


def with_stdin_heredoc(command: str, stdin_text: str) -> str:
    """Append ``stdin_text`` to ``command`` as a quoted heredoc, for transports without stdin.

    The delimiter is chosen so that no line of the text equals it, and the heredoc is quoted
    (``<<'EOF'``), so nothing in the script is expanded by the login shell.
    """
    if len(stdin_text.encode()) > MAX_HEREDOC_BYTES:
        raise ValidationError(
            "script",
            f"script is {len(stdin_text.encode())} bytes; more than {MAX_HEREDOC_BYTES} cannot travel in one "
            "SSH command line, send it as stdin instead",
        )
    lines = set(stdin_text.splitlines())
    counter = 0
    delimiter = "SLURM_PROVIDER_SCRIPT_EOF"
    while delimiter in lines:
        counter += 1
        delimiter = f"SLURM_PROVIDER_SCRIPT_EOF_{counter}"
    body = stdin_text if stdin_text.endswith("\n") else stdin_text + "\n"
    return f"{command} <<'{delimiter}'\n{body}{delimiter}\n"


class SbatchRefused(RuntimeError):
    """sbatch refused the job (bad partition, account, limits...). ``message`` is Slurm's own text."""

    def __init__(self, message: str, stderr: str) -> None:
        super().__init__(message)
        self.message = message
        self.stderr = stderr


@dataclass(frozen=True)
class SubmitResult:
    job_id: str
    cluster: str | None


_PARSABLE = re.compile(r"^(?P<id>\d+)(?:;(?P<cluster>\S+))?$")


_SBATCH_ERROR = re.compile(r"^sbatch: error: (?P<msg>.*)$", re.MULTILINE)


def parse_sbatch_parsable(stdout: str, stderr: str = "") -> SubmitResult:
    """``<id>`` or ``<id>;<cluster>`` from ``sbatch --parsable`` (the last such line; sbatch may
    print warnings first). Raises :class:`SbatchRefused` with Slurm's message when there is no id."""
    for line in reversed((stdout or "").strip().splitlines()):
        match = _PARSABLE.match(line.strip())
        if match:
            return SubmitResult(match.group("id"), match.group("cluster"))
    message = sbatch_error_message(stderr) or sbatch_error_message(stdout)
    raise SbatchRefused(
        message
        or f"sbatch printed no job id (stdout: {stdout.strip()!r}, stderr: {(stderr or '').strip()!r})",
        stderr,
    )


def sbatch_error_message(stderr: str | None) -> str | None:
    """Slurm's own error sentence(s) from sbatch's stderr, without the ``sbatch: error:`` prefix."""
    messages = [m.group("msg").strip() for m in _SBATCH_ERROR.finditer(stderr or "")]
    return "; ".join(messages) if messages else None


@dataclass(frozen=True)
class TestOnlyResult:
    """What ``sbatch --test-only`` predicts."""

    __test__ = False  # not a pytest test class

    job_id: str
    start: str | None
    processors: int | None
    nodes: str | None
    partition: str | None


_TEST_ONLY = re.compile(
    r"sbatch: Job (?P<id>\d+) to start at (?P<start>\S+) using (?P<procs>\d+) processors? "
    r"on nodes? (?P<nodes>\S+) in partition (?P<partition>\S+)"
)


def parse_sbatch_test_only(stderr: str) -> TestOnlyResult:
    """The estimate ``sbatch --test-only`` prints on stderr; :class:`SbatchRefused` if it refused."""
    match = _TEST_ONLY.search(stderr or "")
    if match:
        return TestOnlyResult(
            job_id=match.group("id"),
            start=parse_slurm_time(match.group("start")),
            processors=int(match.group("procs")),
            nodes=match.group("nodes"),
            partition=match.group("partition"),
        )
    message = sbatch_error_message(stderr)
    fallback = f"sbatch --test-only printed no estimate: {(stderr or '').strip()!r}"
    raise SbatchRefused(message or fallback, stderr)
