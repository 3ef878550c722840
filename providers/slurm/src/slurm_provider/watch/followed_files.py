"""Files a watched job writes line by line (a metrics log, say), followed as they grow.

A watch may name extra files of its job to follow besides its output: the shared poller checks their
sizes in a command it already runs (a poll or a read of the exit records, no Slurm call) at most every
``follow_interval`` seconds per job, and reads only the bytes they grew by. The trigger hands the
complete new lines to the file's *fold*, a pure function named by its import path::

    def fold(state: Any, lines: list[str]) -> Any   # JSON-safe, bounded in size

which turns what was read so far into what a UI shows (a curve thinned to a few hundred points), so
the triggerer never keeps a file's whole text. The trigger keeps each file's offset, fold state and
unfinished last line as an XCom of the task try (:data:`FOLLOW_XCOM_KEY`), written when a file grew:
a UI reads it without asking the cluster, and a restarted triggerer goes on from the offset.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

FOLLOW_XCOM_KEY = "slurm_followed"
"""XCom of the task try: ``{"job_id", "files": [FollowedFile.to_json(), ...]}``."""
FOLLOW_INTERVAL = 60.0
"""Least seconds between two size checks of one job's followed files."""
MAX_STATE_BYTES = 256 * 1024
"""A fold's state larger than this (as JSON) is not kept: following that file stops, the watch goes on."""
MAX_REST_BYTES = 64 * 1024
"""An unfinished last line longer than this is dropped (a file that is not line by line)."""

Fold = Callable[[Any, list[str]], Any]


@dataclass(frozen=True)
class FollowedFile:
    """One followed file: where it is, how its lines are folded, and how far it was read."""

    path: str
    fold: str
    """Import path of the fold (``package.module.function``)."""
    offset: int = 0
    state: Any = None
    rest: str = ""
    """Text after the last newline read: the start of a line still being written."""
    read_at: float | None = None
    """When (epoch seconds) the file was last found grown and read."""
    problem: str | None = None
    """Why following stopped (the fold failed, or its state outgrew :data:`MAX_STATE_BYTES`)."""

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "fold": self.fold, "offset": self.offset, "state": self.state,
                "rest": self.rest, "read_at": self.read_at, "problem": self.problem}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> FollowedFile:
        """A file of :meth:`to_json`, or a spec naming only ``path`` and ``fold``; ``ValueError`` if neither."""
        path, fold = data.get("path"), data.get("fold")
        if not isinstance(path, str) or not path or not isinstance(fold, str) or "." not in fold:
            raise ValueError(f"a followed file needs a 'path' and a 'fold' (package.module.function), got {dict(data)!r}")
        offset, read_at = data.get("offset"), data.get("read_at")
        return cls(path, fold, int(offset) if isinstance(offset, int) else 0, data.get("state"),
                   str(data.get("rest") or ""), float(read_at) if isinstance(read_at, (int, float)) else None,
                   data.get("problem") if isinstance(data.get("problem"), str) else None)


def followed_files(specs: Iterable[Mapping[str, Any]] | None) -> tuple[FollowedFile, ...]:
    """The files a watch follows, from its JSON-safe specs (one per path)."""
    files = {f.path: f for f in (FollowedFile.from_json(spec) for spec in specs or ())}
    return tuple(files.values())


def split_lines(rest: str, text: str) -> tuple[list[str], str]:
    """The complete lines of ``rest + text`` and what follows the last newline (a line being written)."""
    joined = rest + text
    head, newline, tail = joined.rpartition("\n")
    if not newline:
        return [], tail if len(tail.encode()) <= MAX_REST_BYTES else ""
    return head.split("\n"), tail if len(tail.encode()) <= MAX_REST_BYTES else ""


def advance(file: FollowedFile, text: str, offset: int, now: float, fold: Fold) -> FollowedFile:
    """``file`` after reading ``text`` (its bytes up to ``offset``): its complete lines folded into the
    state. A fold that raises, or a state too large to keep, stops following the file (``problem``)."""
    if file.problem is not None:
        return file
    if offset < file.offset:  # rewritten from the start (a job that starts the file again)
        file = replace(file, state=None, rest="")
    lines, rest = split_lines(file.rest, text)
    state = file.state
    if lines:
        try:
            state = fold(state, lines)
            size = len(json.dumps(state))
        except Exception as exc:  # a bug in the fold, or a state that is not JSON: the watch goes on
            return replace(file, offset=offset, problem=f"{file.fold} failed on {file.path}: {exc}")
        if size > MAX_STATE_BYTES:
            return replace(file, offset=offset, problem=(
                f"{file.fold} keeps {size} bytes for {file.path}, more than {MAX_STATE_BYTES}: it must thin "
                "what it keeps"))
    return replace(file, offset=offset, state=state, rest=rest, read_at=now)


def load_fold(name: str) -> Fold:
    """The fold at import path ``name``; ``ValueError`` saying what to fix when it cannot be imported."""
    from importlib import import_module

    module, _, attr = name.rpartition(".")
    try:
        fold = getattr(import_module(module), attr)
    except (ImportError, AttributeError, ValueError) as exc:
        raise ValueError(f"cannot import the fold {name!r} of a followed file ({exc}): it must be importable "
                         "where the triggerer runs (a provider or plugins module)") from None
    if not callable(fold):
        raise ValueError(f"the fold {name!r} of a followed file is not a function")
    return fold
