"""``python -m vcloud.train``: exit codes, argument/config validation, completion, --restart."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from vcloud import exitcodes
from vcloud.config import load_config
from vcloud.contract import METRIC_NAMES, parse_metrics_lines
from vcloud.train import main
from vcloud.training.distributed import describe_device, init_distributed
from vcloud.training.loop import format_epoch_line

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "trainer" / "configs" / "model_tiny.yaml"


@pytest.fixture(autouse=True)
def _info_logs(caplog):
    caplog.set_level(logging.INFO)


def _config(tmp_path: Path, edit=None) -> Path:
    raw = yaml.safe_load(TINY.read_text())
    if edit:
        edit(raw)
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def _train(config: Path, data: Path, out: Path, *extra: str, stage: int = 0) -> int:
    return main(["--stage", str(stage), "--config", str(config), "--data", str(data), "--out", str(out), *extra])


def test_exit_codes_are_the_orchestrator_contract() -> None:
    assert (exitcodes.STAGE_COMPLETE, exitcodes.ERROR, exitcodes.BAD_CONFIG, exitcodes.REQUEUE) == (0, 1, 2, 85)
    assert "requeue" in exitcodes.describe(85)


def test_unknown_config_key_exits_2_naming_valid_keys(tmp_path: Path, tiny_prepared: Path, caplog) -> None:
    config = _config(tmp_path, lambda raw: raw["memory"].update(bf16_autocast=True))
    assert _train(config, tiny_prepared, tmp_path / "run") == exitcodes.BAD_CONFIG
    assert "memory: unknown key(s) bf16_autocast (valid: bf16, grad_checkpointing" in caplog.text
    assert not (tmp_path / "run").exists()


def test_bad_model_section_exits_2(tmp_path: Path, tiny_prepared: Path, caplog) -> None:
    config = _config(tmp_path, lambda raw: raw["model"]["stage0"].update(latent_chanels=4))
    assert _train(config, tiny_prepared, tmp_path / "run") == exitcodes.BAD_CONFIG
    assert "model.stage0: unknown key(s) latent_chanels" in caplog.text


def test_unprepared_data_exits_2(tmp_path: Path, caplog) -> None:
    assert _train(TINY, tmp_path, tmp_path / "run") == exitcodes.BAD_CONFIG
    assert "is not a prepared dataset" in caplog.text and "vcloud.data.prepare" in caplog.text


def test_argparse_rejects_unknown_stage() -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--stage", "4", "--config", str(TINY), "--data", ".", "--out", "."])
    assert exit_info.value.code == exitcodes.BAD_CONFIG


def test_missing_predecessor_exits_1_saying_what_to_train(tmp_path: Path, tiny_prepared: Path, caplog) -> None:
    assert _train(TINY, tiny_prepared, tmp_path / "run", stage=2) == exitcodes.ERROR
    assert "train stage 0 first" in caplog.text


def test_complete_stage_is_not_retrained_and_more_epochs_continue(tmp_path: Path, tiny_prepared: Path,
                                                                  caplog) -> None:
    out = tmp_path / "run"
    assert _train(TINY, tiny_prepared, out, "--max-epochs", "1") == 0
    latest = out / "stage0" / "latest.pt"
    first = latest.read_bytes()
    caplog.clear()
    assert _train(TINY, tiny_prepared, out, "--max-epochs", "1") == 0
    assert "already complete" in caplog.text
    assert latest.read_bytes() == first

    assert _train(TINY, tiny_prepared, out, "--max-epochs", "2") == 0
    complete = json.loads((out / "stage0" / "COMPLETE").read_text())
    assert complete["epochs"] == 2
    assert [h["epoch"] for h in json.loads((out / "stage0" / "progress.json").read_text())["history"]] == [1, 2]


def test_restart_moves_old_outputs_aside_keeping_best(tmp_path: Path, tiny_prepared: Path, caplog) -> None:
    out = tmp_path / "run"
    assert _train(TINY, tiny_prepared, out, "--max-epochs", "1") == 0
    old_best = (out / "stage0" / "best.pt").read_bytes()
    assert _train(TINY, tiny_prepared, out, "--max-epochs", "1", "--restart") == 0
    aside = list(out.glob("stage0.replaced-*"))
    assert len(aside) == 1 and (aside[0] / "best.pt").read_bytes() == old_best
    assert "moved the previous stage 0 outputs (best.pt included)" in caplog.text
    assert "fresh start" in caplog.text


def test_best_without_latest_is_kept_aside_not_overwritten(tmp_path: Path, tiny_prepared: Path) -> None:
    out = tmp_path / "run"
    (out / "stage0").mkdir(parents=True)
    (out / "stage0" / "best.pt").write_bytes(b"an older best model")
    assert _train(TINY, tiny_prepared, out, "--max-epochs", "1") == 0
    aside = list(out.glob("stage0.replaced-*"))
    assert len(aside) == 1 and (aside[0] / "best.pt").read_bytes() == b"an older best model"


def test_resume_takes_the_architecture_from_the_checkpoint(tmp_path: Path, tiny_prepared: Path, caplog) -> None:
    out = tmp_path / "run"
    assert _train(TINY, tiny_prepared, out, "--max-epochs", "1") == 0
    wider = _config(tmp_path, lambda raw: raw["model"]["stage0"].update(base_channels=16))
    assert _train(wider, tiny_prepared, out, "--max-epochs", "2") == 0
    assert "resuming with the checkpoint's architecture" in caplog.text
    state = torch.load(out / "stage0" / "latest.pt", weights_only=True)
    assert state["model_config"]["base_channels"] == 8


def test_progress_json_is_what_the_orchestrator_reads(tmp_path: Path, tiny_prepared: Path) -> None:
    out = tmp_path / "run"
    assert _train(TINY, tiny_prepared, out, "--max-epochs", "2") == 0
    progress = json.loads((out / "stage0" / "progress.json").read_text())
    assert {"stage", "status", "epoch", "epochs_total", "step", "best_metric", "last_metrics", "updated_at",
            "history"} <= set(progress)
    assert (progress["stage"], progress["status"], progress["epoch"], progress["epochs_total"]) == (0, "complete", 2, 2)
    assert progress["step"] == 6


def test_every_checkpoint_and_marker_records_the_synced_code_hash(tmp_path: Path, tiny_prepared: Path,
                                                                  monkeypatch: pytest.MonkeyPatch, caplog) -> None:
    """The job scripts set VCLOUD_CODE_HASH (the code directory the job runs from); the trainer
    writes it into latest.pt, best.pt, progress.json and COMPLETE, and says when a resume changes it."""
    out, first, second = tmp_path / "run", "a" * 64, "b" * 64
    monkeypatch.setenv("VCLOUD_CODE_HASH", first)
    assert _train(TINY, tiny_prepared, out, "--max-epochs", "1") == 0
    stage = out / "stage0"
    for name in ("latest.pt", "best.pt"):
        assert torch.load(stage / name, weights_only=True)["code_hash"] == first, name
    assert json.loads((stage / "progress.json").read_text())["code_hash"] == first
    assert json.loads((stage / "COMPLETE").read_text())["code_hash"] == first

    monkeypatch.setenv("VCLOUD_CODE_HASH", second)
    caplog.clear()
    assert _train(TINY, tiny_prepared, out, "--max-epochs", "2") == 0
    assert f"code {first})" in caplog.text
    assert f"the checkpoint was written by code {first}; training goes on with code {second}" in caplog.text
    assert torch.load(stage / "latest.pt", weights_only=True)["code_hash"] == second
    assert json.loads((stage / "COMPLETE").read_text())["code_hash"] == second  # the code that finished it


@pytest.mark.parametrize("value", ["", "not-a-hash", "A" * 64, "a" * 63])
def test_a_code_hash_that_is_not_a_digest_is_not_recorded(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    from vcloud.training.provenance import code_hash

    monkeypatch.setenv("VCLOUD_CODE_HASH", value)
    assert code_hash() is None
    monkeypatch.setenv("VCLOUD_CODE_HASH", "0123456789abcdef" * 4)
    assert code_hash() == "0123456789abcdef" * 4


def test_print_config_prints_the_resolved_yaml_and_exits_0(tmp_path: Path, capsys) -> None:
    code = main(["--config", str(TINY), "--print-config", "--set", "train.log_every_steps=5",
                 "--set", "train.stage0.lr=1e-4"])
    assert code == 0
    printed = tmp_path / "printed.yaml"
    printed.write_text(capsys.readouterr().out)
    resolved = yaml.safe_load(printed.read_text())
    assert resolved["train"]["log_every_steps"] == 5 and resolved["train"]["stage0"]["lr"] == 1e-4
    assert load_config(printed) == load_config(TINY, ["train.log_every_steps=5", "train.stage0.lr=1e-4"])
    assert not list(tmp_path.glob("stage*")), "nothing trained"


def test_set_with_an_unknown_key_exits_2_naming_the_valid_ones(tmp_path: Path, tiny_prepared: Path,
                                                                caplog) -> None:
    assert _train(TINY, tiny_prepared, tmp_path / "run", "--set", "train.log_every=5") == exitcodes.BAD_CONFIG
    assert "with --set train.log_every=5: train: unknown key(s) log_every (valid: seed," in caplog.text
    assert "log_every_steps, log_every_seconds" in caplog.text
    assert not (tmp_path / "run").exists()
    assert main(["--config", str(TINY), "--print-config", "--set", "memory.bf=1"]) == exitcodes.BAD_CONFIG


def test_training_without_stage_data_or_out_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--config", str(TINY), "--stage", "0"])
    assert exit_info.value.code == exitcodes.BAD_CONFIG


def test_set_cadence_gives_step_lines_metrics_jsonl_and_tensorboard(tmp_path: Path, tiny_prepared: Path,
                                                                    caplog) -> None:
    out = tmp_path / "run"
    assert _train(TINY, tiny_prepared, out, "--max-epochs", "2", "--set", "train.log_every_steps=2") == 0
    stage = out / "stage0"
    assert torch.load(stage / "latest.pt", weights_only=True)["config"]["train"]["log_every_steps"] == 2
    curve = parse_metrics_lines((stage / "metrics.jsonl").read_text())
    assert [(r["kind"], r["global_step"], r["epoch"]) for r in curve] == [
        ("train", 2, 1), ("val", 3, 1), ("train", 4, 2), ("train", 6, 2), ("val", 6, 2)]
    assert set(curve[0]) == {"kind", "global_step", "epoch", "loss", "lr", "samples_per_s", "time"}
    assert set(curve[1]) == {"kind", "global_step", "epoch", "time", *METRIC_NAMES}
    history = json.loads((stage / "progress.json").read_text())["history"]
    assert [r["psnr"] for r in curve if r["kind"] == "val"] == [h["val_psnr"] for h in history]
    step_lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("stage 0 | step ")]
    assert len(step_lines) == 3
    assert step_lines[0].startswith("stage 0 | step 2/3 of epoch 1/2 | loss ")
    assert " samples/s | ETA epoch " in step_lines[0]
    assert len(list((stage / "tensorboard").glob("events.out.tfevents.*"))) == 1


def test_epoch_line_reads_well_in_a_task_log() -> None:
    record = {"epoch": 3, "train_loss": 0.04123, "val_psnr": 31.517, "lr": 1.8e-4, "seconds": 95.12,
              "samples_per_s": 8.43, "phase": "mixed"}
    assert format_epoch_line(1, 100, record, improved=True) == (
        "stage 1 | epoch 3/100 | loss 0.0412 | PSNR 31.52 dB | lr 1.8e-04 | 95.1 s | 8.4 samples/s | "
        "phase mixed | best")


def test_start_line_reports_cpu_fallback() -> None:
    line = describe_device(init_distributed(env={}))
    assert line.startswith("no GPU visible (torch.cuda.is_available() is False): training on CPU")
    assert "rank 0/1" in line


def test_module_entry_point_runs(tmp_path: Path, tiny_prepared: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "vcloud.train", "--stage", "0", "--config", str(TINY), "--data",
                           str(tiny_prepared), "--out", str(tmp_path), "--max-epochs", "1"],
                          capture_output=True, text=True, timeout=120,
                          env={"PYTHONPATH": str(REPO / "trainer" / "src"), "OMP_NUM_THREADS": "1",
                               "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert "no GPU visible" in lines[0]
    assert any(" stage 0 | epoch 1/1 | loss " in line for line in lines)
    assert lines[-1].endswith("exit 0: stage complete")


_SIGNAL_DURING_START_UP = '''
import atexit, importlib.abc, os, pathlib, runpy, signal, sys
record = pathlib.Path(sys.argv.pop(1))


class SignalOnTorchImport(importlib.abc.MetaPathFinder):
    """Sends USR2 to this process as torch starts to import: the slow part of a trainer's start."""

    def find_spec(self, name, path=None, target=None):
        if name == "torch":
            sys.meta_path.remove(self)
            os.kill(os.getpid(), signal.SIGUSR2)
        return None


sys.meta_path.insert(0, SignalOnTorchImport())
atexit.register(lambda: record.write_text(signal.getsignal(signal.SIGUSR2).name))
runpy.run_module("vcloud.train", run_name="__main__", alter_sys=True)
'''


def test_usr2_while_torch_imports_stops_with_a_checkpoint_and_is_ignored_at_exit(tmp_path: Path,
                                                                                 tiny_prepared: Path) -> None:
    """Slurm may send the pre-timeout USR2 up to a minute early: the handler must be there first."""
    record = tmp_path / "usr2_at_exit"
    proc = subprocess.run([sys.executable, "-c", _SIGNAL_DURING_START_UP, str(record), "--stage", "0",
                           "--config", str(TINY), "--data", str(tiny_prepared), "--out", str(tmp_path / "run")],
                          capture_output=True, text=True, timeout=120,
                          env={"PYTHONPATH": str(REPO / "trainer" / "src"), "OMP_NUM_THREADS": "1",
                               "PATH": "/usr/bin:/bin"})
    assert proc.returncode == exitcodes.REQUEUE, proc.stdout + proc.stderr
    assert "stage 0 stopped on SIGUSR2 at epoch 0" in proc.stdout
    assert (tmp_path / "run" / "stage0" / "latest.pt").is_file()
    # after the stage has its exit code, a late USR2 cannot turn it into death by signal
    assert record.read_text() == "SIG_IGN"
