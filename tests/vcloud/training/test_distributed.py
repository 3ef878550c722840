"""DDP with two gloo processes under torchrun: same result as one process, only rank 0 writes,
and a signal reaching one rank stops both at the same step without a deadlock."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml

from vcloud import exitcodes

REPO = Path(__file__).resolve().parents[3]
TINY = REPO / "trainer" / "configs" / "model_tiny.yaml"

# Entry point used under torchrun: records every file each rank writes and its pid, then trains.
ENTRY = """
import os, sys
record_dir, dtype = sys.argv[1], sys.argv[2]
import torch
torch.set_default_dtype(getattr(torch, dtype))
rank = os.environ.get("RANK", "0")
with open(os.path.join(record_dir, f"pid-rank{rank}"), "w") as fh:
    fh.write(str(os.getpid()))
import vcloud.checkpoint as checkpoint
real_write = checkpoint.atomic_write_bytes
def recording_write(path, data, **kwargs):
    with open(os.path.join(record_dir, f"writes-rank{rank}.txt"), "a") as fh:
        fh.write(f"{path}\\n")
    return real_write(path, data, **kwargs)
checkpoint.atomic_write_bytes = recording_write
from vcloud.train import main
sys.exit(main(sys.argv[3:]))
"""


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=str(REPO / "trainer" / "src"))
    return env


def _config(tmp_path: Path, batch_size: int, epochs: int) -> Path:
    raw = yaml.safe_load(TINY.read_text())
    raw["train"]["stage0"].update(batch_size=batch_size, epochs=epochs)
    path = tmp_path / f"ddp_b{batch_size}.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def _entry_command(tmp_path: Path, args: list[str], *, ranks: int, dtype: str = "float32",
                   name: str = "record") -> tuple[list[str], Path]:
    """The entry point under torchrun with ``ranks`` gloo processes, or as one plain process (``ranks=1``)."""
    entry = tmp_path / "ddp_entry.py"
    entry.write_text(ENTRY)
    record = tmp_path / name
    record.mkdir()
    launcher = ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}"] if ranks > 1 else []
    return [sys.executable, *launcher, str(entry), str(record), dtype, *args], record


# DDP sums the two ranks' gradients in another order than one process summing the batch, so the
# runs agree only up to rounding, which Adam's per-weight normalisation (g / sqrt(v)) then amplifies
# step by step. In float32 that left differences up to 5e-5 after 6 steps, above any tolerance that
# still tells a real divergence from rounding, and their size depends on the CPU's kernels. Both runs
# therefore train in float64 (unit roundoff 1.1e-16 instead of 6e-8): the same amplification leaves
# ~1e-13, and TOLERANCE sits four orders of magnitude above that and far below what a real mistake
# (a sample dealt to the wrong rank, gradients summed instead of averaged: >= 1e-4) produces.
PARITY_DTYPE = "float64"
PARITY_RTOL, PARITY_ATOL = 1e-8, 1e-9


@pytest.mark.timeout(240)
def test_two_gloo_ranks_match_one_process_with_the_global_batch(tiny_prepared: Path, tmp_path: Path) -> None:
    """Batch 1 on each of 2 ranks sees exactly the samples of batch 2 on 1 rank, step for step
    (DistributedSampler deals one permutation out), and DDP averages gradients: same weights."""
    ddp_out, single_out = tmp_path / "ddp", tmp_path / "single"
    common = ["--stage", "0", "--data", str(tiny_prepared)]
    command, record = _entry_command(tmp_path, [*common, "--config", str(_config(tmp_path, 1, 2)),
                                                "--out", str(ddp_out)], ranks=2, dtype=PARITY_DTYPE)
    ddp = subprocess.run(command, env=_env(), capture_output=True, text=True, timeout=200)
    assert ddp.returncode == 0, ddp.stdout + ddp.stderr
    command, _ = _entry_command(tmp_path, [*common, "--config", str(_config(tmp_path, 2, 2)), "--out", str(single_out)],
                                ranks=1, dtype=PARITY_DTYPE, name="record-single")
    single = subprocess.run(command, env=_env(), capture_output=True, text=True, timeout=200)
    assert single.returncode == 0, single.stdout + single.stderr

    ddp_state = torch.load(ddp_out / "stage0" / "latest.pt", weights_only=True)
    single_state = torch.load(single_out / "stage0" / "latest.pt", weights_only=True)
    assert ddp_state["world_size"] == 2 and single_state["world_size"] == 1
    assert ddp_state["global_step"] == single_state["global_step"] == 6
    for name, tensor in single_state["model"].items():
        assert tensor.dtype == ddp_state["model"][name].dtype == torch.float64, name
        torch.testing.assert_close(ddp_state["model"][name], tensor, rtol=PARITY_RTOL, atol=PARITY_ATOL, msg=name)
    ddp_psnr = ddp_state["train_state"]["history"][-1]["val_psnr"]
    # Validation runs the metrics in float32 (metrics.py); the two float64 models' outputs agree to
    # ~1e-13, so the PSNRs agree to float32 rounding of a ~20 dB figure.
    assert ddp_psnr == pytest.approx(single_state["train_state"]["history"][-1]["val_psnr"], abs=1e-4)

    # The tolerance tells a real mistake apart: one process with the per-rank batch (1, not the
    # global 2) trains on other batches and lands far outside it.
    wrong_out = tmp_path / "wrong-batch"
    command, _ = _entry_command(tmp_path, [*common, "--config", str(_config(tmp_path, 1, 2)), "--out", str(wrong_out),
                                           "--max-epochs", "1"], ranks=1, dtype=PARITY_DTYPE, name="record-wrong")
    wrong = subprocess.run(command, env=_env(), capture_output=True, text=True, timeout=200)
    assert wrong.returncode == 0, wrong.stdout + wrong.stderr
    wrong_state = torch.load(wrong_out / "stage0" / "latest.pt", weights_only=True)
    largest = max(float((wrong_state["model"][n] - t).abs().max()) for n, t in single_state["model"].items()
                  if t.is_floating_point())
    assert largest > 1e3 * PARITY_ATOL, largest

    # rank 0 alone writes files and prints the progress lines
    assert (record / "writes-rank0.txt").read_text().count("latest.pt") >= 2
    assert not (record / "writes-rank1.txt").exists(), (record / "writes-rank1.txt").read_text()
    assert "rank 0/2 (gloo)" in ddp.stdout
    assert ddp.stdout.count("stage 0 | epoch 2/2 | loss") == 1  # the epoch line
    assert ddp.stdout.count("stage 0 | step 3/3 of epoch 2/2 | loss") == 1  # a step line (tiny: every step)
    assert "[rank 1]" not in ddp.stdout
    assert len(ddp_state["rng"]) == 2, "every rank's RNG state is saved"


@pytest.mark.timeout(240)
def test_signal_on_one_rank_stops_both_at_the_same_step(tiny_prepared: Path, tmp_path: Path) -> None:
    """Slurm may deliver USR2 to the ranks at different moments; here only rank 1 gets it. Both
    ranks must agree on it at the next step boundary, rank 0 checkpoints and requeues once."""
    bin_dir, calls = tmp_path / "bin", tmp_path / "scontrol_calls.txt"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text(f'#!/bin/sh\necho "$@" >> "{calls}"\n')
    (bin_dir / "scontrol").chmod(0o755)
    env = _env()
    env.update(SLURM_JOB_ID="777", SLURM_REQUEUE="1", PATH=f"{bin_dir}{os.pathsep}{env['PATH']}")
    out = tmp_path / "run"
    command, record = _entry_command(tmp_path, ["--stage", "0", "--data", str(tiny_prepared), "--out", str(out),
                                           "--config", str(_config(tmp_path, 1, 2)), "--max-epochs", "1000"],
                                     ranks=2)
    proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    progress = out / "stage0" / "progress.json"
    while not (progress.exists() and (record / "pid-rank1").exists()):
        assert proc.poll() is None, proc.communicate()[0]
        time.sleep(0.05)
    os.kill(int((record / "pid-rank1").read_text()), signal.SIGUSR2)
    output = proc.communicate(timeout=200)[0]
    assert proc.returncode != 0, output  # torchrun reports the workers' 85 as a failure of its own
    assert output.count(f"exit {exitcodes.REQUEUE}:") == 1, output  # rank 0's final line
    assert "stopped on SIGUSR2" in output
    assert calls.read_text().splitlines() == ["requeue 777"], "exactly one requeue, from rank 0"
    state = json.loads(progress.read_text())
    assert state["status"] == "stopped"
    latest = torch.load(out / "stage0" / "latest.pt", weights_only=True)
    assert latest["global_step"] == state["step"] >= 1
    assert not (record / "writes-rank1.txt").exists()


# The job's own entry point (python -m vcloud.train) behind an atexit hook that leaves a file behind:
# the file exists only if the interpreter's teardown ran.
TEARDOWN_PROBE = """
import atexit, os, runpy, sys
probe = sys.argv.pop(1)
rank = os.environ.get("RANK", "single")
atexit.register(lambda: open(os.path.join(probe, f"teardown-{rank}"), "w").close())
runpy.run_module("vcloud.train", run_name="__main__", alter_sys=True)
"""


@pytest.mark.timeout(240)
def test_ranks_end_without_the_interpreter_teardown(tiny_prepared: Path, tmp_path: Path) -> None:
    """Once the stage has its exit code, every torchrun rank exits at once: gloo's C++ objects
    sometimes abort while the interpreter tears down ("terminate called without an active
    exception"), and torchrun turns one rank's SIGABRT into a failed launch of a complete stage.
    What was logged is flushed first; a single process keeps its ordinary teardown."""
    entry, probe = tmp_path / "teardown_probe.py", tmp_path / "probe"
    entry.write_text(TEARDOWN_PROBE)
    probe.mkdir()
    args = ["--stage", "0", "--data", str(tiny_prepared), "--config", str(_config(tmp_path, 1, 1))]
    torchrun = ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    ddp = subprocess.run([sys.executable, *torchrun, str(entry), str(probe), *args, "--out", str(tmp_path / "ddp")],
                         env=_env(), capture_output=True, text=True, timeout=200)
    assert ddp.returncode == 0, ddp.stdout + ddp.stderr
    assert (tmp_path / "ddp" / "stage0" / "COMPLETE").exists()
    assert f"exit {exitcodes.STAGE_COMPLETE}: stage complete" in ddp.stdout, ddp.stdout  # flushed before exiting
    assert sorted(p.name for p in probe.iterdir()) == [], "a rank ran the interpreter's teardown"

    single = subprocess.run([sys.executable, str(entry), str(probe), *args, "--out", str(tmp_path / "single")],
                            env=_env(), capture_output=True, text=True, timeout=200)
    assert single.returncode == 0, single.stdout + single.stderr
    assert sorted(p.name for p in probe.iterdir()) == ["teardown-single"]
