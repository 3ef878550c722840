"""Output captured from the real local Slurm 22.05 cluster (golden/capture.sh) and the expected parse of each file."""

from __future__ import annotations

import importlib.util
from pathlib import Path

GOLDEN = Path(__file__).resolve().parents[1] / "golden"
_spec = importlib.util.spec_from_file_location("golden_make_expected", GOLDEN / "make_expected.py")
make_expected = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(make_expected)  # type: ignore[union-attr]

JOBS = dict(line.split("=", 1) for line in (GOLDEN / "jobs.env").read_text().split())


def raw(name: str) -> str:
    return (GOLDEN / name).read_text()
