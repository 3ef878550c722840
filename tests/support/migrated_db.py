"""A migrated Airflow metadata database for a test deployment, without running the migrations again.

Every test deployment starts on an empty SQLite file that ``airflow db migrate`` brings to Airflow's
schema: seconds of CPU each (Airflow's import, then every migration since 2.x), paid by each of the
suite's deployments on a machine where the suite is CPU-bound. The schema does not depend on the
deployment, so each test process migrates one template once and every deployment gets a copy of it
(SQLite's backup API: a consistent copy even of a file in WAL mode).
"""

from __future__ import annotations

import atexit
import shutil
import sqlite3
import subprocess
import sys
import tempfile
from contextlib import closing
from pathlib import Path

SQLITE_PREFIX = "sqlite:///"

_template: Path | None = None


def database_file(env: dict[str, str]) -> Path:
    """The SQLite file of the deployment whose environment is ``env``."""
    url = env.get("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", "")
    if not url.startswith(SQLITE_PREFIX):
        raise ValueError(f"not a SQLite deployment ({url or 'no AIRFLOW__DATABASE__SQL_ALCHEMY_CONN'}): "
                         "migrate it with `airflow db migrate`")
    return Path(url.removeprefix(SQLITE_PREFIX))


def migrated_template(env: dict[str, str]) -> Path:
    """This process's migrated template database, migrated on first use in ``env`` with a home of its own."""
    global _template
    if _template is None:
        home = Path(tempfile.mkdtemp(prefix="vcloud-airflow-template-"))
        atexit.register(shutil.rmtree, home, True)
        template = home / "airflow.db"
        proc = subprocess.run([sys.executable, "-m", "airflow", "db", "migrate"], capture_output=True, text=True,
                              timeout=600, env={**env, "AIRFLOW_HOME": str(home),
                                                "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"{SQLITE_PREFIX}{template}",
                                                "AIRFLOW__LOGGING__BASE_LOG_FOLDER": str(home / "logs")})
        if proc.returncode != 0:
            raise RuntimeError(f"airflow db migrate of the template database failed:\n{proc.stderr[-3000:]}")
        _template = template
    return _template


def migrate(env: dict[str, str]) -> Path:
    """Give the deployment of ``env`` a migrated, empty metadata database; returns its file."""
    target = database_file(env)
    target.parent.mkdir(parents=True, exist_ok=True)
    for leftover in (target, target.with_name(target.name + "-wal"), target.with_name(target.name + "-shm")):
        leftover.unlink(missing_ok=True)
    with closing(sqlite3.connect(migrated_template(env))) as source, closing(sqlite3.connect(target)) as copy:
        source.backup(copy)
    return target
