"""The stage directory is copied to shared storage at every checkpoint (``vcloud.training.mirror``).

Unit tests run the mirror on real checkpoints and markers (written by ``vcloud.checkpoint`` and
``vcloud.training.markers``) and check what the shared side holds: whole files only, in an order
that keeps it consistent, only what changed. A copy that fails or whose process dies half-way is
real: a subprocess runs the mirror under a file-size limit (``RLIMIT_FSIZE``), which the big
checkpoint exceeds in the middle of its copy (the kernel then kills the process with SIGXFSZ, or,
with SIGXFSZ ignored as Python ignores it by default, fails the write with EFBIG).

The trainer test runs tiny stage 0 with :data:`~vcloud.contract.OUTPUTS_MIRROR_ENV` set to a second
directory, kills it with SIGKILL (a node failure: nothing runs after it) after an epoch-end or an
intra-epoch checkpoint, then resumes from a copy of the mirror alone, as the requeued job would
after staging it back, and ends bit-identical to an uninterrupted run.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from vcloud.checkpoint import load_latest, previous_generation, save_checkpoint
from vcloud.contract import LATEST_CHECKPOINT, OUTPUTS_MIRROR_ENV
from vcloud.training import markers
from vcloud.training.loop import move_stage_aside
from vcloud.training.mirror import TEMP_SUFFIX, mirror_after_checkpoint, mirror_stage
from vcloud.training.paths import StagePaths

REPO = Path(__file__).resolve().parents[3]
PREV = previous_generation(Path(LATEST_CHECKPOINT)).name
WEIGHTS = 400_000
"""float32 values in a test checkpoint: 1.6 MB, above the mirror's small-file size."""
SIZE_LIMIT = 256 * 1024
"""RLIMIT_FSIZE for the failing copies: markers fit, a checkpoint does not."""


def _checkpoint(paths: StagePaths, step: int) -> None:
    """What the loop writes at a checkpoint: latest.pt (the old one kept as latest.prev.pt), then
    progress.json."""
    save_checkpoint(paths.latest, {"stage": paths.stage, "model": {"w": torch.full((WEIGHTS,), float(step))},
                                   "epoch": step, "global_step": step}, keep_previous=True)
    markers.write_json(paths.progress, {"status": "running", "step": step})


def _stage(tmp_path: Path, steps: int = 2) -> tuple[StagePaths, Path]:
    """A local stage directory after ``steps`` checkpoints, with best.pt and curve files; and the
    mirror root."""
    paths = StagePaths(tmp_path / "local" / "run", 0)
    save_checkpoint(paths.best, {"stage": 0, "model": {"w": torch.zeros(WEIGHTS)}}, keep_previous=False)
    (paths.dir / "metrics.jsonl").write_text('{"kind": "train", "global_step": 1}\n')
    (paths.dir / "tensorboard").mkdir()
    (paths.dir / "tensorboard" / "events.out.tfevents.1").write_bytes(b"\0" * 100)
    for step in range(1, steps + 1):
        _checkpoint(paths, step)
    return paths, tmp_path / "shared" / "run"


def _shared_step(shared: Path) -> int:
    loaded = load_latest(shared / "stage0" / LATEST_CHECKPOINT)
    assert loaded is not None
    state, read = loaded
    assert read.name == LATEST_CHECKPOINT
    return state["global_step"]


def _snapshot(directory: Path) -> dict[str, bytes]:
    return {p.relative_to(directory).as_posix(): p.read_bytes()
            for p in sorted(directory.rglob("*")) if p.is_file()}


def test_a_pass_copies_the_stage_whole_checkpoints_before_the_markers(tmp_path: Path) -> None:
    paths, shared = _stage(tmp_path)
    markers.write_json(paths.complete, {"stage": 0})
    report = mirror_stage(paths.run_dir, 0, shared)
    assert report.copied == ["best.pt", "metrics.jsonl", "tensorboard/events.out.tfevents.1",
                             PREV, LATEST_CHECKPOINT, "progress.json", "COMPLETE"]
    assert _snapshot(shared / "stage0") == _snapshot(paths.dir)
    for rel in report.copied:  # rsync -a's quick check (the job's copy-back) finds nothing to do
        local, remote = (paths.dir / rel).stat(), (shared / "stage0" / rel).stat()
        assert (remote.st_mtime_ns, remote.st_mode) == (local.st_mtime_ns, local.st_mode)
    assert _shared_step(shared) == 2
    assert not list(shared.rglob(f"*{TEMP_SUFFIX}"))


def test_repeated_passes_copy_only_what_changed_and_link_the_previous_generation(tmp_path: Path) -> None:
    paths, shared = _stage(tmp_path)
    mirror_stage(paths.run_dir, 0, shared)
    assert not mirror_stage(paths.run_dir, 0, shared).changed

    shared_latest = (shared / "stage0" / LATEST_CHECKPOINT).stat()
    _checkpoint(paths, 3)
    report = mirror_stage(paths.run_dir, 0, shared)
    assert (report.linked, report.copied) == ([PREV], [LATEST_CHECKPOINT, "progress.json"])
    assert (shared / "stage0" / PREV).stat().st_ino == shared_latest.st_ino  # not copied a second time
    assert _snapshot(shared / "stage0") == _snapshot(paths.dir)
    assert _shared_step(shared) == 3

    # A marker rewritten at the same size within one tick of the file system clock is still copied.
    progress = paths.progress.stat()
    paths.progress.write_text(paths.progress.read_text().replace('"step": 3', '"step": 4'))
    os.utime(paths.progress, ns=(progress.st_atime_ns, progress.st_mtime_ns))
    assert mirror_stage(paths.run_dir, 0, shared).copied == ["progress.json"]
    assert (shared / "stage0" / "progress.json").read_text() == paths.progress.read_text()


def _mirror_under_size_limit(paths: StagePaths, shared: Path, *,
                             ignore_sigxfsz: bool) -> subprocess.CompletedProcess:
    script = f"""
import logging, resource, signal, sys
from pathlib import Path
logging.basicConfig(level=logging.INFO)
signal.signal(signal.SIGXFSZ, signal.SIG_IGN if {ignore_sigxfsz} else signal.SIG_DFL)  # Python ignores it
resource.setrlimit(resource.RLIMIT_FSIZE, ({SIZE_LIMIT}, {SIZE_LIMIT}))
from vcloud.training.mirror import mirror_after_checkpoint
report = mirror_after_checkpoint(Path(sys.argv[1]), 0, {{"{OUTPUTS_MIRROR_ENV}": sys.argv[2]}})
print("training goes on", report)
"""
    env = {**os.environ, "PYTHONPATH": str(REPO / "trainer" / "src"), "PYTHONDONTWRITEBYTECODE": "1"}
    return subprocess.run([sys.executable, "-c", script, str(paths.run_dir), str(shared)], env=env,
                          capture_output=True, text=True, timeout=60)


def test_a_copy_killed_half_way_leaves_the_shared_checkpoint_whole_and_the_marker_behind(
        tmp_path: Path) -> None:
    paths, shared = _stage(tmp_path)
    mirror_stage(paths.run_dir, 0, shared)
    before = _snapshot(shared / "stage0")
    _checkpoint(paths, 3)

    killed = _mirror_under_size_limit(paths, shared, ignore_sigxfsz=False)
    assert killed.returncode == -signal.SIGXFSZ, killed.stdout + killed.stderr
    partial = list((shared / "stage0").glob(f".{LATEST_CHECKPOINT}.*{TEMP_SUFFIX}"))
    assert len(partial) == 1 and partial[0].stat().st_size == SIZE_LIMIT  # died in the middle of the copy
    after = _snapshot(shared / "stage0")
    assert after.pop(partial[0].name) and after.pop(PREV) == before[LATEST_CHECKPOINT]  # linked before
    assert after == {k: v for k, v in before.items() if k != PREV}  # latest.pt and progress.json untouched
    assert _shared_step(shared) == 2

    report = mirror_stage(paths.run_dir, 0, shared)  # the next checkpoint's pass
    assert report.copied == [LATEST_CHECKPOINT, "progress.json"]
    assert not list(shared.rglob(f"*{TEMP_SUFFIX}")), "a stale temporary was left on shared storage"
    assert _snapshot(shared / "stage0") == _snapshot(paths.dir) and _shared_step(shared) == 3


def test_a_failed_copy_is_logged_does_not_stop_training_and_is_retried(tmp_path: Path) -> None:
    paths, shared = _stage(tmp_path)
    mirror_stage(paths.run_dir, 0, shared)
    _checkpoint(paths, 3)
    _checkpoint(paths, 4)  # both generations new: nothing to link, the first big copy fails

    failed = _mirror_under_size_limit(paths, shared, ignore_sigxfsz=True)
    assert failed.returncode == 0 and "training goes on None" in failed.stdout, failed.stdout + failed.stderr
    assert "ERROR" in failed.stderr and "copying stage 0" in failed.stderr
    assert "File too large" in failed.stderr
    assert "next checkpoint retries" in failed.stderr
    assert not list(shared.rglob(f"*{TEMP_SUFFIX}")), "the failed copy left its temporary behind"
    assert _shared_step(shared) == 2
    assert markers.read_json(shared / "stage0" / "progress.json")["step"] == 2  # not ahead of its checkpoint

    report = mirror_after_checkpoint(paths.run_dir, 0, {OUTPUTS_MIRROR_ENV: str(shared)})
    assert report is not None and report.copied == [PREV, LATEST_CHECKPOINT, "progress.json"]
    assert _snapshot(shared / "stage0") == _snapshot(paths.dir) and _shared_step(shared) == 4


def test_what_the_trainer_removed_or_moved_aside_goes_the_same_way_first(tmp_path: Path) -> None:
    paths, shared = _stage(tmp_path)
    markers.write_json(paths.complete, {"stage": 0, "epochs": 2})
    mirror_stage(paths.run_dir, 0, shared)

    paths.complete.unlink()  # the loop removes a COMPLETE that is stale (epoch count raised)
    _checkpoint(paths, 3)
    report = mirror_stage(paths.run_dir, 0, shared)
    assert report.removed == ["COMPLETE"] and not (shared / "stage0" / "COMPLETE").exists()

    old = _snapshot(shared / "stage0")
    aside = move_stage_aside(paths, "--restart")
    assert aside is not None
    paths.dir.mkdir()
    _checkpoint(paths, 1)
    report = mirror_stage(paths.run_dir, 0, shared)
    assert report.moved_aside == aside.name
    assert _snapshot(shared / aside.name) == old  # nothing deleted; old and new never mix
    assert sorted(_snapshot(shared / "stage0")) == [LATEST_CHECKPOINT, "progress.json"]
    assert _shared_step(shared) == 1
    assert not mirror_stage(paths.run_dir, 0, shared).changed


def test_without_the_variable_nothing_is_copied(tmp_path: Path) -> None:
    paths, shared = _stage(tmp_path)
    assert mirror_after_checkpoint(paths.run_dir, 0, {}) is None
    same = mirror_after_checkpoint(paths.run_dir, 0, {OUTPUTS_MIRROR_ENV: str(paths.run_dir)})
    assert same is not None and not same.changed
    assert not shared.exists()


# ---- the trainer ------------------------------------------------------------------------------

# The tiny stage and the in-step SIGKILL of the resume tests: the same run, killed the same way.
from tests.vcloud.training.test_resume import EPOCHS, KILL_AT_STEP, STEPS_PER_EPOCH, TINY  # noqa: E402


def _train(config: Path, data: Path, out: Path, mirror: Path, kill_at_step: int | None = None
           ) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO / "trainer" / "src"),
           "PYTHONHASHSEED": "0", OUTPUTS_MIRROR_ENV: str(mirror)}
    env.pop("SLURM_JOB_ID", None)
    args = ["--stage", "0", "--config", str(config), "--data", str(data), "--out", str(out)]
    command = [sys.executable, "-c", KILL_AT_STEP, str(kill_at_step), *args] if kill_at_step else \
        [sys.executable, "-m", "vcloud.train", *args]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=240)


@pytest.fixture(scope="module")
def uninterrupted(tiny_prepared: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    tmp = tmp_path_factory.mktemp("mirror_reference")
    raw = yaml.safe_load(TINY.read_text())
    raw["train"]["checkpoint_every_steps"] = 2  # latest.pt after steps 2, 3 (epoch 1), 4, 6 (epoch 2), 8, 9
    raw["train"]["stage0"]["epochs"] = EPOCHS
    config = tmp / "mirror.yaml"
    config.write_text(yaml.safe_dump(raw))
    proc = _train(config, tiny_prepared, tmp / "node" / "outputs", tmp / "shared" / "outputs")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "mirrored to" in proc.stdout
    # At the end the mirror holds the finished stage, file for file.
    assert _snapshot(tmp / "shared" / "outputs" / "stage0") == _snapshot(tmp / "node" / "outputs" / "stage0")
    return config, torch.load(tmp / "node" / "outputs" / "stage0" / LATEST_CHECKPOINT, weights_only=True)


# Killed inside optimizer step 4 (the last checkpoint is epoch 1's end, step 3) or step 6 (the last
# checkpoint is step 4, inside epoch 2).
@pytest.mark.parametrize(("kill_at_step", "checkpointed_step"), [(4, 3), (6, 4)])
def test_after_a_node_failure_the_mirror_alone_resumes_to_the_same_weights(
        kill_at_step: int, checkpointed_step: int, uninterrupted, tiny_prepared: Path,
        tmp_path: Path) -> None:
    config, expected = uninterrupted
    node, shared = tmp_path / "node" / "outputs", tmp_path / "shared" / "outputs"
    killed = _train(config, tiny_prepared, node, shared, kill_at_step=kill_at_step)
    assert killed.returncode == -signal.SIGKILL, killed.stdout + killed.stderr

    mirrored = shared / "stage0"
    state = torch.load(mirrored / LATEST_CHECKPOINT, weights_only=True)
    assert state["global_step"] == checkpointed_step
    assert torch.load(mirrored / PREV, weights_only=True)["global_step"] < checkpointed_step
    progress = markers.read_json(mirrored / "progress.json")
    # progress.json is up to date with the mirrored checkpoint, and not ahead of it
    assert (progress["step"], progress["epoch"]) == (checkpointed_step, state["epoch"])
    assert (mirrored / "best.pt").exists() and not (mirrored / "COMPLETE").exists()
    assert not list(shared.rglob("*.tmp"))

    # The node is gone; the requeued job stages the shared outputs to its own node-local disk.
    shutil.rmtree(tmp_path / "node")
    new_node = tmp_path / "node2" / "outputs"
    shutil.copytree(shared, new_node)  # copy2: modification times kept, as rsync -a does
    resumed = _train(config, tiny_prepared, new_node, shared)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert f"resumed from {new_node / 'stage0' / LATEST_CHECKPOINT}" in resumed.stdout

    final = torch.load(new_node / "stage0" / LATEST_CHECKPOINT, weights_only=True)
    assert final["global_step"] == expected["global_step"] == EPOCHS * STEPS_PER_EPOCH
    for name, tensor in expected["model"].items():
        assert torch.equal(final["model"][name], tensor), f"weights of {name} differ after resuming"
    for pid, ref_state in expected["optimizer"]["state"].items():
        for key, value in ref_state.items():
            assert torch.equal(final["optimizer"]["state"][pid][key], value), f"optimizer {pid}.{key} differs"
    strip = ("seconds", "samples_per_s")
    assert [{k: v for k, v in h.items() if k not in strip} for h in final["train_state"]["history"]] == \
        [{k: v for k, v in h.items() if k not in strip} for h in expected["train_state"]["history"]]
    assert (mirrored / "COMPLETE").exists()
    assert _snapshot(mirrored) == _snapshot(new_node / "stage0")
