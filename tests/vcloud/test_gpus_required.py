"""A job that was given GPUs never trains on the CPU: ``VCLOUD_GPUS_REQUIRED`` and exit code 87.

The decision is a pure function of (GPUs the job was given, GPUs PyTorch sees), tested with made-up
counts; the rest runs the real trainer on this machine, whose PyTorch sees no GPU, in process and
as ``python -m vcloud.train`` the way a job starts it.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from vcloud import exitcodes
from vcloud.train import main
from vcloud.training.distributed import (
    GPU_HINT_ENV,
    GPUS_REQUIRED_ENV,
    GpusMissing,
    describe_device,
    gpu_shortfall,
    gpus_required,
    init_distributed,
    torch_build,
)

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "trainer" / "configs" / "model_tiny.yaml"
HINT = "bind the GPU libraries into the container (test hint)"


@pytest.fixture(autouse=True)
def _info_logs(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)


@pytest.mark.parametrize(("required", "visible", "refused"), [
    (0, 0, False),   # the profile's accelerator is none: CPU training allowed
    (1, 1, False),
    (4, 8, False),   # more visible than given (a whole node seen): fine
    (1, 0, True),    # LUMI without SINGULARITY_CONTAINLIBS: no GCD visible
    (8, 4, True),    # fewer visible than given: ranks would share GPUs
])
def test_only_a_shortfall_refuses(required: int, visible: int, refused: bool) -> None:
    message = gpu_shortfall(required, visible, "torch 9.9, a ROCm build (HIP 6.2)")
    assert (message is not None) == refused
    if refused:
        assert message == (f"GPUs required: this node of the job was given {required} "
                           f"{'GPU' if required == 1 else 'GPUs'}, but PyTorch sees {visible} "
                           "(torch 9.9, a ROCm build (HIP 6.2)); refusing to train on the CPU")


def test_the_requirement_comes_from_the_environment() -> None:
    assert gpus_required({}) == 0
    assert gpus_required({GPUS_REQUIRED_ENV: ""}) == 0
    assert gpus_required({GPUS_REQUIRED_ENV: "4"}) == 4
    with pytest.raises(ValueError, match="VCLOUD_GPUS_REQUIRED='one' is not a number of GPUs"):
        gpus_required({GPUS_REQUIRED_ENV: "one"})


def test_init_distributed_refuses_when_torch_sees_fewer_gpus_than_required() -> None:
    assert not torch.cuda.is_available(), "this test needs a machine whose PyTorch sees no GPU"
    with pytest.raises(GpusMissing) as caught:
        init_distributed(env={GPUS_REQUIRED_ENV: "1", GPU_HINT_ENV: HINT})
    assert str(caught.value).startswith("GPUs required: this node of the job was given 1 GPU, but PyTorch sees 0")
    assert torch_build() in str(caught.value) and "a CPU-only build" in torch_build()
    assert caught.value.hint == HINT


def test_without_the_requirement_the_cpu_fallback_stays() -> None:
    for env in ({}, {GPUS_REQUIRED_ENV: "0"}):
        ctx = init_distributed(env=env)
        assert ctx.device.type == "cpu"
        assert describe_device(ctx).startswith("no GPU visible")


def test_main_returns_87_before_touching_outputs(tmp_path: Path, tiny_prepared: Path,
                                                 caplog: pytest.LogCaptureFixture,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(GPUS_REQUIRED_ENV, "1")
    monkeypatch.setenv(GPU_HINT_ENV, HINT)
    out = tmp_path / "run"
    code = main(["--stage", "0", "--config", str(TINY), "--data", str(tiny_prepared), "--out", str(out)])
    assert code == exitcodes.GPUS_MISSING == 87
    assert "GPUs required: this node of the job was given 1 GPU, but PyTorch sees 0" in caplog.text
    assert f"what to do: {HINT}" in caplog.text
    assert "exit 87: GPUs required but not visible to PyTorch; not training on the CPU" in caplog.text
    assert not out.exists(), "nothing trained, nothing written"


def test_module_entry_point_exits_87_at_once_with_the_hint(tmp_path: Path, tiny_prepared: Path) -> None:
    """The way the job script starts it; a restart must not move anything aside either."""
    out = tmp_path / "run"
    (out / "stage0").mkdir(parents=True)
    (out / "stage0" / "best.pt").write_bytes(b"kept")
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "vcloud.train", "--stage", "0", "--config", str(TINY), "--data",
                           str(tiny_prepared), "--out", str(out), "--restart"],
                          capture_output=True, text=True, timeout=120,
                          env={"PYTHONPATH": str(REPO / "trainer" / "src"), "OMP_NUM_THREADS": "1",
                               "PATH": "/usr/bin:/bin", GPUS_REQUIRED_ENV: "1", GPU_HINT_ENV: HINT})
    seconds = time.monotonic() - started
    assert proc.returncode == exitcodes.GPUS_MISSING, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert "ERROR: GPUs required: this node of the job was given 1 GPU, but PyTorch sees 0" in lines[0], lines
    assert lines[1].endswith(f" what to do: {HINT}") and "ERROR" not in lines[1]
    assert lines[-1].endswith("exit 87: GPUs required but not visible to PyTorch; not training on the CPU")
    assert len(lines) == 3, lines  # no device line, no data, no model, no epoch
    assert sorted(p.name for p in out.iterdir()) == ["stage0"]
    assert (out / "stage0" / "best.pt").read_bytes() == b"kept"
    print(f"python -m vcloud.train refused in {seconds:.1f} s")


def test_the_refusal_with_lumis_advice_reads_as_one_known_signature(tmp_path: Path, tiny_prepared: Path) -> None:
    """What the operator's failure message is built from: the trainer's real output on a LUMI node."""
    from slurm_provider.hints import find_hints
    from vcloud_pipeline.profile import load_profile

    advice = load_profile("lumi").accelerator.missing_gpu_hint
    assert advice
    proc = subprocess.run([sys.executable, "-m", "vcloud.train", "--stage", "1", "--config", str(TINY), "--data",
                           str(tiny_prepared), "--out", str(tmp_path / "run")],
                          capture_output=True, text=True, timeout=120,
                          env={"PYTHONPATH": str(REPO / "trainer" / "src"), "OMP_NUM_THREADS": "1",
                               "PATH": "/usr/bin:/bin", GPUS_REQUIRED_ENV: "8", GPU_HINT_ENV: advice})
    assert proc.returncode == exitcodes.GPUS_MISSING, proc.stdout + proc.stderr
    assert "was given 8 GPUs, but PyTorch sees 0" in proc.stdout
    assert [hint.key for hint in find_hints(proc.stdout)] == ["gpus_not_visible"]


def test_exit_code_87_is_its_own() -> None:
    codes = [exitcodes.STAGE_COMPLETE, exitcodes.ERROR, exitcodes.BAD_CONFIG, exitcodes.REQUEUE,
             exitcodes.GPUS_MISSING]
    assert len(set(codes)) == len(codes) and exitcodes.GPUS_MISSING == 87
    assert "not training on the CPU" in exitcodes.describe(87)
