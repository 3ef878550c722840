"""Exit records: a rank's exit code, left where the torchrun launch of its job finds it.

torchrun reports a failed worker as its own exit 1, ends the other workers of its node with SIGTERM
as soon as one fails, and never sees the workers of other nodes. So a rank that ends with a code of
:data:`vcloud.contract.RECORDED_EXITS` writes it, just before it exits, into the directory the job
script names in :data:`vcloud.contract.RANK_EXITS_DIR_ENV` (shared storage, one per job), and
:mod:`vcloud.launch` reads every rank's record after a failed launch. Standard library only.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path

from vcloud.contract import (
    RANK_EXITS_DIR_ENV,
    RECORDED_EXITS,
    exit_record_name,
    exit_record_rank,
    exit_record_text,
    parse_exit_record,
)
from vcloud.durable import atomic_write_text

log = logging.getLogger("vcloud.train")


def records_dir(env: Mapping[str, str]) -> Path | None:
    """The job's exit record directory, or None where the job script asked for no records."""
    directory = env.get(RANK_EXITS_DIR_ENV, "").strip()
    return Path(directory) if directory else None


def write_exit_record(code: int, env: Mapping[str, str]) -> Path | None:
    """Record ``code`` for this process's global rank (``RANK``, set by torchrun) when the job asked
    for records and ``code`` is one of :data:`~vcloud.contract.RECORDED_EXITS`; returns the file
    written. Written whole (:func:`vcloud.durable.atomic_write_text`: a temporary file that ``mkstemp``
    creates exclusively, so a link planted at a temporary name is never followed, then renamed), so a
    reader on another node never sees half a record. A failure to write is logged, never raised: the process's exit code stands either way,
    and torchrun still reports it for the ranks of its own node."""
    directory = records_dir(env)
    if directory is None or code not in RECORDED_EXITS:
        return None
    rank = env.get("RANK", "0")
    path = directory / exit_record_name(int(rank) if rank.isdigit() else 0)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, exit_record_text(code))
    except OSError as exc:
        log.warning("could not record exit %d in %s (%s); a torchrun job may then report the exit code of "
                    "this node's ranks only", code, path, exc)
        return None
    return path


def read_exit_records(directory: Path | None) -> dict[int, int]:
    """Global rank -> recorded exit code of every record in ``directory``; nothing where the
    directory is None or missing. Other files (temporaries, foreign content) are skipped."""
    if directory is None:
        return {}
    try:
        entries = sorted(directory.iterdir())
    except OSError:
        return {}
    records: dict[int, int] = {}
    for entry in entries:
        rank = exit_record_rank(entry.name)
        if rank is None:
            continue
        try:
            code = parse_exit_record(entry.read_text())
        except OSError:
            continue
        if code is not None:
            records[rank] = code
    return records
