"""Nodes to leave out of the next submissions: where this project's jobs just failed for the node's fault.

Pure. A node whose container runtime does not start, whose GPUs have vanished, or that dies under a
job (Slurm: ``NODE_FAIL``, ``BOOT_FAIL``) fails the next job it gets the same way, within seconds;
Slurm keeps giving it jobs until an administrator drains it. So the operator reads the login user's
own jobs that ended in the last hours (one ``sacct``, which lists only jobs that were alive in that
time), takes the node faults among them (:func:`node_faults`) and submits with ``--exclude`` of those
nodes (:func:`nodes_to_leave_out`). Which exit codes mean "the node's fault" is the job script's to say
(``node_fault_exit_codes``: a script that checks its runtime and its GPUs before it works exits with
them); only jobs with this provider's comment count for those, since another program's exit code 87
means something else. A ``FAILED`` job blames its batch host, the first node of its allocation; a
``NODE_FAIL`` or ``BOOT_FAIL`` blames every node of it (Slurm does not say which one failed).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass

from slurm_provider.cli.sacct import SacctRow
from slurm_provider.cli.sbatch import parse_job_comment
from slurm_provider.cli.values import expand_hostlist
from slurm_provider.job_status import JobStatus
from slurm_provider.state_vocabulary import SlurmState, parse_state_text

NODE_FAULT = "NODE_FAULT"
"""The cause of a job whose script said the node is at fault (one of ``node_fault_exit_codes``): an
interruption resubmitted within its own budget, to other nodes."""

NODE_LEVEL_CAUSES = frozenset({NODE_FAULT, SlurmState.NODE_FAIL.value, SlurmState.BOOT_FAIL.value})
"""Causes whose resubmission leaves the failed nodes out and backs off (``--begin``) before it may start."""

MOST_NODES_LEFT_OUT = 8
"""At most this many nodes are left out at once (the newest faults): a project that excludes half a
small partition waits longer than it would on a bad node."""

LEFT_OUT_XCOM_KEY = "slurm_left_out"
"""XCom of a task that submitted with nodes left out: the job and each node with the fault that left it out."""


@dataclass(frozen=True)
class NodeFault:
    """One job that failed for its node's fault."""

    node: str
    job_id: str
    why: str
    """In words: ``NODE_FAIL``, ``exit 89``."""
    ended: str | None
    """When, as sacct prints it (the cluster's local time)."""


def is_node_fault(state: SlurmState, exit_code: int | None, fault_exit_codes: Collection[int]) -> bool:
    """A ``FAILED`` job whose script exited with one of ``fault_exit_codes``."""
    return state is SlurmState.FAILED and exit_code is not None and exit_code in fault_exit_codes


def job_faults(job_id: str, state: SlurmState, exit_code: int | None, node_list: str | None, ended: str | None,
               fault_exit_codes: Collection[int], *, ours: bool = True) -> list[NodeFault]:
    """The node faults one job's end says there were (``ours``: the job carries this provider's
    comment, so its exit codes are the script's own)."""
    if not node_list or node_list.startswith("None"):  # "None assigned": it never had a node
        return []
    nodes = expand_hostlist(node_list)
    if state in (SlurmState.NODE_FAIL, SlurmState.BOOT_FAIL):
        return [NodeFault(node, job_id, state.value, ended) for node in nodes]
    if ours and is_node_fault(state, exit_code, fault_exit_codes):
        return [NodeFault(nodes[0], job_id, f"exit {exit_code}", ended)]
    return []


def node_faults(rows: Iterable[SacctRow], fault_exit_codes: Collection[int]) -> list[NodeFault]:
    """The node faults among sacct's allocation rows (``-X -D``: every run of a requeued job), oldest first."""
    faults = [fault for row in rows if not row.is_step
              for fault in job_faults(row.job_id, parse_state_text(row.state).state, row.exit_code, row.node_list,
                                      row.end, fault_exit_codes, ours=parse_job_comment(row.comment) is not None)]
    return sorted(faults, key=lambda f: (f.ended or "", int(f.job_id.split("_")[0])))


def nodes_to_leave_out(faults: Iterable[NodeFault], most: int = MOST_NODES_LEFT_OUT) -> dict[str, NodeFault]:
    """The newest fault of each node, for the ``most`` nodes that failed last (newest first)."""
    newest: dict[str, NodeFault] = {}
    for fault in faults:  # oldest first: a later fault of a node replaces its earlier one
        newest.pop(fault.node, None)
        newest[fault.node] = fault
    return dict(list(reversed(newest.items()))[:most])


def same_fault_elsewhere(ended: JobStatus, earlier: Iterable[JobStatus]) -> JobStatus | None:
    """An earlier job of the same task that ended with the same exit code on another node: then the
    exit code is the job's environment (every node shows it), not a node's fault."""
    first = _first_node(ended.node_list)
    for job in earlier:
        if job.job_id != ended.job_id and job.state is ended.state and job.exit_code == ended.exit_code \
                and _first_node(job.node_list) not in (None, first):
            return job
    return None


def _first_node(node_list: str | None) -> str | None:
    if not node_list or node_list.startswith("None"):
        return None
    return expand_hostlist(node_list)[0]


def left_out_words(left_out: Mapping[str, NodeFault], hours: float) -> str:
    """``Leaving out nid005001 (job 12 ended exit 89 at 2026-11-29T02:10:00) ...`` for the task log."""
    if not left_out:
        return ""
    each = "; ".join(f"{node} (job {f.job_id} ended {f.why}" + (f" at {f.ended}" if f.ended else "") + ")"
                     for node, f in left_out.items())
    return (f"Leaving out {', '.join(left_out)} (sbatch --exclude): this project's jobs failed there for the "
            f"node's fault in the last {hours:g} h: {each}")


def left_out_xcom(job_id: str, left_out: Mapping[str, NodeFault]) -> dict[str, object]:
    """What a UI shows of a submission's left-out nodes (the ``slurm_left_out`` XCom)."""
    return {"job_id": job_id,
            "nodes": {node: {"job_id": f.job_id, "why": f.why, "ended": f.ended} for node, f in left_out.items()}}

