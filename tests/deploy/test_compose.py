"""docker-compose.yaml and its images, checked by parsing (no Docker engine runs the stack here)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
COMPOSE = REPO / "docker-compose.yaml"
DOCKER = REPO / "include" / "docker"
PROJECT_MOUNTS = {f"./{d}": f"/opt/airflow/{d}" for d in ("dags", "plugins", "include", "trainer")}
LONG_RUNNING = ("airflow-apiserver", "airflow-scheduler", "airflow-dag-processor", "airflow-worker",
                "airflow-triggerer", "postgres", "redis", "slurm-cluster")
SECRETS_ENV = {"AIRFLOW_JWT_SECRET": "test-secret", "AIRFLOW_ADMIN_PASSWORD": "test-password"}

sys.path.insert(0, str(DOCKER))
from check_connections import problems_of  # noqa: E402


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


def _mounts(service: dict) -> dict[str, tuple[str, str]]:
    """target -> (source, mode) of the service's short-syntax volumes."""
    out = {}
    for entry in service.get("volumes", []):
        match = re.fullmatch(r"(\$\{[^}]*\}|[^:]+):([^:]+)(?::(ro|rw))?", entry)
        assert match, f"cannot read volume {entry!r}"
        out[match.group(2)] = (match.group(1), match.group(3) or "rw")
    return out


def _airflow_services(compose: dict) -> dict[str, dict]:
    return {name: s for name, s in compose["services"].items()
            if s.get("build", {}).get("dockerfile") == "include/docker/airflow.Dockerfile"}


def test_the_services_of_airflows_official_layout_exist(compose: dict) -> None:
    assert set(_airflow_services(compose)) == {"airflow-apiserver", "airflow-scheduler", "airflow-dag-processor",
                                               "airflow-worker", "airflow-triggerer", "airflow-init"}
    assert {"postgres", "redis"} <= set(compose["services"])
    assert compose["services"]["airflow-triggerer"]["command"] == "triggerer"
    assert compose["services"]["airflow-worker"]["command"] == "celery worker"


def test_every_service_importing_project_code_mounts_it(compose: dict) -> None:
    for name, service in _airflow_services(compose).items():
        mounts = _mounts(service)
        for source, target in PROJECT_MOUNTS.items():
            assert mounts.get(target, (None,))[0] == source, f"{name} does not mount {source} at {target}"
        env = service["environment"]
        assert env["AIRFLOW__CORE__DAGS_FOLDER"] == "/opt/airflow/dags"
        assert env["AIRFLOW__CORE__PLUGINS_FOLDER"] == "/opt/airflow/plugins"
        assert "/opt/airflow/trainer/src" in env["PYTHONPATH"].split(":"), f"{name} cannot import vcloud.contract"


def test_healthchecks_and_the_execution_api_url(compose: dict) -> None:
    for name in LONG_RUNNING:
        test = compose["services"][name].get("healthcheck", {}).get("test")
        assert test, f"{name} has no healthcheck"
    for name, service in _airflow_services(compose).items():
        assert service["environment"]["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"] == \
            "http://airflow-apiserver:8080/execution/", name
    deps = compose["services"]["airflow-apiserver"]["depends_on"]
    assert deps["airflow-init"]["condition"] == "service_completed_successfully"
    assert compose["services"]["slurm-cluster"]["profiles"] == ["dev-cluster"]


def test_keys_are_mounted_read_only_and_host_keys_are_checked(compose: dict) -> None:
    for name, service in _airflow_services(compose).items():
        mounts = _mounts(service)
        assert mounts["/opt/airflow/secrets"][1] == "ro", name
        assert mounts["/var/lib/vcloud-localcluster"][1] == "ro", name
        assert mounts["/opt/airflow/ssh-control"][0].startswith("${VCLOUD_SSH_CONTROL_DIR")
        if name != "airflow-init":  # the one-shot init runs as root to chown the logs volume
            assert service["user"].startswith("${AIRFLOW_UID"), name
    assert "no_host_key_check" not in COMPOSE.read_text()
    # The cluster policy (job tasks to their cluster's pool) in every component; the pools made at init.
    for name, service in _airflow_services(compose).items():
        assert _mounts(service)["/opt/airflow/config/airflow_local_settings.py"] == (
            "./include/airflow/airflow_local_settings.py", "ro"), name
    init = "\n".join(compose["services"]["airflow-init"]["command"])
    assert "python -m vcloud_pipeline.dag.pools --create" in init
    assert init.index("check_connections.py") < init.index("vcloud_pipeline.dag.pools")
    for dockerfile in DOCKER.glob("*.Dockerfile"):
        copies = [line for line in dockerfile.read_text().splitlines() if line.startswith(("COPY", "ADD"))]
        assert not [c for c in copies if "ssh" in c or "secret" in c or "id_" in c], dockerfile


def test_the_airflow_image_bakes_in_the_locked_requirements() -> None:
    text = (DOCKER / "airflow.Dockerfile").read_text()
    assert "ARG AIRFLOW_IMAGE=apache/airflow:3.3.2-python3.11" in text
    assert "COPY --chown=airflow:root requirements-lock.txt" in text
    assert "-r /opt/vcloud/requirements-lock.txt" in text
    assert "_PIP_ADDITIONAL_REQUIREMENTS" not in COMPOSE.read_text()
    # the Slurm provider is a distribution of its own, installed after the lock (whose pins it keeps)
    assert "COPY --chown=airflow:root providers/slurm /opt/vcloud/providers/slurm" in text
    assert 'pip install --no-cache-dir "apache-airflow==3.3.2" /opt/vcloud/providers/slurm' in text
    assert text.index("-r /opt/vcloud/requirements-lock.txt") < text.index("/opt/vcloud/providers/slurm")
    cluster = (DOCKER / "cluster.Dockerfile").read_text()
    assert cluster.startswith("#") and "FROM debian:12" in cluster
    assert "cluster.sh install" in cluster
    assert 'bash "$CLUSTER" up' in (DOCKER / "cluster-entrypoint.sh").read_text()


def test_docker_compose_validates_the_file_and_demands_the_secrets() -> None:
    if shutil.which("docker-compose") is None:
        pytest.fail("docker-compose is missing: run include/test_deps.sh (make test does)", pytrace=False)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW_", "VCLOUD_"))}
    ok = subprocess.run(["docker-compose", "--profile", "dev-cluster", "config", "-q"], cwd=REPO,
                        env={**env, **SECRETS_ENV}, capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0, ok.stderr
    missing = subprocess.run(["docker-compose", "config", "-q"], cwd=REPO, env=env, capture_output=True,
                             text=True, timeout=60)
    assert missing.returncode != 0 and "AIRFLOW_JWT_SECRET" in missing.stderr
    resolved = subprocess.run(["docker-compose", "config"], cwd=REPO, env={**env, **SECRETS_ENV},
                              capture_output=True, text=True, timeout=60)
    kwargs = yaml.safe_load(resolved.stdout)["services"]["airflow-worker"]["environment"][
        "AIRFLOW__SECRETS__BACKEND_KWARGS"]
    assert json.loads(kwargs) == {"connections_file_path": "/opt/airflow/secrets/connections.json"}


def test_connection_check_refuses_unpinned_host_keys(tmp_path: Path) -> None:
    key = tmp_path / "id_ed25519"
    key.write_text("private")
    key.chmod(0o600)
    good = {"conn_type": "ssh", "host": "h", "extra": {"key_file": str(key), "host_key": "ssh-ed25519 AAAA"}}
    assert problems_of("good", good) == []
    unchecked = {"conn_type": "ssh", "host": "h", "extra": {"key_file": str(key), "no_host_key_check": "true",
                                                              "host_key": "ssh-ed25519 AAAA"}}
    assert any("no_host_key_check" in p for p in problems_of("bad", unchecked))
    assert any("no host_key" in p for p in problems_of("bare", {"conn_type": "ssh", "extra": {}}))
    assert any("no host_key" in p for p in problems_of("bare", {"conn_type": "slurm", "extra": {}}))
    assert problems_of("good", {**good, "conn_type": "slurm"}) == []
    key.chmod(0o644)
    assert any("chmod 600" in p for p in problems_of("open", good))
    example = json.loads((DOCKER / "examples" / "connections.json").read_text())
    assert all(not c["extra"].get("no_host_key_check") for c in example.values())


def test_connection_check_refuses_what_the_transports_refuse(tmp_path: Path) -> None:
    """The start-up check and the transports at run time ask the same functions (host_keys)."""
    pinned = {"conn_type": "slurm", "host": "h", "extra": {"host_key": "ssh-ed25519 AAAA"}}
    for extra, said in (({"allow_host_key_change": "true"}, "allow_host_key_change is true"),
                        ({"known_hosts": "none"}, "known_hosts is none"),
                        ({"no_host_key_check": True}, "no_host_key_check is true")):
        [problem] = problems_of("c", {**pinned, "extra": {**pinned["extra"], **extra}})
        assert problem.startswith(f"c: {said}"), problem
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text("[lumi.example]:22 ssh-ed25519 AAAA\n")
    config = tmp_path / "ssh_config"
    openssh = {"conn_type": "ssh", "extra": {"transport": "openssh", "ssh_alias": "lumi",
                                             "ssh_config_file": str(config)}}
    config.write_text(f"Host lumi\n    UserKnownHostsFile {known_hosts}\n    StrictHostKeyChecking yes\n")
    assert problems_of("lumi", openssh) == []
    config.write_text(f"Host lumi\n    UserKnownHostsFile {known_hosts}\n    StrictHostKeyChecking no\n")
    [problem] = problems_of("lumi", openssh)
    assert "StrictHostKeyChecking no" in problem and f"({config}, Host lumi)" in problem
    config.write_text("Host lumi\n    UserKnownHostsFile /dev/null\n")
    assert "UserKnownHostsFile /dev/null" in problems_of("lumi", openssh)[0]


def test_the_local_clusters_connections_pass_the_check(local_cluster) -> None:
    """What `cluster.sh up` writes (here, or in the dev-cluster container) is accepted by airflow-init."""
    path = local_cluster.state_dir / "airflow_conn.json"
    for conn_id, conn in json.loads(path.read_text()).items():
        assert problems_of(conn_id, conn) == [], conn_id
