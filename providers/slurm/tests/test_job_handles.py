"""The commands a person reaches a running job with: written from the connection's own login, ready
to copy, and (on the local cluster) doing what they say."""

from __future__ import annotations

import json
import shlex
import subprocess
import time
from pathlib import Path

import pytest

from slurm_provider import JobHandles
from support.localcluster import LocalCluster
from slurm_provider.transport import TransportConfigError, person_login_argv

OPENSSH_CONN = "vcloud_local_cluster_openssh"


@pytest.mark.parametrize(("login", "job_id", "output", "shell", "follow", "cancel"), [
    (("ssh", "lumi"), "4242", "/scratch/project_465000001/logs/r/s.4242.out",
     "ssh -t lumi 'srun --jobid=4242 --overlap --pty bash -l'",
     "ssh lumi 'tail -n 50 -F /scratch/project_465000001/logs/r/s.4242.out'",
     "ssh lumi 'scancel 4242'"),
    (("ssh", "-p", "2222", "-i", "/keys/id ed25519", "me@10.0.0.1"), "7", "/a b/x.7.out",
     "ssh -t -p 2222 -i '/keys/id ed25519' me@10.0.0.1 'srun --jobid=7 --overlap --pty bash -l'",
     "ssh -p 2222 -i '/keys/id ed25519' me@10.0.0.1 'tail -n 50 -F '\"'\"'/a b/x.7.out'\"'\"''",
     "ssh -p 2222 -i '/keys/id ed25519' me@10.0.0.1 'scancel 7'"),
], ids=["alias", "key-login-with-spaces"])
def test_the_handles_are_one_ssh_command_line_each(login: tuple[str, ...], job_id: str, output: str, shell: str,
                                                   follow: str, cancel: str) -> None:
    handles = JobHandles.of(login, job_id, output)
    assert (handles.shell, handles.follow, handles.cancel) == (shell, follow, cancel)
    # What the remote shell runs is exactly the words meant (the quoting survives both shells).
    remote = shlex.split(follow)[-1]
    assert shlex.split(remote) == ["tail", "-n", "50", "-F", output]
    assert JobHandles.from_json(json.loads(json.dumps(handles.to_json()))) == handles
    assert handles.lines()[0] == f"a shell beside job {job_id} (in its allocation): {shell}"


def test_a_login_that_is_not_ssh_or_a_job_id_that_is_not_one_is_refused() -> None:
    with pytest.raises(ValueError, match="ssh command line"):
        JobHandles.of(("bash", "-c"), "1", "/x")
    with pytest.raises(ValueError, match="not a Slurm job id"):
        JobHandles.of(("ssh", "h"), "1; rm -rf /", "/x")
    assert JobHandles.from_json({"job_id": "1", "shell": "s"}) is None
    assert JobHandles.from_json("ssh h") is None


def test_the_login_is_the_connections_own(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "ssh_config"
    config.write_text("Host lumi\n  HostName lumi.csc.fi\n")
    monkeypatch.setenv("AIRFLOW_CONN_HANDLES_OPENSSH", json.dumps({
        "conn_type": "ssh", "host": "ignored", "extra": {"transport": "openssh", "ssh_alias": "lumi",
                                                         "ssh_config_file": str(config)}}))
    monkeypatch.setenv("AIRFLOW_CONN_HANDLES_KEY", json.dumps({
        "conn_type": "ssh", "host": "login.example", "port": 2200, "login": "me",
        "extra": {"key_file": "/home/me/.ssh/id_ed25519"}}))
    monkeypatch.setenv("AIRFLOW_CONN_HANDLES_PLAIN", json.dumps({"conn_type": "ssh", "host": "login.example"}))
    monkeypatch.setenv("AIRFLOW_CONN_HANDLES_NO_HOST", json.dumps({"conn_type": "ssh", "login": "me"}))
    assert person_login_argv("handles_openssh") == ("ssh", "-F", str(config), "lumi")
    assert person_login_argv("handles_key") == ("ssh", "-p", "2200", "-i", "/home/me/.ssh/id_ed25519",
                                                "me@login.example")
    assert person_login_argv("handles_plain") == ("ssh", "login.example")
    with pytest.raises(TransportConfigError, match="names no host"):
        person_login_argv("handles_no_host")


@pytest.mark.usefixtures("cluster_connection")
def test_the_handles_reach_a_running_job_on_the_cluster(local_cluster: LocalCluster) -> None:
    """A person copies each command: the shell runs in the job's allocation on its node, the output
    follows the job's log, the cancel ends it (sacct says CANCELLED)."""
    out = f"{local_cluster.test_dir()}/handles.%j.out"
    job_id = str(local_cluster.sbatch("#!/bin/bash\necho started on $(hostname)\nsleep 300\n", f"--output={out}"))
    local_cluster.wait_for_state(job_id, {"RUNNING"}, timeout=120)
    handles = JobHandles.of(person_login_argv(OPENSSH_CONN), job_id, out.replace("%j", job_id))
    try:
        # The shell, as a person's terminal runs it (script gives it a terminal).
        typed = "echo IN=$SLURM_JOB_ID ON=$(hostname)\nexit\n"
        done = subprocess.run(["script", "-qec", handles.shell, "/dev/null"], input=typed, capture_output=True,
                              text=True, timeout=120)
        node = local_cluster.ssh(f"squeue -h -j {job_id} -o %N").stdout.strip()
        assert f"IN={job_id} ON={node}" in done.stdout, done.stdout[-2000:] + done.stderr[-2000:]
        # The output, followed for a moment.
        follow = subprocess.Popen(["bash", "-c", handles.follow], stdout=subprocess.PIPE, text=True)
        time.sleep(3)
        follow.terminate()
        followed, _ = follow.communicate(timeout=30)
        assert f"started on {node}" in followed, followed
    finally:
        subprocess.run(["bash", "-c", handles.cancel], check=True, timeout=60)
    local_cluster.wait_for_state(job_id, {"CANCELLED"}, timeout=120)
