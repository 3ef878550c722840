"""`make test` runs the suite with `pytest -n 4 --dist loadgroup --no-loadscope-reorder`: the tests of one `xdist_group`
(a module sharing one Airflow deployment, a module-scoped venv) must run on one worker, or each
worker builds that deployment again and tests meant to run one after another run at once.

pytest-xdist 3.8 marks a group by rewriting `item._nodeid`, which pytest 9.2 no longer reads
(requirements.txt pins pytest below 9.2): this runs a probe of grouped tests in a pytest of its own
with the suite's options and checks where they ran.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

PROBE = '''
import os, time, pytest

@pytest.mark.xdist_group("shared-deployment")
@pytest.mark.parametrize("i", range(6))
def test_grouped(i, tmp_path_factory):
    time.sleep(0.2)
    (OUT / f"grouped-{i}").write_text(os.environ["PYTEST_XDIST_WORKER"])

@pytest.mark.parametrize("i", range(6))
def test_free(i):
    time.sleep(0.2)
'''


def test_the_tests_of_one_xdist_group_run_on_one_worker(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "test_probe.py").write_text(f"from pathlib import Path\nOUT = Path({str(out)!r})\n{PROBE}")
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "3",
                           "--dist", "loadgroup", "--no-loadscope-reorder", "--rootdir", str(tmp_path), "-c", str(tmp_path / "pytest.ini"),
                           str(tmp_path / "test_probe.py")],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    workers = {path.name: path.read_text() for path in out.iterdir()}
    assert len(workers) == 6, workers
    assert len(set(workers.values())) == 1, f"one group ran on several workers: {workers}"
