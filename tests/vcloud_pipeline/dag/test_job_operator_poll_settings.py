"""A job task's polling from the deployment's settings: unset or empty keeps the provider's
defaults (``slurm_provider.timing``), which docker-compose.yaml does not repeat."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from slurm_provider import timing
from vcloud_pipeline.dag.job_operator import POLL_ENV, poll_settings

COMPOSE = Path(__file__).resolve().parents[3] / "docker-compose.yaml"
TIMING_SETTINGS = ("VCLOUD_POLL_INTERVAL", "VCLOUD_MAX_POLL_INTERVAL", "VCLOUD_FIRST_POLL_DELAY")


@pytest.mark.parametrize(("environ", "expected"), [
    ({}, {"poll_interval": timing.POLL_INTERVAL, "max_poll_interval": timing.MAX_POLL_INTERVAL,
          "first_poll_delay": timing.FIRST_POLL_DELAY}),
    ({"VCLOUD_POLL_INTERVAL": "", "VCLOUD_FIRST_POLL_DELAY": ""},
     {"poll_interval": timing.POLL_INTERVAL, "first_poll_delay": timing.FIRST_POLL_DELAY}),
    ({"VCLOUD_POLL_INTERVAL": "2", "VCLOUD_MAX_POLL_INTERVAL": "4.5", "VCLOUD_SHORT_JOB_WAIT": "0"},
     {"poll_interval": 2.0, "max_poll_interval": 4.5, "short_job_wait": 0.0}),
])
def test_a_setting_overrides_its_default_and_an_empty_one_keeps_it(environ: dict[str, str],
                                                                    expected: dict[str, float]) -> None:
    settings = poll_settings(environ)
    assert set(settings) == set(POLL_ENV)
    assert {attr: settings[attr] for attr in expected} == expected


def test_compose_passes_the_polling_through_without_a_default_of_its_own() -> None:
    environment = yaml.safe_load(COMPOSE.read_text())["x-airflow-common"]["environment"]
    assert {name: environment[name] for name in TIMING_SETTINGS} == \
        {name: f"${{{name}:-}}" for name in TIMING_SETTINGS}
