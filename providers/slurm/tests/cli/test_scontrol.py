"""scontrol show job, show reservation and scancel: command lines and records."""

from __future__ import annotations

import json

import pytest

from slurm_provider.cli.scancel import build_scancel
from slurm_provider.cli.scontrol import (
    build_scontrol_ping,
    build_scontrol_show_job,
    build_scontrol_show_reservations,
    parse_scontrol_ping,
    parse_scontrol_show_job,
    parse_scontrol_show_reservations,
)
from slurm_provider.cli.values import SlurmOutputError, is_invalid_job_id_error
from slurm_provider.validation import ValidationError
from providers.slurm.tests.cli.captured_output import JOBS, raw
from providers.slurm.tests.cli.command_words import argv_of


def test_scontrol_and_scancel() -> None:
    assert argv_of(build_scontrol_show_job(42)) == ["scontrol", "show", "job", "-o", "42"]
    assert argv_of(build_scancel([42, 43])) == ["scancel", "42", "43"]
    assert argv_of(build_scancel([42], signal="SIGUSR1", batch_only=True)) == ["scancel", "--signal=USR1", "--batch", "42"]
    assert argv_of(build_scancel([42], signal=15, full=True)) == ["scancel", "--signal=15", "--full", "42"]
    with pytest.raises(ValidationError, match="batch_only"):
        build_scancel([42], batch_only=True, full=True)
    with pytest.raises(ValidationError, match="signal"):
        build_scancel([42], signal="USR1;reboot")


def test_scontrol_records() -> None:
    record = parse_scontrol_show_job(raw("scontrol_requeued.txt"))[0]
    assert record["JobId"] == JOBS["REQUEUE_ID"]
    assert (record["Restarts"], record["Requeue"], record["BatchFlag"]) == ("1", "1", "1")
    assert record["JobState"] == "PENDING" and record["Reason"] == "BeginTime"
    assert record["Command"] == "(null)", "the script came on stdin"
    assert record["StdOut"].endswith(f"/gc-requeue_{JOBS['REQUEUE_ID']}.out")
    assert record["AllocNode:Sid"].startswith("localhost")
    assert json.loads(record["Comment"])["task"] == "requeue"
    pending = parse_scontrol_show_job(raw("scontrol_pending.txt"))[0]
    assert pending["Reason"] == "PartitionTimeLimit" and pending["Partition"] == "dev-g"
    array = parse_scontrol_show_job(raw("scontrol_array.txt"))
    assert {r["ArrayTaskId"] for r in array} >= {"0"}
    assert parse_scontrol_show_job(raw("scontrol_unknown.txt")) == []
    assert is_invalid_job_id_error(raw("scontrol_unknown.stderr.txt"))


def test_scontrol_values_with_spaces() -> None:
    line = "JobId=7 JobName=probe one JobState=RUNNING Reason=None StdOut=/home/a b/probe 7.out TRES=cpu=1,mem=1G,gres/gpu=2 Power="
    record = parse_scontrol_show_job(line)[0]
    assert record["JobName"] == "probe one"
    assert record["StdOut"] == "/home/a b/probe 7.out"
    assert record["TRES"] == "cpu=1,mem=1G,gres/gpu=2"
    assert record["Power"] == ""
    with pytest.raises(SlurmOutputError):
        parse_scontrol_show_job("slurm_load_jobs error: Invalid job id specified")


def test_scontrol_ping() -> None:
    assert argv_of(build_scontrol_ping()) == ["scontrol", "ping"]
    assert parse_scontrol_ping("Slurmctld(primary) at vm is UP\n") == {"primary": "UP"}
    down = ("Slurmctld(primary) at ctl1 is DOWN\nSlurmctld(backup) at ctl2 is UP\n"
            "*****************************************\n** RESTORE SLURMCTLD DAEMON TO SERVICE **\n")
    assert parse_scontrol_ping(down) == {"primary": "DOWN", "backup": "UP"}
    with pytest.raises(SlurmOutputError, match="not a 'scontrol ping' answer"):
        parse_scontrol_ping("scontrol: error: something else\n")


def test_scontrol_show_reservation_reads_each_reservation_and_no_reservation_at_all() -> None:
    assert argv_of(build_scontrol_show_reservations()) == ["scontrol", "show", "reservation", "-o"]
    maint, team = parse_scontrol_show_reservations(raw("scontrol_show_reservation.txt"))
    assert (maint["ReservationName"], maint["Nodes"], maint["Flags"]) == ("maint-test", "nid001001",
                                                                          "MAINT,IGNORE_JOBS,SPEC_NODES")
    assert maint["StartTime"] < maint["EndTime"] and maint["StartTime"][:2] == "20", "ISO times"
    assert maint["TRES"] == "cpu=32"
    assert (team["ReservationName"], team["Flags"], team["Users"]) == ("team-demo", "SPEC_NODES", "vcloud")
    assert parse_scontrol_show_reservations(raw("scontrol_no_reservation.txt")) == []
    with pytest.raises(SlurmOutputError, match="not a 'scontrol show reservation -o' line"):
        parse_scontrol_show_reservations("scontrol: error: Unable to contact slurm controller")
