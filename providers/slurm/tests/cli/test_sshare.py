"""sshare: an account's TRES-minute limit, usage and running jobs' share."""

from __future__ import annotations

import pytest

from slurm_provider.cli.sshare import account_tres_minutes, build_sshare_account, parse_sshare
from slurm_provider.cli.values import SlurmOutputError, parse_tres_minutes
from slurm_provider.validation import ValidationError
from providers.slurm.tests.cli.captured_output import raw
from providers.slurm.tests.cli.command_words import argv_of


def test_sshare_of_one_account_with_fixed_fields() -> None:
    assert argv_of(build_sshare_account("project_465002500")) == [
        "sshare", "--noheader", "--parsable2", "--all", "--accounts=project_465002500",
        "--format=Account,User,GrpTRESMins,GrpTRESRaw,TRESRunMins"]
    with pytest.raises(ValidationError, match="account"):
        build_sshare_account("project;scancel -u $USER")


def test_sshare_gives_the_accounts_limit_usage_and_what_running_jobs_hold() -> None:
    # Captured with one --gpus=1 -t 5 job running after a 65-s --gpus=1 job: billing counts GPUs.
    rows = parse_sshare(raw("sshare_account.txt"))
    assert [(row.account, row.user) for row in rows] == [("vcloud_local", None), ("vcloud_local", "vcloud")]
    account = account_tres_minutes(rows, "vcloud_local")
    assert (account.limit, account.used, account.running) == (60000, 1, 5)
    assert account.left == 60000 - 1 - 5
    assert rows[1].limits == {}  # the limit is the account's, not the user's
    assert account_tres_minutes(rows, "other_account") is None
    assert parse_sshare(raw("sshare_unknown_account.txt")) == []


def test_sshare_without_a_limit_and_unreadable_lines() -> None:
    line = raw("sshare_account.txt").splitlines()[0].replace("|billing=60000|", "||")
    account = account_tres_minutes(parse_sshare(line), "vcloud_local")
    assert account.limit is None and account.left is None and account.used == 1
    assert parse_tres_minutes("cpu=N(5),billing=N,gres/gpu=120") == {"gres/gpu": 120}
    gres = account_tres_minutes(parse_sshare(raw("sshare_account.txt")), "vcloud_local", "gres/gpu")
    assert (gres.limit, gres.used, gres.running) == (None, 1, 5)
    with pytest.raises(SlurmOutputError, match="sshare line has 2 fields"):
        parse_sshare("vcloud_local|billing=1\n")


# `sshare --all` of a private account while root's 1-GPU job with --time=90 runs and vcloud's job pends
# with AssocGrpBillingMinutes (GrpTRESMins=billing=100), as the local cluster printed it.
TEAM = """\
vctest_probe||billing=100|cpu=0,mem=0,energy=0,node=0,billing=0,fs/disk=0,vmem=0,pages=0,gres/gpu=0|cpu=90,mem=90000,energy=0,node=90,billing=90,fs/disk=0,vmem=0,pages=0,gres/gpu=90
 vctest_probe|root||cpu=0,mem=0,energy=0,node=0,billing=0,fs/disk=0,vmem=0,pages=0,gres/gpu=0|cpu=90,mem=90000,energy=0,node=90,billing=90,fs/disk=0,vmem=0,pages=0,gres/gpu=90
 vctest_probe|vcloud||cpu=0,mem=0,energy=0,node=0,billing=0,fs/disk=0,vmem=0,pages=0,gres/gpu=0|cpu=0,mem=0,energy=0,node=0,billing=0,fs/disk=0,vmem=0,pages=0,gres/gpu=0
"""


def test_sshare_says_whose_running_jobs_hold_the_allocation() -> None:
    account = account_tres_minutes(parse_sshare(TEAM), "vctest_probe")
    assert (account.limit, account.used, account.running) == (100, 0, 90)
    assert account.holders == (("root", 90),)  # vcloud holds nothing: left out
    assert account.left == 10 and account.left_by_usage == 100
    two = TEAM.replace("|vcloud||cpu=0,mem=0,energy=0,node=0,billing=0,fs/disk=0,vmem=0,pages=0,gres/gpu=0|cpu=0,",
                       "|vcloud||cpu=0,mem=0,energy=0,node=0,billing=0,fs/disk=0,vmem=0,pages=0,gres/gpu=0|cpu=5,")
    two = two.replace("billing=0,fs/disk=0,vmem=0,pages=0,gres/gpu=0\n", "billing=120,fs/disk=0,vmem=0,pages=0,gres/gpu=0\n")
    assert account_tres_minutes(parse_sshare(two), "vctest_probe").holders == (("vcloud", 120), ("root", 90))
