"""The command lines run over SSH on the real local cluster."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from slurm_provider.cli.sbatch import build_sbatch_test_only, parse_sbatch_test_only
from slurm_provider.cli.squeue import build_squeue, parse_squeue
from slurm_provider.cli.values import is_invalid_job_id_error

from providers.slurm.tests.cli.test_sbatch import COMMENT

STATE_DIR = Path("/var/lib/vcloud-localcluster/ssh")


def ssh(command: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    argv = [
        "ssh", "-p", "2222", "-i", str(STATE_DIR / "id_ed25519"),
        "-o", f"UserKnownHostsFile={STATE_DIR / 'known_hosts'}", "-o", "StrictHostKeyChecking=yes",
        "-o", "BatchMode=yes", "-o", "ConnectTimeout=10", "vcloud@127.0.0.1", command,
    ]  # fmt: skip
    return subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=60)


def cluster_reachable() -> bool:
    if not (STATE_DIR / "id_ed25519").exists():
        return False
    try:
        return ssh("true").returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def test_commands_over_ssh_on_the_local_cluster(local_cluster) -> None:
    if not cluster_reachable():
        pytest.fail("the local Slurm cluster is up but not reachable over SSH", pytrace=False)
    command = build_sbatch_test_only(
        job_name="slurm-provider-test",
        output="/home/vcloud/it's a dir/%x_%j.out",
        partition="small-g",
        time_limit="0:05:00",
        comment=COMMENT,
        extra_options=["--gpus=1"],
    )
    answer = ssh(command, stdin="#!/bin/bash\necho 'never runs'\n")
    estimate = parse_sbatch_test_only(answer.stderr)
    assert estimate.partition == "small-g" and estimate.nodes

    unknown = ssh(build_squeue([999999999]))
    assert unknown.returncode == 1 and is_invalid_job_id_error(unknown.stderr)
    assert parse_squeue(unknown.stdout) == []


def test_a_refused_sbatch_is_kept_in_accounting_as_failed_and_a_refused_test_only_is_not(local_cluster) -> None:
    """Why a submission leaving out nodes asks ``--test-only`` first: Slurm keeps a job ``sbatch``
    refused ("Requested node configuration is not available") in accounting, ``FAILED`` on no node."""
    import time
    import uuid

    from slurm_provider.cli.sbatch import SbatchRefused, build_sbatch_submit

    def accounted() -> list[str]:
        return local_cluster.root("sacct", "-X", "-n", "-P", "-a", "-S", "now-1hours", f"--name={name}",
                                  "--format=State,NodeList").stdout.splitlines()

    name = f"refused-{uuid.uuid4().hex[:8]}"
    options = dict(job_name=name, output="/dev/null", partition="small-g", time_limit="0:05:00", comment=COMMENT,
                   extra_options=["--gpus=1"], exclude=["nid005001", "nid005002", "nid005003"])
    script = "#!/bin/bash\necho 'never runs'\n"
    with pytest.raises(SbatchRefused, match="Requested node configuration is not available"):
        parse_sbatch_test_only(ssh(build_sbatch_test_only(**options), stdin=script).stderr)
    refused = ssh(build_sbatch_submit(**options), stdin=script)
    assert refused.returncode == 1 and "Requested node configuration is not available" in refused.stderr
    deadline = time.monotonic() + 30
    while not accounted() and time.monotonic() < deadline:  # slurmdbd may take a moment
        time.sleep(0.5)
    assert accounted() == ["FAILED|None assigned"]  # one record: the refused sbatch's, none of --test-only
