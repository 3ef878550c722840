"""The rendered scripts, executed by bash: code-hash refusal and the stop-signal relay.

The trainer's side of the contract (checkpoint on USR2/TERM at a step boundary, exit 85) is played
by a stand-in module in a temporary code tree, so these tests exercise the shell plumbing itself:
trap, forward, wait again, pass the exit code through, and with torchrun, reach its workers.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from vcloud_pipeline.jobspec import JobSpec
from vcloud_pipeline.layout import RunPaths, run_paths
from vcloud_pipeline.profiles import load_profile
from vcloud_pipeline.render import EXIT_CODE_MISMATCH, EXIT_REQUEUE, RenderedJob, render_job
from vcloud_pipeline.rsync import CodeManifest

CODE_HASH = "c" * 64

STAND_IN_TRAINER = '''
import os, pathlib, signal, sys, time
stop = []
signal.signal(signal.SIGUSR2, lambda s, f: stop.append("USR2"))
signal.signal(signal.SIGTERM, lambda s, f: stop.append("TERM"))
out = pathlib.Path(sys.argv[sys.argv.index("--out") + 1])
rank = os.environ.get("RANK", "0")
out.mkdir(parents=True, exist_ok=True)
(out / f"ready.{rank}").write_text(" ".join(sys.argv[1:]))
while not stop:
    time.sleep(0.05)
(out / f"stopped.{rank}").write_text(stop[0])
sys.exit(85)
'''


def render(tmp_path: Path, spec: JobSpec, runtime: str = "none") -> tuple[RenderedJob, RunPaths]:
    """Scripts of the local profile in a temporary project; ``none``: bare, in this interpreter."""
    base = tmp_path / "project dir's"
    profile = load_profile("local", overrides={"paths.base": str(base), "software.python": sys.executable,
                                               "container.runtime": runtime,
                                               "container.binds": [str(tmp_path)]})
    paths = run_paths(profile, "r1")
    job = render_job(profile, spec, paths, CODE_HASH)
    for directory in paths.directories_to_create():
        Path(directory).mkdir(parents=True, exist_ok=True)
    Path(job.outer_path).write_text(job.outer)
    Path(job.inner_path).write_text(job.inner)
    package = Path(paths.pythonpath_dir) / "vcloud"
    package.mkdir(parents=True, exist_ok=True)
    (package / "__init__.py").write_text("")
    (package / "train.py").write_text(STAND_IN_TRAINER)
    return job, paths


def job_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env.update({"SLURM_JOB_ID": "4242", "SLURM_NODEID": "0", **extra})
    return env


def test_outer_refuses_to_start_without_a_manifest(tmp_path: Path) -> None:
    job, _ = render(tmp_path, JobSpec.train(0))
    result = subprocess.run(["bash", str(job.outer_path)], env=job_env(), capture_output=True, text=True, timeout=60)
    assert result.returncode == EXIT_CODE_MISMATCH
    assert "code manifest" in result.stderr and "is missing" in result.stderr


def test_outer_refuses_to_start_when_the_code_was_synced_again(tmp_path: Path) -> None:
    job, paths = render(tmp_path, JobSpec.train(0))
    Path(paths.code_manifest).write_text(CodeManifest("d" * 64, 3, "2026-02-16T12:00:00+00:00").to_json())
    result = subprocess.run(["bash", str(job.outer_path)], env=job_env(), capture_output=True, text=True, timeout=60)
    assert result.returncode == EXIT_CODE_MISMATCH
    assert f"the code on the cluster ({'d' * 64}) is not the code this job was rendered for ({CODE_HASH})" \
        in result.stderr


def test_the_charliecloud_inner_script_refuses_to_run_outside_the_container(tmp_path: Path) -> None:
    job, paths = render(tmp_path, JobSpec.train(1), runtime="charliecloud")
    env = {k: v for k, v in job_env().items() if k != "CH_RUNNING"}
    result = subprocess.run(["bash", str(job.inner_path)], env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert "not inside a Charliecloud container (CH_RUNNING is unset)" in result.stderr
    assert not (Path(paths.outputs_dir) / "ready.0").exists()  # the trainer never started


def wait_for(paths: list[Path], process: subprocess.Popen, deadline_s: float = 120) -> None:
    """Until the stand-in trainers are up (a synchronisation point, not a timing assumption)."""
    end = time.monotonic() + deadline_s
    while not all(p.exists() for p in paths):
        if process.poll() is not None:
            out, err = process.communicate()
            pytest.fail(f"inner script exited {process.returncode} early: {out}{err}")
        if time.monotonic() > end:
            process.kill()
            pytest.fail(f"stand-in trainer never started: {paths}")
        time.sleep(0.05)


@pytest.mark.parametrize("sig", [signal.SIGUSR2, signal.SIGTERM])
def test_inner_forwards_the_stop_signal_and_passes_exit_85_through(tmp_path: Path, sig: signal.Signals) -> None:
    job, paths = render(tmp_path, JobSpec.train(1))
    out = Path(paths.outputs_dir)
    process = subprocess.Popen(["bash", str(job.inner_path)], env=job_env(), stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    wait_for([out / "ready.0"], process)
    assert (out / "ready.0").read_text().startswith("--stage 1 --config ")
    process.send_signal(sig)
    _, err = process.communicate(timeout=60)
    assert process.returncode == EXIT_REQUEUE, err
    assert (out / "stopped.0").read_text() == sig.name.removeprefix("SIG")
    assert f"stopped after {sig.name}, exit code 85" in err


@pytest.mark.slow
def test_inner_reaches_torchrun_workers_and_reports_the_requeue(tmp_path: Path) -> None:
    job, paths = render(tmp_path, JobSpec.train(0, gpus_per_node=2))
    assert "torch.distributed.run" in job.inner
    out = Path(paths.outputs_dir)
    env = job_env(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(29500 + os.getpid() % 1000), OMP_NUM_THREADS="1")
    process = subprocess.Popen(["bash", str(job.inner_path)], env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    wait_for([out / "ready.0", out / "ready.1"], process)
    process.send_signal(signal.SIGUSR2)
    _, err = process.communicate(timeout=120)
    assert process.returncode == EXIT_REQUEUE, err
    assert (out / "stopped.0").read_text() == "USR2" and (out / "stopped.1").read_text() == "USR2"
