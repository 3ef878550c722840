"""Resuming stage 1 after a code change: real tiny training on the CPU, one process per code version.

Stage 0 trains once; stage 1 then trains one epoch with one code version and resumes (two epochs
asked) with another. A code version is a ``VCLOUD_CODE_HASH`` (what the job scripts set) and, where
it differs, a change made before the trainer starts: the optimizer as it was before CFDT's date
decay had a group of its own, or a change gate whose output convolution is wider. Every outcome is
an exit code and a message in the log, never a traceback.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from vcloud.checkpoint import save_checkpoint
from vcloud.contract import EXIT_RESUME_REFUSED

REPO = Path(__file__).resolve().parents[3]
TINY = REPO / "trainer" / "configs" / "model_tiny.yaml"
HASH_A, HASH_B = "a" * 64, "b" * 64

ONE_GROUP = """
import sys, torch
import vcloud.training.loop as loop
def build_optimizer(model, lr, weight_decay):
    return torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr, weight_decay=weight_decay)
loop.build_optimizer = build_optimizer
from vcloud.train import main
sys.exit(main(sys.argv[1:]))
"""
"""The trainer as it was before the date decay trained in an optimizer group of its own."""

WIDER_GATE = """
import sys
from torch import nn
import vcloud.models.cfdt as cfdt
built = cfdt.ChangeGate.__init__
def wider(self, cfg):
    built(self, cfg)
    self.pair_out = nn.Conv2d(cfg.gate_channels, 1, 5, padding=2)
cfdt.ChangeGate.__init__ = wider
from vcloud.train import main
sys.exit(main(sys.argv[1:]))
"""
"""A trainer whose change gate ends in a 5x5 convolution instead of a 3x3 one."""


def train(data: Path, out: Path, *, code: str, epochs: int, script: str | None = None,
          extra: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO / "trainer" / "src"), PYTHONHASHSEED="0",
               VCLOUD_CODE_HASH=code)
    env.pop("SLURM_JOB_ID", None)
    args = ["--stage", "1", "--config", str(TINY), "--data", str(data), "--out", str(out),
            "--max-epochs", str(epochs), *extra]
    command = [sys.executable, "-c", script, *args] if script else [sys.executable, "-m", "vcloud.train", *args]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=240)


@pytest.fixture(scope="module")
def stage0(tiny_prepared: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run directory whose stage 0 is complete (one epoch)."""
    out = tmp_path_factory.mktemp("stage0") / "run"
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO / "trainer" / "src"))
    proc = subprocess.run([sys.executable, "-m", "vcloud.train", "--stage", "0", "--config", str(TINY), "--data",
                           str(tiny_prepared), "--out", str(out), "--max-epochs", "1"],
                          env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return out


@pytest.fixture(scope="module")
def one_group_epoch(stage0: Path, tiny_prepared: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Stage 1 after one epoch by code A, whose optimizer has one group."""
    return _first_epoch(stage0, tiny_prepared, tmp_path_factory, ONE_GROUP)


@pytest.fixture(scope="module")
def current_epoch(stage0: Path, tiny_prepared: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Stage 1 after one epoch by code A, today's trainer."""
    return _first_epoch(stage0, tiny_prepared, tmp_path_factory, None)


def _first_epoch(stage0: Path, data: Path, tmp_path_factory: pytest.TempPathFactory, script: str | None) -> Path:
    out = tmp_path_factory.mktemp("stage1") / "run"
    shutil.copytree(stage0, out)
    proc = train(data, out, code=HASH_A, epochs=1, script=script)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (out / "stage1" / "COMPLETE").unlink()  # one epoch of the two the resumes ask for
    return out


def copy_of(run: Path, tmp_path: Path, *, legacy: bool = False) -> Path:
    """A copy of ``run`` to resume; ``legacy``: its latest.pt as written before fingerprints existed."""
    out = tmp_path / "run"
    shutil.copytree(run, out)
    if legacy:
        latest = out / "stage1" / "latest.pt"
        state = torch.load(latest, weights_only=True)
        del state["fingerprint"]
        save_checkpoint(latest, state, keep_previous=False)
    return out


def latest(out: Path) -> dict:
    return torch.load(out / "stage1" / "latest.pt", weights_only=True)


def no_traceback(proc: subprocess.CompletedProcess) -> None:
    assert "Traceback" not in proc.stdout + proc.stderr, proc.stdout + proc.stderr


def test_the_same_layout_resumes_weights_and_optimizer_state_as_before(current_epoch: Path, tiny_prepared: Path,
                                                                       tmp_path: Path) -> None:
    out = copy_of(current_epoch, tmp_path)
    proc = train(tiny_prepared, out, code=HASH_B, epochs=2)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"resumed from {out}/stage1/latest.pt: epoch 1, batch 0, step 1" in proc.stdout
    assert f"the checkpoint was written by code {HASH_A}; training goes on with code {HASH_B}" in proc.stdout
    assert "fresh optimizer" not in proc.stdout
    state = latest(out)
    assert state["code_hash"] == HASH_B and state["epoch"] == 2
    steps = {int(s["step"]) for s in state["optimizer"]["state"].values()}
    assert steps == {state["global_step"]}, "the optimizer's moments carried on from the checkpoint"


@pytest.mark.parametrize("legacy", [False, True], ids=["fingerprinted", "before-fingerprints"])
def test_new_optimizer_groups_resume_the_weights_with_a_fresh_optimizer(one_group_epoch: Path, tiny_prepared: Path,
                                                                        tmp_path: Path, legacy: bool) -> None:
    out = copy_of(one_group_epoch, tmp_path, legacy=legacy)
    before = latest(out)
    assert len(before["optimizer"]["param_groups"]) == 1 and ("fingerprint" in before) != legacy
    # Mark the saved weights: a bias far from anything the initialization or two steps give.
    before["model"]["decoder.head.3.bias"] += 0.5
    save_checkpoint(out / "stage1" / "latest.pt", before, keep_previous=False)

    proc = train(tiny_prepared, out, code=HASH_B, epochs=2)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    no_traceback(proc)
    lines = [line for line in proc.stdout.splitlines() if "fresh optimizer state" in line]
    assert len(lines) == 1, proc.stdout
    assert (f"WARNING: stage 1: {out}/stage1/latest.pt was written by code {HASH_A}, this is code {HASH_B}, "
            "and the optimizer's layout differs (groups 1 -> 2; ") in lines[0]
    assert ("group 0: -date_decay scalar" in lines[0]) != legacy
    assert lines[0].endswith("the weights fit: resuming them at epoch 1, step 1 with a fresh optimizer state "
                             "(train.on_code_change: keep_weights)")
    assert "training goes on with code" not in proc.stdout  # the line above already says it

    after = latest(out)
    assert (after["epoch"], after["global_step"]) == (2, before["global_step"] + 2)
    assert after["train_state"]["history"][0] == before["train_state"]["history"][0]
    assert [g["lr_scale"] for g in after["optimizer"]["param_groups"]] == [1.0, 100.0]
    steps = {int(s["step"]) for s in after["optimizer"]["state"].values()}
    assert steps == {after["global_step"] - before["global_step"]}, "the optimizer started afresh at the resume"
    moved = (after["model"]["decoder.head.3.bias"] - before["model"]["decoder.head.3.bias"]).abs().max()
    assert moved < 0.01, "the weights were resumed from the checkpoint"
    assert after["fingerprint"]["optimizer"]["groups"][1]["params"] == [["date_decay", []]]


def test_new_optimizer_groups_with_on_code_change_refuse_stop_with_their_exit_code(one_group_epoch: Path,
                                                                                   tiny_prepared: Path,
                                                                                   tmp_path: Path) -> None:
    out = copy_of(one_group_epoch, tmp_path)
    checkpoint = (out / "stage1" / "latest.pt").read_bytes()
    proc = train(tiny_prepared, out, code=HASH_B, epochs=2, extra=("--set", "train.on_code_change=refuse"))
    assert proc.returncode == EXIT_RESUME_REFUSED == 88, proc.stdout + proc.stderr
    no_traceback(proc)
    assert (f"ERROR: cannot resume stage 1 from {out}/stage1/latest.pt: it was written by code {HASH_A}, this job "
            f"runs code {HASH_B}, and the optimizer's layout differs (groups 1 -> 2; ") in proc.stdout
    assert "the weights fit, but train.on_code_change is refuse. Nothing was trained." in proc.stdout
    assert proc.stdout.rstrip().endswith("exit 88: latest.pt was written by other code and cannot be resumed as "
                                         "asked; nothing trained")
    assert (out / "stage1" / "latest.pt").read_bytes() == checkpoint
    assert " | epoch " not in proc.stdout


@pytest.mark.parametrize("legacy", [False, True], ids=["fingerprinted", "before-fingerprints"])
def test_a_reshaped_layer_is_refused_with_both_hashes_and_the_remedies(current_epoch: Path, tiny_prepared: Path,
                                                                       tmp_path: Path, legacy: bool) -> None:
    out = copy_of(current_epoch, tmp_path, legacy=legacy)
    checkpoint = (out / "stage1" / "latest.pt").read_bytes()
    proc = train(tiny_prepared, out, code=HASH_B, epochs=2, script=WIDER_GATE,
                 extra=("--set", "train.on_code_change=keep_weights"))
    assert proc.returncode == EXIT_RESUME_REFUSED, proc.stdout + proc.stderr
    no_traceback(proc)
    errors = [line for line in proc.stdout.splitlines() if "ERROR: " in line]
    assert len(errors) == 1, proc.stdout
    assert (f"ERROR: cannot resume stage 1 from {out}/stage1/latest.pt: it was written by code {HASH_A}, this job "
            f"runs code {HASH_B}, and its weights no longer fit the model: gate.pair_out.weight 1x8x3x3 -> 1x8x5x5. "
            "Nothing was trained.") in errors[0]
    assert 'mode: restart for this stage (DAG run params {"stages": [1], "mode": "restart"}' in errors[0]
    assert f"or finish the stage with code {HASH_A}: deploy that code version" in errors[0]
    assert (out / "stage1" / "latest.pt").read_bytes() == checkpoint


def test_an_architecture_this_code_cannot_build_is_refused(current_epoch: Path, tiny_prepared: Path,
                                                           tmp_path: Path) -> None:
    """A model option the code dropped since: the checkpoint's architecture no longer parses."""
    out = copy_of(current_epoch, tmp_path)
    state = latest(out)
    state["model_config"] = {**state["model_config"], "dropped_option": 3}
    save_checkpoint(out / "stage1" / "latest.pt", state, keep_previous=False)
    proc = train(tiny_prepared, out, code=HASH_B, epochs=2)
    assert proc.returncode == EXIT_RESUME_REFUSED, proc.stdout + proc.stderr
    no_traceback(proc)
    assert (f"cannot resume stage 1 from {out}/stage1/latest.pt: it was written by code {HASH_A}, this job runs "
            f"code {HASH_B}, and its weights no longer fit the model: this code cannot build the checkpoint's "
            "architecture (") in proc.stdout
    assert "dropped_option" in proc.stdout
