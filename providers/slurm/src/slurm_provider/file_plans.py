"""The reads of a job's files on the login node as command plans (:mod:`slurm_provider.plans`): a log
from an offset, a small file, sizes and stamps of many files at once, and the exit records and grown
logs of every watched job in as few commands as the login node's argument limit allows."""

from __future__ import annotations

from collections.abc import Iterable

from slurm_provider.cli.job_files import (
    LogChunk,
    build_file_sizes,
    build_file_stamps,
    build_poll_files,
    build_read_log,
    build_read_progress,
    parse_file_stamps,
    parse_log_chunk,
    parse_poll_files,
    parse_progress,
)
from slurm_provider.cli.values import SlurmOutputError
from slurm_provider.plans import Plan, RemoteCommand
from slurm_provider.verb_plans import SlurmCommandFailed, command_failed


def read_log_plan(path: str, offset: int, max_bytes: int) -> Plan[LogChunk]:
    result = yield RemoteCommand(build_read_log(path, offset, max_bytes), "read_log")
    if result.exit_status != 0:
        raise command_failed(f"reading {path}", result)
    try:
        return parse_log_chunk(result.stdout, offset)
    except SlurmOutputError as exc:
        raise SlurmCommandFailed(f"reading {path}: {exc}", result) from exc


def read_file_plan(path: str) -> Plan[str | None]:
    result = yield RemoteCommand(build_read_progress(path), "read_file")
    if result.exit_status != 0:
        raise command_failed(f"reading {path}", result)
    return parse_progress(result.stdout)


def file_sizes_plan(paths: Iterable[str]) -> Plan[dict[str, int]]:
    """Byte sizes of the files that exist (missing ones are left out), in one command."""
    wanted = list(dict.fromkeys(paths))
    if not wanted:
        return {}
    result = yield RemoteCommand(build_file_sizes(wanted), "file_sizes")
    if result.exit_status != 0:
        raise command_failed("file size check", result)
    sizes = {}
    for line in result.stdout.splitlines():
        index, _, size = line.strip().partition(" ")
        if not (index.isdigit() and size.strip().isdigit() and int(index) < len(wanted)):
            raise SlurmCommandFailed(f"file size check printed {line!r}", result)
        sizes[wanted[int(index)]] = int(size)
    return sizes


def file_stamps_plan(paths: Iterable[str]) -> Plan[dict[str, tuple[int, int]]]:
    """Size and modification time of the files that exist (missing ones are left out), in one command."""
    wanted = list(dict.fromkeys(paths))
    if not wanted:
        return {}
    result = yield RemoteCommand(build_file_stamps(wanted), "file_stamps")
    if result.exit_status != 0:
        raise command_failed("file stamp check", result)
    try:
        return parse_file_stamps(result.stdout, wanted)
    except SlurmOutputError as exc:
        raise SlurmCommandFailed(f"file stamp check printed output that cannot be read: {exc}", result) from exc


def poll_files_plan(size_paths: Iterable[str],
                    record_paths: Iterable[str]) -> Plan[tuple[dict[str, int], dict[str, str]]]:
    """Log sizes and exit records (:mod:`slurm_provider.watch.end_records`) in one command, no Slurm call
    (one more per ``POLL_FILES_CHUNK`` characters of paths: a shell takes a command line of 128 KiB)."""
    sizes, records = list(dict.fromkeys(size_paths)), list(dict.fromkeys(record_paths))
    found_sizes: dict[str, int] = {}
    found_records: dict[str, str] = {}
    for size_part, record_part in _chunks(sizes, records, POLL_FILES_CHUNK):
        result = yield RemoteCommand(build_poll_files(size_part, record_part), "poll_files")
        if result.exit_status != 0:
            raise command_failed("reading the jobs' files", result)
        try:
            part_sizes, part_records = parse_poll_files(result.stdout, size_part, record_part)
        except SlurmOutputError as exc:
            raise SlurmCommandFailed(str(exc), result) from exc
        found_sizes.update(part_sizes)
        found_records.update(part_records)
    return found_sizes, found_records


POLL_FILES_CHUNK = 60_000
"""Characters of paths in one file-reading command."""


def _chunks(sizes: list[str], records: list[str], budget: int) -> list[tuple[list[str], list[str]]]:
    """``(size paths, record paths)`` parts whose paths add up to at most ``budget`` characters each."""
    parts: list[tuple[list[str], list[str]]] = []
    current: tuple[list[str], list[str]] = ([], [])
    used = 0
    for kind, path in [*((0, p) for p in sizes), *((1, p) for p in records)]:
        if used + len(path) > budget and (current[0] or current[1]):
            parts.append(current)
            current, used = ([], []), 0
        current[kind].append(path)
        used += len(path) + 3
    if current[0] or current[1]:
        parts.append(current)
    return parts
