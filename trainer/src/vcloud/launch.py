"""``python -m vcloud.launch TORCHRUN_ARGS``: torchrun that ends with the exit code of its ranks.

torchrun (``python -m torch.distributed.run``) reports a failed worker as its own exit 1 with a
``ChildFailedError`` traceback, whatever the worker's exit code said: a stage stopped after its
checkpoint (85), a job whose GPUs PyTorch cannot see (87) and a refused resume (88) would all end
as "exit 1" and a traceback. This launcher runs the same launch with the same arguments
(``torch.distributed.run.run``, what ``torchrun`` runs under its error-recording decorator). After a
failed launch it prints one line instead of the traceback and exits with the highest code of
:data:`vcloud.contract.RECORDED_EXITS` any rank ended with: this node's ranks as torchrun reports
them, and every rank's exit record (:mod:`vcloud.exit_record`; on shared storage, so the ranks of
other nodes count too). Where no rank ended with such a code it exits 1, as torchrun does, and the
ranks' own output above the line says why.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Mapping
from dataclasses import dataclass

from vcloud import exitcodes
from vcloud.contract import EXIT_ERROR, RECORDED_EXITS
from vcloud.exit_record import read_exit_records, records_dir

PREFIX = "vcloud launch:"


@dataclass(frozen=True)
class LaunchOutcome:
    """What a failed launch exits with, and the one line that says so."""

    code: int
    line: str


def _ranks(ranks: list[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, sorted(ranks)))


def _how(exitcode: int) -> str:
    """A worker's end as torchrun reports it: an exit code, or minus the signal that killed it."""
    if exitcode >= 0:
        return f"exit {exitcode}"
    try:
        return signal.Signals(-exitcode).name
    except ValueError:
        return f"signal {-exitcode}"


def _failed(failures: Mapping[int, int]) -> str:
    """``ranks 0, 1 exit 88, rank 2 SIGTERM``: the failed ranks grouped by how they ended."""
    by_end: dict[str, list[int]] = {}
    for rank, exitcode in sorted(failures.items()):
        by_end.setdefault(_how(exitcode), []).append(rank)
    return ", ".join(f"{_ranks(ranks)} {end}" for end, ranks in by_end.items()) or "no rank"


def launch_outcome(failures: Mapping[int, int], recorded: Mapping[int, int]) -> LaunchOutcome:
    """The exit code of a failed launch and its line. ``failures``: global rank -> exit code of this
    node's failed workers as torchrun reports them (minus the signal for one killed by a signal);
    ``recorded``: global rank -> code of every exit record (:mod:`vcloud.exit_record`), any node."""
    ended = {rank: code for rank, code in failures.items() if code in RECORDED_EXITS}
    ended.update({rank: code for rank, code in recorded.items() if code in RECORDED_EXITS})
    reported = f"torchrun reported {_failed(failures)}"
    if not ended:
        why = ("no rank ended with an exit code of the trainer's contract, the ranks' own output above "
               "says why")
        return LaunchOutcome(EXIT_ERROR, f"{PREFIX} exit {EXIT_ERROR}: {reported}; {why}")
    code = max(ended.values())
    ranks = [rank for rank, c in ended.items() if c == code]
    return LaunchOutcome(code, f"{PREFIX} exit {code} of {_ranks(ranks)}: {exitcodes.describe(code)} "
                               f"({reported} as its own exit {EXIT_ERROR})")


def main(argv: list[str] | None = None) -> int:
    """Launch as torchrun does; the exit code of a failed launch from :func:`launch_outcome`."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    args = parse_args(argv)
    try:
        run(args)
    except ChildFailedError as exc:
        failures = {rank: failure.exitcode for rank, failure in exc.failures.items()}
        outcome = launch_outcome(failures, read_exit_records(records_dir(os.environ)))
        print(outcome.line, file=sys.stderr, flush=True)
        return outcome.code
    except SignalException as exc:
        # torchrun itself was signalled (it ends its workers first): a death by that signal, as the
        # shell would report it, without torchrun's traceback.
        print(f"{PREFIX} torchrun stopped on {exc.sigval.name} after ending its workers", file=sys.stderr,
              flush=True)
        return 128 + int(exc.sigval)
    return 0


if __name__ == "__main__":
    sys.exit(main())
