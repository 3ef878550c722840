"""Typed config loading: the three shipped sizes load, and mistakes fail naming field and allowed values."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
import yaml

from vcloud.config import ConfigError, MemoryConfig, apply_overrides, config_from_dict, config_yaml, load_config

CONFIGS = Path(__file__).resolve().parents[2] / "trainer" / "configs"


def _tiny() -> dict:
    return yaml.safe_load((CONFIGS / "model_tiny.yaml").read_text())


@pytest.mark.parametrize("size", ["tiny", "small", "full"])
def test_shipped_configs_load_and_round_trip(size: str) -> None:
    config = load_config(CONFIGS / f"model_{size}.yaml")
    assert config.name == size
    assert config_from_dict(config.to_dict()) == config
    for stage in range(4):
        assert config.train.for_stage(stage).epochs >= 1


def test_full_config_has_the_production_settings_of_the_field_notes() -> None:
    full = load_config(CONFIGS / "model_full.yaml")
    assert (full.train.stage0.epochs, full.train.stage0.batch_size) == (50, 2)
    assert (full.train.stage1.epochs, full.train.stage1.batch_size) == (100, 1)
    assert (full.data.curriculum.mixed_from_epoch, full.data.curriculum.all_from_epoch) == (30, 90)
    assert full.memory == MemoryConfig(bf16=True, grad_checkpointing=True, gate_downsample=64,
                                       target_only_pyramid=True, pair_chunk_size=64)


def test_unknown_key_names_the_valid_ones() -> None:
    raw = _tiny()
    raw["train"]["checkpoint_every_step"] = 5
    with pytest.raises(ConfigError) as err:
        config_from_dict(raw)
    assert "train: unknown key(s) checkpoint_every_step" in str(err.value)
    assert "checkpoint_every_steps" in str(err.value)


def test_unknown_top_level_section_is_rejected() -> None:
    raw = _tiny()
    raw["optimiser"] = {}
    with pytest.raises(ConfigError, match=r"top level: unknown key\(s\) optimiser \(valid: name, data, train"):
        config_from_dict(raw)


def test_unknown_model_stage_is_rejected() -> None:
    raw = _tiny()
    raw["model"]["stage4"] = {}
    with pytest.raises(ConfigError, match=r"model: unknown key\(s\) stage4"):
        config_from_dict(raw)


@pytest.mark.parametrize(("section", "key", "value", "message"), [
    ("train", "lr_schedule", "linear", "train.lr_schedule='linear' is invalid (allowed: cosine, constant)"),
    ("train", "best_metric", "loss", "train.best_metric='loss' is invalid"),
    ("train", "checkpoint_every_steps", -1, "train.checkpoint_every_steps=-1 is invalid"),
    ("train", "start_min_gain", -0.1, "train.start_min_gain=-0.1 is invalid (allowed: a number >= 0, in the units "
     "of best_metric (psnr))"),
    ("memory", "bf16", "yes", "memory.bf16='yes' is invalid (allowed: true or false)"),
    ("memory", "pair_chunk_size", -64, "memory.pair_chunk_size=-64 is invalid"),
    ("data", "num_workers", 1.5, "data.num_workers=1.5 is invalid (allowed: an integer)"),
    ("train", "log_every_steps", -1, "train.log_every_steps=-1 is invalid (allowed: an integer >= 0"),
    ("train", "log_every_seconds", 0, "train.log_every_seconds=0.0 is invalid (allowed: a number > 0)"),
])
def test_bad_values_name_field_and_allowed_values(section: str, key: str, value: object, message: str) -> None:
    raw = _tiny()
    raw[section][key] = value
    with pytest.raises(ConfigError) as err:
        config_from_dict(raw)
    assert message in str(err.value)


def test_stage_budget_errors_name_the_stage() -> None:
    raw = _tiny()
    raw["train"]["stage2"] = {"epochs": 0, "batch_size": 1, "lr": 1e-4}
    with pytest.raises(ConfigError, match=r"train\.stage2\.epochs=0 is invalid"):
        config_from_dict(raw)


def test_only_stages_2_and_3_may_be_off_by_default() -> None:
    raw = _tiny()
    raw["train"]["stage2"]["run_by_default"] = False
    raw["train"]["stage3"]["run_by_default"] = False
    assert not config_from_dict(raw).train.for_stage(2).run_by_default
    raw["train"]["stage1"]["run_by_default"] = False
    with pytest.raises(ConfigError, match=r"train\.stage1\.run_by_default=False is invalid \(allowed: true "
                                          r"\(every later stage builds on this stage's best\.pt"):
        config_from_dict(raw)


def test_curriculum_boundaries_must_be_ordered() -> None:
    raw = _tiny()
    raw["data"]["curriculum"] = {"mixed_from_epoch": 5, "all_from_epoch": 2}
    with pytest.raises(ConfigError, match=r"data\.curriculum\.all_from_epoch=2 is invalid"):
        config_from_dict(raw)


def test_yaml_exponent_without_dot_is_read_as_a_number(tmp_path: Path) -> None:
    raw = _tiny()
    raw["train"]["stage0"]["lr"] = "2e-4"  # what PyYAML makes of `lr: 2e-4`
    assert config_from_dict(raw).train.stage0.lr == pytest.approx(2e-4)


def test_config_is_frozen_including_model_sections() -> None:
    config = load_config(CONFIGS / "model_tiny.yaml")
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.train.seed = 1  # type: ignore[misc]
    with pytest.raises(TypeError):
        config.model.stage0["base_channels"] = 64  # type: ignore[index]
    section = config.model.section(0)
    section["base_channels"] = 64
    assert config.model.stage0["base_channels"] == 8


def test_missing_file_and_bad_yaml_name_the_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read config"):
        load_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("train: [unclosed\n")
    with pytest.raises(ConfigError, match=f"config {bad} is not valid YAML"):
        load_config(bad)


def test_every_config_field_has_a_docstring() -> None:
    """Field docs are attribute docstrings in the source; check each field is followed by one."""
    import inspect

    import vcloud.config as module

    for cls in (module.CurriculumConfig, module.DataConfig, module.StageTrainConfig, module.TrainConfig,
                module.MemoryConfig, module.ModelSections, module.VCloudConfig):
        lines = inspect.getsource(cls).splitlines()
        for f in dataclasses.fields(cls):
            idx = next(i for i, line in enumerate(lines) if line.strip().startswith(f"{f.name}:"))
            assert lines[idx + 1].strip().startswith('"""'), f"{cls.__name__}.{f.name} has no docstring"


# ---- --set overrides and --print-config ---------------------------------------------------------

def test_overrides_set_values_at_any_depth_parsed_as_yaml() -> None:
    raw = apply_overrides(_tiny(), ["train.log_every_steps=10", "train.stage1.lr=5e-5", "memory.bf16=false",
                                    "train.lr_schedule=constant", "data.curriculum.mixed_from_epoch=0",
                                    "model.stage0.channel_mult=[1, 4]", "name=tiny-probe"])
    config = config_from_dict(raw)
    assert config.train.log_every_steps == 10
    assert config.train.stage1.lr == pytest.approx(5e-5)
    assert config.memory.bf16 is False
    assert config.train.lr_schedule == "constant"
    assert config.data.curriculum.mixed_from_epoch == 0
    assert config.model.stage0["channel_mult"] == [1, 4]
    assert config.name == "tiny-probe"


def test_overrides_leave_the_parsed_file_unchanged() -> None:
    raw = _tiny()
    apply_overrides(raw, ["train.stage0.epochs=99"])
    assert raw["train"]["stage0"]["epochs"] == 8


@pytest.mark.parametrize(("override", "message"), [
    ("train.log_every_step=5", "train: unknown key(s) log_every_step (valid: seed, lr_schedule"),
    ("trian.seed=1", "top level: unknown key(s) trian (valid: name, data, train, model, memory)"),
    ("train.stage0.epoch=3", "train.stage0: unknown key(s) epoch (valid: epochs, batch_size, lr, patience, run_by_default)"),
    ("train.seed=one", "train.seed='one' is invalid (allowed: an integer)"),
])
def test_unknown_or_bad_overrides_are_refused_by_the_config_validation(tmp_path: Path, override: str,
                                                                       message: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(CONFIGS / "model_tiny.yaml", [override])
    assert message in str(err.value)
    assert f"with --set {override}" in str(err.value)


@pytest.mark.parametrize(("override", "message"), [
    ("train.seed", "expected section.key=value"),
    ("train..seed=1", "expected section.key=value"),
    ("train.seed.x=1", "train.seed is a value (0), not a section"),
    ("train.seed=[1", "the value is not valid YAML"),
])
def test_malformed_overrides_say_what_is_expected(override: str, message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        apply_overrides(_tiny(), [override])


@pytest.mark.parametrize("size", ["tiny", "small", "full"])
def test_printed_config_loads_back_to_the_same_config(size: str, tmp_path: Path) -> None:
    config = load_config(CONFIGS / f"model_{size}.yaml", ["train.seed=7"])
    printed = tmp_path / "printed.yaml"
    printed.write_text(config_yaml(config))
    assert load_config(printed) == config
