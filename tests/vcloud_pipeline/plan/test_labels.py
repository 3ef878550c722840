"""Job labels as a type: a label read back from an XCom, a ledger or a job comment is looked up, never parsed."""

from __future__ import annotations

import pytest

from vcloud_pipeline.plan.labels import STAGE_LABELS, JobLabel, training_label


@pytest.mark.parametrize("text, expected", [
    ("stage0", JobLabel.STAGE0), ("stage3", JobLabel.STAGE3), (JobLabel.STAGE2, JobLabel.STAGE2),
    ("data", None), ("export", None), ("preflight", None), ("stage4", None), ("stage", None), ("Stage1", None),
    ("", None), (None, None), (1, None),
])
def test_a_training_stages_label_is_known_by_name_and_nothing_else_is(text: object, expected: JobLabel | None) -> None:
    assert training_label(text) is expected


def test_every_stage_has_one_label_and_back() -> None:
    assert [label.stage for label in STAGE_LABELS] == [0, 1, 2, 3]
    assert [JobLabel.of_stage(stage) for stage in range(4)] == list(STAGE_LABELS)
    with pytest.raises(ValueError, match="stage 4 not a training stage"):
        JobLabel.of_stage(4)
