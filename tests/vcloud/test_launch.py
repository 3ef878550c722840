"""The torchrun launch of a multi-GPU job: the exit code its ranks ended with, one line, no traceback.

The decision is a pure function of what torchrun reports and what the ranks recorded; the launches
below are real torchrun launches (two gloo processes on the CPU), of stand-in workers that exit with
a given code and of the trainer refusing to resume a checkpoint whose weights no longer fit.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from vcloud import contract
from vcloud.checkpoint import save_checkpoint
from vcloud.launch import launch_outcome

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "trainer" / "configs" / "model_tiny.yaml"
RETIRED = "retired.weight"
"""A parameter the checkpoint holds and today's model does not: its weights no longer fit."""


# --------------------------------------------------------------------------- the decision


def test_the_ranks_exit_code_replaces_torchruns_own() -> None:
    outcome = launch_outcome({0: 88, 1: -15}, {0: 88})
    assert outcome.code == contract.EXIT_RESUME_REFUSED
    assert outcome.line == ("vcloud launch: exit 88 of rank 0: latest.pt was written by other code and cannot "
                            "be resumed as asked; nothing trained (torchrun reported rank 0 exit 88, rank 1 "
                            "SIGTERM as its own exit 1)")


def test_a_code_torchrun_reports_counts_without_a_record() -> None:
    """A rank whose record could not be written: torchrun still saw its exit code on this node."""
    assert launch_outcome({0: 85, 1: 85}, {}).code == contract.EXIT_REQUEUE
    assert launch_outcome({1: 87}, {}).line.startswith("vcloud launch: exit 87 of rank 1: GPUs required")


def test_records_of_other_nodes_ranks_count() -> None:
    """This node's ranks failed because their peers on another node stopped: the peers' code wins."""
    outcome = launch_outcome({0: 1, 1: -15}, {4: 88, 5: 88, 6: 88, 7: 88})
    assert outcome.code == contract.EXIT_RESUME_REFUSED
    assert outcome.line.startswith("vcloud launch: exit 88 of ranks 4, 5, 6, 7: latest.pt was written by")
    assert "(torchrun reported rank 0 exit 1, rank 1 SIGTERM as its own exit 1)" in outcome.line


def test_several_codes_the_highest_wins_as_srun_merges_nodes() -> None:
    assert launch_outcome({0: 85}, {2: 87, 3: 88}).code == 88
    assert launch_outcome({0: 85, 1: 87}, {}).code == 87


def test_without_an_outcome_code_the_launch_fails_as_torchrun_does() -> None:
    outcome = launch_outcome({0: 1, 1: -15, 2: -15, 3: 2}, {5: 1})
    assert outcome.code == contract.EXIT_ERROR
    assert outcome.line == ("vcloud launch: exit 1: torchrun reported rank 0 exit 1, ranks 1, 2 SIGTERM, "
                            "rank 3 exit 2; no rank ended with an exit code of the trainer's contract, the "
                            "ranks' own output above says why")


# --------------------------------------------------------------------------- real launches

WORKER = """
import os, sys
code = int(sys.argv[1])
print(f"worker rank {os.environ['RANK']} exits {code}", flush=True)
os._exit(code)
"""


def env_with(records: Path | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "VCLOUD_"))}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=str(REPO / "trainer" / "src"))
    if records is not None:
        env[contract.RANK_EXITS_DIR_ENV] = str(records)
    return env


def launch(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "vcloud.launch", "--standalone", "--nproc_per_node=2", *args]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=200)


def no_torchrun_traceback(result: subprocess.CompletedProcess[str]) -> None:
    assert "Traceback" not in result.stderr and "ChildFailedError" not in result.stderr, result.stderr


@pytest.mark.timeout(240)
def test_a_launch_of_workers_exits_as_they_and_their_records_say(tmp_path: Path) -> None:
    worker = tmp_path / "worker.py"
    worker.write_text(WORKER)
    done = launch([str(worker), "0"], env_with())
    assert done.returncode == 0, done.stderr
    assert "vcloud launch:" not in done.stderr

    failed = launch([str(worker), "1"], env_with(tmp_path / "no records"))
    assert failed.returncode == contract.EXIT_ERROR, failed.stderr
    assert "vcloud launch: exit 1: torchrun reported rank" in failed.stderr
    no_torchrun_traceback(failed)

    # ranks 2 and 3, on another node, recorded a refusal before this node's ranks failed
    records = tmp_path / "records"
    records.mkdir()
    for rank in (2, 3):
        (records / contract.exit_record_name(rank)).write_text(contract.exit_record_text(88))
    peers = launch([str(worker), "1"], env_with(records))
    assert peers.returncode == contract.EXIT_RESUME_REFUSED, peers.stderr
    assert "vcloud launch: exit 88 of ranks 2, 3: latest.pt was written by other code" in peers.stderr
    no_torchrun_traceback(peers)


def stage_that_refuses_to_resume(data: Path, out: Path) -> Path:
    """Stage 0 of a run in ``out`` after one epoch of two, whose ``latest.pt`` holds a parameter the
    model no longer has (as if written by other code): every resume is refused with exit 88."""
    trained = subprocess.run([sys.executable, "-m", "vcloud.train", "--stage", "0", "--config", str(TINY),
                              "--data", str(data), "--out", str(out), "--max-epochs", "1"],
                             env=env_with(), capture_output=True, text=True, timeout=200)
    assert trained.returncode == 0, trained.stdout + trained.stderr
    (out / "stage0" / contract.COMPLETE_FILE).unlink()
    latest = out / "stage0" / contract.LATEST_CHECKPOINT
    state = torch.load(latest, weights_only=True)
    state["model"][RETIRED] = torch.zeros(2)
    state["fingerprint"]["model"].append([RETIRED, [2]])
    save_checkpoint(latest, state, keep_previous=False)
    return latest


@pytest.mark.timeout(300)
def test_a_refused_resume_under_torchrun_exits_88_with_one_line(tiny_prepared: Path, tmp_path: Path) -> None:
    out, records = tmp_path / "run", tmp_path / "records"
    latest = stage_that_refuses_to_resume(tiny_prepared, out)
    before = latest.read_bytes()
    result = launch(["-m", "vcloud.train", "--stage", "0", "--config", str(TINY), "--data",
                     str(tiny_prepared), "--out", str(out), "--max-epochs", "2"], env_with(records))
    assert result.returncode == contract.EXIT_RESUME_REFUSED, result.stdout[-3000:] + result.stderr[-3000:]
    assert f"its weights no longer fit the model: -{RETIRED} 2. Nothing was trained." in result.stdout
    launch_lines = [line for line in result.stderr.splitlines() if line.startswith("vcloud launch:")]
    assert len(launch_lines) == 1, result.stderr
    assert launch_lines[0].startswith("vcloud launch: exit 88 of rank"), result.stderr
    no_torchrun_traceback(result)
    # each rank that got as far as the refusal recorded it (torchrun ends the others with SIGTERM)
    recorded = {p.name: p.read_text() for p in records.iterdir()}
    assert recorded and set(recorded) <= {"rank0.exit", "rank1.exit"} and set(recorded.values()) == {"88\n"}
    assert latest.read_bytes() == before
