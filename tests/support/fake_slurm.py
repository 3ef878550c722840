"""A fake Slurm cluster at the runner boundary: the real ``SlurmHook``/``SlurmAsyncHook`` run on top.

The hooks build their command lines (:mod:`slurm_provider.cli`) and parse the answers with the real
parsers; :class:`FakeSlurm` is the login node that answers them. It holds a job table
(:class:`SlurmTable`) and answers exactly the lines the provider's plans build (sbatch ``--parsable``
and ``--test-only``, the exclusive submit, squeue ``--Format``, sacct ``--parsable2``, scancel,
scontrol show job / ping / config, sshare, and the file verbs the tests need), in the formats of the golden
files under providers/slurm/tests/golden. Any other line fails loudly with an ``AssertionError``
naming it: the fake never answers what it does not understand with an empty success.

The core, :func:`answer`, is a function from a command line (and stdin) and the table to a
``CommandResult``; :class:`FakeSlurm` is the thin runner around it, with the test-facing controls:
how sbatch behaves (:meth:`FakeSlurm.accept_submits`, :meth:`~FakeSlurm.refuse_submits`,
:meth:`~FakeSlurm.fail_submits`, :meth:`~FakeSlurm.lose_submit_answers`), an outage switch
(``down``: every command raises it), and a record of every command asked (``asked``, ``verbs``).
Tests install it under the provider's own seam with :func:`install` (``runner_for_connection``).
"""

from __future__ import annotations

import base64
import re
import shlex
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from slurm_provider.cli.files import build_touch_record
from slurm_provider.cli.job_files import (
    LOG_MARKER,
    NOT_FOUND_MARKER,
    build_file_sizes,
    build_poll_files,
    build_read_log,
    build_read_progress,
)
from slurm_provider.cli.sacct import SACCT_FIELDS
from slurm_provider.cli.exclusive_submit import DONE_MARKER, LIVE_MARKER
from slurm_provider.cli.squeue import LIVE_JOB_STATES, SQUEUE_FIELDS
from slurm_provider.cli.sshare import SSHARE_FIELDS
from slurm_provider.cli.values import FIELD_SEPARATOR, TIME_FORMAT_ENV, format_duration
from slurm_provider.transport import CommandResult

EPOCH = datetime(2026, 11, 21, 23, 47, 34)
"""The fake cluster's clock starts here (times print as Slurm prints them: ``2026-11-21T23:47:34``)."""

TERMINAL_STATES = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL",
                   "PREEMPTED", "BOOT_FAIL", "DEADLINE", "REVOKED")

INVALID_JOB_ID = "slurm_load_jobs error: Invalid job id specified"


SITE_CONFIG = {"AccountingStoreFlags": "job_comment", "JobRequeue": "1", "PrivateData": "none",
               "SLURM_VERSION": "22.05.8"}
"""The settings the fake controller lists, as the local cluster has them (golden ``config_show.txt``)."""


def _stamp(moment: datetime | None) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%S") if moment is not None else "Unknown"


@dataclass
class FakeRun:
    """One earlier run of a requeued job, as ``sacct -D`` keeps it."""

    state: str
    exit_code: int
    signal: int
    submit: datetime
    start: datetime | None
    end: datetime | None
    node: str
    reason: str


@dataclass
class FakeJob:
    """One job of the fake cluster's table."""

    job_id: str
    name: str
    comment: str | None = None
    state: str = "PENDING"
    reason: str | None = None
    """Slurm's reason (``Priority``, ``AssocGrpBillingMinutes``, ``NonZeroExitCode``); None prints
    ``None``."""
    exit_code: int = 0
    signal: int = 0
    restarts: int = 0
    node: str = ""
    submit: datetime = EPOCH
    start: datetime | None = None
    expected_start: datetime | None = None
    """While it pends: when Slurm expects it to start (squeue prints it as StartTime)."""
    end: datetime | None = None
    partition: str = "debug"
    account: str = "vcloud_local"
    user: str = "vcloud"
    time_limit_s: int = 300
    tres: str = "cpu=1,mem=256M,node=1,billing=1"
    std_out: str = ""
    std_err: str = ""
    work_dir: str = "/home/vcloud"
    cancelled_by: str | None = None
    in_squeue: bool = True
    """slurmctld still lists it (it forgets finished jobs after ``MinJobAge``)."""
    in_sacct: bool = True
    current_in_sacct: bool = True
    """False: slurmdbd has not recorded the current run yet; sacct prints only the earlier runs."""
    earlier: list[FakeRun] = field(default_factory=list)
    signals: list[str] = field(default_factory=list)
    """Signals ``scancel --signal`` sent it."""
    script: str | None = None
    excluded: tuple[str, ...] = ()
    """Nodes it was submitted not to run on (``--exclude``)."""
    begin: str | None = None
    """``--begin`` it was submitted with (``now+120``)."""

    @property
    def is_terminal(self) -> bool:
        return self.state in TERMINAL_STATES

    def elapsed_s(self) -> int:
        if self.start is None:
            return 0
        return int(((self.end or self.start) - self.start).total_seconds())


@dataclass
class SlurmTable:
    """What the fake cluster knows: its jobs, the login node's files, the accounts' allocations."""

    jobs: dict[str, FakeJob] = field(default_factory=dict)
    next_id: int = 900
    files: dict[str, str] = field(default_factory=dict)
    allocations: dict[str, list[str]] = field(default_factory=dict)
    """account -> sshare rows (``Account|User|GrpTRESMins|GrpTRESRaw|TRESRunMins``)."""
    user: str = "vcloud"
    uid: str = "1001"
    controller_up: bool = True
    clock: datetime = EPOCH
    config: dict[str, str] = field(default_factory=lambda: dict(SITE_CONFIG))
    """What ``scontrol show config`` lists (a test turns a setting off by changing it)."""
    most_left_out: int | None = None
    """The most nodes a submission may leave out (``--exclude``) and still be placed (a small
    partition; None: any number). With more, ``sbatch`` and ``sbatch --test-only`` refuse, and, as
    Slurm does, a refused ``sbatch`` leaves its job in accounting as ``FAILED``."""

    def tick(self, seconds: int = 1) -> datetime:
        self.clock += timedelta(seconds=seconds)
        return self.clock

    def add(self, job_id: str | int, name: str, **fields: Any) -> FakeJob:
        fields.setdefault("submit", self.clock)
        job = FakeJob(str(job_id), name, **fields)
        if job.is_terminal or job.state == "RUNNING":
            job.start = job.start or job.submit
            job.node = job.node or "vcnode1"
        if job.is_terminal:
            job.end = job.end or job.start
        self.jobs[job.job_id] = job
        return job

    def new_id(self) -> str:
        job_id = str(self.next_id)
        self.next_id += 1
        return job_id


# --- the sans-IO core: a command line and the table -> the answer --------------------------------------


class UnknownCommand(AssertionError):
    """A line the fake does not know how to answer: the provider built something new, or the fake lags."""

    def __init__(self, line: str, why: str = "") -> None:
        super().__init__(f"fake Slurm cannot answer {line!r}{': ' + why if why else ''}")


@dataclass(frozen=True)
class Answer:
    """What :func:`answer` returns: the verb the line was (for the record) and the result."""

    verb: str
    result: CommandResult


def _ok(line: str, stdout: str = "", stderr: str = "", exit_status: int = 0) -> CommandResult:
    return CommandResult(line, exit_status, stdout, stderr)


def _argv(line: str) -> list[str]:
    words = shlex.split(line)
    if words and words[0] == TIME_FORMAT_ENV:
        words = words[1:]
    return words


def _options(line: str, argv: Sequence[str], known: Iterable[str], flags: Iterable[str] = ()) -> tuple[
        dict[str, str], list[str]]:
    """``--key=value`` options and bare flags of a Slurm command; anything else is a loud failure."""
    values: dict[str, str] = {}
    bare: list[str] = []
    known, flags = set(known), set(flags)
    rest = list(argv)
    while rest:
        word = rest.pop(0)
        key, sep, value = word.partition("=")
        if sep and key in known:
            values[key] = value
        elif word in flags:
            if word == "-t":
                values["-t"] = rest.pop(0)
            else:
                bare.append(word)
        else:
            raise UnknownCommand(line, f"option {word!r}")
    return values, bare


def _squeue_format() -> str:
    return ",".join(f"{name}:{FIELD_SEPARATOR}" for name in SQUEUE_FIELDS[:-1]) + f",{SQUEUE_FIELDS[-1]}:"


def squeue_row(job: FakeJob) -> str:
    """One ``squeue -h -O`` line of ``SQUEUE_FIELDS``, as slurmctld prints it."""
    array_job, _, task = job.job_id.partition("_")
    values = {
        "JobID": job.job_id if not task else str(int(array_job) + int(task) + 1),
        "ArrayJobID": array_job,
        "ArrayTaskID": task or "N/A",
        "State": job.state,
        "Reason": job.reason or "None",
        "RestartCnt": str(job.restarts),
        "Name": job.name,
        "Partition": job.partition,
        "Account": job.account,
        "UserName": job.user,
        "NodeList": job.node,
        "TimeUsed": format_duration(job.elapsed_s()),
        "TimeLimit": format_duration(job.time_limit_s),
        "SubmitTime": _stamp(job.submit),
        "StartTime": _stamp(job.start or job.expected_start) if job.start or job.expected_start else "N/A",
        "EndTime": _stamp(job.end) if job.end else "N/A",
        "tres-alloc": job.tres,
        "exit_code": str(job.exit_code * 256 + job.signal),
        "STDOUT": job.std_out,
        "STDERR": job.std_err or job.std_out,
        "WorkDir": job.work_dir,
        "Comment": job.comment or "",
    }
    return FIELD_SEPARATOR.join(values[name] for name in SQUEUE_FIELDS)


def sacct_rows(job: FakeJob, duplicates: bool, since: datetime | None = None) -> list[str]:
    """The allocation rows ``sacct --parsable2`` prints for the job: every run with ``-D``, else the
    latest; with ``since`` (``--starttime`` without ``--jobs``) only the runs alive at or after it."""
    state = f"CANCELLED by {job.cancelled_by}" if job.state == "CANCELLED" and job.cancelled_by else job.state
    latest = FakeRun(state, job.exit_code, job.signal, job.submit, job.start, job.end, job.node,
                     job.reason or "None")
    runs = [*job.earlier, *([latest] if job.current_in_sacct else [])]
    lines = []
    for run in runs if duplicates else runs[-1:]:
        if since is not None and run.end is not None and run.end < since:
            continue
        elapsed = int(((run.end or run.start) - run.start).total_seconds()) if run.start else 0
        values = {
            "JobID": job.job_id, "JobIDRaw": job.job_id, "JobName": job.name, "State": run.state,
            "ExitCode": f"{run.exit_code}:{run.signal}", "DerivedExitCode": "0:0", "Reason": run.reason,
            "Elapsed": format_duration(elapsed), "ElapsedRaw": str(elapsed), "Start": _stamp(run.start),
            "End": _stamp(run.end), "Submit": _stamp(run.submit), "NodeList": run.node or "None assigned",
            "AllocTRES": job.tres if run.start else "", "Partition": job.partition, "Account": job.account,
            "User": job.user, "Timelimit": format_duration(job.time_limit_s), "WorkDir": job.work_dir,
            "Comment": job.comment or "",
        }
        lines.append(FIELD_SEPARATOR.join(values[name] for name in SACCT_FIELDS))
    return lines


def _squeue(line: str, argv: list[str], table: SlurmTable) -> CommandResult:
    options, flags = _options(line, argv[1:],
                              ("--jobs", "--name", "--user", "--account", "--states", "--Format"),
                              ("-h", "-r", "--all", "--me", "-t"))
    if options.get("--Format") != _squeue_format() or "-h" not in flags:
        raise UnknownCommand(line, "not the provider's squeue -h --Format field list")
    states = options.get("--states", options.get("-t", "all"))
    wanted = None if states.lower() == "all" else set(states.split(","))
    jobs = [job for job in table.jobs.values() if job.in_squeue]
    if "--jobs" in options:
        ids = options["--jobs"].split(",")
        jobs = [job for job in jobs if job.job_id in ids]
        if len(ids) == 1 and not jobs:
            return _ok(line, "", INVALID_JOB_ID + "\n", 1)
    if "--name" in options:
        jobs = [job for job in jobs if job.name == options["--name"]]
    if "--me" in flags:
        jobs = [job for job in jobs if job.user == table.user]
    if "--user" in options:
        jobs = [job for job in jobs if job.user == options["--user"]]
    if "--account" in options:
        jobs = [job for job in jobs if job.account == options["--account"]]
    if wanted is not None:
        jobs = [job for job in jobs if job.state in wanted]
    return _ok(line, "".join(squeue_row(job) + "\n" for job in jobs))


def _sacct(line: str, argv: list[str], table: SlurmTable) -> CommandResult:
    options, flags = _options(line, argv[1:],
                              ("--delimiter", "--format", "--jobs", "--name", "--user", "--starttime"),
                              ("--parsable2", "--noheader", "--allocations", "--duplicates"))
    if options.get("--format") != ",".join(SACCT_FIELDS) or options.get("--delimiter") != FIELD_SEPARATOR \
            or not {"--parsable2", "--noheader"} <= set(flags):
        raise UnknownCommand(line, "not the provider's sacct --parsable2 --format field list")
    if "--jobs" not in options and "--starttime" not in options:
        raise UnknownCommand(line, "sacct without --jobs needs --starttime (it only looks back to midnight)")
    jobs = [job for job in table.jobs.values() if job.in_sacct]
    if "--jobs" in options:
        ids = options["--jobs"].split(",")
        jobs = [job for job in jobs if job.job_id in ids]
    if "--name" in options:
        jobs = [job for job in jobs if job.name == options["--name"]]
    jobs = [job for job in jobs if job.user == options.get("--user", table.user)]
    since = None if "--jobs" in options else _since(options["--starttime"], table.clock)
    rows = [row for job in jobs for row in sacct_rows(job, "--duplicates" in flags, since)]
    return _ok(line, "".join(row + "\n" for row in rows))


SBATCH_OPTIONS = ("--job-name", "--output", "--error", "--comment", "--chdir", "--export", "--dependency",
                  "--partition", "--account", "--qos", "--reservation", "--time", "--time-min", "--exclude",
                  "--begin")


_UNITS = {"seconds": 1, "minutes": 60, "hours": 3600, "days": 86400, "weeks": 604800}


def _since(text: str, clock: datetime) -> datetime | None:
    """sacct's ``--starttime`` as the fake's clock reads it (``now-3600seconds``, ``now-365days``, a date)."""
    relative = re.fullmatch(r"now-(\d+)(seconds|minutes|hours|days|weeks)?", text)
    if relative:
        return clock - timedelta(seconds=int(relative[1]) * _UNITS[relative[2] or "seconds"])
    try:
        return datetime.fromisoformat(text)
    except ValueError:
        return None


def _parse_time(text: str) -> int:
    from slurm_provider.validation import duration_seconds

    return int(text) * 60 if text.isdigit() else int(duration_seconds(text) or 0)


UNPLACEABLE = "Requested node configuration is not available"


def _unplaceable(options: dict[str, str], table: SlurmTable) -> bool:
    """More nodes left out than the partition can spare (``SlurmTable.most_left_out``)."""
    left_out = [n for n in options.get("--exclude", "").split(",") if n]
    return table.most_left_out is not None and len(left_out) > table.most_left_out


def sbatch_submit(line: str, argv: list[str], table: SlurmTable,
                  script: str | None) -> tuple[CommandResult, str]:
    """``sbatch --parsable``: a new PENDING job in the table; the answer and the new id."""
    options, _ = _options(line, argv[2:], SBATCH_OPTIONS, ())
    if not (script or "").startswith("#!"):
        raise UnknownCommand(line, "sbatch without a script on stdin")
    submitted = table.tick()
    job_id = table.new_id()
    if _unplaceable(options, table):
        refused = table.add(job_id, options["--job-name"], comment=options.get("--comment"), submit=submitted,
                            state="FAILED", exit_code=1, user=table.user)
        refused.node, refused.start, refused.end = "", submitted, submitted
        return _ok(line, "", f"sbatch: error: Batch job submission failed: {UNPLACEABLE}\n", 1), job_id
    table.add(job_id, options["--job-name"], comment=options.get("--comment"), submit=submitted,
              partition=options.get("--partition", "debug"), account=options.get("--account", "vcloud_local"),
              user=table.user, time_limit_s=_parse_time(options["--time"]) if "--time" in options else 300,
              std_out=options.get("--output", ""), std_err=options.get("--error", ""),
              work_dir=options.get("--chdir", f"/home/{table.user}"), script=script,
              excluded=tuple(options["--exclude"].split(",")) if "--exclude" in options else (),
              begin=options.get("--begin"))
    return _ok(line, f"{job_id}\n"), job_id


def _sbatch_test_only(line: str, argv: list[str], table: SlurmTable, script: str | None) -> CommandResult:
    options, _ = _options(line, argv[2:], SBATCH_OPTIONS, ())
    if not (script or "").startswith("#!"):
        raise UnknownCommand(line, "sbatch without a script on stdin")
    job_id = table.new_id()
    if _unplaceable(options, table):
        return _ok(line, "", f"allocation failure: {UNPLACEABLE}\n", 1)
    partition = options.get("--partition", "debug")
    return _ok(line, "", f"sbatch: Job {job_id} to start at {_stamp(table.clock)} using 1 processors "
                         "on nodes "
                         f"vcnode1 in partition {partition}\n")


def _scancel(line: str, argv: list[str], table: SlurmTable) -> CommandResult:
    signal = None
    ids = []
    for word in argv[1:]:
        if word.startswith("--signal="):
            signal = word.partition("=")[2]
        elif word.replace("_", "").isdigit():
            ids.append(word)
        else:
            raise UnknownCommand(line, f"option {word!r}")
    errors = []
    for job_id in ids:
        job = table.jobs.get(job_id)
        if job is None or not job.in_squeue:  # slurmctld no longer knows it (sacct may)
            errors.append(f"scancel: error: Kill job error on job id {job_id}: Invalid job id specified")
        elif signal is not None:
            job.signals.append(signal)
        elif not job.is_terminal:
            job.state, job.cancelled_by, job.end = "CANCELLED", table.uid, table.tick()
    return _ok(line, "", "".join(e + "\n" for e in errors), 1 if errors else 0)


def _scontrol(line: str, argv: list[str], table: SlurmTable) -> CommandResult:
    if argv[1:] == ["ping"]:
        state = "UP" if table.controller_up else "DOWN"
        return _ok(line, f"Slurmctld(primary) at slurmctld is {state}\n")
    if argv[1:] == ["show", "config"]:
        lines = [f"Configuration data as of {_stamp(table.clock)}"]
        lines += [f"{name:<23} = {value}" for name, value in sorted(table.config.items())]
        return _ok(line, "\n".join(lines) + "\n")
    if argv[1:4] == ["show", "job", "-o"] and len(argv) == 5:
        job = table.jobs.get(argv[4])
        if job is None or not job.in_squeue:
            return _ok(line, "", INVALID_JOB_ID + "\n", 1)
        words = [f"JobId={job.job_id}", f"JobName={job.name}", f"UserId={job.user}({table.uid})",
                 f"Account={job.account}", f"JobState={job.state}", f"Reason={job.reason or 'None'}",
                 f"Restarts={job.restarts}", f"ExitCode={job.exit_code}:{job.signal}",
                 f"SubmitTime={_stamp(job.submit)}", f"StartTime={_stamp(job.start)}",
                 f"EndTime={_stamp(job.end)}", f"Partition={job.partition}",
                 f"NodeList={job.node or '(null)'}",
                 f"StdOut={job.std_out}", f"Comment={job.comment or '(null)'}"]
        return _ok(line, " ".join(words) + "\n")
    raise UnknownCommand(line)


def _sshare(line: str, argv: list[str], table: SlurmTable) -> CommandResult:
    options, flags = _options(line, argv[1:], ("--accounts", "--format"),
                              ("--noheader", "--parsable2", "--all"))
    if options.get("--format") != ",".join(SSHARE_FIELDS) or len(flags) != 3:
        raise UnknownCommand(line, "not the provider's sshare field list")
    rows = table.allocations.get(options["--accounts"], [])
    return _ok(line, "".join(row + "\n" for row in rows))


# --- file verbs: recognised by their shape, checked by building them again -----------------------------


def _words(text: str) -> list[str]:
    return shlex.split(text)


def _checked(line: str, rebuilt: Callable[[], str]) -> None:
    try:
        again = rebuilt()
    except Exception as exc:  # a path the builder refuses: not a line the provider built
        raise UnknownCommand(line, f"not rebuilt ({exc})") from exc
    if again != line:
        raise UnknownCommand(line, f"looks like {again!r} but is not")


_READ_PROGRESS = re.compile(r"^if \[ -f (?P<path>.+?) \]; then cat -- ")
_FILE_SIZES = re.compile(r'^i=0; for f in (?P<paths>.*?); do if \[ -f "\$f" \]; then printf "%s %s')
_POLL_PART = re.compile(r'for f in (?P<paths>.*?); do if \[ -f "\$f" \]; then printf "(?P<kind>size|end) ')
_READ_LOG = re.compile(r"^f=(?P<path>.+?); o=(?P<offset>\d+); m=(?P<max>\d+); ")
_TOUCH = re.compile(r"^umask 002; mkdir -p (?P<dir>.+?) && touch -- (?P<path>.+)$")
_EXCLUSIVE = re.compile(r"^umask 002; mkdir -p (?P<dir>\S+) \|\| exit 70; lock=")


def _file_verb(line: str, table: SlurmTable) -> Answer | None:
    if match := _READ_PROGRESS.match(line):
        path = _words(match["path"])[0]
        _checked(line, lambda: build_read_progress(path))
        text = table.files.get(path)
        return Answer("read_file", _ok(line, text if text is not None else NOT_FOUND_MARKER + "\n"))
    if match := _FILE_SIZES.match(line):
        paths = _words(match["paths"])
        _checked(line, lambda: build_file_sizes(paths))
        out = "".join(f"{i} {len(table.files[p].encode())}\n"
                      for i, p in enumerate(paths) if p in table.files)
        return Answer("file_sizes", _ok(line, out))
    if line == "true" or (line.startswith("i=0; for f in") and _POLL_PART.search(line)):
        parts = {m["kind"]: _words(m["paths"]) for m in _POLL_PART.finditer(line)}
        sizes, records = parts.get("size", []), parts.get("end", [])
        _checked(line, lambda: build_poll_files(sizes, records))
        out = "".join(f"size {i} {len(table.files[p].encode())}\n"
                      for i, p in enumerate(sizes) if p in table.files)
        out += "".join(f"end {i} {table.files[p].splitlines()[0][:200] if table.files[p] else ''}\n"
                       for i, p in enumerate(records) if p in table.files)
        return Answer("poll_files", _ok(line, out))
    if match := _READ_LOG.match(line):
        path, offset, most = _words(match["path"])[0], int(match["offset"]), int(match["max"])
        _checked(line, lambda: build_read_log(path, offset, most))
        if path not in table.files:
            return Answer("read_log", _ok(line, f"{LOG_MARKER} missing\n"))
        data = table.files[path].encode()
        truncated = len(data) < offset
        start = 0 if truncated else offset
        chunk = data[start:start + most]
        out = f"{LOG_MARKER} size={len(data)} offset={start} count={len(chunk)} truncated={int(truncated)}\n"
        return Answer("read_log", _ok(line, out + (base64.b64encode(chunk).decode() + "\n" if chunk else "")))
    if match := _TOUCH.match(line):
        directory, path = _words(match["dir"])[0], _words(match["path"])[0]
        name = path.rpartition("/")[2]
        _checked(line, lambda: build_touch_record(directory, name))
        table.files.setdefault(path, "")
        return Answer("touch", _ok(line))
    return None


def _exclusive_submit(line: str, table: SlurmTable, script: str | None) -> Answer:
    """The exclusive submit (``build_exclusive_sbatch_submit``): live writers, done markers, else sbatch."""
    directory = _words(_EXCLUSIVE.match(line)["dir"])[0]  # type: ignore[index]
    live = re.search(r"live=\$\((?P<squeue>.*?)\) \|\| exit 76; ", line)
    needles = re.search(r"grep -F (?P<needles>(?:-e \S+ ?)+)\)", line)
    submit = line.rpartition("; ")[2]
    if live is None or needles is None or not submit.startswith("sbatch --parsable "):
        raise UnknownCommand(line, "not the shape of the exclusive submit")
    if "--replace" in line or ".replaced-" in line:
        raise UnknownCommand(line, "the fake does not move outputs aside (replace)")
    rows = _squeue(live["squeue"], _argv(live["squeue"]), table).stdout.splitlines()
    wanted = [w for w in _words(needles["needles"]) if w != "-e"]
    match = [row for row in rows if any(n in row for n in wanted)]
    if match:
        return Answer("sbatch", _ok(line, f"{LIVE_MARKER} {table.user}\n" + "".join(r + "\n" for r in match)))
    done = re.search(r"if (?P<tests>\[ -e .*?\](?: && \[ -e .*?\])*); then echo " + DONE_MARKER, line)
    if done is not None:
        present = [_words(t)[2] for t in re.findall(r"\[ -e .*? \]", done["tests"])]
        if all(path in table.files for path in present):
            return Answer("sbatch", _ok(line, DONE_MARKER + "\n"))
    table.files.setdefault(f"{directory}/", "")
    result, _ = sbatch_submit(line, _argv(submit), table, script)
    return Answer("sbatch", result)


def answer(line: str, table: SlurmTable, stdin: str | None = None) -> Answer:
    """The fake login node's answer to one command line (the sans-IO core). Raises
    :class:`UnknownCommand` for a line it does not know."""
    if _EXCLUSIVE.match(line):
        return _exclusive_submit(line, table, stdin)
    if (verb := _file_verb(line, table)) is not None:
        return verb
    if " && " in line and line.startswith(f"{TIME_FORMAT_ENV} squeue "):
        parts = [answer(part, table, stdin) for part in line.split(" && ")]
        bad = next((p.result for p in parts if not p.result.ok), None)
        if bad is not None:
            return Answer("squeue", bad)
        return Answer("squeue", _ok(line, "".join(p.result.stdout for p in parts)))
    try:
        argv = _argv(line)
    except ValueError as exc:
        raise UnknownCommand(line, str(exc)) from exc
    program = argv[0] if argv else ""
    if program == "squeue":
        return Answer("squeue", _squeue(line, argv, table))
    if program == "sacct":
        return Answer("sacct", _sacct(line, argv, table))
    if program == "sbatch" and argv[1:2] == ["--parsable"]:
        return Answer("sbatch", sbatch_submit(line, argv, table, stdin)[0])
    if program == "sbatch" and argv[1:2] == ["--test-only"]:
        return Answer("sbatch", _sbatch_test_only(line, argv, table, stdin))
    if program == "scancel":
        return Answer("scancel", _scancel(line, argv, table))
    if program == "scontrol":
        return Answer("scontrol", _scontrol(line, argv, table))
    if program == "sshare":
        return Answer("sshare", _sshare(line, argv, table))
    if argv == ["sinfo", "--version"]:
        return Answer("sinfo", _ok(line, "slurm 22.05.8\n"))
    raise UnknownCommand(line)


# --- the runner: the table, the controls, the record -----------------------------------------------------


@dataclass(frozen=True)
class Asked:
    """One command the fake was asked to run."""

    verb: str
    line: str
    stdin: str | None


class FakeSlurm:
    """A login node with Slurm, in memory: a ``RemoteCommandRunner`` whose answers come from a job table.

    ``down``: while set, every command raises it (an outage, or a step that keeps failing). ``asked``
    records every command, answered or not, in order; ``verbs`` their verbs (``squeue``, ``sbatch``,
    ``read_file`` ...). sbatch accepts every job until told otherwise.
    """

    def __init__(self, *, first_id: int = 900, user: str = "vcloud") -> None:
        self.table = SlurmTable(next_id=first_id, user=user)
        self.down: BaseException | None = None
        self.asked: list[Asked] = []
        self.submitted: list[str] = []
        """Ids of the jobs sbatch accepted (whether the answer reached the caller or not)."""
        self.closed = 0
        self.connects = 0
        """How often a hook looked up its connection's runner (``install``'s seam): a hook that runs
        no command never does."""
        self.before_each: Callable[[FakeSlurm], None] | None = None
        """A test's own step before each command is answered (time passing: an outage ends, a job starts)."""
        self.failing: dict[str, BaseException] = {}
        """verb -> the error every command of that verb raises
        (``{"scancel": TransportUnavailable(...)}``)."""
        self.erring: dict[str, tuple[int, str]] = {}
        """verb -> (exit status, stderr): the program runs and fails (``sshare: error: Problem talking
        to the database``)."""
        self.site_commands: dict[str, tuple[int, str, str]] = {}
        """program -> (exit status, stdout, stderr) of a site's own command run as a script
        (``bash -s``, :meth:`site_command`)."""
        self._refusal: str | None = None
        self._submit_error: BaseException | None = None
        self._lost_answer: tuple[BaseException, BaseException | None] | None = None
        self._down_after_submit: BaseException | None = None

    # --- the runner --------------------------------------------------------------------------------

    def run(self, command: str, *, stdin: bytes | str | None = None, timeout: float) -> CommandResult:
        text = stdin.decode() if isinstance(stdin, bytes) else stdin
        verb = _verb_of(command)
        self.asked.append(Asked(verb, command, text))
        if self.before_each is not None:
            self.before_each(self)
        if self.down is not None:
            raise self.down
        if verb in self.failing:
            raise self.failing[verb]
        if verb in self.erring:
            exit_status, stderr = self.erring[verb]
            answer(command, SlurmTable(), text)  # still a line the fake must know
            return _ok(command, "", stderr, exit_status)
        if command == "bash -s":
            return self._site_script(command, text)
        if verb == "sbatch" and "--test-only" not in command:
            return self._submit(command, text)
        return answer(command, self.table, text).result

    def close(self) -> None:
        self.closed += 1

    def site_command(self, program: str, *, exit_status: int = 0, stdout: str = "", stderr: str = "") -> None:
        """A script (``bash -s``) that runs ``program`` gets this answer (``lumi-allocations``)."""
        self.site_commands[program] = (exit_status, stdout, stderr)

    def _site_script(self, command: str, script: str | None) -> CommandResult:
        for program, (exit_status, stdout, stderr) in self.site_commands.items():
            if script is not None and re.search(rf"(^|[\s;&|(]){re.escape(program)}(\s|$)", script):
                return _ok(command, stdout, stderr, exit_status)
        raise UnknownCommand(command, f"a script running no site command the test named: {script!r}")

    def _submit(self, command: str, script: str | None) -> CommandResult:
        if self._submit_error is not None:
            raise self._submit_error
        if self._refusal is not None:
            answer(command, SlurmTable(), script)  # still a line the fake must know
            return _ok(command, "", f"sbatch: error: {self._refusal}\n", 1)
        before = set(self.table.jobs)
        result = answer(command, self.table, script).result
        self.submitted.extend(job_id for job_id in self.table.jobs if job_id not in before)
        if self._lost_answer is not None:
            error, then_down = self._lost_answer
            self.down = then_down
            raise error
        if self._down_after_submit is not None:
            self.down = self._down_after_submit
        return result

    # --- what sbatch does ----------------------------------------------------------------------------

    def accept_submits(self) -> None:
        self._refusal = self._submit_error = self._lost_answer = self._down_after_submit = None

    def refuse_submits(self, message: str) -> None:
        """sbatch refuses every job with Slurm's ``message`` (``sbatch: error: <message>``, exit 1)."""
        self.accept_submits()
        self._refusal = message

    def fail_submits(self, error: BaseException) -> None:
        """Every submit raises ``error`` (a ``TransportError``, ``SubmitLockBusy`` ...); nothing is
        submitted."""
        self.accept_submits()
        self._submit_error = error

    def lose_submit_answers(self, error: BaseException, *, then_down: BaseException | None = None) -> None:
        """sbatch accepts the job, but its answer never arrives: the submit raises ``error`` and the
        cluster is ``down`` with ``then_down`` afterwards."""
        self.accept_submits()
        self._lost_answer = (error, then_down)

    def go_down_after_submit(self, error: BaseException) -> None:
        """sbatch answers, then the login node goes away (``down = error``)."""
        self.accept_submits()
        self._down_after_submit = error

    # --- moving jobs ---------------------------------------------------------------------------------

    def add(self, job_id: str | int, name: str = "job", state: str = "PENDING", **fields: Any) -> FakeJob:
        """A job already in the table (submitted before the test looks)."""
        return self.table.add(job_id, name, state=state, **fields)

    def job(self, job_id: str | int) -> FakeJob:
        return self.table.jobs[str(job_id)]

    def start(self, job_id: str | int, node: str = "vcnode1") -> FakeJob:
        job = self.job(job_id)
        job.state, job.reason, job.node, job.start = "RUNNING", None, node, self.table.tick()
        return job

    def requeue(self, job_id: str | int, reason: str = "BeginTime", ended: str = "REQUEUED") -> FakeJob:
        """The running job goes back to the queue: sacct keeps the run that ended (``REQUEUED``, or
        ``NODE_FAIL``/``PREEMPTED`` when Slurm requeued it after those)."""
        job = self.job(job_id)
        job.earlier.append(FakeRun(ended, 0, 0, job.submit, job.start, self.table.tick(), job.node,
                                   job.reason or "None"))
        job.state, job.reason, job.restarts = "PENDING", reason, job.restarts + 1
        job.submit, job.start, job.end, job.node = self.table.clock, None, None, ""
        return job

    def end(self, job_id: str | int, state: str = "COMPLETED", exit_code: int = 0, signal: int = 0,
            reason: str | None = None) -> FakeJob:
        job = self.job(job_id)
        if job.start is None:
            job.start, job.node = self.table.tick(), job.node or "vcnode1"
        job.state, job.exit_code, job.signal, job.end = state, exit_code, signal, self.table.tick()
        job.reason = reason if reason is not None else ("NonZeroExitCode" if exit_code else None)
        return job

    def vanish(self, job_id: str | int) -> FakeJob:
        """slurmctld forgets the job (``MinJobAge``): only sacct knows it now."""
        job = self.job(job_id)
        job.in_squeue = False
        return job

    def forget(self, job_id: str | int) -> None:
        """Neither squeue nor sacct knows the job any more."""
        job = self.job(job_id)
        job.in_squeue = job.in_sacct = False

    def allocation(self, account: str, *, limit: int | None = None, used: int = 0, running: int = 0,
                   tres: str = "billing", holders: Iterable[tuple[str, int]] = ()) -> None:
        """The account's own association in sshare: ``GrpTRESMins`` (None: no limit), usage, what running
        jobs hold; ``holders``: a user row each (``(user, TRES-minutes their running jobs hold)``)."""
        limits = f"{tres}={limit}" if limit is not None else ""
        rows = [[account, "", limits, f"{tres}={used}", f"{tres}={running}"]]
        rows += [[account, user, "", f"{tres}=0", f"{tres}={held}"] for user, held in holders]
        self.table.allocations[account] = [FIELD_SEPARATOR.join(row) for row in rows]

    # --- the record ----------------------------------------------------------------------------------

    @property
    def verbs(self) -> list[str]:
        return [asked.verb for asked in self.asked]


def _verb_of(line: str) -> str:
    """What a line is, for the record: the Slurm program it runs, else the file verb."""
    if _EXCLUSIVE.match(line):
        return "sbatch"
    from slurm_provider.scheduler_calls import slurm_verbs

    verbs = slurm_verbs(line)
    if verbs:
        return verbs[0]
    for pattern, verb in ((_READ_PROGRESS, "read_file"), (_FILE_SIZES, "file_sizes"), (_READ_LOG, "read_log"),
                          (_TOUCH, "touch")):
        if pattern.match(line):
            return verb
    if line == "true" or line.startswith("i=0; for f in"):
        return "poll_files"
    if line == "bash -s":
        return "script"
    return line


class AsyncFakeSlurm:
    """The same fake cluster as an ``AsyncRemoteCommandRunner`` (what ``SlurmAsyncHook`` drives)."""

    def __init__(self, fake: FakeSlurm) -> None:
        self.fake = fake

    async def run(self, command: str, *, stdin: bytes | str | None = None, timeout: float) -> CommandResult:
        return self.fake.run(command, stdin=stdin, timeout=timeout)

    async def close(self) -> None:
        self.fake.close()


def install(monkeypatch: Any, fake: FakeSlurm | None = None) -> FakeSlurm:
    """Make every ``SlurmHook``/``SlurmAsyncHook`` built without a runner talk to ``fake`` (the
    provider's seams ``runner_for_connection``/``async_runner_for_connection``); returns it."""
    from slurm_provider import hooks

    runner = fake if fake is not None else FakeSlurm()

    def connect(conn_id: str) -> FakeSlurm:
        runner.connects += 1
        return runner

    monkeypatch.setattr(hooks, "runner_for_connection", connect)
    monkeypatch.setattr(hooks, "async_runner_for_connection",
                        lambda conn_id: AsyncFakeSlurm(connect(conn_id)))
    return runner
