"""Job states and pending reasons: parsing every spelling Slurm uses, and what each one means."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slurm_provider.state_vocabulary import (
    SlurmState,
    StateCategory,
    category,
    is_retryable,
    is_success,
    is_terminal,
    parse_state,
    parse_state_text,
)
from slurm_provider.pending_reasons import ReasonKind, classify_pending_reason, split_reason

GOLDEN = Path(__file__).parent / "golden"

SHORT_CODES = {
    "PD": SlurmState.PENDING,
    "CF": SlurmState.CONFIGURING,
    "R": SlurmState.RUNNING,
    "CG": SlurmState.COMPLETING,
    "CD": SlurmState.COMPLETED,
    "F": SlurmState.FAILED,
    "TO": SlurmState.TIMEOUT,
    "CA": SlurmState.CANCELLED,
    "NF": SlurmState.NODE_FAIL,
    "PR": SlurmState.PREEMPTED,
    "OOM": SlurmState.OUT_OF_MEMORY,
    "BF": SlurmState.BOOT_FAIL,
    "DL": SlurmState.DEADLINE,
    "RQ": SlurmState.REQUEUED,
    "RH": SlurmState.REQUEUE_HOLD,
    "RF": SlurmState.REQUEUE_FED,
    "RS": SlurmState.RESIZING,
    "RV": SlurmState.REVOKED,
    "SI": SlurmState.SIGNALING,
    "SE": SlurmState.SPECIAL_EXIT,
    "SO": SlurmState.STAGE_OUT,
    "ST": SlurmState.STOPPED,
    "S": SlurmState.SUSPENDED,
    "RD": SlurmState.RESV_DEL_HOLD,
}


@pytest.mark.parametrize(("code", "state"), sorted(SHORT_CODES.items()))
def test_short_codes_parse_and_round_trip(code: str, state: SlurmState) -> None:
    assert parse_state(code) is state
    assert parse_state(code.lower()) is state
    assert state.short_code == code


def test_every_state_has_a_distinct_short_code_and_a_description() -> None:
    real = [s for s in SlurmState if s is not SlurmState.UNKNOWN]
    assert len({s.short_code for s in real}) == len(real) == 24
    assert all(s.description.endswith(".") for s in SlurmState)


@pytest.mark.parametrize("state", list(SlurmState))
def test_long_names_in_any_case_and_with_plus_suffix(state: SlurmState) -> None:
    assert parse_state(state.value) is state
    assert parse_state(state.value.lower()) is state
    assert parse_state(f"{state.value}+") is state
    assert parse_state(f"  {state.value}\n") is state


@pytest.mark.parametrize(
    ("text", "state", "by"),
    [
        ("CANCELLED by 1234", SlurmState.CANCELLED, "1234"),
        ("CANCELLED by 0", SlurmState.CANCELLED, "0"),
        ("cancelled+ by 1001", SlurmState.CANCELLED, "1001"),
        ("CANCELED", SlurmState.CANCELLED, None),
        ("FAILED by 5", SlurmState.FAILED, None),  # only cancellations carry an author
    ],
)
def test_cancelled_by(text: str, state: SlurmState, by: str | None) -> None:
    parsed = parse_state_text(text)
    assert parsed.state is state
    assert parsed.cancelled_by == by
    assert parsed.raw == text.strip()


@pytest.mark.parametrize("text", [None, "", "   ", "NOT_FOUND", "BOGUS", "123", "?"])
def test_unknown_or_not_found_is_never_success_nor_terminal(text: str | None) -> None:
    assert parse_state(text) is SlurmState.UNKNOWN
    assert not is_success(text)
    assert not is_terminal(text)
    assert category(text) is StateCategory.UNKNOWN


def test_categories() -> None:
    assert {s for s in SlurmState if s.category is StateCategory.SUCCESS} == {SlurmState.COMPLETED}
    assert {s for s in SlurmState if s.category is StateCategory.INTERRUPTED} == {
        SlurmState.TIMEOUT,
        SlurmState.NODE_FAIL,
        SlurmState.PREEMPTED,
        SlurmState.BOOT_FAIL,
    }
    assert {s for s in SlurmState if s.category is StateCategory.FAILED} == {
        SlurmState.FAILED,
        SlurmState.CANCELLED,
        SlurmState.OUT_OF_MEMORY,
        SlurmState.DEADLINE,
        SlurmState.REVOKED,
        SlurmState.SPECIAL_EXIT,
    }
    waiting = {s for s in SlurmState if s.category is StateCategory.WAITING}
    assert {SlurmState.PENDING, SlurmState.RUNNING, SlurmState.COMPLETING, SlurmState.REQUEUED} <= waiting
    assert not any(s.is_terminal for s in waiting)


def test_predicates_accept_text_and_enum() -> None:
    assert is_terminal("TO") and is_retryable("timeout") and not is_success("TIMEOUT")
    assert is_success(SlurmState.COMPLETED) and is_terminal("CD")
    assert not is_terminal("CG"), "COMPLETING still has processes on the nodes"
    assert not is_retryable("FAILED") and not is_retryable("OOM")
    assert SlurmState.RUNNING.has_started and not SlurmState.PENDING.has_started


def test_states_seen_on_the_real_cluster() -> None:
    """Every state word in the captured sacct/squeue output parses to a known state."""
    seen = set()
    for name in ("sacct_finished", "sacct_requeue", "sacct_steps", "sacct_pending", "squeue_live"):
        for row in json.loads((GOLDEN / f"{name}.json").read_text())["rows"]:
            seen.add(row["state"])
    parsed = {text: parse_state(text) for text in seen}
    assert SlurmState.UNKNOWN not in parsed.values(), parsed
    assert parsed["CANCELLED by 1001"] is SlurmState.CANCELLED
    assert {SlurmState.TIMEOUT, SlurmState.REQUEUED, SlurmState.FAILED, SlurmState.PENDING} <= set(parsed.values())


# --- pending reasons -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("reason", "kind"),
    [
        ("Priority", ReasonKind.WAITING),
        ("Resources", ReasonKind.WAITING),
        ("BeginTime", ReasonKind.WAITING),
        ("Dependency", ReasonKind.WAITING),
        ("(Priority)", ReasonKind.WAITING),
        ("None", ReasonKind.WAITING),
        (None, ReasonKind.WAITING),
        ("JobArrayTaskLimit", ReasonKind.WAITING),
        ("PartitionDown", ReasonKind.WAITING),
        ("JobHeldUser", ReasonKind.HELD),
        ("JobHeldAdmin", ReasonKind.HELD),
        # The account's allocation: waiting or spent, which the account's figures tell (allocation.py).
        ("AssocGrpBillingMinutes", ReasonKind.ALLOCATION),
        ("AssocGrpCPUMinutesLimit", ReasonKind.ALLOCATION),
        ("AssocGrpGRESMinutes", ReasonKind.NEVER),
        ("QOSGrpBillingMinutes", ReasonKind.NEVER),
        ("AssocGrpWallLimit", ReasonKind.NEVER),
        ("AssocMaxWallDurationPerJobLimit", ReasonKind.NEVER),
        ("QOSMaxWallDurationPerJobLimit", ReasonKind.NEVER),
        ("AssocMaxCpuPerJobLimit", ReasonKind.NEVER),
        ("AssocMaxGRESPerJob", ReasonKind.NEVER),
        ("QOSMaxNodePerJobLimit", ReasonKind.NEVER),
        ("AssocMaxCpuMinutesPerJobLimit", ReasonKind.NEVER),
        ("QOSMinGRES", ReasonKind.NEVER),
        ("QOSMinCpuNotSatisfied", ReasonKind.NEVER),
        ("DependencyNeverSatisfied", ReasonKind.NEVER),
        ("PartitionTimeLimit", ReasonKind.NEVER),
        ("PartitionNodeLimit", ReasonKind.NEVER),
        ("InvalidAccount", ReasonKind.NEVER),
        ("InvalidQOS", ReasonKind.NEVER),
        ("BadConstraints", ReasonKind.NEVER),
        ("launch failed requeued held", ReasonKind.NEVER),
        # Concurrency limits: the job starts when the user's other jobs end.
        ("AssocGrpCpuLimit", ReasonKind.LIMIT),
        ("AssocGrpJobsLimit", ReasonKind.LIMIT),
        ("AssocGrpGRES", ReasonKind.LIMIT),
        ("AssocGrpCPURunMinutesLimit", ReasonKind.LIMIT),
        ("AssocGrpBillingRunMinutes", ReasonKind.LIMIT),
        ("AssocMaxJobsLimit", ReasonKind.LIMIT),
        ("AssocMaxSubmitJobLimit", ReasonKind.LIMIT),
        ("QOSGrpGRES", ReasonKind.LIMIT),
        ("QOSGrpNodeLimit", ReasonKind.LIMIT),
        ("QOSMaxJobsPerUserLimit", ReasonKind.LIMIT),
        ("QOSMaxGRESPerUser", ReasonKind.LIMIT),
        ("QOSMaxCpuPerUserLimit", ReasonKind.LIMIT),
        ("AssociationJobLimit", ReasonKind.LIMIT),
    ],
)
def test_reason_kinds(reason: str | None, kind: ReasonKind) -> None:
    result = classify_pending_reason(reason)
    assert result.kind is kind, result
    assert result.explanation and result.explanation[0].isupper()
    assert result.blocks_forever is (kind is ReasonKind.NEVER)


def test_the_allocation_reason_is_explained_in_plain_words_and_names_its_tres() -> None:
    result = classify_pending_reason("AssocGrpBillingMinutes")
    assert result.kind is ReasonKind.ALLOCATION and not result.blocks_forever
    assert "project's GPU-hour allocation" in result.explanation
    assert "GrpTRESMins" in result.explanation and "starts as they end" in result.explanation
    assert "shorten --time" in result.explanation
    assert result.allocation_tres == "billing"
    assert classify_pending_reason("AssocGrpCPUMinutesLimit").allocation_tres == "cpu"
    # GRES minutes name no single TRES and a QOS's usage is not the account's: they stay "never".
    gres = classify_pending_reason("AssocGrpGRESMinutes")
    assert "GPU/GRES-minutes limit" in gres.explanation and gres.allocation_tres is None
    assert gres.blocks_forever
    qos = classify_pending_reason("QOSGrpBillingMinutes")
    assert qos.blocks_forever and "GPU-hour allocation is used up" in qos.explanation
    assert classify_pending_reason("Priority").allocation_tres is None


def test_special_exit_is_over_for_its_watcher_but_keeps_its_place_in_the_queue() -> None:
    waiting = [s for s in SlurmState if s.category is StateCategory.WAITING]
    assert all(s.keeps_place_in_queue for s in waiting) and SlurmState.REQUEUE_HOLD in waiting
    assert SlurmState.SPECIAL_EXIT.is_terminal and SlurmState.SPECIAL_EXIT.keeps_place_in_queue
    gone = [SlurmState.COMPLETED, SlurmState.FAILED, SlurmState.CANCELLED, SlurmState.TIMEOUT,
            SlurmState.NODE_FAIL, SlurmState.PREEMPTED, SlurmState.OUT_OF_MEMORY, SlurmState.UNKNOWN]
    assert not any(s.keeps_place_in_queue for s in gone)


def test_unknown_reason_is_waiting_and_names_the_code() -> None:
    result = classify_pending_reason("SomeFutureReason")
    assert result.kind is ReasonKind.WAITING
    assert "SomeFutureReason" in result.explanation


def test_split_reason_forms() -> None:
    assert split_reason("(ReqNodeNotAvail, UnavailableNodes:nid[005001-005002])") == (
        "ReqNodeNotAvail",
        "UnavailableNodes:nid[005001-005002]",
    )
    assert split_reason("ReqNodeNotAvail,_UnavailableNodes:vcnode1") == ("ReqNodeNotAvail", "UnavailableNodes:vcnode1")
    assert split_reason("") == ("None", "")


def test_req_node_not_avail_depends_on_whether_the_named_nodes_are_down() -> None:
    reason = "ReqNodeNotAvail, UnavailableNodes:nid[005001-005002]"
    unknown = classify_pending_reason(reason)
    assert unknown.kind is ReasonKind.WAITING and unknown.unavailable_nodes == "nid[005001-005002]"
    down = classify_pending_reason(reason, down_nodes={"nid005001", "nid005002", "nid009999"})
    assert down.kind is ReasonKind.NEVER and "nid[005001-005002]" in down.explanation
    partly = classify_pending_reason(reason, down_nodes={"nid005001"})
    assert partly.kind is ReasonKind.WAITING
    maintenance = classify_pending_reason("ReqNodeNotAvail, Reserved for maintenance", down_nodes={"nid005001"})
    assert maintenance.kind is ReasonKind.WAITING and maintenance.unavailable_nodes is None
    sentence = classify_pending_reason(
        "(Nodes required for job are DOWN, DRAINED or reserved for jobs in higher priority partitions)"
    )
    assert sentence.code == "ReqNodeNotAvail" and sentence.kind is ReasonKind.WAITING


def test_reasons_captured_on_the_real_cluster() -> None:
    rows = json.loads((GOLDEN / "squeue_live.json").read_text())["rows"]
    kinds = {row["name"]: classify_pending_reason(row["reason"]).kind for row in rows if row["state"] == "PENDING"}
    assert kinds == {
        "gc-partlimit": ReasonKind.NEVER,
        "gc-depnever": ReasonKind.NEVER,
        "gc-held": ReasonKind.HELD,
        "gc-begin": ReasonKind.WAITING,
        "gc-throttled": ReasonKind.WAITING,
    }
