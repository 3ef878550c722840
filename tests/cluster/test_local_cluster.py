"""Smoke tests of the local cluster: real Slurm behind a real SSH login, as the cluster user."""

from __future__ import annotations

import json
import subprocess
import threading
import uuid
from pathlib import Path

import pytest

from support.localcluster import LocalCluster, cluster_up, poll_until


def test_partitions_are_shaped_like_the_sites(local_cluster: LocalCluster) -> None:
    partitions = local_cluster.ssh("sinfo -h -o '%P'").stdout.split()
    # LUMI-G's (small-g the default: '*'), the preempting "urgent", LUMI-C's small, Levante's gpu,
    # Cosmos' debug.
    assert set(partitions) == {"small-g*", "standard-g", "dev-g", "urgent", "small", "gpu", "debug"}


def test_accounting_answers(local_cluster: LocalCluster) -> None:
    out = local_cluster.ssh("sacctmgr -n -P list cluster format=cluster").stdout.split()
    assert "vcloud-local" in out
    assert local_cluster.ssh("sacct -n -X -S now-1hours --format=JobID").returncode == 0


def test_submitted_job_shows_in_squeue_then_sacct(local_cluster: LocalCluster) -> None:
    out_dir = local_cluster.test_dir()
    name = f"smoke-{uuid.uuid4().hex[:8]}"
    job_id = local_cluster.sbatch("#!/bin/bash\nid -u\nsleep 4\n", f"--job-name={name}",
                                  f"--output={out_dir}/%j.out", "--time=2")
    local_cluster.wait_for_state(job_id, {"RUNNING"}, timeout=60)
    squeue = local_cluster.ssh(f"squeue -h -j {job_id} -o '%i|%j|%T'").stdout.strip()
    assert squeue == f"{job_id}|{name}|RUNNING"

    local_cluster.wait_for_state(job_id, {"COMPLETED"}, timeout=60)
    sacct = poll_until(lambda: local_cluster.ssh(
        f"sacct -X -n -P -S now-1hours -j {job_id} --format=JobIDRaw,State,ExitCode").stdout.strip(),
        timeout=60, what="the job in sacct")
    assert sacct == f"{job_id}|COMPLETED|0:0"
    uid = local_cluster.ssh(f"cat {out_dir}/{job_id}.out").stdout.strip()
    assert uid != "0", "jobs must run as the unprivileged cluster user, never as root"


def test_requeued_job_runs_again_with_restart_count(local_cluster: LocalCluster) -> None:
    out_dir = local_cluster.test_dir()
    script = (
        "#!/bin/bash\n"
        'echo "run restart=${SLURM_RESTART_COUNT:-0}"\n'
        '[ "${SLURM_RESTART_COUNT:-0}" -ge 1 ] && exit 0\n'
        "sleep 120\n"
    )
    job_id = local_cluster.sbatch(script, "--requeue", "--open-mode=append",
                                  f"--output={out_dir}/%j.out", "--time=5")
    local_cluster.wait_for_state(job_id, {"RUNNING"}, timeout=60)
    local_cluster.root("scontrol", "requeue", str(job_id))
    local_cluster.wait_for_state(job_id, {"COMPLETED"}, timeout=180)

    lines = local_cluster.ssh(f"cat {out_dir}/{job_id}.out").stdout.split("\n")
    assert [ln for ln in lines if ln.startswith("run ")] == ["run restart=0", "run restart=1"]
    runs = poll_until(lambda: [r["State"] for r in local_cluster.sacct_runs(job_id)
                               if r["State"] == "COMPLETED"] and local_cluster.sacct_runs(job_id),
                      timeout=60, what="both runs in sacct -D")
    assert [run["State"] for run in runs] == ["REQUEUED", "COMPLETED"]


def test_gpu_job_sees_visible_devices(local_cluster: LocalCluster) -> None:
    out_dir = local_cluster.test_dir()
    job_id = local_cluster.sbatch(
        "#!/bin/bash\necho \"CUDA=${CUDA_VISIBLE_DEVICES:-unset} ROCR=${ROCR_VISIBLE_DEVICES:-unset}\"\n",
        "--gpus=1", f"--output={out_dir}/%j.out", "--time=1")
    local_cluster.wait_for_state(job_id, {"COMPLETED"}, timeout=60)
    seen = local_cluster.ssh(f"cat {out_dir}/{job_id}.out").stdout.strip()
    # one of the four emulated GPUs (others may be held by concurrent jobs), the same for both stacks
    assert seen in {f"CUDA={i} ROCR={i}" for i in range(4)}, seen
    tres = poll_until(lambda: local_cluster.ssh(
        f"sacct -X -n -P -S now-1hours -j {job_id} --format=AllocTRES").stdout.strip(),
        timeout=60, what="the job in sacct")
    assert "gres/gpu=1" in tres


def test_job_is_found_again_by_name_and_comment(local_cluster: LocalCluster) -> None:
    name = f"vcloud-find-{uuid.uuid4().hex[:8]}"
    comment = json.dumps({"dag": "vcloud_training", "task": "stage_1", "attempt": 1}, separators=(",", ":"))
    job_id = local_cluster.sbatch("#!/bin/bash\nsleep 30\n", f"--job-name={name}", f"--comment={comment}",
                                  "--output=/dev/null", "--time=2")
    try:
        found = local_cluster.ssh(f"squeue -h --name={name} -o '%i|%k'").stdout.strip()
        assert found == f"{job_id}|{comment}"
        local_cluster.ssh(f"scancel {job_id}")
        local_cluster.wait_for_state(job_id, {"CANCELLED"}, timeout=60)
        rows = poll_until(lambda: local_cluster.ssh(
            f"sacct -X -n -P -S now-1hours --name={name} --format=JobIDRaw,Comment").stdout.strip(),
            timeout=60, what="the cancelled job in sacct")
        assert rows == f"{job_id}|{comment}"
    finally:
        local_cluster.ssh(f"scancel {job_id}", check=False)


def test_rsync_over_the_same_login(local_cluster: LocalCluster, tmp_path: Path) -> None:
    (tmp_path / "pkg" / "data").mkdir(parents=True)
    (tmp_path / "pkg" / "data" / "reader.py").write_text("X = 1\n")
    (tmp_path / "with space 'quoted'.txt").write_text("ok\n")
    dest = local_cluster.test_dir()
    ssh_cmd = " ".join(local_cluster.ssh_argv()[:-1])
    subprocess.run(["rsync", "-az", "-e", ssh_cmd, f"{tmp_path}/", f"vcloud-local:{dest}/"],
                   check=True, capture_output=True, timeout=60)
    listing = local_cluster.ssh(f"cd {dest} && find . -type f | sort").stdout.split("\n")
    assert "./pkg/data/reader.py" in listing
    assert "./with space 'quoted'.txt" in listing


@pytest.fixture
def ssh_without_master(local_cluster: LocalCluster) -> list[str]:
    """ssh options that bypass the shared ControlMaster, so each attempt really authenticates."""
    return ["-o", "ControlMaster=no", "-o", "ControlPath=none", "-o", "BatchMode=yes",
            "-o", "ConnectTimeout=10"]


def test_login_refuses_an_unknown_key(local_cluster: LocalCluster, ssh_without_master: list[str],
                                      tmp_path: Path) -> None:
    other_key = tmp_path / "other_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other_key)], check=True)
    proc = subprocess.run(
        ["ssh", "-F", "/dev/null", *ssh_without_master, "-o", "IdentitiesOnly=yes", "-i", str(other_key),
         "-o", f"UserKnownHostsFile={local_cluster.known_hosts}", "-o", "StrictHostKeyChecking=yes",
         "-p", str(local_cluster.ssh_port), f"{local_cluster.user}@127.0.0.1", "true"],
        capture_output=True, text=True, timeout=30)
    assert proc.returncode == 255
    assert "Permission denied" in proc.stderr


def test_login_works_with_the_generated_key_and_pinned_host_key(
        local_cluster: LocalCluster, ssh_without_master: list[str]) -> None:
    proc = subprocess.run(
        ["ssh", "-F", "/dev/null", *ssh_without_master, "-o", "IdentitiesOnly=yes",
         "-i", str(local_cluster.key_file), "-o", f"UserKnownHostsFile={local_cluster.known_hosts}",
         "-o", "StrictHostKeyChecking=yes", "-p", str(local_cluster.ssh_port),
         f"{local_cluster.user}@127.0.0.1", "whoami"],
        capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == local_cluster.user


def test_login_refuses_a_host_whose_key_is_not_pinned(local_cluster: LocalCluster,
                                                      ssh_without_master: list[str],
                                                      tmp_path: Path) -> None:
    impostor = tmp_path / "impostor"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(impostor)], check=True)
    known_hosts = tmp_path / "known_hosts"
    key = " ".join((impostor.with_suffix(".pub")).read_text().split()[:2])
    known_hosts.write_text(f"[127.0.0.1]:{local_cluster.ssh_port} {key}\n")
    proc = subprocess.run(
        ["ssh", "-F", "/dev/null", *ssh_without_master, "-o", "IdentitiesOnly=yes",
         "-i", str(local_cluster.key_file), "-o", f"UserKnownHostsFile={known_hosts}",
         "-o", "StrictHostKeyChecking=yes", "-p", str(local_cluster.ssh_port),
         f"{local_cluster.user}@127.0.0.1", "true"],
        capture_output=True, text=True, timeout=30)
    assert proc.returncode == 255
    assert "REMOTE HOST IDENTIFICATION HAS CHANGED" in proc.stderr or "Host key verification failed" in proc.stderr


def test_root_cannot_log_in(local_cluster: LocalCluster, ssh_without_master: list[str]) -> None:
    proc = subprocess.run(
        ["ssh", "-F", "/dev/null", *ssh_without_master, "-o", "IdentitiesOnly=yes",
         "-i", str(local_cluster.key_file), "-o", f"UserKnownHostsFile={local_cluster.known_hosts}",
         "-o", "StrictHostKeyChecking=yes", "-p", str(local_cluster.ssh_port), "root@127.0.0.1", "true"],
        capture_output=True, text=True, timeout=30)
    assert proc.returncode == 255


def test_connection_pins_the_host_key(local_cluster: LocalCluster) -> None:
    extra = local_cluster.connection()["extra"]
    assert extra["no_host_key_check"] is False
    pub = (local_cluster.state_dir / "ssh" / "host_ed25519_key.pub").read_text().split()
    assert extra["host_key"] == f"{pub[0]} {pub[1]}"


def test_cluster_up_is_idempotent(local_cluster: LocalCluster) -> None:
    before = local_cluster.daemon_pids()
    nodes = {f"slurmd-{node}" for node in local_cluster.nodes()}
    assert len(nodes) >= 3
    assert set(before) == {"munged", "mariadb", "slurmdbd", "slurmctld", "sshd"} | nodes
    proc = cluster_up(timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert local_cluster.daemon_pids() == before


def test_logins_and_connections_read_while_another_bring_up_runs_are_whole(local_cluster: LocalCluster) -> None:
    """Every test worker's session starts with `cluster.sh up` while other workers' tests log in: the
    client files it writes (ssh config, known_hosts, the Airflow connections) are replaced in one
    rename, so no reader ever sees one empty ("Could not resolve hostname vcloud-local")."""
    ups: list[subprocess.CompletedProcess[str]] = []
    bring_ups = threading.Thread(target=lambda: ups.extend(cluster_up(timeout=300) for _ in range(3)))
    bring_ups.start()
    failures, logins = [], 0
    connections = local_cluster.state_dir / "airflow_conn.json"
    while bring_ups.is_alive() or logins == 0:
        proc = local_cluster.ssh("true", check=False)
        logins += 1
        if proc.returncode != 0:
            failures.append(proc.stderr.strip())
        json.loads(connections.read_text())  # whole JSON at every instant
    bring_ups.join()
    assert [up.returncode for up in ups] == [0, 0, 0], [up.stderr[-2000:] for up in ups]
    assert failures == [], f"{len(failures)} of {logins} logins failed: {failures[:3]}"
