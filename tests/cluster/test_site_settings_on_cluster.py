"""The preflight's reading of the site settings the pipeline relies on, on the local cluster with each
one turned off (slurm.conf changed and reconfigured, the account's limit removed) and on again.

The table of consequences and fallbacks is tested pure (tests/vcloud_pipeline/budget/test_site_settings.py);
this proves the reading against a real controller, and the consequences as Slurm shows them: with
``PrivateData=jobs`` the second member of the project no longer sees the first member's job; with
``PrivateData=usage`` sshare hides the account's association, so no allocation is read from Slurm.
"""

from __future__ import annotations

import logging
import re
import shlex
import uuid

import pytest

from slurm_provider.hooks import SlurmHook
from support.localcluster import LocalCluster, poll_until
from vcloud_pipeline.budget.preflight import ledger_from_statuses, read_allocation
from vcloud_pipeline.dag.tasks import read_site_settings
from vcloud_pipeline.profile import load_profile

pytestmark = [pytest.mark.exclusive_cluster, pytest.mark.timeout(600)]

COMMENTS, JOBS, USAGE, ALLOCATION = ("AccountingStoreFlags includes job_comment", "PrivateData does not hide jobs",
                                     "PrivateData does not hide usage",
                                     "an allocation limit the site reports for the whole account")


def _off(local_cluster: LocalCluster, conn_id: str, said_as: str | None = None) -> list[str]:
    """The settings the preflight finds off; ``said_as``: the name it says the site's version under."""
    profile = load_profile("local")
    hook = SlurmHook(conn_id)
    allocation = read_allocation(hook, profile, ledger_from_statuses(profile, []))
    return [setting.setting for setting in read_site_settings(hook, allocation, said_as or conn_id)
            if not setting.holds]


def _teammate_sees(local_cluster: LocalCluster, job_id: int) -> bool:
    listed = local_cluster.root("runuser", "-u", local_cluster.teammate, "--", "squeue", "-h", "-A",
                                local_cluster.account, "-o", "%i").stdout.split()
    return str(job_id) in listed


def test_the_preflight_names_each_setting_the_site_turns_off(local_cluster: LocalCluster, cluster_connection: str,
                                                             caplog: pytest.LogCaptureFixture) -> None:
    # The local cluster as it is set up; the site's version comes with its settings (a name of its own:
    # the version is said once per name in a process, and this worker may have run a preflight before).
    said_as = f"{cluster_connection}-{uuid.uuid4().hex[:8]}"
    with caplog.at_level(logging.INFO, logger="vcloud_pipeline.dag.tasks"):
        assert _off(local_cluster, cluster_connection, said_as) == []
    [version] = [r.getMessage() for r in caplog.records if r.getMessage().startswith(f"{said_as}: ")]
    assert re.fullmatch(rf"{said_as}: Slurm 22\.05\.\d+ \(a release this provider is tested against\)", version), \
        version

    held = local_cluster.sbatch("#!/bin/bash\ntrue\n", "--hold", "-J", "site-settings", "-t", "1")
    try:
        assert _teammate_sees(local_cluster, held)
        with local_cluster.slurm_settings(AccountingStoreFlags=None, PrivateData="jobs"):
            assert _off(local_cluster, cluster_connection) == [COMMENTS, JOBS]
            # the consequence the preflight states, as Slurm shows it
            assert not _teammate_sees(local_cluster, held)
        assert _teammate_sees(local_cluster, held)
        with local_cluster.slurm_settings(PrivateData="usage"):
            # sshare then hides the account's association from its user: no limit read from Slurm either
            assert _off(local_cluster, cluster_connection) == [USAGE, ALLOCATION]
        assert _off(local_cluster, cluster_connection) == []

        with local_cluster.billing_limit():
            local_cluster.root("sacctmgr", "-i", "modify", "account", local_cluster.account, "where",
                               "cluster=vcloud-local", "set", "GrpTRESMins=billing=-1")
            poll_until(lambda: local_cluster.billing_minutes()[0] is None, timeout=30,
                       what="slurmctld to drop the account's billing limit")
            assert _off(local_cluster, cluster_connection) == [ALLOCATION]
    finally:
        local_cluster.ssh(f"scancel {shlex.quote(str(held))}", check=False)
