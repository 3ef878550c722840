"""Pure builders for the remote command lines the hook runs over SSH.

Convention: every ``build_*`` function returns **one string**, a complete POSIX ``sh``
command line ready for ``SSHHook``/``asyncssh`` ``run()``. Each word is made with
:func:`shlex.quote` after validation, so a value can never become shell syntax. Tests take
the strings apart with :func:`shlex.split` or run them with ``sh -c``.

The job script is never written to a file by the user: :func:`build_sbatch_submit` makes
sbatch read it from standard input, and the hook sends the script text as the command's
stdin (or, for transports without stdin, wraps it with :func:`with_stdin_heredoc`).

Output formats are fixed here and read back by :mod:`slurm_provider.parsers` using the same
field tuples (``SQUEUE_FIELDS``, ``SACCT_FIELDS``), separated by ``|`` with the free-text
``Comment`` field last. ``SLURM_TIME_FORMAT=standard`` pins timestamps to
``YYYY-MM-DDTHH:MM:SS`` whatever the user's login environment says.
"""

from __future__ import annotations

import hashlib
import json
import re
import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from slurm_provider.validation import (
    ValidationError,
    validate_account,
    validate_dependency,
    validate_export_vars,
    validate_extra_sbatch_options,
    validate_job_id,
    validate_job_ids,
    validate_job_name,
    validate_partition,
    validate_qos,
    validate_remote_path,
    validate_reservation,
    validate_signal,
    validate_since,
    validate_time_limit,
    validate_user,
)

FIELD_SEPARATOR = "|"
TIME_FORMAT_ENV = "SLURM_TIME_FORMAT=standard"

LOG_STREAMS = ("out", "err")
"""A job's output (``--output``) and error output (``--error``)."""


def job_log_name(job_name: str, job_id: str, stream: str = "out") -> str:
    """``<job name>.<job id>.out`` (or ``.err``): the one name of a job's log files, so that a job
    script's own ``#SBATCH --output``/``--error`` (``job_log_name("%x", "%j")``) and the operator's
    write where the operator reads."""
    if stream not in LOG_STREAMS:
        raise ValueError(f"log stream {stream!r} is not one of {', '.join(LOG_STREAMS)}")
    return f"{job_name}.{job_id}.{stream}"


SQUEUE_FIELDS: tuple[str, ...] = (
    "JobID",
    "ArrayJobID",
    "ArrayTaskID",
    "State",
    "Reason",
    "RestartCnt",
    "Name",
    "Partition",
    "Account",
    "UserName",
    "NodeList",
    "TimeUsed",
    "TimeLimit",
    "SubmitTime",
    "StartTime",
    "EndTime",
    "tres-alloc",
    "exit_code",
    "STDOUT",
    "STDERR",
    "WorkDir",
    "Comment",
)
"""Fields of ``squeue -O``. ``Comment`` stays last: it is the only free text, so extra separators
in it are joined back by the parser."""

SACCT_FIELDS: tuple[str, ...] = (
    "JobID",
    "JobIDRaw",
    "JobName",
    "State",
    "ExitCode",
    "DerivedExitCode",
    "Reason",
    "Elapsed",
    "ElapsedRaw",
    "Start",
    "End",
    "Submit",
    "NodeList",
    "AllocTRES",
    "Partition",
    "Account",
    "User",
    "Timelimit",
    "WorkDir",
    "Comment",
)
"""Fields of ``sacct --format``. ``Comment`` needs ``AccountingStoreFlags=job_comment`` (empty otherwise)."""

SINFO_FIELDS: tuple[str, ...] = ("NodeList", "StateLong", "Reason")

SSHARE_FIELDS: tuple[str, ...] = ("Account", "User", "GrpTRESMins", "GrpTRESRaw", "TRESRunMins")
"""Fields of ``sshare --format``: the association, its TRES-minute limits, the TRES-minutes it has
used (what Slurm holds against ``GrpTRESMins``) and the TRES-minutes its running jobs may still use."""

LOG_MARKER = "__SLURM_PROVIDER_LOG__"
NOT_FOUND_MARKER = "__SLURM_PROVIDER_NOT_FOUND__"
MAX_HEREDOC_BYTES = 100_000
"""A heredoc travels inside the SSH exec request; Linux caps one argument at 128 KiB."""

DEFAULT_PROJECT_TAG = "airflow"
"""The job comment's ``project`` unless the operator is given its own ``project_tag``."""


def _join(argv: Sequence[str]) -> str:
    return shlex.join(argv)


# --- the job comment ------------------------------------------------------------------------------


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
        """True when ``other`` is the same task of the same DAG run, clear and place (any attempt)."""
        return other is not None and self._identity() == other._identity()

    def _identity(self) -> tuple:
        return (self.project, self.dag, self.task, self.run, self.stage, self.clear, self.place)


_OMITTED_AT_DEFAULT = {"clear": 0, "place": None, "code": None, "xdir": None}


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
        )
    except (ValueError, KeyError, TypeError):
        return None


# --- sbatch --------------------------------------------------------------------------------------


def _sbatch_argv(
    *,
    job_name: str,
    output: str,
    error: str | None,
    comment: JobComment | str | None,
    chdir: str | None,
    export: Mapping[str, str] | None,
    export_all: bool,
    dependency: str | None,
    partition: str | None,
    account: str | None,
    qos: str | None,
    reservation: str | None,
    time_limit: str | None,
    extra_options: Sequence[str] | None,
) -> list[str]:
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
    argv.extend(validate_extra_sbatch_options(extra_options))
    return argv


def build_sbatch_submit(
    *,
    job_name: str,
    output: str,
    error: str | None = None,
    comment: JobComment | str | None = None,
    chdir: str | None = None,
    export: Mapping[str, str] | None = None,
    export_all: bool = True,
    dependency: str | None = None,
    partition: str | None = None,
    account: str | None = None,
    qos: str | None = None,
    reservation: str | None = None,
    time_limit: str | None = None,
    extra_options: Sequence[str] | None = None,
) -> str:
    """``sbatch --parsable ...`` that reads the job script from stdin.

    Options given here override ``#SBATCH`` lines in the script. Output is ``<id>`` or
    ``<id>;<cluster>`` (read it with ``parsers.parse_sbatch_parsable``). ``export`` adds
    variables on top of the submitting environment (``--export=ALL,START_STAGE=2``).
    """
    argv = _sbatch_argv(**locals())  # exactly this function's keyword arguments
    argv.insert(1, "--parsable")
    return _join(argv)


LIVE_JOB_STATES: tuple[str, ...] = (
    "PENDING", "RUNNING", "SUSPENDED", "COMPLETING", "CONFIGURING", "REQUEUED", "REQUEUE_HOLD",
    "REQUEUE_FED", "RESIZING", "SIGNALING", "STAGE_OUT", "STOPPED", "SPECIAL_EXIT",
)
"""Every state in which a job may still (or again) write its outputs."""

LIVE_MARKER = "__SLURM_PROVIDER_LIVE__"
SUBMIT_LOCK_NAME = ".slurm-submit.lock"
SUBMIT_LOCK_STALE_MINUTES = 2
"""A lock directory older than this was left by a submit that died; it is taken over."""


def exclusive_dir_marker(directory: str) -> str:
    """The short digest a job comment carries for the directory the job writes (``"xdir":"..."``)."""
    return hashlib.sha256(directory.rstrip("/").encode()).hexdigest()[:16]


def build_squeue_live_own_jobs() -> str:
    """``squeue --me`` of the login user's live jobs (``LIVE_JOB_STATES``), every field."""
    argv = ["squeue", "-h", "-r", "--me", f"--states={','.join(LIVE_JOB_STATES)}", f"--Format={_squeue_format()}"]
    return f"{TIME_FORMAT_ENV} " + _join(argv)


def build_exclusive_sbatch_submit(*, exclusive_dir: str, **submit: Any) -> str:
    """Submit unless a live job of the login user already writes ``exclusive_dir``; one command.

    Under a lock directory inside ``exclusive_dir`` (``mkdir`` is atomic on every POSIX file system,
    Lustre included), ``squeue --me`` lists the live jobs whose comment names the directory's
    digest: if there is one, it prints ``LIVE_MARKER`` and those squeue rows and submits nothing;
    otherwise it runs :func:`build_sbatch_submit` (the script on stdin). Two Airflow deployments
    that submit for the same directory at the same moment thus get one job between them. The
    comment in ``submit`` must carry the same digest (``JobComment.xdir``).
    """
    directory = validate_remote_path(exclusive_dir.rstrip("/") or "/", "exclusive_dir", absolute=True)
    comment = submit.get("comment")
    marker = exclusive_dir_marker(directory)
    if not isinstance(comment, JobComment) or comment.xdir != marker:
        raise ValidationError("comment", f"must be a JobComment with xdir={marker!r} for {directory}")
    lock = f"{directory}/{SUBMIT_LOCK_NAME}"
    needle = f'"xdir":"{marker}"'
    return "; ".join([
        f"mkdir -p {shlex.quote(directory)} || exit 70",
        f"lock={shlex.quote(lock)}; waited=0",
        'until mkdir "$lock" 2>/dev/null; do '
        f'if [ -n "$(find "$lock" -maxdepth 0 -mmin +{SUBMIT_LOCK_STALE_MINUTES} 2>/dev/null)" ]; then '
        'rmdir "$lock" 2>/dev/null; continue; fi; '
        'waited=$((waited + 1)); '
        'if [ "$waited" -gt 1200 ]; then echo "sbatch: error: another submit holds $lock" >&2; exit 75; fi; '
        "sleep 0.1; done",
        "trap 'rmdir \"$lock\" 2>/dev/null' EXIT",
        f"live=$({build_squeue_live_own_jobs()}) || exit $?",
        f"match=$(printf '%s\\n' \"$live\" | grep -F -- {shlex.quote(needle)})",
        f'if [ -n "$match" ]; then echo {LIVE_MARKER}; printf \'%s\\n\' "$match"; exit 0; fi',
        build_sbatch_submit(**submit),
    ])


def build_sbatch_test_only(
    *,
    job_name: str,
    output: str,
    error: str | None = None,
    comment: JobComment | str | None = None,
    chdir: str | None = None,
    export: Mapping[str, str] | None = None,
    export_all: bool = True,
    dependency: str | None = None,
    partition: str | None = None,
    account: str | None = None,
    qos: str | None = None,
    reservation: str | None = None,
    time_limit: str | None = None,
    extra_options: Sequence[str] | None = None,
) -> str:
    """``sbatch --test-only ...`` (script on stdin): validates the request and estimates a start
    time without submitting. The answer is on **stderr** (``parsers.parse_sbatch_test_only``)."""
    argv = _sbatch_argv(**locals())  # exactly this function's keyword arguments
    argv.insert(1, "--test-only")
    return _join(argv)


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


# --- squeue / sacct / scontrol / scancel ---------------------------------------------------------


def _squeue_format() -> str:
    return ",".join(f"{field}:{FIELD_SEPARATOR}" for field in SQUEUE_FIELDS[:-1]) + f",{SQUEUE_FIELDS[-1]}:"


def build_squeue(job_ids: Iterable[str | int]) -> str:
    """``squeue`` for many jobs at once, every state (``-t all`` keeps just-finished jobs visible).

    One line per job and per array element (``-r``), no header, fixed ``-O`` fields (each
    ``Field:|`` means "no width limit, then a |"). With a single unknown id squeue exits 1 with
    ``Invalid job id specified`` (``parsers.is_invalid_job_id_error``); with several it lists the
    known ones and exits 0.
    """
    ids = validate_job_ids(job_ids)
    argv = ["squeue", "-h", "-r", "-t", "all", f"--jobs={','.join(ids)}", f"--Format={_squeue_format()}"]
    return f"{TIME_FORMAT_ENV} " + _join(argv)


def build_squeue_by_name(job_name: str, user: str | None = None) -> str:
    """``squeue`` for jobs with this exact name (all states), optionally only one user's."""
    argv = ["squeue", "-h", "-r", "-t", "all", f"--name={validate_job_name(job_name)}"]
    if user is not None:
        argv.append(f"--user={validate_user(user)}")
    argv.append(f"--Format={_squeue_format()}")
    return f"{TIME_FORMAT_ENV} " + _join(argv)


def _sacct_argv(*, allocations_only: bool, duplicates: bool) -> list[str]:
    argv = [
        "sacct",
        "--parsable2",
        "--noheader",
        f"--delimiter={FIELD_SEPARATOR}",
        f"--format={','.join(SACCT_FIELDS)}",
    ]
    if allocations_only:
        argv.append("--allocations")
    if duplicates:
        argv.append("--duplicates")
    return argv


def build_sacct(
    job_ids: Iterable[str | int],
    *,
    allocations_only: bool = True,
    duplicates: bool = True,
    since: str | None = None,
) -> str:
    """``sacct`` for many jobs at once: the source of truth once squeue has forgotten a job.

    ``allocations_only`` (``-X``) drops step rows (``.batch``, ``.extern``, ``.0``).
    ``duplicates`` (``-D``) returns one row per run of a requeued job; the newest decides
    (``parsers.latest_job_rows``). With ``--jobs`` sacct searches from the epoch, so ``since``
    is optional here (unlike :func:`build_sacct_by_name`).
    """
    ids = validate_job_ids(job_ids)
    argv = _sacct_argv(allocations_only=allocations_only, duplicates=duplicates)
    if since is not None:
        argv.append(f"--starttime={validate_since(since)}")
    argv.append(f"--jobs={','.join(ids)}")
    return f"{TIME_FORMAT_ENV} " + _join(argv)


def build_squeue_own_jobs() -> str:
    """``squeue --me``: every job of the login user, every state (adoption by comment without a name)."""
    argv = ["squeue", "-h", "-r", "-t", "all", "--me", f"--Format={_squeue_format()}"]
    return f"{TIME_FORMAT_ENV} " + _join(argv)


def build_squeue_account_jobs(account: str) -> str:
    """``squeue`` of every job of the account (all its users) and of the login user, every state.

    One command line, two queries (the user's own jobs may run under another account); a job in
    both is listed twice.
    """
    fields = f"--Format={_squeue_format()}"
    by_account = ["squeue", "-h", "-r", "-t", "all", f"--account={validate_account(account)}", fields]
    own = ["squeue", "-h", "-r", "-t", "all", "--me", fields]
    return f"{TIME_FORMAT_ENV} {_join(by_account)} && {TIME_FORMAT_ENV} {_join(own)}"


def build_sacct_own_jobs(since: str) -> str:
    """``sacct`` of the login user's jobs since ``since`` (``now-7days``, ``2026-01-31``), every run."""
    argv = _sacct_argv(allocations_only=True, duplicates=True)
    argv.append(f"--starttime={validate_since(since)}")
    return f"{TIME_FORMAT_ENV} " + _join(argv)


def build_sacct_by_name(
    job_name: str,
    *,
    since: str,
    user: str | None = None,
    allocations_only: bool = True,
    duplicates: bool = True,
) -> str:
    """``sacct`` for jobs with this exact name. ``since`` is required: without ``--jobs`` sacct
    only looks back to midnight, and a job submitted yesterday would be missed."""
    argv = _sacct_argv(allocations_only=allocations_only, duplicates=duplicates)
    argv.append(f"--starttime={validate_since(since)}")
    argv.append(f"--name={validate_job_name(job_name)}")
    if user is not None:
        argv.append(f"--user={validate_user(user)}")
    return f"{TIME_FORMAT_ENV} " + _join(argv)


def build_scontrol_show_job(job_id: str | int) -> str:
    """``scontrol show job -o ID``: one ``Key=Value`` line per job (per element for arrays)."""
    return f"{TIME_FORMAT_ENV} " + _join(["scontrol", "show", "job", "-o", validate_job_id(job_id)])


def build_scancel(
    job_ids: Iterable[str | int],
    *,
    signal: str | int | None = None,
    batch_only: bool = False,
    full: bool = False,
) -> str:
    """``scancel``; with ``signal`` it only signals (e.g. ``USR1`` asks the trainer to checkpoint).

    ``batch_only`` (``--batch``) signals just the batch shell, ``full`` (``--full``) every step
    and the batch shell; they are mutually exclusive.
    """
    if batch_only and full:
        raise ValidationError("batch_only", "batch_only and full cannot both be set")
    argv = ["scancel"]
    if signal is not None:
        argv.append(f"--signal={validate_signal(signal)}")
    if batch_only:
        argv.append("--batch")
    if full:
        argv.append("--full")
    argv.extend(validate_job_ids(job_ids))
    return _join(argv)


def build_sinfo_unavailable_nodes(partition: str | None = None) -> str:
    """``sinfo`` listing nodes that are down, drained, draining, failing or not responding,
    one node per line (feeds ``states.classify_pending_reason(down_nodes=...)``)."""
    argv = ["sinfo", "-h", "-N", "--states=down,drain,drained,draining,fail,no_respond"]
    if partition is not None:
        argv.append(f"--partition={validate_partition(partition)}")
    argv.append("--format=" + FIELD_SEPARATOR.join(("%N", "%T", "%E")))
    return _join(argv)


def build_sshare_account(account: str) -> str:
    """``sshare`` of one account: one ``|``-separated line per association (the account's own, with
    an empty user, then its users), fields :data:`SSHARE_FIELDS`.

    An allocation that Slurm enforces is a ``GrpTRESMins`` limit (``billing=6000000``) on the
    account; ``GrpTRESRaw`` is the usage counted against it and ``TRESRunMins`` what running jobs
    still hold (time limit left x TRES), which ``AccountingStorageEnforce=safe`` counts too before it
    starts a job. An account the user cannot see prints nothing and exits 0.
    """
    argv = ["sshare", "--noheader", "--parsable2", f"--accounts={validate_account(account)}",
            f"--format={','.join(SSHARE_FIELDS)}"]
    return _join(argv)


# --- files: log tail and progress ----------------------------------------------------------------


def build_read_log(path: str, offset: int, max_bytes: int = 65536) -> str:
    """Read at most ``max_bytes`` of a log file from byte ``offset``.

    Prints one header line ``__SLURM_PROVIDER_LOG__ size=S offset=O count=N truncated=T`` and
    then exactly those N bytes, base64-encoded, so the parser gets the bytes unchanged and
    advances the offset by bytes, never by decoded characters. If the file is shorter than
    ``offset`` (log truncated, e.g. after a requeue), reading restarts at 0 with ``truncated=1``.
    A missing file prints ``__SLURM_PROVIDER_LOG__ missing``. Parse with ``parsers.parse_log_chunk``.
    """
    validate_remote_path(path, "log_path")
    if not isinstance(offset, int) or isinstance(offset, bool) or offset < 0:
        raise ValidationError("offset", f"{offset!r} is not a byte offset (an integer >= 0)", offset)
    if not isinstance(max_bytes, int) or isinstance(max_bytes, bool) or not 4 <= max_bytes <= 16 * 2**20:
        raise ValidationError(
            "max_bytes",
            f"{max_bytes!r} must be an integer between 4 (one UTF-8 character) and 16 MiB",
            max_bytes,
        )
    return (
        f"f={shlex.quote(path)}; o={offset}; m={max_bytes}; "
        'if [ -f "$f" ] && [ -r "$f" ]; then '
        's=$(wc -c < "$f" | tr -d " "); t=0; '
        'if [ "$s" -lt "$o" ]; then o=0; t=1; fi; '
        'n=$((s - o)); if [ "$n" -gt "$m" ]; then n=$m; fi; '
        f'printf "{LOG_MARKER} size=%s offset=%s count=%s truncated=%s\\n" "$s" "$o" "$n" "$t"; '
        'if [ "$n" -gt 0 ]; then tail -c +$((o + 1)) -- "$f" | head -c "$n" | base64; fi; '
        f'else printf "{LOG_MARKER} missing\\n"; fi'
    )


def build_file_sizes(paths: Sequence[str]) -> str:
    """Byte size of each existing file, one ``<index> <size>`` line each (missing files print nothing).

    One command for every log the poller streams, so only the logs that grew are read.
    """
    quoted = " ".join(shlex.quote(validate_remote_path(p, "paths")) for p in paths)
    return (f'i=0; for f in {quoted}; do if [ -f "$f" ]; then printf "%s %s\\n" "$i" "$(wc -c < "$f")"; fi; '
            "i=$((i + 1)); done")


def build_read_progress(path: str) -> str:
    """``cat`` a small progress file; prints ``__SLURM_PROVIDER_NOT_FOUND__`` if it does not exist
    (``parsers.parse_progress`` returns None then)."""
    validate_remote_path(path, "progress_path")
    quoted = shlex.quote(path)
    return f"if [ -f {quoted} ]; then cat -- {quoted}; else printf '%s\\n' {NOT_FOUND_MARKER}; fi"




# --- Slurm filename patterns -----------------------------------------------------------------------

_FILENAME_PATTERN = re.compile(r"%(?P<width>\d*)(?P<letter>[%AaJjNnstux])")


def expand_filename_pattern(
    pattern: str,
    *,
    job_id: str,
    job_name: str,
    user: str | None = None,
    array_job_id: str | None = None,
    array_task_id: str | None = None,
    first_node: str | None = None,
) -> str:
    """The file a batch job actually writes for an ``--output``/``--error`` pattern (``%x_%j.out``).

    squeue prints the pattern, not the file; the log reader needs the file. ``job_id`` is the
    job's own (raw) id, which for an array element differs from ``array_job_id``. A pattern
    containing a backslash is used verbatim, as Slurm does. Unknown values stay as written.
    """
    if "\\" in pattern:
        return pattern.replace("\\", "")

    def replace(match: re.Match[str]) -> str:
        letter, width = match.group("letter"), match.group("width")
        numeric = {
            "j": job_id,
            "A": array_job_id or job_id,
            "a": array_task_id,
            "n": "0",
            "t": "0",
        }
        if letter == "%":
            return "%"
        if letter in numeric:
            value = numeric[letter]
            if value is None:
                return match.group(0)
            return value.zfill(int(width)) if width and value.isdigit() else value
        text = {
            "x": job_name,
            "u": user,
            "N": first_node.split(".")[0] if first_node else None,
            "s": "batch",
            "J": f"{job_id}.batch",
        }[letter]
        return match.group(0) if text is None else text

    return _FILENAME_PATTERN.sub(replace, pattern)
