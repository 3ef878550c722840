"""The HPC view runs no command on the cluster: the API server holds no cluster credentials, and a
login node that hangs must not hold a request thread (the outage test in
``tests/deploy/test_hpc_view_outage.py`` shows it with a frozen sshd)."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import hpc_view

PACKAGE = Path(hpc_view.__file__).resolve().parent
TRANSPORT_MODULES = ("slurm_provider.hooks", "slurm_provider.transport", "slurm_provider.watch.poller", "paramiko",
                     "asyncssh", "airflow.providers.ssh.hooks", "subprocess")


def _imported(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def test_no_module_of_the_view_imports_a_cluster_transport() -> None:
    modules = sorted(PACKAGE.glob("*.py"))
    assert len(modules) >= 8, modules
    found = {path.name: sorted(n for n in _imported(path) if n.startswith(TRANSPORT_MODULES))
             for path in modules}
    assert {name: hits for name, hits in found.items() if hits} == {}


def test_loading_the_plugin_loads_no_cluster_transport() -> None:
    """What the API server imports when it mounts the view (its app and the plugin)."""
    code = ("import json, sys; import hpc_view.plugin, hpc_view.app; "
            f"print(json.dumps(sorted(m for m in sys.modules if m.startswith({TRANSPORT_MODULES!r}))))")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120,
                          check=False)
    assert done.returncode == 0, done.stderr
    loaded = json.loads(done.stdout.strip().splitlines()[-1])
    assert [m for m in loaded if m != "subprocess"] == []
