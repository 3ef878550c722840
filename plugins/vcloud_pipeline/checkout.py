"""Where the project checkout the DAG runs from is, on the Airflow worker: the one place that knows."""

from __future__ import annotations

from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[2]
"""The project checkout: its ``trainer/`` is synced, its ``include/`` holds the profiles and templates."""

INCLUDE_DIR = PROJECT_ROOT / "include"
