"""Which nodes are left out of the next submissions, from the login user's recent accounting."""

from __future__ import annotations

import pytest

from slurm_provider.bad_nodes import (
    MOST_NODES_LEFT_OUT,
    NodeFault,
    left_out_words,
    left_out_xcom,
    node_faults,
    nodes_to_leave_out,
)
from slurm_provider.cli.sacct import SACCT_FIELDS, parse_sacct
from slurm_provider.cli.sbatch import JobComment
from slurm_provider.cli.values import FIELD_SEPARATOR

OURS = JobComment(dag="d", task="t", run="r", attempt=1).to_json()


def sacct_line(job: str, state: str, exit_code: str, nodes: str, end: str, comment: str = OURS) -> str:
    """One allocation row of ``sacct --parsable2`` with the provider's fields."""
    values = {"JobID": job, "JobIDRaw": job, "JobName": "j", "State": state, "ExitCode": exit_code,
              "DerivedExitCode": "0:0", "Elapsed": "00:00:03", "ElapsedRaw": "3", "Start": end, "End": end,
              "Submit": end, "NodeList": nodes, "Partition": "small-g", "Comment": comment}
    return FIELD_SEPARATOR.join(values.get(field, "") for field in SACCT_FIELDS)


ROWS = parse_sacct("\n".join([
    sacct_line("10", "COMPLETED", "0:0", "nid005001", "2026-11-29T01:00:00"),
    sacct_line("11", "FAILED", "89:0", "nid005001", "2026-11-29T01:05:00"),
    sacct_line("12", "FAILED", "1:0", "nid005002", "2026-11-29T01:06:00"),  # the program's own failure
    sacct_line("13", "NODE_FAIL", "0:0", "nid[005002-005003]", "2026-11-29T01:07:00"),
    sacct_line("14", "FAILED", "89:0", "nid005004", "2026-11-29T01:08:00", comment="not ours"),
    sacct_line("15", "FAILED", "87:0", "nid[001001,001002]", "2026-11-29T01:09:00"),
    sacct_line("16", "BOOT_FAIL", "0:0", "nid001003", "2026-11-29T01:10:00"),
    sacct_line("17", "RUNNING", "0:0", "nid001004", "Unknown"),
]))


def test_a_node_fault_blames_the_batch_host_a_node_failure_every_node_and_foreign_exit_codes_nothing() -> None:
    faults = node_faults(ROWS, fault_exit_codes=(87, 89))
    assert [(f.node, f.job_id, f.why) for f in faults] == [
        ("nid005001", "11", "exit 89"),
        ("nid005002", "13", "NODE_FAIL"), ("nid005003", "13", "NODE_FAIL"),
        ("nid001001", "15", "exit 87"),  # the first node of the allocation runs the batch script
        ("nid001003", "16", "BOOT_FAIL"),
    ]
    assert [f.job_id for f in node_faults(ROWS, fault_exit_codes=())] == ["13", "13", "16"]


def test_the_newest_fault_of_each_node_and_at_most_the_newest_nodes_are_left_out() -> None:
    faults = node_faults(ROWS, fault_exit_codes=(87, 89))
    faults.append(NodeFault("nid005001", "18", "NODE_FAIL", "2026-11-29T01:11:00"))
    left_out = nodes_to_leave_out(faults)
    assert list(left_out) == ["nid005001", "nid001003", "nid001001", "nid005003", "nid005002"]
    assert left_out["nid005001"].job_id == "18"
    assert list(nodes_to_leave_out(faults, most=2)) == ["nid005001", "nid001003"]
    many = [NodeFault(f"n{i:03d}", str(i), "NODE_FAIL", f"2026-11-29T01:{i:02d}:00") for i in range(20)]
    assert list(nodes_to_leave_out(many)) == [f"n{i:03d}" for i in range(19, 19 - MOST_NODES_LEFT_OUT, -1)]
    assert nodes_to_leave_out([]) == {}


@pytest.mark.parametrize("hours", [6, 0.5])
def test_the_task_log_and_the_view_say_which_nodes_and_why(hours: float) -> None:
    left_out = nodes_to_leave_out(node_faults(ROWS[:2], fault_exit_codes=(89,)))
    assert left_out_words(left_out, hours) == (
        f"Leaving out nid005001 (sbatch --exclude): this project's jobs failed there for the node's fault in the "
        f"last {hours:g} h: nid005001 (job 11 ended exit 89 at 2026-11-29T01:05:00)")
    assert left_out_words({}, hours) == ""
    assert left_out_xcom("20", left_out) == {
        "job_id": "20", "nodes": {"nid005001": {"job_id": "11", "why": "exit 89", "ended": "2026-11-29T01:05:00"}}}


def test_the_same_exit_on_another_node_of_the_same_task_is_not_a_nodes_fault() -> None:
    from slurm_provider.bad_nodes import same_fault_elsewhere
    from slurm_provider.job_status import JobStatus
    from slurm_provider.state_vocabulary import SlurmState

    def failed(job_id: str, code: int, nodes: str) -> JobStatus:
        return JobStatus(job_id=job_id, state=SlurmState.FAILED, exit_code=code, node_list=nodes, source="sacct")

    ended = failed("3", 89, "nid005002")
    assert same_fault_elsewhere(ended, [failed("1", 89, "nid005002"), failed("2", 87, "nid005003")]) is None
    assert same_fault_elsewhere(ended, [failed("1", 89, "nid[005001-005002]")]).job_id == "1"
    assert same_fault_elsewhere(ended, [failed("1", 89, "None assigned"), ended]) is None
