"""Exact resume: SIGKILL a real training process at a random step, resume, get bit-identical weights.

The reference run trains tiny stage 0 uninterrupted. The interrupted run is the same command in a
process that SIGKILLs itself at the k-th optimizer step (or in the middle of the k-th checkpoint
write, after the temporary file is written but before it is renamed); rerunning the command then
resumes from ``latest.pt`` (or ``latest.prev.pt``). Model, optimizer state, per-epoch losses and
validation metrics must equal the reference exactly, and so must the training curve: ``metrics.jsonl``
holds the reference's lines (step, loss, lr, validation metrics; wall-clock fields aside), each step
once, and TensorBoard shows each step once.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from vcloud.contract import parse_metrics_lines

REPO = Path(__file__).resolve().parents[3]
TINY = REPO / "trainer" / "configs" / "model_tiny.yaml"
EPOCHS = 3
STEPS_PER_EPOCH = 3  # tiny train split: 6 series, batch 2

KILL_AT_STEP = """
import os, signal, sys, torch
k = int(sys.argv[1])
calls = [0]
real_step = torch.optim.AdamW.step
def step(self, *args, **kwargs):
    calls[0] += 1
    if calls[0] == k:
        os.kill(os.getpid(), signal.SIGKILL)
    return real_step(self, *args, **kwargs)
torch.optim.AdamW.step = step
from vcloud.train import main
sys.exit(main(sys.argv[2:]))
"""

KILL_IN_CHECKPOINT_WRITE = """
import os, signal, sys
import vcloud.durable as durable
k = int(sys.argv[1])
calls = [0]
real_replace = os.replace
def replace(src, dst):
    if str(dst).endswith("latest.pt"):
        calls[0] += 1
        if calls[0] == k:
            os.kill(os.getpid(), signal.SIGKILL)
    return real_replace(src, dst)
durable.os.replace = replace
from vcloud.train import main
sys.exit(main(sys.argv[2:]))
"""


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=str(REPO / "trainer" / "src"), PYTHONHASHSEED="0")
    env.pop("SLURM_JOB_ID", None)
    return env


def _config(tmp_path: Path) -> Path:
    raw = yaml.safe_load(TINY.read_text())
    raw["train"]["checkpoint_every_steps"] = 2  # intra-epoch checkpoints, and some work lost per kill
    raw["train"]["stage0"]["epochs"] = EPOCHS
    raw["train"]["log_every_steps"] = 1  # a metrics.jsonl line per step: any lost or repeated step shows
    path = tmp_path / "resume.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def _train_args(config: Path, data: Path, out: Path) -> list[str]:
    return ["--stage", "0", "--config", str(config), "--data", str(data), "--out", str(out)]


def _run(args: list[str], script: str | None = None, extra: list[str] = ()) -> subprocess.CompletedProcess:
    command = [sys.executable, "-c", script, *extra, *args] if script else [sys.executable, "-m", "vcloud.train", *args]
    return subprocess.run(command, env=_env(), capture_output=True, text=True, timeout=240)


@pytest.fixture(scope="module")
def reference(tiny_prepared: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, dict, list]:
    tmp = tmp_path_factory.mktemp("resume_reference")
    config = _config(tmp)
    out = tmp / "run"
    proc = _run(_train_args(config, tiny_prepared, out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return config, tiny_prepared, torch.load(out / "stage0" / "latest.pt", weights_only=True), _curve(out)


def _curve(out: Path) -> list[dict]:
    """metrics.jsonl without its wall-clock fields."""
    records = parse_metrics_lines((out / "stage0" / "metrics.jsonl").read_text())
    return [{k: v for k, v in r.items() if k not in ("time", "samples_per_s")} for r in records]


def _assert_same_curve(out: Path, reference_curve: list[dict]) -> None:
    curve = _curve(out)
    steps = [r["global_step"] for r in curve if r["kind"] == "train"]
    assert steps == list(range(1, EPOCHS * STEPS_PER_EPOCH + 1)), f"train steps lost or repeated: {steps}"
    assert curve == reference_curve


def _tensorboard_steps(out: Path, tag: str) -> list[int]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(str(out / "stage0" / "tensorboard"))
    accumulator.Reload()
    return [event.step for event in accumulator.Scalars(tag)]


def _assert_identical(resumed: dict, reference: dict) -> None:
    assert resumed["global_step"] == reference["global_step"] == EPOCHS * STEPS_PER_EPOCH
    for name, tensor in reference["model"].items():
        assert torch.equal(resumed["model"][name], tensor), f"weights of {name} differ after resume"
    for pid, ref_state in reference["optimizer"]["state"].items():
        for key, value in ref_state.items():
            assert torch.equal(resumed["optimizer"]["state"][pid][key], value), f"optimizer {pid}.{key} differs"
    strip = ("seconds", "samples_per_s")
    ours = [{k: v for k, v in h.items() if k not in strip} for h in resumed["train_state"]["history"]]
    theirs = [{k: v for k, v in h.items() if k not in strip} for h in reference["train_state"]["history"]]
    assert ours == theirs


# Kill points whose last surviving checkpoint lies inside an epoch, so the resumed run must
# continue the epoch's data order mid-way. With 3 steps per epoch and checkpoint_every_steps=2,
# latest.pt is written after steps 2, 3 (epoch end), 4, 6 (epoch end), 8 and 9 (final).
KILL_POINTS = {
    # killed inside the k-th optimizer step: resumes from step 2, 4 (losing step 5) or 8
    "optimizer_step": (KILL_AT_STEP, (3, 5, 6, 9)),
    # killed between moving latest.pt to latest.prev.pt and renaming the new file into place:
    # latest.pt is missing and the run resumes from latest.prev.pt (steps 2, 4 or 8)
    "checkpoint_write": (KILL_IN_CHECKPOINT_WRITE, (2, 4, 6)),
}


@pytest.mark.parametrize("where", sorted(KILL_POINTS))
def test_sigkill_at_random_point_then_resume_is_bit_identical(where: str, reference, tmp_path: Path) -> None:
    config, data, expected, expected_curve = reference
    seed = random.randrange(1_000_000)
    script, candidates = KILL_POINTS[where]
    k = random.Random(seed).choice(candidates)
    out = tmp_path / "run"
    args = _train_args(config, data, out)
    killed = _run(args, script, [str(k)])
    context = f"(killed in {where} #{k}, seed {seed})\n{killed.stdout}{killed.stderr}"
    assert killed.returncode == -signal.SIGKILL, context
    assert not (out / "stage0" / "COMPLETE").exists()

    resumed = _run(args)
    assert resumed.returncode == 0, context + resumed.stdout + resumed.stderr
    assert "resumed from" in resumed.stdout, context
    _assert_identical(torch.load(out / "stage0" / "latest.pt", weights_only=True), expected)
    _assert_same_curve(out, expected_curve)
    assert (out / "stage0" / "COMPLETE").exists()
    assert not list((out / "stage0").glob(".*.tmp")), "stale temporary checkpoint left behind"


def test_resume_from_previous_generation_when_latest_is_corrupt(reference, tmp_path: Path) -> None:
    """Kill mid-run, truncate latest.pt: the run warns, resumes from latest.prev.pt, still ends identical."""
    config, data, expected, expected_curve = reference
    out = tmp_path / "run"
    args = _train_args(config, data, out)
    killed = _run(args, KILL_AT_STEP, ["4"])
    assert killed.returncode == -signal.SIGKILL
    latest = out / "stage0" / "latest.pt"
    latest.write_bytes(latest.read_bytes()[:1000])
    resumed = _run(args)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "resuming from the previous generation" in resumed.stdout
    _assert_identical(torch.load(latest, weights_only=True), expected)
    # killed in step 4 after lines 1-3, validation 3 and latest.pt of step 3; resumed from step 2:
    # line 3 and the validation dropped and written again, TensorBoard's copies hidden by purge_step
    assert "dropped 2 line(s) after step 2" in resumed.stdout
    _assert_same_curve(out, expected_curve)
    assert _tensorboard_steps(out, "train/loss") == list(range(1, EPOCHS * STEPS_PER_EPOCH + 1))
    assert _tensorboard_steps(out, "val/psnr") == [3, 6, 9]
