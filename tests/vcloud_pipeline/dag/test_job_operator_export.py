"""The export task decides from the export's done marker and the stage outputs' stamps, as a stage
decides from its ``COMPLETE``: an exported run cleared or run again submits no second export."""

from __future__ import annotations

import json
from typing import Any

import pytest
from airflow.sdk.exceptions import AirflowSkipException

from vcloud.contract import export_inputs_digest, exported_done_name, exported_record
from vcloud_pipeline.dag.job_operator import PipelineJobOperator
from vcloud_pipeline.plan.labels import JobLabel
from vcloud_pipeline.plan.request import parse_request
from vcloud_pipeline.plan.run_plan import RunPlan
from tests.vcloud_pipeline.conftest import complete_profile

PLAN = RunPlan.build(parse_request({"profile": "local", "config": "tiny", "run_name": "exported"}),
                     complete_profile("local"))
OUTPUTS = PLAN.paths.outputs_dir
STAMPS = {f"{OUTPUTS}/stage0/best.pt": (4096, 1767225600), f"{OUTPUTS}/stage0/COMPLETE": (310, 1767225600)}


class LoginNode:
    """The two answers the export's decision asks for: the inputs' stamps and the marker's text."""

    def __init__(self, stamps: dict[str, tuple[int, int]], marker: str | None) -> None:
        self.stamps, self.marker, self.calls = stamps, marker, []

    def file_stamps(self, paths: Any) -> dict[str, tuple[int, int]]:
        wanted = list(paths)
        self.calls.append(("file_stamps", len(wanted)))
        return {p: s for p, s in self.stamps.items() if p in wanted}

    def read_file(self, path: str) -> str | None:
        self.calls.append(("read_file", path))
        return self.marker if path == str(PLAN.paths.exported_marker) else None


def _marker(stamps: dict[str, tuple[int, int]]) -> str:
    by_name = {path.removeprefix(f"{OUTPUTS}/"): stamp for path, stamp in stamps.items()}
    return json.dumps(exported_record(inputs=export_inputs_digest(by_name), stamps=by_name, stage=0,
                                      checkpoint=f"{OUTPUTS}/stage0/best.pt", series=4, code_hash=None))


@pytest.mark.parametrize("marker, submit", [
    (None, True),
    (_marker(STAMPS), False),
    (_marker({**STAMPS, f"{OUTPUTS}/stage0/best.pt": (4096, 1767229200)}), True),
], ids=["never-exported", "exported-unchanged", "checkpoint-changed"])
def test_the_export_task_reads_the_marker_and_the_stamps_in_two_commands_and_decides(
        marker: str | None, submit: bool) -> None:
    operator = PipelineJobOperator(task_id="export", job=JobLabel.EXPORT)
    node = LoginNode(STAMPS, marker)
    decision = operator._decide(PLAN, node)  # type: ignore[arg-type]
    assert decision is not None and decision.submit is submit, decision
    assert node.calls == [("file_stamps", 12), ("read_file", str(PLAN.paths.exported_marker))]


def test_an_exported_run_skips_the_export_task_with_the_reason_in_its_log(
        capsys: pytest.CaptureFixture[str]) -> None:
    operator = PipelineJobOperator(task_id="export", job=JobLabel.EXPORT)
    with pytest.raises(AirflowSkipException, match="already exported from these stage outputs"):
        operator._before_submitting(PLAN, LoginNode(STAMPS, _marker(STAMPS)))  # type: ignore[arg-type]
    assert "export: already exported from these stage outputs (inputs " in capsys.readouterr().out


def test_a_run_that_exports_nothing_reads_no_file() -> None:
    plan = RunPlan.build(parse_request({"profile": "local", "config": "tiny", "run_name": "noexport",
                                        "export": False}), complete_profile("local"))
    node = LoginNode(STAMPS, None)
    decision = PipelineJobOperator(task_id="export", job=JobLabel.EXPORT)._decide(plan, node)  # type: ignore[arg-type]
    assert decision is not None and not decision.submit and node.calls == []


def test_the_export_submit_looks_under_the_lock_for_the_done_marker_of_the_outputs_there_are_now() -> None:
    """As a stage's submit looks for its ``COMPLETE``: a second submit of one export, racing the first
    (two deployments, a re-trigger), finds ``EXPORTED.<digest>`` once the first export is done."""
    operator = PipelineJobOperator(task_id="export", job=JobLabel.EXPORT)
    operator._decide(PLAN, LoginNode(STAMPS, None))  # type: ignore[arg-type]
    by_name = {path.removeprefix(f"{OUTPUTS}/"): stamp for path, stamp in STAMPS.items()}
    assert operator.done_markers == (exported_done_name(export_inputs_digest(by_name)),)
    assert operator.done_markers[0] == f"EXPORTED.{export_inputs_digest(by_name)}"
    changed = {**STAMPS, f"{OUTPUTS}/stage0/best.pt": (4096, 1767229200)}
    operator._decide(PLAN, LoginNode(changed, None))  # type: ignore[arg-type]
    assert operator.done_markers != (exported_done_name(export_inputs_digest(by_name)),)


def test_a_done_name_is_made_of_a_digest_only() -> None:
    with pytest.raises(ValueError, match="not an export inputs digest"):
        exported_done_name("../COMPLETE")
