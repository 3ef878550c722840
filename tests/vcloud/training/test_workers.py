"""DataLoader workers start with the stop signals blocked, the first iterator of a process included.

Each case runs in a fresh interpreter: what matters is the first spawn-context iterator, the one
that also starts Python's multiprocessing resource tracker (which unblocks SIGTERM when it has
started it)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]

PROBE = '''
import ctypes
import signal
import torch

class SignalStateAtStart(torch.utils.data.Dataset):
    """Records, when a worker unpickles it (before any worker_init_fn), which signals are blocked."""

    def __init__(self):
        self.blocked_at_start = None  # a non-empty state, so that unpickling calls __setstate__

    def __setstate__(self, state):
        self.__dict__.update(state)
        self.blocked_at_start = sorted(int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, []))

    def __len__(self):
        return 4

    def __getitem__(self, i):
        ignored = [int(s) for s in (signal.SIGUSR2, signal.SIGTERM) if signal.getsignal(s) == signal.SIG_IGN]
        death_signal = ctypes.c_int(-1)
        ctypes.CDLL(None).prctl(2, ctypes.byref(death_signal), 0, 0, 0)  # PR_GET_PDEATHSIG
        return {"blocked_at_start": torch.tensor(self.blocked_at_start), "ignored": torch.tensor(ignored),
                "death_signal": torch.tensor(death_signal.value)}
'''

DRIVER = '''
import json, signal, sys
sys.path.insert(0, sys.argv[1])
from probe import SignalStateAtStart
from torch.utils.data import DataLoader
from vcloud.training.workers import shield_loader_kwargs, shielded_batches

loader = DataLoader(SignalStateAtStart(), batch_size=1,
                    **shield_loader_kwargs({"num_workers": 2, "multiprocessing_context": sys.argv[2]}))
before = sorted(int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, []))
with shielded_batches(loader) as batches:
    items = [{k: v[0].tolist() for k, v in b.items()} for b in batches]
after = sorted(int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, []))
print(json.dumps({"items": items, "main_before": before, "main_after": after}))
'''


@pytest.mark.timeout(120)
@pytest.mark.parametrize("context", ["spawn", "forkserver"])
def test_first_iterator_starts_its_workers_with_the_stop_signals_blocked(context: str, tmp_path: Path) -> None:
    (tmp_path / "probe.py").write_text(PROBE)
    env = {**os.environ, "PYTHONPATH": str(REPO / "trainer" / "src"), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", DRIVER, str(tmp_path), context], env=env,
                          capture_output=True, text=True, timeout=110)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    stop = sorted(int(s) for s in (signal.SIGUSR2, signal.SIGTERM))
    assert len(result["items"]) == 4
    for item in result["items"]:
        assert set(stop) <= set(item["blocked_at_start"]), item  # from fork/exec until the init ignores them
        assert sorted(item["ignored"]) == stop, item
        # a spawned worker dies with the training process; a forkserver's parent is the server
        assert item["death_signal"] == (int(signal.SIGKILL) if context == "spawn" else 0), item
    assert result["main_after"] == result["main_before"]  # the training process's own mask is restored


def test_a_worker_whose_training_process_is_already_gone_exits_at_once(tmp_path: Path) -> None:
    """The parent died while the worker started: no death signal can cover that, so the init exits."""
    code = ("import os\nfrom vcloud.training.workers import die_with_parent\n"
            "die_with_parent(os.getppid() + 1_000_000)\nprint('still running')")
    env = {**os.environ, "PYTHONPATH": str(REPO / "trainer" / "src")}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    from vcloud.training.workers import ORPHANED_EXIT_CODE

    assert done.returncode == ORPHANED_EXIT_CODE and "still running" not in done.stdout, done
    alive = subprocess.run([sys.executable, "-c", code.replace(" + 1_000_000", "")], env=env, capture_output=True,
                           text=True, timeout=60)
    assert alive.returncode == 0 and "still running" in alive.stdout, alive
