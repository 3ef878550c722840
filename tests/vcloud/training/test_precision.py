"""bf16 never meets a GradScaler; CPU trains in fp32; activation checkpointing is non-reentrant."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

from vcloud.training.precision import Precision, PrecisionError, resolve_precision

PACKAGE = Path(__file__).resolve().parents[3] / "trainer" / "src" / "vcloud"


@pytest.mark.parametrize("device_type", ["cuda", "cpu"])
@pytest.mark.parametrize("bf16", [True, False])
def test_resolved_precision_never_has_a_scaler(device_type: str, bf16: bool) -> None:
    precision = resolve_precision(device_type, bf16)
    assert precision.scaler is None
    expected = torch.bfloat16 if (device_type == "cuda" and bf16) else torch.float32
    assert precision.dtype == expected


def test_gradscaler_with_bf16_is_refused() -> None:
    scaler = torch.amp.GradScaler("cpu")
    with pytest.raises(PrecisionError, match="GradScaler combined with bfloat16"):
        Precision(device_type="cuda", dtype=torch.bfloat16, scaler=scaler)


def test_float16_is_not_a_training_mode() -> None:
    with pytest.raises(PrecisionError, match="unsupported training dtype"):
        Precision(device_type="cuda", dtype=torch.float16)


def test_cpu_autocast_is_a_no_op_and_keeps_fp32() -> None:
    precision = resolve_precision("cpu", bf16=True)
    layer = torch.nn.Linear(4, 4)
    with precision.autocast():
        out = layer(torch.ones(2, 4))
    assert out.dtype == torch.float32


def test_bf16_autocast_context_computes_in_bf16() -> None:
    """The bf16 context is a real torch.autocast; checked on CPU where it is available everywhere."""
    precision = Precision(device_type="cpu", dtype=torch.bfloat16)
    with precision.autocast():
        out = torch.nn.Linear(4, 4)(torch.ones(2, 4))
    assert out.dtype == torch.bfloat16


def _calls(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            yield name, node


def test_no_module_in_the_package_builds_a_gradscaler() -> None:
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        for name, node in _calls(ast.parse(path.read_text())):
            if name == "GradScaler":
                offenders.append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
    assert offenders == [], f"GradScaler constructed in {offenders}; bf16 training must not use one (seed 001)"


def test_every_activation_checkpoint_is_non_reentrant() -> None:
    """Seed 000: torch.utils.checkpoint.checkpoint(..., use_reentrant=False) everywhere."""
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        for name, node in _calls(ast.parse(path.read_text())):
            if name in ("checkpoint", "checkpoint_sequential"):
                kwargs = {k.arg: k.value for k in node.keywords}
                value = kwargs.get("use_reentrant")
                if not (isinstance(value, ast.Constant) and value.value is False):
                    offenders.append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
    assert offenders == [], f"checkpoint() without use_reentrant=False at {offenders}"
