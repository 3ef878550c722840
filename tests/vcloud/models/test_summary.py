"""Parameter counts of the production config, built on the meta device (no memory allocated)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import torch

from vcloud.models.summary import build_stage_models, main

CONFIGS = Path(__file__).resolve().parents[3] / "trainer" / "configs"


def test_full_config_counts_match_production(capsys):
    assert main(["--config", str(CONFIGS / "model_full.yaml")]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    counts = json.loads(lines[-1])
    assert set(counts) == {"stage0", "stage1", "stage2", "stage3"}
    assert abs(counts["stage0"] - 29.8e6) / 29.8e6 < 0.10, counts  # seed 000: 29.8M
    assert abs(counts["stage1"] - 154e6) / 154e6 < 0.10, counts  # seed 000: 154M
    assert counts["stage3"] == counts["stage1"] + counts["stage2"]
    assert any("draft model (CFDT)" in line for line in lines[:-1])


def test_models_are_built_on_meta_device_without_storage():
    import yaml

    doc = yaml.safe_load((CONFIGS / "model_full.yaml").read_text())
    models = build_stage_models(doc["model"], doc["memory"])
    for model in models.values():
        assert all(p.device == torch.device("meta") for p in model.parameters())
    assert models["stage1"].memory.grad_checkpointing and models["stage1"].memory.gate_downsample == 64


def test_cli_rejects_unknown_model_key(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("model:\n  stage1: {tmt_depth: 3}\n")
    proc = subprocess.run([sys.executable, "-m", "vcloud.models.summary", "--config", str(bad)],
                          capture_output=True, text=True, cwd=Path(__file__).resolve().parents[3],
                          env={"PYTHONPATH": str(CONFIGS.parent / "src"), "PATH": ""})
    assert proc.returncode == 2
    assert "unknown key(s) tmt_depth" in proc.stderr
