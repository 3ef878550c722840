"""``sbatch``: the submit command line, the job comment it attaches, and what sbatch answers.

The job script is never written to a file by the user: :func:`build_sbatch_submit` makes sbatch
read it from standard input, and the hook sends the script text as the command's stdin (or, for
transports without stdin, wraps it with :func:`with_stdin_heredoc`). The exclusive submit holds a
lock in the job's directory and refuses while a live job of the project writes there.
"""

from __future__ import annotations

import hashlib
import json
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from slurm_provider.cli.squeue import build_squeue_live_jobs
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


LIVE_MARKER = "__SLURM_PROVIDER_LIVE__"
"""Printed (with the login user after it) instead of a job id when live jobs already write the directory."""

DONE_MARKER = "__SLURM_PROVIDER_DONE__"
"""Printed instead of a job id when the directory's done markers exist: nothing is left to do."""

MOVED_MARKER = "__SLURM_PROVIDER_MOVED__"
"""Printed before the job id, with a directory after it, for each directory whose outputs were moved aside."""


SUBMIT_LOCK_NAME = ".slurm-submit.lock"

SUBMIT_LOCK_OWNER = "owner"
"""File inside the lock directory: ``<host> <pid>`` of the shell that holds it, touched while held."""

SUBMIT_LOCK_STALE_MINUTES = 1
"""An owner file on another login node not refreshed for this long belongs to a submit that died."""

SUBMIT_LOCK_WAIT_TENTHS = 1200
"""How long (tenths of a second) a submit waits for the lock before it gives up with exit 75."""

EXIT_LOCK_BUSY = 75
"""The exclusive submit's exit status when another submit held the lock all along (EX_TEMPFAIL):
nothing was submitted, and trying again later is right."""

EXIT_NO_DIRECTORY = 70
"""The exclusive submit's exit status when the directory cannot be created or its outputs moved aside."""

EXIT_QUERY_FAILED = 76
"""The exclusive submit's exit status when ``squeue`` gave no answer (slurmctld busy): nothing was
submitted, and trying again later is right."""


def exclusive_dir_marker(directory: str) -> str:
    """The short digest a job comment carries for the directory the job writes (``"xdir":"..."``)."""
    return hashlib.sha256(directory.rstrip("/").encode()).hexdigest()[:16]


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


def lock_acquire_lines(lock: str, *, program: str = "sbatch", what: str = "submit") -> list[str]:
    """Shell lines that take a lock such as the submit lock, a directory (``mkdir`` is atomic on every POSIX file
    system, Lustre included), for a live holder only.

    The holder writes ``<host> <pid>`` into the lock and a keeper touches it every few seconds while
    it is held. A waiter on the same host takes the lock over when that pid is gone; a waiter on
    another login node when the owner file went unrefreshed for ``SUBMIT_LOCK_STALE_MINUTES``. A
    takeover renames the lock away and checks that it took the very lock it judged dead, putting it
    back otherwise. A submit that waits ``SUBMIT_LOCK_WAIT_TENTHS`` in vain exits ``EXIT_LOCK_BUSY``, saying
    "``<program>: error: another <what> holds <lock>``". The lock is released when the shell exits.
    Other one-writer steps on the login node (installing a job environment) take the same kind of lock.
    """
    owner = f'"$lock"/{SUBMIT_LOCK_OWNER}'
    return [
        f"lock={shlex.quote(lock)}; here=$(hostname); waited=0",
        'until mkdir -m 775 "$lock" 2>/dev/null; do '
        f'holder=$(cat {owner} 2>/dev/null); stale=; '
        'if [ -n "$holder" ]; then '
        'if [ "${holder%% *}" = "$here" ]; then [ -d "/proc/${holder#* }" ] || stale=1; '
        f'elif [ -n "$(find {owner} -mmin +{SUBMIT_LOCK_STALE_MINUTES} 2>/dev/null)" ]; then stale=1; fi; '
        f'elif [ -n "$(find "$lock" -maxdepth 0 -mmin +{SUBMIT_LOCK_STALE_MINUTES} 2>/dev/null)" ]; then stale=1; fi; '
        'if [ -n "$stale" ]; then '
        'if mv -T "$lock" "$lock.stale.$$" 2>/dev/null; then '
        f'if [ "$(cat "$lock.stale.$$/{SUBMIT_LOCK_OWNER}" 2>/dev/null)" = "$holder" ]; then rm -rf "$lock.stale.$$"; '
        'else mv -T "$lock.stale.$$" "$lock" 2>/dev/null; fi; fi; continue; fi; '
        'waited=$((waited + 1)); '
        f'if [ "$waited" -gt {SUBMIT_LOCK_WAIT_TENTHS} ]; then '
        f'echo "{program}: error: another {what} holds $lock (${{holder:-owner unknown}}); try again" >&2; '
        f'exit {EXIT_LOCK_BUSY}; fi; '
        "sleep 0.1; done",
        f'echo "$here $$" > {owner}',
        f'( while sleep 5 && [ -d "/proc/$$" ]; do touch -c {owner} 2>/dev/null || exit 0; done ) '
        "</dev/null >/dev/null 2>&1 & keeper=$!",
        f"trap 'kill $keeper 2>/dev/null; rm -f {owner}; rmdir \"$lock\" 2>/dev/null' EXIT",
    ]


def build_exclusive_sbatch_submit(*, exclusive_dir: str, done_markers: Sequence[str] = (),
                                  replace: str | None = None, supersede: Sequence[str] = (),
                                  live_account: str | None = None, **submit: Any) -> str:
    """Submit unless a live job already writes ``exclusive_dir``, or it is done; one command.

    Under a lock directory inside ``exclusive_dir`` held by a live holder (see :func:`lock_acquire_lines`),
    one ``squeue`` lists every user's live jobs of the project's account (``live_account``, else
    ``submit['account']``; every account's when neither names one) whose comment names the
    directory's digest: if there is one, it prints ``LIVE_MARKER``, the login user and those rows,
    and submits nothing. Otherwise, when every one of ``done_markers`` (paths relative to the
    directory) exists, it prints ``DONE_MARKER`` and submits nothing: the work is done. Otherwise it
    runs :func:`build_sbatch_submit` (the script on stdin). Two Airflow deployments, or two members
    of a project, that submit for the same directory at the same moment thus get one job between
    them, and one that comes a moment after the job finished gets none.

    ``replace`` (a stamp such as ``20260312T101500``) asks for a fresh start: the done markers are
    not looked at, and before ``sbatch`` what the directory holds is moved into
    ``<directory>.replaced-<stamp>``, and what each ``supersede`` directory holds (outputs computed
    from the old ones, e.g. later training stages) into ``<that directory>.superseded-<stamp>``,
    each printed after ``MOVED_MARKER``. A live job writing a ``supersede`` directory counts as a
    live writer too. The job and its outputs are created with ``umask 002``: the project's members
    share the directories. The comment in ``submit`` must carry the directory's digest
    (``JobComment.xdir``).
    """
    directory = _directory(exclusive_dir, "exclusive_dir")
    comment = submit.get("comment")
    marker = exclusive_dir_marker(directory)
    if not isinstance(comment, JobComment) or comment.xdir != marker:
        raise ValidationError("comment", f"must be a JobComment with xdir={marker!r} for {directory}")
    markers = [_relative(m, "done_markers") for m in done_markers]
    later = [_directory(d, "supersede") for d in supersede]
    if later and replace is None:
        raise ValidationError("supersede", "only a replacing submit moves other directories aside (give replace)")
    if replace is not None and not re.fullmatch(r"[A-Za-z0-9._-]{1,64}", replace):
        raise ValidationError("replace", "must be a stamp of letters, digits, '.', '_' or '-'", replace)
    account = live_account if live_account is not None else submit.get("account")
    needles = " ".join(f"-e {shlex.quote(_xdir_needle(d))}" for d in [directory, *later])
    lines = [
        "umask 002",
        f"mkdir -p {shlex.quote(directory)} || exit {EXIT_NO_DIRECTORY}",
        *lock_acquire_lines(f"{directory}/{SUBMIT_LOCK_NAME}"),
        f"live=$({build_squeue_live_jobs(account)}) || exit {EXIT_QUERY_FAILED}",
        f"match=$(printf '%s\\n' \"$live\" | grep -F {needles})",
        f'if [ -n "$match" ]; then echo "{LIVE_MARKER} $(id -un)"; printf \'%s\\n\' "$match"; exit 0; fi',
    ]
    if replace is None and markers:
        present = " && ".join(f"[ -e {shlex.quote(directory + '/' + m)} ]" for m in markers)
        lines.append(f"if {present}; then echo {DONE_MARKER}; exit 0; fi")
    if replace is not None:
        moves = [(directory, f"{directory}.replaced-{replace}", SUBMIT_LOCK_NAME)]
        moves += [(d, f"{d}.superseded-{replace}", SUBMIT_LOCK_NAME) for d in later]
        for source, target, keep in moves:
            src, dst = shlex.quote(source), shlex.quote(target)
            lines.append(
                f"if [ -d {src} ] && [ -n \"$(find {src} -mindepth 1 -maxdepth 1 ! -name {keep} -print -quit)\" ]; "
                f"then mkdir {dst} && find {src} -mindepth 1 -maxdepth 1 ! -name {keep} -exec mv -t {dst} -- {{}} + "
                f"|| exit {EXIT_NO_DIRECTORY}; echo {MOVED_MARKER} {dst}; fi")
    lines.append(build_sbatch_submit(**submit))
    return "; ".join(lines)


def _xdir_needle(directory: str) -> str:
    """The text a job comment holds when the job writes ``directory`` (compact JSON, see JobComment)."""
    return f'"xdir":"{exclusive_dir_marker(directory)}"'


def _directory(value: str, field: str) -> str:
    return validate_remote_path(value.rstrip("/") or "/", field, absolute=True)


def _relative(value: str, field: str) -> str:
    value = validate_remote_path(value, field)
    if value.startswith("/") or ".." in value.split("/"):
        raise ValidationError(field, f"{value!r} must be a path inside the directory (relative, no '..')", value)
    return value


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
