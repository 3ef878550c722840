"""The site settings the pipeline relies on, each said with its consequence and fallback where it does
not hold (vcloud_pipeline.budget.site_settings); the preflight reads them from ``scontrol show config``
(on the fake Slurm here, turning each one off; on the local cluster in test_dag_on_cluster.py)."""

from __future__ import annotations

import logging
import uuid

import pytest

from slurm_provider.cli.scontrol import parse_scontrol_show_config
from slurm_provider.cli.sshare import TresMinutes
from slurm_provider.hooks import SlurmHook
from support.fake_slurm import FakeSlurm
from tests.vcloud_pipeline.budget.test_preflight import accounting
from vcloud_pipeline.budget.billing import Allocation
from vcloud_pipeline.budget.preflight import Ledger, read_allocation
from vcloud_pipeline.budget.site_settings import site_settings
from vcloud_pipeline.dag.tasks import read_site_settings
from vcloud_pipeline.profile import load_profile
from providers.slurm.tests.cli.captured_output import GOLDEN

LOCAL = load_profile("local")
SETTINGS = ("AccountingStoreFlags includes job_comment", "PrivateData does not hide jobs",
            "PrivateData does not hide usage", "an allocation limit the site reports for the whole account")


def _allocation(source: str = "slurm", limit: float | None = 1000.0, note: str = "") -> Allocation:
    return Allocation(unit="billing", limit=limit, used=0.0, held=0.0, source=source, limit_from="",
                      used_from="", held_from="", note=note)


def _holding(config: dict[str, str] | None, allocation: Allocation) -> dict[str, bool]:
    return {setting.setting: setting.holds for setting in site_settings(config, allocation)}


def test_the_local_cluster_as_captured_holds_every_setting() -> None:
    config = parse_scontrol_show_config((GOLDEN / "config_show.txt").read_text())
    findings = site_settings(config, _allocation())
    assert [f.setting for f in findings] == list(SETTINGS)
    assert all(f.holds for f in findings), findings
    assert findings[0].line() == "site setting: AccountingStoreFlags includes job_comment: yes (job_comment)"


@pytest.mark.parametrize(("config", "off"), [
    ({"AccountingStoreFlags": "(null)", "PrivateData": "none"}, {SETTINGS[0]}),
    ({"AccountingStoreFlags": "job_env,job_script", "PrivateData": "none"}, {SETTINGS[0]}),
    ({"AccountingStoreFlags": "job_comment,job_env", "PrivateData": "jobs"}, {SETTINGS[1]}),
    ({"AccountingStoreFlags": "job_comment", "PrivateData": "accounts,usage"}, {SETTINGS[2]}),
    ({"AccountingStoreFlags": "job_comment", "PrivateData": "jobs,usage,users"}, {SETTINGS[1], SETTINGS[2]}),
    ({}, {SETTINGS[0]}),
], ids=["flags-null", "other-flags", "private-jobs", "private-usage", "private-both", "nothing-listed"])
def test_each_setting_that_does_not_hold_is_named(config: dict[str, str], off: set[str]) -> None:
    holding = _holding(config, _allocation())
    assert {name for name, holds in holding.items() if not holds} == off


def test_a_setting_that_does_not_hold_says_what_goes_wrong_and_what_the_pipeline_does_instead() -> None:
    comments, jobs, usage, allocation = site_settings(
        {"AccountingStoreFlags": "(null)", "PrivateData": "jobs,usage"}, _allocation("profile", note="no limit"))
    assert comments.line().startswith("site setting: AccountingStoreFlags includes job_comment: NO ((null)). "
                                      "accounting keeps no comment of a finished job")
    assert "adoption of its own job goes by the job's name" in comments.fallback
    assert "sees this user's jobs only" in jobs.consequence and "own names" in jobs.fallback
    assert "cannot be read from Slurm's limit" in usage.consequence and "site's command" in usage.fallback
    assert not allocation.holds and allocation.seen == "the profile: no limit"
    assert "other members of the project spend is not subtracted" in allocation.consequence
    assert allocation.fallback == "The profile's billing.allocation is the limit, less this user's jobs"
    unlimited = site_settings(None, _allocation("profile", limit=None))
    assert len(unlimited) == 1 and "No budget limit stops a run" in unlimited[0].fallback


@pytest.mark.parametrize(("config", "warned"), [
    ({}, []),
    ({"AccountingStoreFlags": "(null)"}, [SETTINGS[0]]),
    ({"PrivateData": "jobs"}, [SETTINGS[1]]),
    ({"PrivateData": "usage"}, [SETTINGS[2]]),
], ids=["as-the-local-cluster", "no-job-comment", "private-jobs", "private-usage"])
def test_the_preflight_reads_the_sites_settings_and_warns_of_each_missing_one(
        config: dict[str, str], warned: list[str], caplog: pytest.LogCaptureFixture) -> None:
    """The fake controller lists the local cluster's settings, with the case's changed."""
    fake = accounting(TresMinutes("vcloud_local", "billing", limit=60000, used=0, running=0))
    fake.table.config.update(config)
    hook = SlurmHook("c", runner=fake)
    allocation = read_allocation(hook, LOCAL, _empty_ledger())
    with caplog.at_level(logging.INFO, logger="vcloud_pipeline.dag.tasks"):
        findings = read_site_settings(hook, allocation, "c")
    assert "scontrol show config" in [asked.line for asked in fake.asked]
    assert [f.setting for f in findings if not f.holds] == warned
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert [w.split(": NO")[0] for w in warnings] == [f"site setting: {name}" for name in warned]


def test_a_controller_that_lists_no_settings_is_said_and_the_preflight_goes_on(
        caplog: pytest.LogCaptureFixture) -> None:
    fake = accounting(TresMinutes("vcloud_local", "billing", limit=60000, used=0, running=0))
    fake.erring["scontrol"] = (1, "scontrol: error: Unable to contact slurm controller (connect failure)\n")
    hook = SlurmHook("c", runner=fake)
    with caplog.at_level(logging.INFO, logger="vcloud_pipeline.dag.tasks"):
        findings = read_site_settings(hook, read_allocation(hook, LOCAL, _empty_ledger()), "c")
    assert [f.setting for f in findings] == [SETTINGS[3]] and findings[0].holds
    assert any("scontrol show config gave no answer" in r.getMessage() and "Unable to contact" in r.getMessage()
               for r in caplog.records if r.levelno == logging.WARNING)


@pytest.mark.parametrize("version, level, said", [
    ("22.05.8", logging.INFO, "Slurm 22.05.8 (a release this provider is tested against)"),
    ("24.11.5", logging.WARNING, "Slurm 24.11.5: release 24.11 is not one this provider is tested against (22.05)"),
], ids=["tested", "untested"])
def test_the_preflight_says_the_sites_slurm_version_once_and_warns_of_an_untested_release(
        version: str, level: int, said: str, caplog: pytest.LogCaptureFixture) -> None:
    """Read from the settings the preflight reads anyway (no command more); a second preflight of the
    same connection in the same process says nothing more; an untested release is used, not refused."""
    fake = accounting(TresMinutes("vcloud_local", "billing", limit=60000, used=0, running=0))
    fake.table.config["SLURM_VERSION"] = version
    hook = SlurmHook("c", runner=fake)
    conn_id = f"site-version-{uuid.uuid4().hex[:8]}"
    with caplog.at_level(logging.INFO, logger="vcloud_pipeline.dag.tasks"):
        for _ in range(2):
            read_site_settings(hook, read_allocation(hook, LOCAL, _empty_ledger()), conn_id)
    lines = [(r.levelno, r.getMessage()) for r in caplog.records if r.getMessage().startswith(f"{conn_id}: ")]
    assert len(lines) == 1 and lines[0][0] == level and said in lines[0][1], lines
    assert [asked.line for asked in fake.asked].count("scontrol show config") == 2


def _empty_ledger() -> Ledger:
    from vcloud_pipeline.budget.preflight import ledger_from_statuses

    return ledger_from_statuses(LOCAL, [])


def test_the_fake_controller_answers_as_scontrol_prints() -> None:
    """The fake's answer parses with the provider's parser to what it holds (its format is the golden one)."""
    fake = FakeSlurm()
    assert SlurmHook("c", runner=fake).site_config() == fake.table.config
