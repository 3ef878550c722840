"""RunPaths: every remote path of a run, from one function."""

from __future__ import annotations

from pathlib import PurePosixPath

import pytest

from vcloud_pipeline.plan.layout import MANIFEST_NAME, RunNameError, is_code_hash, run_paths
from vcloud_pipeline.profile import load_profile


def test_lumi_run_paths() -> None:
    paths = run_paths(load_profile("lumi"), "full")
    base = PurePosixPath("/scratch/project_465002500/vcloud")
    assert paths.code_root == base / "code"
    assert paths.data_dir == base / "data/sen12mscrts_real/prepared"
    assert paths.outputs_dir == base / "outputs/full"
    assert paths.stage_dir(1) == base / "outputs/full/stage1"
    assert paths.progress_path(2) == base / "outputs/full/stage2/progress.json"
    assert paths.complete_path(0) == base / "outputs/full/stage0/COMPLETE"
    assert paths.latest_checkpoint(3) == base / "outputs/full/stage3/latest.pt"
    assert paths.best_checkpoint(0) == base / "outputs/full/stage0/best.pt"
    assert paths.logs_dir == base / "logs/full"
    assert paths.viewer_dir == base / "viewer_data/full"
    assert paths.jobs_dir == base / "jobs/full"
    code = paths.code("ab" * 32)
    assert code.dir == base / "code" / ("ab" * 32) and code.hash == "ab" * 32
    assert code.manifest == base / "code" / ("ab" * 32) / MANIFEST_NAME
    assert code.pythonpath_dir == base / "code" / ("ab" * 32) / "trainer/src"
    assert paths.code_being_removed("ab" * 32) == base / "code" / f".{'ab' * 32}.removing"
    assert paths.inner_script("vcloud-full-stage1", "ab" * 32) == base / f"jobs/full/vcloud-full-stage1.inner.{'ab' * 8}.sh"
    assert paths.logs_dir in paths.directories_to_create()
    # one per job, expanded in the job; hidden next to the job's logs, on storage all its nodes see
    assert paths.exit_records_dir("vcloud-full-stage1") == base / "logs/full/.vcloud-full-stage1.{job_id}.exits"


def test_runs_do_not_share_outputs() -> None:
    profile = load_profile("local")
    a, b = run_paths(profile, "a"), run_paths(profile, "b")
    assert a.code("0" * 64) == b.code("0" * 64) and a.data_dir == b.data_dir
    assert a.outputs_dir != b.outputs_dir and a.logs_dir != b.logs_dir and a.jobs_dir != b.jobs_dir


def test_each_synthetic_preset_has_its_own_dataset() -> None:
    profile = load_profile("local")
    base = PurePosixPath(profile.paths.data).parent
    tiny, small = run_paths(profile, "r", synthetic_preset="tiny"), run_paths(profile, "r", synthetic_preset="small")
    assert tiny.data_dir == base / "synthetic-tiny/prepared" and tiny.raw_data_dir == base / "synthetic-tiny/raw"
    assert small.data_dir == base / "synthetic-small/prepared" and small.data_index == small.data_dir / "index.json"
    assert run_paths(profile, "r").data_dir == PurePosixPath(profile.paths.data)
    with pytest.raises(RunNameError):
        run_paths(profile, "r", synthetic_preset="../x")


def test_the_run_context_reads_the_data_of_its_config() -> None:
    from vcloud_pipeline.plan.request import parse_request
    from vcloud_pipeline.dag.tasks import build_plan

    ctx = build_plan(parse_request({"profile": "local", "config": "small"}))
    assert ctx.paths.data_dir.parts[-2:] == ("synthetic-small", "prepared")
    assert "synthetic-small/prepared" in ctx.render("0" * 64)["stage1"].inner


def test_each_code_hash_has_its_own_directory() -> None:
    paths = run_paths(load_profile("local"), "r")
    first, second = paths.code("1" * 64), paths.code("2" * 64)
    assert first.dir != second.dir and first.dir.parent == second.dir.parent == paths.code_root
    assert paths.code_root in paths.directories_to_create()
    assert first.dir not in paths.directories_to_create()  # rsync creates it, the manifest completes it


@pytest.mark.parametrize("value", ["", "abc", "../" + "a" * 61, "A" * 64, "a" * 65, None, 7])
def test_a_code_directory_is_named_only_by_a_digest(value: object) -> None:
    assert not is_code_hash(value)
    with pytest.raises(ValueError, match="not a sha256 hex digest"):
        run_paths(load_profile("local"), "r").code(value)  # type: ignore[arg-type]


@pytest.mark.parametrize("stage", [-1, 4, "1", None])
def test_stage_numbers_are_checked(stage: object) -> None:
    with pytest.raises(ValueError, match="not a training stage"):
        run_paths(load_profile("local"), "r").stage_dir(stage)  # type: ignore[arg-type]


@pytest.mark.parametrize("run", ["", "../x", "a b", ".hidden", "x/y", "a" * 65, "-x", "run;rm", "ends."])
def test_unsafe_run_names_are_refused(run: str) -> None:
    with pytest.raises(RunNameError, match="is not allowed"):
        run_paths(load_profile("local"), run)


@pytest.mark.parametrize("run", ["full", "tiny-2026.02.16", "A_1"])
def test_safe_run_names(run: str) -> None:
    assert run_paths(load_profile("local"), run).run == run
