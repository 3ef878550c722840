"""Pre-timeout signals: flag only in the handler, checkpoint at a step boundary, requeue, exit 85.

The end-to-end tests send real signals to a real training process and put a stand-in ``scontrol``
on its PATH that records its arguments (there is no Slurm controller in CI).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from vcloud import exitcodes
from vcloud.contract import parse_metrics_lines
from vcloud.training.signals import RequeuePolicy, install_stop_handlers, request_requeue

REPO = Path(__file__).resolve().parents[3]
TINY = REPO / "trainer" / "configs" / "model_tiny.yaml"


# ---- handler and policy -------------------------------------------------------------------------

@pytest.fixture
def restore_handlers():
    saved = {s: signal.getsignal(s) for s in (signal.SIGUSR2, signal.SIGTERM)}
    yield
    for s, handler in saved.items():
        signal.signal(s, handler)


def test_real_signal_only_sets_the_flag(restore_handlers) -> None:
    stop = install_stop_handlers()
    assert not stop.requested
    os.kill(os.getpid(), signal.SIGUSR2)
    assert stop.requested and stop.signal_number == signal.SIGUSR2
    os.kill(os.getpid(), signal.SIGTERM)  # a second signal does not overwrite the first
    assert stop.signal_number == signal.SIGUSR2


@pytest.mark.parametrize(("env", "flag", "expected"), [
    ({}, None, RequeuePolicy(job_id=None, allowed=False)),
    ({"SLURM_JOB_ID": "17"}, None, RequeuePolicy(job_id="17", allowed=False)),
    ({"SLURM_JOB_ID": "17", "SLURM_REQUEUE": "1"}, None, RequeuePolicy(job_id="17", allowed=True)),
    ({"SLURM_JOB_ID": "17", "SLURM_REQUEUE": "yes"}, False, RequeuePolicy(job_id="17", allowed=False)),
    ({"SLURM_JOB_ID": "17"}, True, RequeuePolicy(job_id="17", allowed=True)),
])
def test_requeue_policy_from_env_and_flag(env, flag, expected) -> None:
    assert RequeuePolicy.from_env(env, flag) == expected


class _Recorder:
    def __init__(self, returncode: int = 0, stderr: str = "", raises: BaseException | None = None) -> None:
        self.calls: list[list[str]] = []
        self.returncode, self.stderr, self.raises = returncode, stderr, raises

    def __call__(self, command, **kwargs):
        self.calls.append(command)
        if self.raises:
            raise self.raises
        return subprocess.CompletedProcess(command, self.returncode, "", self.stderr)


ALLOWED = RequeuePolicy(job_id="4242", allowed=True)


def test_requeue_runs_scontrol_for_the_job_after_usr2() -> None:
    run = _Recorder()
    assert request_requeue(ALLOWED, signal.SIGUSR2, run) is True
    assert run.calls == [["scontrol", "requeue", "4242"]]


@pytest.mark.parametrize(("policy", "signum"), [
    (ALLOWED, signal.SIGTERM),  # may be a scancel: never requeue on TERM
    (RequeuePolicy(job_id=None, allowed=True), signal.SIGUSR2),
    (RequeuePolicy(job_id="4242", allowed=False), signal.SIGUSR2),
])
def test_no_scontrol_call_when_not_allowed(policy, signum) -> None:
    run = _Recorder()
    assert request_requeue(policy, signum, run) is False
    assert run.calls == []


def test_scontrol_failures_are_logged_not_raised(caplog) -> None:
    with caplog.at_level(logging.WARNING):
        assert request_requeue(ALLOWED, signal.SIGUSR2, _Recorder(raises=FileNotFoundError("scontrol"))) is False
        assert request_requeue(ALLOWED, signal.SIGUSR2, _Recorder(1, "Requested operation is presently disabled")) \
            is False
    assert "scontrol not found on PATH" in caplog.text
    assert "scontrol exited 1 (Requested operation is presently disabled)" in caplog.text


# ---- a real training process ------------------------------------------------------------------

def _fake_scontrol(bin_dir: Path, log: Path, exit_code: int = 0) -> None:
    bin_dir.mkdir(parents=True, exist_ok=True)
    script = bin_dir / "scontrol"
    script.write_text(f'#!/bin/sh\necho "$@" >> "{log}"\nexit {exit_code}\n')
    script.chmod(0o755)


def _start(tiny_prepared: Path, out: Path, path_dirs: list[Path], extra_env: dict[str, str]) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=str(REPO / "trainer" / "src"),
               PATH=os.pathsep.join(str(p) for p in path_dirs), **extra_env)
    command = [sys.executable, "-m", "vcloud.train", "--stage", "0", "--config", str(TINY),
               "--data", str(tiny_prepared), "--out", str(out), "--max-epochs", "1000"]
    return subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _wait_until_training(proc: subprocess.Popen, progress: Path) -> None:
    """Block until the loop has started (its first progress.json); bounded by pytest-timeout."""
    while not progress.exists():
        assert proc.poll() is None, proc.communicate()[0]
        time.sleep(0.05)


@pytest.mark.timeout(180)
def test_usr2_checkpoints_requests_requeue_and_exits_85(tiny_prepared: Path, tmp_path: Path) -> None:
    calls = tmp_path / "scontrol_calls.txt"
    _fake_scontrol(tmp_path / "bin", calls)
    out = tmp_path / "run"
    proc = _start(tiny_prepared, out, [tmp_path / "bin", Path("/usr/bin"), Path("/bin")],
                  {"SLURM_JOB_ID": "4242", "SLURM_REQUEUE": "1"})
    _wait_until_training(proc, out / "stage0" / "progress.json")
    proc.send_signal(signal.SIGUSR2)
    output = proc.communicate(timeout=120)[0]
    assert proc.returncode == exitcodes.REQUEUE, output
    assert calls.read_text().split() == ["requeue", "4242"], output
    assert "stopped on SIGUSR2" in output
    assert "requeue of job 4242 requested" in output

    progress = json.loads((out / "stage0" / "progress.json").read_text())
    assert progress["status"] == "stopped"
    state = torch.load(out / "stage0" / "latest.pt", weights_only=True)
    assert state["global_step"] == progress["step"] >= 1
    assert not (out / "stage0" / "COMPLETE").exists()

    # the requeued job resumes where it stopped and finishes
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=str(REPO / "trainer" / "src"))
    epochs_done = state["epoch"]
    resumed = subprocess.run(
        [sys.executable, "-m", "vcloud.train", "--stage", "0", "--config", str(TINY), "--data", str(tiny_prepared),
         "--out", str(out), "--max-epochs", str(epochs_done + 1)],
        env=env, capture_output=True, text=True, timeout=120)
    assert resumed.returncode == exitcodes.STAGE_COMPLETE, resumed.stdout + resumed.stderr
    assert f"step {state['global_step']}" in resumed.stdout
    assert (out / "stage0" / "COMPLETE").exists()
    # the curve across stop and resume: a line per step (tiny logs every step), none lost or repeated
    final = torch.load(out / "stage0" / "latest.pt", weights_only=True)
    curve = parse_metrics_lines((out / "stage0" / "metrics.jsonl").read_text())
    assert [r["global_step"] for r in curve if r["kind"] == "train"] == list(range(1, final["global_step"] + 1))
    assert [r["epoch"] for r in curve if r["kind"] == "val"] == list(range(1, final["epoch"] + 1))


@pytest.mark.timeout(180)
def test_usr2_without_scontrol_still_exits_85(tiny_prepared: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    empty = tmp_path / "empty_bin"
    empty.mkdir()
    proc = _start(tiny_prepared, out, [empty], {"SLURM_JOB_ID": "4242", "SLURM_REQUEUE": "1"})
    _wait_until_training(proc, out / "stage0" / "progress.json")
    proc.send_signal(signal.SIGUSR2)
    output = proc.communicate(timeout=120)[0]
    assert proc.returncode == exitcodes.REQUEUE, output
    assert "scontrol not found on PATH" in output
    assert (out / "stage0" / "latest.pt").exists()


@pytest.mark.timeout(180)
def test_sigterm_checkpoints_and_exits_85_without_requeue(tiny_prepared: Path, tmp_path: Path) -> None:
    calls = tmp_path / "scontrol_calls.txt"
    _fake_scontrol(tmp_path / "bin", calls)
    out = tmp_path / "run"
    proc = _start(tiny_prepared, out, [tmp_path / "bin", Path("/usr/bin"), Path("/bin")],
                  {"SLURM_JOB_ID": "4242", "SLURM_REQUEUE": "1"})
    _wait_until_training(proc, out / "stage0" / "progress.json")
    proc.send_signal(signal.SIGTERM)
    output = proc.communicate(timeout=120)[0]
    assert proc.returncode == exitcodes.REQUEUE, output
    assert not calls.exists(), "SIGTERM (possibly scancel) must not requeue the job"
    assert "stopped on SIGTERM" in output
    assert json.loads((out / "stage0" / "progress.json").read_text())["status"] == "stopped"


@pytest.mark.timeout(240)
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGUSR2], ids=["TERM", "USR2"])
def test_signal_to_the_whole_process_group_spares_dataloader_workers(signum: int, tiny_prepared: Path,
                                                                     tmp_path: Path) -> None:
    """Slurm (and ``timeout``) signal every process of the step, DataLoader workers included.
    Workers must not die of it before the training process checkpoints at its step boundary."""
    import yaml

    raw = yaml.safe_load(TINY.read_text())
    raw["data"]["num_workers"] = 2
    raw["train"]["checkpoint_every_steps"] = 1
    config = tmp_path / "workers.yaml"
    config.write_text(yaml.safe_dump(raw))
    out = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=str(REPO / "trainer" / "src"))
    proc = subprocess.Popen(
        [sys.executable, "-m", "vcloud.train", "--stage", "0", "--config", str(config), "--data", str(tiny_prepared),
         "--out", str(out), "--max-epochs", "1000"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    progress = out / "stage0" / "progress.json"
    while not (progress.exists() and json.loads(progress.read_text() or "{}").get("step", 0) >= 1):
        assert proc.poll() is None, proc.communicate()[0]
        time.sleep(0.05)
    os.killpg(proc.pid, signum)
    output = proc.communicate(timeout=200)[0]
    assert proc.returncode == exitcodes.REQUEUE, output
    assert "killed by signal" not in output
    assert json.loads(progress.read_text())["status"] == "stopped"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # no worker outlives the training process
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        pytest.fail("DataLoader workers still alive after the training process exited")
