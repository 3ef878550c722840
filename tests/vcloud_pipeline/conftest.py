"""Fixtures for the pipeline-profile tests: loaded profiles with the settings a user must supply."""

from __future__ import annotations

import pytest

from vcloud_pipeline.profile import ClusterProfile, load_profile

USER_SETTINGS = {
    "levante": {"account": "bb1234"},
    "cosmos": {"account": "csd999"},
}
"""What a user supplies for the profiles that ship with CHANGE_ME placeholders."""

LOGINS = {"levante": "b381234", "cosmos": "cosmouser"}
"""The Login of each profile's Airflow connection, for profiles whose paths use {user}."""

PROFILE_NAMES = ("lumi", "levante", "cosmos", "local")


def complete_profile(name: str, extra: dict | None = None) -> ClusterProfile:
    overrides = {**USER_SETTINGS.get(name, {}), **(extra or {})}
    return load_profile(name, overrides=overrides or None, login=LOGINS.get(name))


@pytest.fixture(params=PROFILE_NAMES)
def any_profile(request: pytest.FixtureRequest) -> ClusterProfile:
    return complete_profile(request.param)
