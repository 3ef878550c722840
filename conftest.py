"""Fixtures shared by every test area (tests/ and the Slurm provider's providers/slurm/tests): the local cluster, its Airflow connection, an Airflow home.

Airflow reads its configuration when first imported, so the throwaway AIRFLOW_HOME (SQLite, no
examples) is set here, at import time, before any test module imports Airflow. Each test process
(pytest-xdist worker) gets its own home and database.
"""

from __future__ import annotations

import atexit
import fcntl
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent

_AIRFLOW_HOME = Path(tempfile.mkdtemp(prefix="vcloud-airflow-home-"))
atexit.register(shutil.rmtree, _AIRFLOW_HOME, True)
os.environ.update({
    "AIRFLOW_HOME": str(_AIRFLOW_HOME),
    "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
    "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "dags"),
    "AIRFLOW__CORE__PLUGINS_FOLDER": str(REPO / "plugins"),
    "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{_AIRFLOW_HOME}/airflow.db",
    "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
    # Every test deployment inherits this environment: its DAG processor parses each DAG file at
    # its start, and again every 30 s by default (about a second of CPU each time for the training
    # DAG), though no test changes a DAG file under a running deployment.
    "AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL": "600",
    # As docker-compose.yaml: the Rendered Template view holds a job's whole sbatch script.
    "AIRFLOW__CORE__MAX_TEMPLATED_FIELD_LENGTH": "65536",
    "AIRFLOW__LOGGING__BASE_LOG_FOLDER": str(_AIRFLOW_HOME / "logs"),
    # The product's DAGs plus small DAGs that exist only to drive operators in tests (dag.test()
    # needs a DAG to live in a configured bundle).
    "AIRFLOW__DAG_PROCESSOR__DAG_BUNDLE_CONFIG_LIST": json.dumps([
        {"name": "dags-folder", "classpath": "airflow.dag_processing.bundles.local.LocalDagBundle",
         "kwargs": {"path": str(REPO / "dags")}},
        {"name": "test-dags", "classpath": "airflow.dag_processing.bundles.local.LocalDagBundle",
         "kwargs": {"path": str(REPO / "tests" / "dag_fixtures")}},
    ]),
})

# One OpenMP thread per test process and per trainer it starts: the tests share two cores, and
# torch's second thread mostly spins on tiny tensors (include/profiles/local.yaml says the same for jobs).
os.environ.setdefault("OMP_NUM_THREADS", "1")

from support.localcluster import ClusterUnavailable, LocalCluster, bring_up  # noqa: E402


EXCLUSIVE_GROUP = "exclusive-cluster"
"""The pytest-xdist group of the whole-cluster fault tests: one worker runs them one after another."""


CPU_BOUND = ("tests/vcloud/training/",)
"""Tests that need no cluster and keep a core busy from start to end (real training on the CPU, in
the test's process and in the trainers it starts)."""


def _slow_first(items: list[pytest.Item]) -> list[pytest.Item]:
    return sorted(items, key=lambda item: item.get_closest_marker("slow") is None)


def _spread(waiting: list[pytest.Item], busy: list[pytest.Item]) -> list[pytest.Item]:
    """``busy`` spread evenly among ``waiting``, each list keeping its own order."""
    placed = [(i / len(waiting), 0, n, item) for n, (i, item) in enumerate(enumerate(waiting))]
    placed += [((j + 0.5) / len(busy), 1, n, item) for n, (j, item) in enumerate(enumerate(busy))]
    return [item for *_, item in sorted(placed, key=lambda entry: entry[:3])]


def run_order(items: list[pytest.Item]) -> list[pytest.Item]:
    """Slow cluster tests; the cluster's short tests with the CPU-bound tests that need no cluster
    spread among them; the whole-cluster fault tests; the other tests that need no cluster. Slow
    tests first within each part.

    pytest-xdist (``--dist loadgroup --no-loadscope-reorder``, as ``make test`` runs it) hands out
    work units in this order as workers free up. Longest first: a long test started early overlaps
    the rest instead of running on alone at the end. The cluster's short tests mostly wait on Slurm
    (a job to start, end or be requeued): four workers running only them left the two cores half
    idle for five minutes, which the training tests (:data:`CPU_BOUND`) now fill. The fault tests
    wait for every other cluster test to end (they take the cluster's lock exclusively) and then run
    alone on the cluster: one group, so only one worker waits, while the others run the remaining
    tests that need no cluster, which fill what would otherwise be an idle end of the run."""
    exclusive, slow_cluster, short_cluster, cpu_bound, rest = [], [], [], [], []
    for item in items:
        if item.get_closest_marker("exclusive_cluster") is not None:
            exclusive.append(item)
        elif item.get_closest_marker("cluster") is not None:
            (slow_cluster if item.get_closest_marker("slow") is not None else short_cluster).append(item)
        elif item.nodeid.startswith(CPU_BOUND):
            cpu_bound.append(item)
        else:
            rest.append(item)
    return [*slow_cluster, *_spread(short_cluster, _slow_first(cpu_bound)), *_slow_first(exclusive),
            *_slow_first(rest)]


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark cluster tests (`-m "not cluster"` skips them), group the whole-cluster fault tests and
    put them in :func:`run_order` (otherwise the collection order stays).

    First among the hooks: pytest-xdist's own hook names each test's group from its marks."""
    for item in items:
        if "local_cluster" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.cluster)
        if item.get_closest_marker("exclusive_cluster") is not None:
            item.add_marker(pytest.mark.xdist_group(EXCLUSIVE_GROUP))
    items[:] = run_order(items)


def _process_specific_texts() -> tuple[str, ...]:
    """Texts that differ between two test processes or two moments: today's date (in the forms a
    timestamp takes), the temporary directory and the Airflow home made for this process."""
    import datetime

    today = datetime.datetime.now(datetime.timezone.utc)
    local = datetime.datetime.now()
    return (today.strftime("%Y-%m-%d"), local.strftime("%Y-%m-%d"), str(_AIRFLOW_HOME))


def pytest_make_parametrize_id(config: pytest.Config, val: object, argname: str) -> str | None:
    """Refuse a text value holding a time or a per-process path as its own test id.

    Every pytest-xdist worker collects on its own and must produce the same ids; a value written
    at collection (a marker with its time, a path under this process's temporary directory) gives
    ids that differ between workers once a second passes, and the whole run stops at collection."""
    if isinstance(val, str):
        for text in _process_specific_texts():
            if text in val:
                raise ValueError(f"parametrize {argname!r}: its value holds {text!r}, which differs "
                                 "between test processes; give the parametrize explicit ids=[...]")
    return None


@pytest.fixture(autouse=True)
def _own_worker_caches(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """What a worker host keeps between tasks (the incremental ledger), per test: tests talk to
    different (fake) clusters through the same connection ids."""
    monkeypatch.setenv("VCLOUD_CACHE_DIR", str(tmp_path_factory.mktemp("worker-cache")))


@pytest.fixture(autouse=True)
def _cluster_access(request: pytest.FixtureRequest):
    """Cluster tests share the node; a test that downs or preempts the whole node waits until it is alone.

    A file lock across pytest-xdist workers: shared for ordinary cluster tests, exclusive for
    `exclusive_cluster` ones.
    """
    if "local_cluster" not in request.fixturenames:
        yield
        return
    exclusive = request.node.get_closest_marker("exclusive_cluster") is not None
    with open("/tmp/vcloud-localcluster-access.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        yield


@pytest.fixture(scope="session")
def local_cluster() -> LocalCluster:
    """The running local cluster; brought up once per session. Fails loudly if it cannot come up."""
    try:
        return bring_up()
    except ClusterUnavailable as exc:
        pytest.fail(str(exc), pytrace=False)


@pytest.fixture(scope="session")
def cluster_connection(local_cluster: LocalCluster) -> str:
    """The cluster's SSH login as Airflow connections (`AIRFLOW_CONN_...`); returns the paramiko conn id.

    `<conn_id>_openssh` is the same login through the system OpenSSH client and its ssh_config alias.
    """
    os.environ.update(local_cluster.connection_env())
    return local_cluster.conn_id


@pytest.fixture(scope="session")
def airflow_home() -> Path:
    """A migrated throwaway Airflow home (SQLite, no examples) for dag.test() and `airflow dags test`."""
    from support import migrated_db

    try:
        migrated_db.migrate(dict(os.environ))
    except RuntimeError as exc:
        pytest.fail(str(exc), pytrace=False)
    return _AIRFLOW_HOME


@pytest.fixture
def control_dir():
    """A short directory for ControlPath sockets (Unix socket paths are limited to ~100 bytes); any
    master still listening there is stopped afterwards."""
    path = Path(tempfile.mkdtemp(prefix="cm-", dir="/tmp"))
    yield path
    for socket_path in path.iterdir():
        subprocess.run(["ssh", "-S", str(socket_path), "-O", "exit", "x"], capture_output=True, timeout=10)
        socket_path.unlink(missing_ok=True)
    path.rmdir()


@pytest.fixture
def fake_slurm(monkeypatch: pytest.MonkeyPatch):
    """A fake Slurm login node (tests/support/fake_slurm.py) under every hook built during the test:
    the real ``SlurmHook``/``SlurmAsyncHook`` and their parsers run on top of its job table."""
    from support.fake_slurm import install

    return install(monkeypatch)
