"""The lineage record of a stage's checkpoints: what it was built from, compared with the run now."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from vcloud.contract import describe_built_from, describe_lineage, recorded_lineage
from vcloud.stage_records import CompleteRecord
from vcloud.lineage import Replaced, checkpoint_digest, current_digests, lineage_json, replaced_since, resume_refusal

A, B, C = "a" * 64, "b" * 64, "c" * 64


@pytest.mark.parametrize(("recorded", "now", "replaced"), [
    ({}, {}, []),
    ({0: A, 1: B}, {0: A, 1: B}, []),
    ({0: A, 1: B}, {0: A, 1: C}, [Replaced(1, B, C)]),
    ({1: B}, {1: None}, [Replaced(1, B, None)]),
    ({0: A, 1: B}, {0: C, 1: C}, [Replaced(0, A, C), Replaced(1, B, C)]),
])
def test_replaced_since_names_each_predecessor_that_is_another_file_now(
        recorded: dict[int, str], now: dict[int, str | None], replaced: list[Replaced]) -> None:
    assert replaced_since(recorded, now) == replaced


def test_the_record_round_trips_and_reads_as_a_line() -> None:
    complete = CompleteRecord(stage=2, epochs=1, step=4, final_metrics={}, best=None, code_version="v",
                              lineage=lineage_json({1: B, 0: A}))
    record = complete.to_json()
    assert record["lineage"] == {"0": A, "1": B}
    assert recorded_lineage(record) == {0: A, 1: B} == complete.built_from()
    assert complete.describe_lineage() == f"built from stage 0 best.pt {A[:12]}, stage 1 best.pt {B[:12]}"
    assert describe_lineage(record) == f"built from stage 0 best.pt {A[:12]}, stage 1 best.pt {B[:12]}"
    assert describe_lineage({**record, "lineage": {}}) == "built from no earlier stage's best.pt"
    assert describe_lineage({**record, "lineage": None}) == "lineage not recorded"
    assert describe_lineage({"stage": 2}) == "lineage not recorded"  # a record written before lineages
    assert recorded_lineage({"stage": 2}) == {}


def test_resume_refusal_only_where_the_start_changed(tmp_path: Path) -> None:
    latest = tmp_path / "stage3" / "latest.pt"
    assert resume_refusal(3, latest, {0: A, 1: B}, {0: A, 1: B}) is None
    # stage 3 began on stage 2's untrained start; stage 2 has been trained since
    refused = resume_refusal(3, latest, {0: A, 1: B}, {0: A, 1: B, 2: C})
    assert refused == (
        f"{latest} holds weights built from stage 0 best.pt {A[:12]}, stage 1 best.pt {B[:12]}, but stage 3 would "
        f"now be {describe_built_from({0: A, 1: B, 2: C})}: an earlier stage was trained again while stage 3 was "
        "under way, and its weights do not go on from another start. Train stage 3 again (mode restart)")


def test_current_digests_read_the_run_directory_and_see_a_replaced_file(tmp_path: Path) -> None:
    best = tmp_path / "stage0" / "best.pt"
    best.parent.mkdir()
    best.write_bytes(b"weights")
    assert current_digests(tmp_path, {0: A, 1: B}) == {
        0: "9a129038d9a00aed0cf6a7ea059ca50a813449061ab87848cf1a13eafdf33b2c", 1: None}
    replacement = best.with_name(".best.pt.tmp")  # as a checkpoint is replaced: written aside, renamed over
    replacement.write_bytes(b"weight2")
    replacement.rename(best)
    assert checkpoint_digest(best) == hashlib.sha256(b"weight2").hexdigest()
