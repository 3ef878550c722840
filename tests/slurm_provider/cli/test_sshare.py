"""sshare: an account's TRES-minute limit, usage and running jobs' share."""

from __future__ import annotations

import pytest

from slurm_provider.cli.sshare import account_tres_minutes, build_sshare_account, parse_sshare
from slurm_provider.cli.values import SlurmOutputError, parse_tres_minutes
from slurm_provider.validation import ValidationError
from tests.slurm_provider.cli.captured_output import raw
from tests.slurm_provider.cli.command_words import argv_of


def test_sshare_of_one_account_with_fixed_fields() -> None:
    assert argv_of(build_sshare_account("project_465002500")) == [
        "sshare", "--noheader", "--parsable2", "--accounts=project_465002500",
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
