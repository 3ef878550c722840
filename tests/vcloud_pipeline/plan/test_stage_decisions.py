"""Skip logic: complete stages are skipped, missing inputs fail with the path, dry runs submit nothing."""

from __future__ import annotations

import json

import pytest

from vcloud.config import config_from_dict, load_config
from vcloud.contract import export_inputs_digest, exported_record
from vcloud.stage_records import CompleteRecord
from vcloud_pipeline.plan.layout import run_paths
from vcloud_pipeline.plan.request import parse_request
from vcloud_pipeline.profile import load_profile
from vcloud_pipeline.plan.stages import (
    ExportFiles,
    StageDecisionError,
    StageFiles,
    StagePlan,
    decide,
    decide_data,
    decide_export,
    stages_without_work,
)

LOCAL = load_profile("local")
LUMI = load_profile("lumi")
PATHS = run_paths(LOCAL, "r")
DONE = StageFiles(complete=120, best=4096, predecessor_best=4096)
FRESH = StageFiles(complete=None, best=None, predecessor_best=4096)


def plan(cluster=LOCAL, **conf) -> StagePlan:
    return StagePlan.build(parse_request({"profile": cluster.name, **conf}), cluster)


def test_a_complete_stage_is_skipped_and_an_incomplete_one_submitted() -> None:
    p = plan()
    skip = decide(p, 1, DONE, PATHS)
    assert not skip.submit
    assert "stage 1 is complete" in skip.reason and str(PATHS.complete_path(1)) in skip.reason
    assert decide(p, 1, FRESH, PATHS).submit
    # best.pt without COMPLETE: the stage stopped mid-way and resumes from latest.pt
    partial = decide(p, 2, StageFiles(complete=None, best=10, predecessor_best=10), PATHS)
    assert partial.submit and "resuming" in partial.reason and not partial.restart


def test_complete_marker_without_best_checkpoint_is_not_complete() -> None:
    assert decide(plan(), 0, StageFiles(complete=10, best=None), PATHS).submit


def test_start_stage_and_stage_selection_skip_the_others() -> None:
    p = plan(start_stage=2)
    assert not decide(p, 0, FRESH, PATHS).submit
    assert "not selected" in decide(p, 1, FRESH, PATHS).reason
    assert decide(p, 2, FRESH, PATHS).submit


def test_restart_trains_complete_stages_again_after_moving_them_aside() -> None:
    d = decide(plan(mode="restart"), 3, DONE, PATHS)
    assert d.submit and d.restart


def test_a_stage_without_its_predecessor_checkpoint_fails_naming_the_file() -> None:
    with pytest.raises(StageDecisionError, match=r"stage 2 reads stage 1's best.pt.*/outputs/r/stage1/best.pt"):
        decide(plan(stages=[2]), 2, StageFiles(complete=None, best=None, predecessor_best=None), PATHS)
    assert decide(plan(stages=[0]), 0, StageFiles(complete=None, best=None), PATHS).submit


def test_dry_run_submits_no_training_data_or_export_job() -> None:
    p = plan(dry_run=True)
    assert not decide(p, 0, FRESH, PATHS).submit
    assert not decide_data(p, None).submit
    assert not decide_export(p, None, PATHS).submit


TRAINED = {"stage0/best.pt": (4096, 1767225600), "stage0/COMPLETE": (310, 1767225600),
           "stage0/metrics.jsonl": (2200, 1767225599), "stage1/best.pt": (8192, 1767229200),
           "stage1/COMPLETE": (305, 1767229200), "stage1/metrics.jsonl": (4100, 1767229199)}


def marker_for(stamps: dict) -> str:
    """The ``EXPORTED`` an export of ``stamps`` writes (vcloud.export)."""
    return json.dumps(exported_record(inputs=export_inputs_digest(stamps), stamps=stamps, stage=1,
                                      checkpoint="/outputs/r/stage1/best.pt", series=4, code_hash=None))


@pytest.mark.parametrize("marker, stamps, submit, reason", [
    (None, TRAINED, True, "not exported yet (/srv/vcloud/scratch/vcloud/viewer_data/r/EXPORTED missing)"),
    # cleared or run again, nothing trained since: no second export of the same outputs
    (marker_for(TRAINED), TRAINED, False, f"already exported from these stage outputs (inputs "
                                          f"{export_inputs_digest(TRAINED)}, /srv/vcloud/scratch/vcloud/viewer_data/r/"
                                          "EXPORTED); a stage's new outputs export again"),
    # a stage trained again (its best.pt rewritten at the same size), a stage more, a stage moved aside
    (marker_for(TRAINED), {**TRAINED, "stage1/best.pt": (8192, 1767232800)}, True,
     "the stage outputs changed since the last export"),
    (marker_for(TRAINED), {**TRAINED, "stage2/best.pt": (9000, 1767232800)}, True, "changed since the last export"),
    (marker_for(TRAINED), {k: v for k, v in TRAINED.items() if k.startswith("stage0")}, True,
     "changed since the last export"),
    ("{half a", TRAINED, True, "EXPORTED unreadable"),
], ids=["not-exported", "same-outputs", "best-rewritten", "stage-added", "stage-moved-aside", "unreadable"])
def test_the_export_is_submitted_unless_its_marker_names_the_stage_outputs_there_are_now(
        marker: str | None, stamps: dict, submit: bool, reason: str) -> None:
    decision = decide_export(plan(), ExportFiles(marker=marker, stamps=stamps), PATHS)
    assert decision.submit is submit and reason in decision.reason, decision.reason
    if submit:
        assert decision.reason.startswith("exporting the viewer data of the best stage: ")


def test_an_export_not_asked_for_or_dry_is_decided_without_files() -> None:
    assert decide_export(plan(export=False), None, PATHS).reason == "export not requested"
    assert decide_export(plan(dry_run=True), None, PATHS).reason == "dry run: no export job"
    assert decide_export(plan(), None, PATHS).submit


def test_synthetic_data_only_where_the_profile_has_no_real_dataset() -> None:
    assert plan().data_preset == "tiny"
    assert decide_data(plan(), None).submit
    assert not decide_data(plan(), 2048).submit
    assert plan(LUMI, config="full").data_preset is None
    assert not decide_data(plan(LUMI), None).submit
    with pytest.raises(StageDecisionError, match="config full needs the real dataset"):
        plan(config="full")


def test_job_specs_cover_every_job_with_the_requested_limits() -> None:
    specs = plan(time_limit="00:05:00", max_epochs=2).job_specs()
    assert list(specs) == ["preflight", "data", "stage0", "stage1", "stage2", "stage3", "export"]
    assert specs["stage1"].time_limit == "00:05:00" and specs["stage1"].max_epochs == 2
    assert specs["stage1"].on_code_change == "keep_weights" and specs["export"].on_code_change is None
    assert plan(on_code_change="refuse").job_specs()["stage3"].on_code_change == "refuse"
    assert specs["data"].data_preset == "tiny"
    assert "data" not in plan(LUMI).job_specs()


def test_a_complete_record_reads_the_trainer_complete_file() -> None:
    record = CompleteRecord.parse('{"epochs": 3, "final_metrics": {"psnr": 35.5}}')
    assert record is not None and record.final_metrics == {"psnr": 35.5}
    assert CompleteRecord.parse(None) is None
    assert CompleteRecord.parse("not json") is None


def test_best_checkpoint_metrics_are_those_of_best_pt_not_of_the_last_epoch() -> None:
    record = CompleteRecord.from_json({
        "epochs": 3, "final_metrics": {"psnr": 45.5},
        "best_metric": {"name": "psnr", "value": 48.1, "epoch": 0, "metrics": {"psnr": 48.1, "ssim": 0.99}}})
    assert record.best_epoch_and_metrics() == (0, {"psnr": 48.1, "ssim": 0.99})
    older = CompleteRecord.from_json({"epochs": 3, "final_metrics": {"psnr": 45.5},
                                      "best_metric": {"name": "psnr", "value": 48.1, "epoch": 2}})
    assert older.best_epoch_and_metrics() == (3, {"psnr": 45.5})


def _tiny(unlabeled_data: str = "", stage2_by_default: bool = True):
    from vcloud_pipeline.checkout import PROJECT_ROOT

    raw = load_config(PROJECT_ROOT / "trainer/configs/model_tiny.yaml").to_dict()
    raw["model"]["stage3"]["unlabeled_data"] = unlabeled_data
    raw["train"]["stage2"]["run_by_default"] = stage2_by_default
    return config_from_dict(raw)


def test_stage3_without_an_unlabeled_domain_is_not_submitted_unless_forced() -> None:
    request = parse_request({"profile": "local", "run_name": "r"})
    without = stages_without_work(request, _tiny())
    assert list(without) == [3]
    assert "model.stage3.unlabeled_data is empty in trainer/configs/model_tiny.yaml" in without[3]
    assert "force_stages [3]" in without[3]
    p = StagePlan.build(request, LOCAL, without)
    skip = decide(p, 3, FRESH, PATHS)
    assert not skip.submit and skip.reason == without[3]
    assert decide(p, 2, FRESH, PATHS).submit
    assert p.stages == (0, 1, 2) and "stage3" not in p.training_labels(), "no test-only, no worst case"
    assert "stage3" in p.job_specs(), "still rendered (a later run may force it)"

    assert stages_without_work(request, _tiny("../hazier")) == {}
    forced = parse_request({"profile": "local", "run_name": "r", "force_stages": [3]})
    assert stages_without_work(forced, _tiny()) == {}
    assert stages_without_work(parse_request({"profile": "local", "stages": [0, 1]}), _tiny()) == {}


def test_a_stage_off_by_default_is_not_submitted_and_the_next_starts_from_the_one_before() -> None:
    request = parse_request({"profile": "local", "run_name": "r"})
    without = stages_without_work(request, _tiny("../hazier", stage2_by_default=False))
    assert list(without) == [2]
    assert "train.stage2.run_by_default is false in trainer/configs/model_tiny.yaml" in without[2]
    assert "force_stages [2]" in without[2]
    p = StagePlan.build(request, LOCAL, without)
    skip = decide(p, 2, FRESH, PATHS)
    assert not skip.submit and skip.reason == without[2]
    assert p.stages == (0, 1, 3) and "stage2" not in p.training_labels()
    assert (p.predecessor(3), p.predecessor(2), p.predecessor(1)) == (1, 1, 0)
    assert decide(p, 3, FRESH, PATHS).submit
    with pytest.raises(StageDecisionError, match=r"stage 3 reads stage 1's best.pt, but .*/stage1/best.pt does not "
                                                 r"exist; run stage 1 first \(e.g. stages=\[1, 3\]\)"):
        decide(p, 3, StageFiles(complete=None, best=None, predecessor_best=None), PATHS)

    both = stages_without_work(request, _tiny(stage2_by_default=False))
    assert list(both) == [2, 3], "no domain to adapt to either"
    forced = parse_request({"profile": "local", "run_name": "r", "force_stages": [2]})
    assert list(stages_without_work(forced, _tiny(stage2_by_default=False))) == [3]
    assert StagePlan.build(forced, LOCAL, {3: "x"}).predecessor(3) == 2
