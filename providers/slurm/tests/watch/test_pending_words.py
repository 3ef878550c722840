"""A pending job's reason in a few words, with Slurm's estimated start (pure)."""

from __future__ import annotations

import pytest

from slurm_provider.watch.pending_words import REASON_WORDS, expected_start_words, reason_words, waiting_line
from slurm_provider.pending_reasons import classify_pending_reason


@pytest.mark.parametrize(("reason", "words"), [
    ("Priority", "waiting for higher-priority jobs"),
    ("Resources", "waiting for free nodes"),
    ("(Resources)", "waiting for free nodes"),
    ("QOSMaxGRESPerUser", "waiting: your GPUs in use are at the QOS per-user limit"),
    ("AssocGrpBillingMinutes", "waiting for the project's GPU-hour allocation"),
    ("ReqNodeNotAvail, UnavailableNodes:nid[005001-005002]",
     "waiting for nodes that are unavailable (down, drained or reserved)"),
    ("BeginTime", "waiting for its start time (--begin)"),
    ("Dependency", "waiting for the jobs it depends on"),
    ("JobHeldUser", "on user hold until released ('scontrol release <job id>')"),
    (None, "waiting to be scheduled"),
])
def test_common_reasons_in_words(reason: str | None, words: str) -> None:
    assert reason_words(reason) == words


@pytest.mark.parametrize(("reason", "words"), [
    ("AssocGrpMemLimit", "waiting for a usage limit (AssocGrpMemLimit)"),
    ("QOSMaxWallDurationPerJobLimit", "never starts as submitted (QOSMaxWallDurationPerJobLimit)"),
    ("SomethingNewInSlurm24", "waiting (SomethingNewInSlurm24)"),
])
def test_other_reasons_are_phrased_by_how_hopeful_they_are_with_their_code(reason: str, words: str) -> None:
    assert reason_words(reason) == words


def test_the_table_agrees_with_the_classification_on_which_reasons_never_start() -> None:
    for code, words in REASON_WORDS.items():
        never = classify_pending_reason(code).blocks_forever
        assert words.startswith("never starts") == never, code


def test_the_line_names_slurms_code_and_the_expected_start() -> None:
    assert waiting_line("Resources", "2026-11-27T14:05:33") == \
        "waiting for free nodes (Resources); expected to start 2026-11-27 14:05"
    assert waiting_line("ReqNodeNotAvail, UnavailableNodes:nid01", None) == \
        "waiting for nodes that are unavailable (down, drained or reserved) (ReqNodeNotAvail, UnavailableNodes:nid01)"
    assert waiting_line("AssocGrpMemLimit", None) == "waiting for a usage limit (AssocGrpMemLimit)"
    assert waiting_line(None, None) == "waiting to be scheduled"


@pytest.mark.parametrize("no_estimate", [None, "", "N/A", "Unknown"])
def test_no_estimate_says_nothing_about_the_start(no_estimate: str | None) -> None:
    assert expected_start_words(no_estimate) is None
