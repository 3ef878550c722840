"""docker-compose.yaml and its images, checked by parsing (no Docker engine runs the stack here)."""

from __future__ import annotations

import fnmatch
import json
import os
import re
import shlex
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
CLUSTER_SIDE = ("airflow-worker", "airflow-triggerer")
"""The services that run cluster commands (task and trigger code): the only ones with the credentials."""
NO_CREDENTIALS = ("airflow-apiserver", "airflow-scheduler", "airflow-dag-processor")
JWT_HOLDERS = ("airflow-apiserver", "airflow-scheduler")
"""Airflow 3.3: the API server verifies the Task Execution API's tokens, the scheduler signs the
tokens of the workloads it queues; workers only carry theirs, the triggerer and the DAG processor
use the Execution API in-process without one."""
CREDENTIAL_MOUNTS = ("/opt/airflow/secrets", "/opt/airflow/ssh-control", "/var/lib/vcloud-localcluster")
ENV_EXAMPLE = DOCKER / "env.example"

sys.path.insert(0, str(DOCKER))
from check_connections import problems_of, resolve_alias  # noqa: E402
from slurm_provider.transport.host_keys import extra_problems, ssh_config_problems  # noqa: E402


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


def _default(source: str) -> str:
    """The default of a ``${VAR:-default}`` mount source."""
    match = re.fullmatch(r"\$\{\w+:-(.*)\}", source)
    assert match, f"{source!r} is not ${{VAR:-default}}"
    return match.group(1).rstrip("/")


def _airflow_services(compose: dict) -> dict[str, dict]:
    return {name: s for name, s in compose["services"].items()
            if s.get("build", {}).get("dockerfile") == "include/docker/airflow.Dockerfile"}


def test_the_services_of_airflows_official_layout_exist(compose: dict) -> None:
    assert set(_airflow_services(compose)) == {"airflow-apiserver", "airflow-scheduler", "airflow-dag-processor",
                                               "airflow-worker", "airflow-triggerer", "airflow-init"}
    assert {"postgres", "redis"} <= set(compose["services"])
    assert compose["services"]["airflow-triggerer"]["command"].split()[0] == "triggerer"
    assert compose["services"]["airflow-worker"]["command"].split()[:2] == ["celery", "worker"]


def test_the_worker_and_the_triggerer_beside_it_consume_the_same_queues(compose: dict) -> None:
    """Triggers go to their task's queue: a triggerer without the worker's queues would leave that
    worker's deferred tasks unwatched (and one without ``default`` every job task of a key login)."""
    services = compose["services"]
    assert services["airflow-worker"]["environment"]["AIRFLOW__TRIGGERER__QUEUES_ENABLED"] == "true"
    worker = services["airflow-worker"]["command"].split()
    triggerer = services["airflow-triggerer"]["command"].split()
    assert worker[2:] == triggerer[1:] == ["--queues", "${VCLOUD_QUEUES:-default}"]
    example = dict(line.split("=", 1) for line in ENV_EXAMPLE.read_text().splitlines()
                   if line and not line.startswith("#"))
    assert example["VCLOUD_QUEUES"].split(",")[0] == "default"


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


def test_only_the_services_that_run_cluster_commands_hold_the_credentials(compose: dict) -> None:
    services = compose["services"]
    for name in CLUSTER_SIDE:
        mounts = _mounts(services[name])
        assert {target: mounts[target][1] for target in CREDENTIAL_MOUNTS} == dict.fromkeys(CREDENTIAL_MOUNTS, "ro"), name
        assert mounts["/opt/airflow/secrets"][0].startswith("${VCLOUD_SECRETS_DIR"), name
        assert mounts["/opt/airflow/ssh-control"][0].startswith("${VCLOUD_SSH_CONTROL_DIR"), name
        env = services[name]["environment"]
        assert env["AIRFLOW__WORKERS__SECRETS_BACKEND"] == "airflow.secrets.local_filesystem.LocalFilesystemBackend"
        assert "VCLOUD_CONNECTIONS_FILE" in env["AIRFLOW__WORKERS__SECRETS_BACKEND_KWARGS"], name
    for name in NO_CREDENTIALS:
        assert not set(CREDENTIAL_MOUNTS) & set(_mounts(services[name])), f"{name} holds cluster credentials"
        assert not [k for k in services[name]["environment"] if "SECRETS_BACKEND" in k or k.startswith(
            "AIRFLOW__SECRETS__")], name
    # airflow-init checks the connections and their key files (read-only); it never sees the
    # ControlMaster directory, which lies outside the secrets directory by default.
    init = _mounts(services["airflow-init"])
    assert init["/opt/airflow/secrets"][1] == "ro" and "/opt/airflow/ssh-control" not in init
    secrets_dir = _default(init["/opt/airflow/secrets"][0])
    control_dir = _default(_mounts(services["airflow-worker"])["/opt/airflow/ssh-control"][0])
    assert not (control_dir + "/").startswith(secrets_dir + "/"), "the ControlMaster directory is in the secrets"
    for name, service in _airflow_services(compose).items():
        if name != "airflow-init":  # the one-shot init runs as root to chown the logs volume
            assert service["user"].startswith("${AIRFLOW_UID"), name
        assert "AIRFLOW__SECRETS__BACKEND" not in service["environment"], name


def test_the_jwt_secret_reaches_only_the_components_that_sign_or_verify_tokens(compose: dict) -> None:
    holders = {name for name, service in _airflow_services(compose).items()
               if "AIRFLOW__API_AUTH__JWT_SECRET" in service["environment"]}
    assert holders == set(JWT_HOLDERS)


def test_only_the_ui_is_published_and_on_loopback_by_default(compose: dict) -> None:
    published = {name: service["ports"] for name, service in compose["services"].items() if service.get("ports")}
    assert published == {"airflow-apiserver": ["${AIRFLOW_BIND:-127.0.0.1}:${AIRFLOW_PORT:-8080}:8080"]}
    redis = compose["services"]["redis"]
    assert "--requirepass" in " ".join(redis["command"]) and "PONG" in " ".join(redis["healthcheck"]["test"])


def test_host_keys_are_checked_and_the_cluster_policy_is_everywhere(compose: dict) -> None:
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


def _instructions(dockerfile: Path) -> list[str]:
    """The Dockerfile's instructions, continuation lines joined, comments dropped."""
    instructions, current = [], ""
    for raw in dockerfile.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            current += line[:-1] + " "
            continue
        instructions.append(current + line)
        current = ""
    return instructions


def copy_sources(dockerfile: Path) -> list[str]:
    """The build-context sources of every COPY and ADD (not ``--from`` another stage or image)."""
    sources = []
    for instruction in _instructions(dockerfile):
        keyword, _, rest = instruction.partition(" ")
        if keyword.upper() not in ("COPY", "ADD"):
            continue
        words = rest.split()
        flags = []
        while words and words[0].startswith("--"):
            flags.append(words.pop(0))
        if any(flag.startswith("--from=") for flag in flags):
            continue
        rest = " ".join(words)
        args = json.loads(rest) if rest.startswith("[") else shlex.split(rest)
        sources += args[:-1]
    return sources


def _ignore_patterns(dockerfile: Path, context: Path) -> list[str]:
    """BuildKit's rule: ``<Dockerfile>.dockerignore`` next to the Dockerfile wins over the context's
    ``.dockerignore``; lines as Docker reads them (trimmed, no comments, no blanks)."""
    for candidate in (Path(f"{dockerfile}.dockerignore"), context / ".dockerignore"):
        if candidate.is_file():
            return [line.strip() for line in candidate.read_text().splitlines()
                    if line.strip() and not line.strip().startswith("#")]
    return []


def _tracked_files(context: Path) -> list[str]:
    out = subprocess.run(["git", "ls-files", "-z"], cwd=context, capture_output=True, text=True, check=True,
                         timeout=60).stdout
    return [path for path in out.split("\0") if path]


def context_problems(sources: list[str], patterns: list[str], files: list[str]) -> list[str]:
    """What a build would miss: a source that no file of the context matches, or a file of a source
    that the ignore patterns leave out of the context (Docker's own matcher decides)."""
    try:
        from docker.utils.build import PatternMatcher
    except ImportError:
        pytest.fail("the docker package (Docker's .dockerignore matcher) is missing: "
                    "pip install -r requirements-lock.txt (make venv does)", pytrace=False)

    matcher = PatternMatcher(patterns)
    problems = []
    for source in sources:
        source = source.strip("/").removeprefix("./")
        under = [f for f in files if fnmatch.fnmatchcase(f, source) or f.startswith(source + "/")]
        if not under:
            problems.append(f"{source}: no such file in the build context")
        problems += [f"{source}: {f} is excluded by the .dockerignore" for f in under if matcher.matches(f)]
    return problems


def _compose_builds(compose: dict) -> list[tuple[Path, Path]]:
    """(Dockerfile, context) of every service that builds an image."""
    builds = {(REPO / s["build"]["context"] / s["build"]["dockerfile"], REPO / s["build"]["context"])
              for s in compose["services"].values() if "build" in s}
    return sorted(builds)


def test_every_copy_source_of_each_image_is_inside_its_build_context(compose: dict) -> None:
    builds = _compose_builds(compose)
    assert {d.name for d, _ in builds} == {"airflow.Dockerfile", "cluster.Dockerfile"}
    for dockerfile, context in builds:
        sources = copy_sources(dockerfile)
        assert sources, dockerfile
        problems = context_problems(sources, _ignore_patterns(dockerfile, context), _tracked_files(context))
        assert problems == [], f"{dockerfile.name}: {problems}"
    assert "providers/slurm" in copy_sources(DOCKER / "airflow.Dockerfile")


def test_the_context_check_finds_a_source_the_dockerignore_leaves_out() -> None:
    """The check itself: the earlier airflow.Dockerfile.dockerignore (only the lock file) failed it."""
    files = ["requirements-lock.txt", "providers/slurm/pyproject.toml", "providers/slurm/src/p/__init__.py"]
    sources = ["requirements-lock.txt", "providers/slurm"]
    problems = context_problems(sources, ["*", "!requirements-lock.txt"], files)
    assert problems == ["providers/slurm: providers/slurm/pyproject.toml is excluded by the .dockerignore",
                        "providers/slurm: providers/slurm/src/p/__init__.py is excluded by the .dockerignore"]
    assert context_problems(sources, ["*", "!requirements-lock.txt", "!providers/slurm"], files) == []
    assert context_problems(["trainer/missing.txt"], [], files) == [
        "trainer/missing.txt: no such file in the build context"]
    assert copy_sources(DOCKER / "cluster.Dockerfile") == [
        "include/local_cluster", "trainer/requirements-runtime.txt", "include/docker/cluster-entrypoint.sh"]


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


def _required_variables() -> set[str]:
    """The variables docker-compose.yaml demands (``${VAR:?message}``)."""
    return set(re.findall(r"\$\{(\w+):\?", COMPOSE.read_text()))


def _example_env() -> dict[str, str]:
    """include/docker/env.example as a team fills it in: every empty setting gets a value."""
    env = {}
    for line in ENV_EXAMPLE.read_text().splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            env[key] = value or f"filled-{key.lower().replace('_', '-')}"
    return env


def _compose(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    if shutil.which("docker-compose") is None:
        pytest.fail("docker-compose is missing: run include/test_deps.sh (make test does)", pytrace=False)
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW_", "VCLOUD_", "POSTGRES_", "REDIS_"))}
    return subprocess.run(["docker-compose", *args], cwd=REPO, env={**clean, **env}, capture_output=True,
                          text=True, timeout=60, check=False)


def test_every_secret_is_required_and_named_in_the_example_env() -> None:
    required = _required_variables()
    assert {"POSTGRES_PASSWORD", "REDIS_PASSWORD", "AIRFLOW_FERNET_KEY", "AIRFLOW_JWT_SECRET",
            "AIRFLOW_ADMIN_PASSWORD"} <= required
    example = ENV_EXAMPLE.read_text()
    for name in required:
        assert re.search(rf"^{name}=$", example, re.MULTILINE), f"env.example must list {name} with no value"
    assert not re.search(r"\$\{(POSTGRES|REDIS)_PASSWORD:-|\$\{AIRFLOW_(FERNET_KEY|JWT_SECRET):-", COMPOSE.read_text())


def test_docker_compose_accepts_the_filled_example_env_and_resolves_the_secrets_where_they_go() -> None:
    env = _example_env()
    ok = _compose("--profile", "dev-cluster", "config", "-q", env=env)
    assert ok.returncode == 0, ok.stderr
    resolved = yaml.safe_load(_compose("config", env=env).stdout)["services"]
    worker = resolved["airflow-worker"]["environment"]
    kwargs = worker["AIRFLOW__WORKERS__SECRETS_BACKEND_KWARGS"]
    assert json.loads(kwargs) == {"connections_file_path": "/opt/airflow/secrets/connections.json"}
    assert worker["AIRFLOW__CELERY__BROKER_URL"] == f"redis://:{env['REDIS_PASSWORD']}@redis:6379/0"
    assert f":{env['POSTGRES_PASSWORD']}@postgres/" in worker["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"]
    assert resolved["redis"]["environment"]["REDIS_PASSWORD"] == env["REDIS_PASSWORD"]
    assert resolved["postgres"]["environment"]["POSTGRES_PASSWORD"] == env["POSTGRES_PASSWORD"]
    assert [name for name, s in resolved.items()
            if s.get("environment", {}).get("AIRFLOW__API_AUTH__JWT_SECRET") == env["AIRFLOW_JWT_SECRET"]] \
        == sorted(JWT_HOLDERS)
    assert resolved["airflow-apiserver"]["ports"] == ["127.0.0.1:8080:8080/tcp"]
    opened = yaml.safe_load(_compose("config", env={**env, "AIRFLOW_BIND": "0.0.0.0"}).stdout)
    assert opened["services"]["airflow-apiserver"]["ports"] == ["0.0.0.0:8080:8080/tcp"]


@pytest.mark.parametrize("name", sorted(_required_variables()))
def test_docker_compose_refuses_to_start_without_a_secret_and_names_it(name: str) -> None:
    env = {k: v for k, v in _example_env().items() if k != name}
    missing = _compose("config", "-q", env=env)
    assert missing.returncode != 0
    assert f"set {name} in .env" in missing.stderr, missing.stderr
    empty = _compose("config", "-q", env={**env, name: ""})  # `VAR=` in .env is not a value either
    assert empty.returncode != 0 and f"set {name} in .env" in empty.stderr


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
    # The examples a team starts from pass: their extras, and the containers' ssh_config for LUMI.
    examples = json.loads((DOCKER / "examples" / "connections.json").read_text())
    assert all(extra_problems(conn["extra"]) == [] for conn in examples.values())
    assert ssh_config_problems(resolve_alias("lumi2", str(DOCKER / "examples" / "ssh_config"))) == []


def test_the_local_clusters_connections_pass_the_check(local_cluster) -> None:
    """What `cluster.sh up` writes (here, or in the dev-cluster container) is accepted by airflow-init."""
    path = local_cluster.state_dir / "airflow_conn.json"
    for conn_id, conn in json.loads(path.read_text()).items():
        assert problems_of(conn_id, conn) == [], conn_id
