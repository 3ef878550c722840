"""Fixtures of the DAG tests that run the training DAG in this process (``dag.test()``)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from support.localcluster import LocalCluster


@pytest.fixture
def profile_overrides() -> dict[str, Any]:
    """Settings of the local profile a test module changes besides its project directory."""
    return {}


@pytest.fixture
def project_dir(local_cluster: LocalCluster, monkeypatch: pytest.MonkeyPatch,
                profile_overrides: dict[str, Any]) -> str:
    """A fresh project directory for the local profile, and the fast status polling of ``dag.test()``."""
    base = local_cluster.test_dir()
    monkeypatch.setenv("VCLOUD_PROFILE_OVERRIDES",
                       json.dumps({"local": {"paths.base": base, **profile_overrides}}))
    monkeypatch.setenv("VCLOUD_POLL_INTERVAL", "2")
    monkeypatch.setenv("VCLOUD_MAX_POLL_INTERVAL", "5")
    monkeypatch.setenv("VCLOUD_FIRST_POLL_DELAY", "1")
    return base
