"""Atomic, generational, device-agnostic checkpoint files."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from vcloud.checkpoint import (
    CHECKPOINT_FORMAT,
    CheckpointError,
    load_checkpoint,
    load_latest,
    previous_generation,
    remove_stale_temporaries,
    save_checkpoint,
)
from vcloud.durable import atomic_write_text
from vcloud.training.rng import capture_rng_state, restore_rng_state


def _state(step: int) -> dict:
    return {"stage": 0, "model": {"w": torch.full((3,), float(step))}, "global_step": step}


def test_save_keeps_the_previous_generation(tmp_path: Path) -> None:
    latest = tmp_path / "latest.pt"
    save_checkpoint(latest, _state(1))
    save_checkpoint(latest, _state(2))
    assert load_checkpoint(latest)["global_step"] == 2
    assert load_checkpoint(previous_generation(latest))["global_step"] == 1
    assert load_checkpoint(latest)["format"] == CHECKPOINT_FORMAT
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest.prev.pt", "latest.pt"]


def test_truncated_latest_falls_back_to_previous_with_warning(tmp_path: Path, caplog) -> None:
    latest = tmp_path / "latest.pt"
    save_checkpoint(latest, _state(1))
    save_checkpoint(latest, _state(2))
    data = latest.read_bytes()
    latest.write_bytes(data[: len(data) // 2])
    with caplog.at_level(logging.WARNING):
        state, source = load_latest(latest)
    assert state["global_step"] == 1
    assert source == previous_generation(latest)
    assert "resuming from the previous generation" in caplog.text


def test_garbage_latest_falls_back(tmp_path: Path) -> None:
    latest = tmp_path / "latest.pt"
    save_checkpoint(latest, _state(1))
    save_checkpoint(latest, _state(2))
    latest.write_bytes(b"\x00" * 100)
    assert load_latest(latest)[0]["global_step"] == 1


def test_missing_latest_with_previous_present_resumes_from_previous(tmp_path: Path) -> None:
    latest = tmp_path / "latest.pt"
    save_checkpoint(latest, _state(1))
    save_checkpoint(latest, _state(2))
    latest.unlink()  # as after a crash between the two renames
    assert load_latest(latest)[0]["global_step"] == 1


def test_no_checkpoint_is_a_fresh_start_but_all_corrupt_is_an_error(tmp_path: Path) -> None:
    latest = tmp_path / "latest.pt"
    assert load_latest(latest) is None
    latest.write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError, match="--restart"):
        load_latest(latest)


def test_foreign_pickle_is_rejected(tmp_path: Path) -> None:
    path = tmp_path / "x.pt"
    torch.save({"something": 1}, path)
    with pytest.raises(CheckpointError, match="not a vcloud checkpoint"):
        load_checkpoint(path)


def test_checkpoint_written_on_a_gpu_loads_on_a_cpu_only_machine(tmp_path: Path, monkeypatch) -> None:
    """Storages tagged ``cuda:0`` (as torch.save records GPU tensors) must load here via map_location."""
    path = tmp_path / "latest.pt"
    with monkeypatch.context() as m:
        m.setattr(torch.serialization, "location_tag", lambda storage: "cuda:0")
        save_checkpoint(path, {"stage": 0, "model": {"w": torch.ones(2)}})
    with pytest.raises(RuntimeError, match="CUDA"):
        torch.load(path, weights_only=True)  # what a naive loader would do on a CPU-only node
    state = load_checkpoint(path)
    assert state["model"]["w"].device.type == "cpu"
    assert torch.equal(state["model"]["w"], torch.ones(2))


def test_kill_during_write_leaves_old_checkpoint_intact(tmp_path: Path) -> None:
    """SIGKILL a real process halfway through writing: latest.pt stays the previous, whole file."""
    latest = tmp_path / "latest.pt"
    save_checkpoint(latest, _state(1))
    script = textwrap.dedent(f"""
        import os, signal, torch
        import vcloud.checkpoint as ck
        import vcloud.durable as durable
        def die(fd):
            os.kill(os.getpid(), signal.SIGKILL)
        durable.os.fsync = die  # killed after the bytes are written, before the rename
        ck.save_checkpoint({str(latest)!r}, {{"stage": 0, "model": {{"w": torch.zeros(1000)}}, "global_step": 2}})
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL
    assert load_checkpoint(latest)["global_step"] == 1
    leftovers = [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    assert len(leftovers) == 1
    assert remove_stale_temporaries(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest.pt"]


def test_atomic_text_write_is_readable_by_others(tmp_path: Path) -> None:
    path = tmp_path / "progress.json"
    atomic_write_text(path, "{}\n")
    assert path.read_text() == "{}\n"
    umask = os.umask(0)
    os.umask(umask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~umask


def test_rng_state_round_trips_through_a_checkpoint(tmp_path: Path) -> None:
    import random

    import numpy as np

    torch.manual_seed(3)
    np.random.seed(3)
    random.seed(3)
    path = tmp_path / "latest.pt"
    save_checkpoint(path, {"stage": 0, "model": {}, "rng": capture_rng_state()})
    expected = (random.random(), np.random.rand(), torch.rand(1).item())
    restore_rng_state(load_checkpoint(path)["rng"])  # weights_only load of every RNG state
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == expected
