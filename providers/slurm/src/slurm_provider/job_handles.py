"""The commands a person uses next on a job that runs: a shell beside it, its output, its cancel.

A job watched for days is looked at by hand now and then: a shell on its node to see the GPUs
(``srun --jobid=<id> --overlap --pty bash``, a step that shares the job's allocation instead of
waiting for one), its output as it grows (``tail -F``), and its cancel. :class:`JobHandles` writes
them with the connection's own login (:func:`slurm_provider.transport.person_login_argv`: the
ssh_config alias of an ``openssh`` connection, whose ControlMaster serves the person's session too,
or ``user@host`` with its port and key), ready to copy. Pure: the login words come in.

The operator logs them when it hands a job to the trigger and keeps them in the task's XCom
(:data:`JOB_HANDLES_XCOM_KEY`), where a view of the running jobs shows them.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

JOB_HANDLES_XCOM_KEY = "slurm_job_handles"
"""The task's XCom with the handles of the job it watches (:meth:`JobHandles.to_json`)."""


@dataclass(frozen=True)
class JobHandles:
    """Three command lines to copy, each run where the person types (they log in themselves)."""

    job_id: str
    shell: str
    """An interactive shell in the job's allocation, on its first node."""
    follow: str
    """The job's output, followed as it grows (and across a requeue's new lines)."""
    cancel: str

    @classmethod
    def of(cls, login: Sequence[str], job_id: str, output_path: str) -> JobHandles:
        """The handles of job ``job_id`` writing ``output_path``, reached with ``login`` (an ssh argv
        without a remote command, e.g. ``("ssh", "-F", "/etc/ssh/cluster.conf", "cluster")``)."""
        if not login or login[0] != "ssh":
            raise ValueError(f"a login is an ssh command line (ssh [options] destination), not {list(login)!r}")
        if not str(job_id).isdigit():
            raise ValueError(f"job id {job_id!r} is not a Slurm job id")

        def on_login(words: Sequence[str], tty: bool = False) -> str:
            options = ["-t"] if tty else []
            return shlex.join([login[0], *options, *login[1:], shlex.join(words)])

        return cls(job_id=str(job_id),
                   shell=on_login(["srun", f"--jobid={job_id}", "--overlap", "--pty", "bash", "-l"], tty=True),
                   follow=on_login(["tail", "-n", "50", "-F", output_path]),
                   cancel=on_login(["scancel", str(job_id)]))

    def lines(self) -> list[str]:
        """The handles as the task log says them."""
        return [f"a shell beside job {self.job_id} (in its allocation): {self.shell}",
                f"its output as it grows: {self.follow}",
                f"cancel it: {self.cancel}"]

    def to_json(self) -> dict[str, str]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Any) -> JobHandles | None:
        """The handles in an XCom value; None for anything else."""
        if not isinstance(data, Mapping):
            return None
        try:
            values = {name: data[name] for name in cls.__dataclass_fields__}
        except KeyError:
            return None
        if not all(isinstance(value, str) and value for value in values.values()):
            return None
        return cls(**values)
