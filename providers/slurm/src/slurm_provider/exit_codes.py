"""Exit codes and signals of a batch job, in plain sentences for the task's failure message.

Slurm reports ``ExitCode=N:S``: the batch script's exit status ``N`` and the signal ``S`` that
killed it. Only the meanings every job shares live here (shell conventions, signals); what a
particular job script or program means by its own codes is passed to the operator
(``SlurmSubmitOperator(exit_code_meanings=...)``).
"""

from __future__ import annotations

import signal as signals
from collections.abc import Mapping

_SIGNAL_CAUSES = {
    signals.SIGKILL: "often the kernel's out-of-memory killer, or Slurm ending the job after its time "
                     "limit or a cancel",
    signals.SIGTERM: "Slurm sends it on a cancel, a time limit or a preemption",
    signals.SIGSEGV: "a crash in native code (a library or driver)",
    signals.SIGABRT: "the program aborted itself (a failed assertion in native code, or an abort() call)",
    signals.SIGBUS: "a bad memory access, often a file that shrank while it was memory-mapped",
    signals.SIGUSR2: "the pre-timeout warning (`--signal`) ended a script that does not handle it",
}

_SHELL = {
    126: "a command was found but could not be run (permission denied, or not an executable)",
    127: "a command was not found (a missing module, a typo, or PATH not set in the job)",
}


def _signal_sentence(number: int) -> str:
    try:
        name = signals.Signals(number).name
    except ValueError:
        name = f"signal {number}"
    cause = _SIGNAL_CAUSES.get(number)  # type: ignore[call-overload]
    return f"killed by {name}" + (f" ({cause})" if cause else "")


def explain_exit(exit_code: int | None, signal: int | None = None,
                 meanings: Mapping[int, str] | None = None) -> str | None:
    """One sentence on why the job's script ended as it did, or None when there is nothing to say.

    ``meanings`` (the job's own codes) win over the shell conventions; ``128 + N`` is death by
    signal N, as bash reports a child killed by a signal."""
    if signal:
        return f"The batch script was {_signal_sentence(signal)}."
    if exit_code is None or exit_code == 0:
        return None
    own = (meanings or {}).get(exit_code)
    if own:
        return f"Exit code {exit_code}: {own}"
    if exit_code in _SHELL:
        return f"Exit code {exit_code}: {_SHELL[exit_code]}."
    if 128 < exit_code < 128 + 65:
        return f"Exit code {exit_code}: a process of the job was {_signal_sentence(exit_code - 128)}."
    return None
