"""The provider as a distribution: its wheel, installed into a fresh venv with only Airflow and the SSH
provider (the versions of requirements-lock.txt), runs a job on the local cluster from there.

Nothing of this checkout is on that venv's ``sys.path``: each command runs with its own environment
(no ``PYTHONPATH``) and from a directory outside the checkout.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from support.localcluster import LocalCluster

# One worker builds the module's venv once (under --dist loadgroup each test is otherwise its own unit).
pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.xdist_group("provider-distribution")]

REPO = Path(__file__).resolve().parents[3]
PROVIDER = REPO / "providers" / "slurm"
GOLDEN = Path(__file__).parent / "golden"
PINNED = ("apache-airflow", "apache-airflow-providers-ssh")


@dataclass(frozen=True)
class FreshVenv:
    root: Path
    wheel: Path
    python: Path
    env: dict[str, str]
    """Environment of every command in the venv: its own Airflow home, no PYTHONPATH."""

    def run(self, *argv: str, env: dict[str, str] | None = None, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(argv, env={**self.env, **(env or {})}, cwd=self.root, capture_output=True, text=True,
                              timeout=timeout)
        assert proc.returncode == 0, f"{' '.join(argv[:4])} exited {proc.returncode}:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
        return proc

    def python_json(self, code: str, *args: str, env: dict[str, str] | None = None, timeout: float = 300) -> dict:
        """Run ``code`` (with ``args``) in the venv's interpreter; its last stdout line is JSON."""
        proc = self.run(str(self.python), "-c", code, *args, env=env, timeout=timeout)
        return json.loads(proc.stdout.strip().splitlines()[-1])

    def airflow(self, *args: str, env: dict[str, str] | None = None, timeout: float = 300) -> str:
        return self.run(str(self.root / "venv" / "bin" / "airflow"), *args, env=env, timeout=timeout).stdout

    def airflow_json(self, *args: str) -> list[dict]:
        """An ``airflow ... -o json`` listing (warnings Airflow prints to stdout before it skipped)."""
        out = self.airflow(*args, "-o", "json")
        return json.loads(next(line for line in reversed(out.splitlines()) if line.startswith("[")))


def _pins() -> list[str]:
    lines = (REPO / "requirements-lock.txt").read_text().splitlines()
    pins = [line.strip() for line in lines if line.split("==")[0].strip() in PINNED]
    assert len(pins) == len(PINNED), f"requirements-lock.txt does not pin {PINNED}: {pins}"
    return pins


@pytest.fixture(scope="module")
def fresh_venv(tmp_path_factory: pytest.TempPathFactory) -> FreshVenv:
    root = tmp_path_factory.mktemp("provider-dist")
    source = root / "source"
    shutil.copytree(PROVIDER, source, ignore=shutil.ignore_patterns("build", "dist", "*.egg-info", "__pycache__"))
    # Built offline with this venv's setuptools, as `pip wheel --no-build-isolation` does on a developer's machine.
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--disable-pip-version-check", "--no-deps",
                    "--no-build-isolation", "-w", str(root / "dist"), str(source)],
                   check=True, capture_output=True, text=True, timeout=300)
    (wheel,) = (root / "dist").glob("airflow_provider_slurm_ssh-*.whl")
    base_python = Path(sys.base_prefix) / "bin" / "python3"
    subprocess.run([str(base_python), "-m", "venv", str(root / "venv")], check=True, timeout=300)
    home = root / "airflow-home"
    home.mkdir()
    env = {key: value for key, value in os.environ.items()
           if key != "PYTHONPATH" and not key.startswith("AIRFLOW")}
    env.update({
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__DAGS_FOLDER": str(root / "dags"),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(root / "plugins"),
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home}/airflow.db",
        "AIRFLOW__LOGGING__NAMESPACE_LEVELS": "asyncssh=WARNING paramiko=WARNING",
        "PATH": f"{root / 'venv' / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}",
    })
    (root / "dags").mkdir()
    (root / "plugins").mkdir()
    venv = FreshVenv(root, wheel, root / "venv" / "bin" / "python", env)
    # The lock as constraints: pip resolves Airflow's dependencies to the tested versions. No bytecode
    # compiled ahead (--no-compile): the commands below import a small part of what is installed.
    venv.run(str(venv.python), "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-compile", *_pins(),
             "-c", str(REPO / "requirements-lock.txt"), str(wheel), timeout=900)
    venv.run(str(root / "venv" / "bin" / "airflow"), "db", "migrate", timeout=600)
    return venv


def test_the_wheel_holds_the_provider_and_nothing_of_the_project(fresh_venv: FreshVenv) -> None:
    with zipfile.ZipFile(fresh_venv.wheel) as wheel:
        names = wheel.namelist()
        assert "slurm_provider/operators.py" in names and "slurm_provider/get_provider_info.py" in names
        assert {name.split("/")[0] for name in names if not name.endswith(".dist-info/RECORD")} == {
            "slurm_provider", fresh_venv.wheel.name.split("-py3")[0] + ".dist-info"}
        for name in names:
            text = wheel.read(name).decode(errors="replace")
            assert not re.search(r"(?i)vcloud|lumi|hpc.?view|cosmos|levante", text), name
        metadata = wheel.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
        entry_points = wheel.read(next(n for n in names if n.endswith(".dist-info/entry_points.txt"))).decode()
    requires = [line.split(":", 1)[1].strip() for line in metadata.splitlines() if line.startswith("Requires-Dist:")]
    assert "apache-airflow>=3.0" in requires
    assert any(req.startswith("apache-airflow-providers-ssh") for req in requires)
    assert "[apache_airflow_provider]\nprovider_info = slurm_provider.get_provider_info:get_provider_info" in entry_points


def test_the_fresh_venv_imports_the_installed_provider(fresh_venv: FreshVenv) -> None:
    found = fresh_venv.python_json(
        "import json, sys, slurm_provider, airflow, airflow.providers.ssh, importlib.metadata as md\n"
        "print(json.dumps({'file': slurm_provider.__file__, 'path': sys.path,\n"
        "                  'versions': {n: md.version(n) for n in ('apache-airflow', 'apache-airflow-providers-ssh',"
        " 'airflow-provider-slurm-ssh')}}))")
    site_packages = fresh_venv.root / "venv" / "lib"
    assert Path(found["file"]).is_relative_to(site_packages), found["file"]
    assert not any(entry and Path(entry).resolve().is_relative_to(REPO) for entry in found["path"]), found["path"]
    assert found["versions"] == {"apache-airflow": "3.3.2", "apache-airflow-providers-ssh": "7.0.1",
                                 "airflow-provider-slurm-ssh": "0.1.0"}


def test_airflow_lists_the_provider_with_its_connection_form(fresh_venv: FreshVenv) -> None:
    listed = fresh_venv.airflow_json("providers", "list")
    (slurm,) = [p for p in listed if p["package_name"] == "airflow-provider-slurm-ssh"]
    assert slurm["version"] == "0.1.0"
    form = fresh_venv.python_json(
        "import json\n"
        "from airflow.providers_manager import ProvidersManager\n"
        "pm = ProvidersManager()\n"
        "widgets = {k: [v.field_name, v.is_sensitive] for k, v in pm.connection_form_widgets.items()"
        " if k.startswith('extra__slurm__')}\n"
        "hook = pm.hooks['slurm']\n"
        "print(json.dumps({'widgets': widgets, 'behaviour': pm.field_behaviours.get('slurm'),\n"
        "                  'hook': [hook.hook_class_name, hook.connection_testable],\n"
        "                  'links': sorted(pm.extra_links_class_names)}))")
    assert form["widgets"]["extra__slurm__transport"] == ["transport", False]
    assert form["widgets"]["extra__slurm__private_key"] == ["private_key", True]
    assert {"extra__slurm__ssh_alias", "extra__slurm__ssh_config_file", "extra__slurm__host_key",
            "extra__slurm__key_file"} <= set(form["widgets"])
    assert form["behaviour"]["relabeling"]["host"] == "Login node"
    assert "slurm_provider.links.SlurmJobLogLink" in form["links"]
    assert form["hook"] == ["slurm_provider.hooks.SlurmHook", True], "the form's Test button asks the hook"


def _slurm_connection(cluster: LocalCluster) -> str:
    return json.dumps({**cluster.connection(), "conn_type": "slurm"})


TRIGGER_PROBE = """
import asyncio, json, sys
from airflow._shared.module_loading import import_string
from airflow.models.trigger import Trigger

row = json.loads(sys.argv[1])
stored = Trigger(classpath=row["classpath"], kwargs=row["kwargs"])  # as the deferral wrote it (encrypted)
trigger_class = import_string(stored.classpath)  # as the triggerer loads it
trigger = trigger_class(**stored.kwargs)

async def first_event():
    async for event in trigger.run():
        return event.payload

payload = asyncio.run(asyncio.wait_for(first_event(), 180))
print(json.dumps({"module": sys.modules[trigger_class.__module__].__file__, "payload": payload}))
"""


def test_a_trigger_stored_before_the_move_resumes_from_the_distribution(fresh_venv: FreshVenv,
                                                                        local_cluster: LocalCluster) -> None:
    """A trigger row written while ``slurm_provider`` lived in plugins/ names the same classpath."""
    row = json.loads((GOLDEN / "trigger_row_plugins_era.json").read_text())
    assert row["classpath"] == "slurm_provider.triggers.SlurmJobTrigger"
    log_dir = local_cluster.test_dir()
    job_id = str(local_cluster.sbatch("#!/bin/bash\necho resumed watch\n", "--job-name=train", "--time=2",
                                      f"--output={log_dir}/train.%j.out", f"--error={log_dir}/train.%j.err"))
    row["kwargs"].update(conn_id="slurm_fresh", job_id=job_id, log_path=f"{log_dir}/train.{job_id}.out",
                         err_log_path=f"{log_dir}/train.{job_id}.err")
    found = fresh_venv.python_json(TRIGGER_PROBE, json.dumps(row),
                                   env={"AIRFLOW_CONN_SLURM_FRESH": _slurm_connection(local_cluster)})
    assert Path(found["module"]).is_relative_to(fresh_venv.root / "venv"), found["module"]
    assert found["payload"]["status"]["state"] == "COMPLETED", found["payload"]
    assert found["payload"]["status"]["job_id"] == job_id


DAG_FILE = '''
from datetime import datetime

from airflow.sdk import DAG
from slurm_provider.operators import SlurmSubmitOperator

with DAG(dag_id="slurm_hello", schedule=None, start_date=datetime(2026, 1, 1), catchup=False):
    SlurmSubmitOperator(task_id="hello", conn_id="slurm_fresh", script="#!/bin/bash\\necho hello; hostname\\n",
                        log_dir={log_dir!r}, time_limit="2", retries=0,
                        poll_interval=1.0, max_poll_interval=3.0, first_poll_delay=0.0)
'''


def test_a_dag_of_the_installed_provider_runs_a_job(fresh_venv: FreshVenv, local_cluster: LocalCluster) -> None:
    log_dir = local_cluster.test_dir()
    (fresh_venv.root / "dags" / "slurm_hello.py").write_text(DAG_FILE.format(log_dir=log_dir))
    proc = fresh_venv.run(str(fresh_venv.root / "venv" / "bin" / "airflow"), "dags", "test", "slurm_hello",
                          env={"AIRFLOW_CONN_SLURM_FRESH": _slurm_connection(local_cluster)}, timeout=600)
    output = proc.stdout + proc.stderr
    listing = local_cluster.ssh(f"ls {log_dir}").stdout.split()
    (out_file,) = [name for name in listing if name.endswith(".out")]
    job_id = re.fullmatch(r".+\.(\d+)\.out", out_file).group(1)
    assert [run["State"] for run in local_cluster.sacct_runs(int(job_id))] == ["COMPLETED"]
    hello, hostname = local_cluster.ssh(f"cat {log_dir}/{out_file}").stdout.splitlines()
    assert hello == "hello" and re.fullmatch(r"nid\d{6}|l\d{5}", hostname), (hello, hostname)
    assert f"[job {job_id}] hello" in output
    (run,) = fresh_venv.airflow_json("dags", "list-runs", "slurm_hello")
    assert run["state"] == "success"


WIDGETS_PROBE = """
import json
from slurm_provider.hooks import SlurmHook
widgets = SlurmHook.get_connection_form_widgets()
print(json.dumps({name: [field.field_class.__name__, field.args[0], field.kwargs.get("default")]
                  for name, field in widgets.items()}))
"""


def test_the_hook_builds_the_same_form_for_airflow_versions_that_ask_it(fresh_venv: FreshVenv) -> None:
    """Before Airflow 3.2 the form came from the hook (WTForms, which the UI's FAB provider brings)."""
    from slurm_provider.connection_form import CONNECTION_FIELDS

    fresh_venv.run(str(fresh_venv.python), "-m", "pip", "install", "-q", "--disable-pip-version-check", "wtforms")
    widgets = fresh_venv.python_json(WIDGETS_PROBE)
    assert list(widgets) == list(CONNECTION_FIELDS)
    assert {name: label for name, (_, label, _) in widgets.items()} == \
        {name: field["label"] for name, field in CONNECTION_FIELDS.items()}
    kinds = {name: kind for name, (kind, _, _) in widgets.items()}
    assert kinds["private_key"] == kinds["private_key_passphrase"] == "PasswordField"
    assert kinds["require_control_master"] == "BooleanField"
    assert {kinds[name] for name in ("transport", "host_key", "key_file", "ssh_alias", "ssh_config_file")} == \
        {"StringField"}, "Airflow accepts only String, Password, Integer and Boolean fields"
    assert widgets["transport"][2] == "paramiko"
