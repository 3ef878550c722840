"""The rendered scripts, executed by bash: code-hash refusal and the stop-signal relay.

The trainer's side of the contract (checkpoint on USR2/TERM at a step boundary, exit 85) is played
by a stand-in module in a temporary code tree, so these tests exercise the shell plumbing itself:
trap, forward, wait again, pass the exit code through, and with torchrun, reach its workers. The
outer script runs with stand-ins for ``srun`` (runs its command) and ``scontrol`` (records its
arguments) first on PATH.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from slurm_provider.cli.job_files import job_log_name
from slurm_provider.watch.end_records import EndRecord, end_record_path, parse_end_record
from slurm_provider.hints import find_hints
from vcloud_pipeline.plan.jobspec import JobSpec
from vcloud.code_digest import synced_tree_hash
from vcloud_pipeline.plan.layout import CodePaths, RunPaths, run_paths
from vcloud_pipeline.profile import load_profile
from vcloud_pipeline.jobs.render import (
    EXIT_CODE_MISMATCH,
    EXIT_REQUEUE,
    MAX_EARLY_STOPS,
    RenderedJob,
    render_job,
    shell_word,
)
from vcloud_pipeline.code.tree import CodeManifest

TRAINER_PACKAGE = Path(__file__).resolve().parents[3] / "trainer" / "src" / "vcloud"
LAUNCHER = ("launch.py", "exit_record.py", "contract.py", "durable.py", "exitcodes.py")
"""The real torchrun launcher of a multi-GPU job and what it imports, next to the stand-in trainer."""

STAND_IN_TRAINER = '''
import os, pathlib, signal, sys, time
stop = []
signal.signal(signal.SIGUSR2, lambda s, f: stop.append("USR2"))
signal.signal(signal.SIGTERM, lambda s, f: stop.append("TERM"))
out = pathlib.Path(sys.argv[sys.argv.index("--out") + 1])
rank = os.environ.get("RANK", "0")
out.mkdir(parents=True, exist_ok=True)
def publish(name, text):
    """Whole or not at all: a test polling for the name never reads it half written."""
    (out / f".{name}.part").write_text(text)
    (out / f".{name}.part").rename(out / name)
publish(f"ready.{rank}", " ".join(sys.argv[1:]))
while not stop:
    time.sleep(0.05)
publish(f"stopped.{rank}", stop[0])
# As vcloud.train does: the step's processes get the stop signal from Slurm and from the inner script;
# one arriving during the interpreter's teardown (Python restores default handlers there) would kill it.
for signum in (signal.SIGUSR2, signal.SIGTERM):
    signal.signal(signum, signal.SIG_IGN)
sys.exit(85)
'''

SLOW_START = '''
import os, pathlib, sys, time
slow_out = pathlib.Path(sys.argv[sys.argv.index("--out") + 1])
slow_out.mkdir(parents=True, exist_ok=True)
(slow_out / f"starting.{os.environ.get('RANK', '0')}").write_text("")
time.sleep(600)  # like importing torch on a loaded node: no signal handler yet
'''
"""Prepended to :data:`STAND_IN_TRAINER`: a trainer still starting when the stop signal arrives."""


@pytest.fixture(autouse=True)
def _node_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The scripts' node-local TMPDIR (their bytecode directory lives there): the test's own, not this
    machine's /tmp."""
    node_tmp = tmp_path / "node-local tmp"
    node_tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(node_tmp))


def render(tmp_path: Path, spec: JobSpec, runtime: str = "none", trainer: str = STAND_IN_TRAINER,
           **overrides: object) -> tuple[RenderedJob, RunPaths]:
    """Scripts of the local profile in a temporary project; ``none``: bare, in this interpreter. The
    code tree is made first, in the directory its hash names, as a sync leaves it (without its manifest)."""
    base = tmp_path / "project dir's"
    profile = load_profile("local", overrides={"paths.base": str(base), "software.python": sys.executable,
                                               "container.runtime": runtime,
                                               "container.binds": [str(tmp_path)], **overrides})
    paths = run_paths(profile, "r1")
    staging = tmp_path / "code being synced"
    package = staging / "trainer" / "src" / "vcloud"
    package.mkdir(parents=True, exist_ok=True)
    (package / "__init__.py").write_text("")
    (package / "train.py").write_text(trainer)
    (package / "export.py").write_text(trainer)
    for module in LAUNCHER:
        (package / module).write_text((TRAINER_PACKAGE / module).read_text())
    code = paths.code(synced_tree_hash(staging))
    job = render_job(profile, spec, paths, code.hash)
    for directory in paths.directories_to_create():
        Path(directory).mkdir(parents=True, exist_ok=True)
    if Path(code.dir).exists():  # a second render of the same code
        shutil.rmtree(staging)
    else:
        staging.rename(code.dir)
    Path(job.outer_path).write_text(job.outer)
    Path(job.inner_path).write_text(job.inner)
    return job, paths


def code_of(job: RenderedJob, paths: RunPaths) -> CodePaths:
    """The code directory ``job`` was rendered for (:func:`render` made it)."""
    match = re.search(r"^readonly EXPECTED_CODE_HASH=([0-9a-f]{64})$", job.outer, re.MULTILINE)
    assert match is not None
    return paths.code(match.group(1))


def job_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env.update({"SLURM_JOB_ID": "4242", "SLURM_JOB_NAME": "submitted-as", "SLURM_NODEID": "0",
                "SLURM_JOB_NODELIST": "node1", **extra})
    return env


def test_outer_refuses_to_start_without_a_manifest(tmp_path: Path) -> None:
    job, _ = render(tmp_path, JobSpec.train(0))
    result = subprocess.run(["bash", str(job.outer_path)], env=job_env(), capture_output=True, text=True, timeout=60)
    assert result.returncode == EXIT_CODE_MISMATCH
    assert "code manifest" in result.stderr and "is missing" in result.stderr


def test_outer_runs_only_the_inner_script_it_was_submitted_with(tmp_path: Path) -> None:
    """The inner script is named by its sha256 and checked before it runs: one changed on the cluster
    after submission (or removed) is refused, naming both digests; another render of the job (other
    settings) is written under another name and leaves this job's script as it was."""
    import hashlib

    job, paths = render(tmp_path, JobSpec.train(0))
    code = code_of(job, paths)
    Path(code.manifest).write_text(CodeManifest(code.hash, 3, "2026-02-16T12:00:00+00:00").to_json())
    digest = hashlib.sha256(job.inner.encode()).hexdigest()
    assert job.inner_path.name == f"{job.job_name}.inner.{digest[:16]}.sh"
    other, _ = render(tmp_path, JobSpec.train(0, max_epochs=7))
    assert other.job_name == job.job_name and other.inner_path != job.inner_path
    assert Path(job.inner_path).read_text() == job.inner

    submitted = tmp_path / "submitted.sbatch"  # Slurm's copy of the outer script, taken at submission
    submitted.write_text(job.outer)
    Path(job.inner_path).write_text(job.inner + "echo something else\n")
    changed = hashlib.sha256(Path(job.inner_path).read_bytes()).hexdigest()
    result = subprocess.run(["bash", str(submitted)], env=job_env(), capture_output=True, text=True, timeout=60)
    assert result.returncode == EXIT_CODE_MISMATCH, result.stderr
    assert (f"refusing to start: the inner script {job.inner_path} has sha256 {changed}, not {digest} that this "
            "job was submitted with") in result.stderr
    Path(job.inner_path).unlink()
    result = subprocess.run(["bash", str(submitted)], env=job_env(), capture_output=True, text=True, timeout=60)
    assert result.returncode == EXIT_CODE_MISMATCH
    assert f"has sha256 (none: the file is missing), not {digest}" in result.stderr


def test_outer_refuses_to_start_when_its_code_directory_holds_other_code(tmp_path: Path) -> None:
    job, paths = render(tmp_path, JobSpec.train(0))
    Path(code_of(job, paths).manifest).write_text(CodeManifest("d" * 64, 3, "2026-02-16T12:00:00+00:00").to_json())
    result = subprocess.run(["bash", str(job.outer_path)], env=job_env(), capture_output=True, text=True, timeout=60)
    assert result.returncode == EXIT_CODE_MISMATCH
    expected = code_of(job, paths).hash
    assert f"the code on the cluster ({'d' * 64}) is not the code this job was rendered for ({expected})" \
        in result.stderr


QUICK_TRAINER = "import pathlib, sys\npathlib.Path(sys.argv[sys.argv.index('--out') + 1]).mkdir(parents=True, exist_ok=True)\n"


@pytest.mark.parametrize("change", ["edited", "added", "removed", "bytecode"])
def test_inner_refuses_to_run_a_code_tree_that_no_longer_hashes_to_its_code(tmp_path: Path, change: str) -> None:
    """The manifest's string is not enough: another member could change the files behind it. The inner
    script hashes the tree (vcloud.code_digest, carried in the script) before anything of it runs; bytecode
    planted in the tree counts too, as Python would load it."""
    job, paths = render(tmp_path, JobSpec.train(0), trainer=QUICK_TRAINER)
    code = code_of(job, paths)
    package = Path(code.pythonpath_dir) / "vcloud"
    if change == "edited":
        (package / "train.py").write_text("print('other code')\n")
    elif change == "added":
        (package / "sitecustomize.py").write_text("print('other code')\n")
    elif change == "removed":
        (package / "export.py").unlink()
    else:
        (package / "__pycache__").mkdir()
        (package / "train.cpython-311.pyc").write_bytes(b"planted")
    result = subprocess.run(["bash", str(job.inner_path)], env=job_env(), capture_output=True, text=True, timeout=60)
    assert result.returncode == EXIT_CODE_MISMATCH, result.stderr
    assert f"refusing to start: the code in {code.dir} hashes to " in result.stderr
    assert f", not {code.hash} that this job was synced and rendered for" in result.stderr
    assert not Path(paths.outputs_dir).exists() or not any(Path(paths.outputs_dir).iterdir())


def _run_read_only(job: RenderedJob, code: CodePaths, node_tmp: Path) -> subprocess.CompletedProcess[str]:
    """The job's inner script on a read-only code tree, with ``node_tmp`` as the node's TMPDIR and
    bytecode writing on (as on a compute node)."""
    env = job_env(TMPDIR=str(node_tmp))
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    subprocess.run(["chmod", "-R", "a-w", str(code.dir)], check=True)
    try:
        return subprocess.run(["bash", str(job.inner_path)], env=env, capture_output=True, text=True, timeout=60)
    finally:
        subprocess.run(["chmod", "-R", "u+w", str(code.dir)], check=True)


def test_inner_runs_a_read_only_code_tree_and_keeps_bytecode_in_the_users_own_directory(tmp_path: Path) -> None:
    """A synced tree is read-only for everyone; the job's bytecode goes to this user's private directory on
    the node (PYTHONPYCACHEPREFIX), never into the tree, and the next start finds it there (the image's
    packages compile once per node, not at every start)."""
    job, paths = render(tmp_path, JobSpec.train(0), trainer=QUICK_TRAINER + "import vcloud.contract\n")
    code = code_of(job, paths)
    node_tmp = tmp_path / "node tmp"
    node_tmp.mkdir()
    result = _run_read_only(job, code, node_tmp)
    assert result.returncode == 0, result.stderr
    assert f"vcloud code check: {code.dir} holds code {code.hash}" in result.stderr
    assert not list(Path(code.dir).rglob("__pycache__")) and not list(Path(code.dir).rglob("*.pyc"))
    cache = node_tmp / f"vcloud-pycache-{os.getuid()}"
    assert list(node_tmp.iterdir()) == [cache]
    assert stat.S_IMODE(cache.stat().st_mode) == 0o700
    [compiled] = [p for p in cache.rglob("contract.*.pyc") if Path(code.dir).name in str(p)]
    written = compiled.stat().st_mtime_ns

    again = _run_read_only(job, code, node_tmp)
    assert again.returncode == 0, again.stderr
    assert compiled.stat().st_mtime_ns == written, "the second start compiled again instead of reading the first's bytecode"
    assert "bytecode goes to one of this start's own" not in again.stderr


@pytest.mark.parametrize("taken_by", ["link", "open directory"])
def test_a_bytecode_directory_name_taken_by_a_link_or_an_open_directory_is_not_used(tmp_path: Path,
                                                                                     taken_by: str) -> None:
    """The node's /tmp is shared: a link or a directory others can write at the bytecode directory's name
    is passed over; the start writes to a fresh directory of its own and removes it at its end."""
    job, paths = render(tmp_path, JobSpec.train(0), trainer=QUICK_TRAINER + "import vcloud.contract\n")
    code = code_of(job, paths)
    node_tmp = tmp_path / "node tmp"
    node_tmp.mkdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    taken = node_tmp / f"vcloud-pycache-{os.getuid()}"
    if taken_by == "link":
        taken.symlink_to(elsewhere)
    else:
        taken.mkdir()
        taken.chmod(0o777)
    result = _run_read_only(job, code, node_tmp)
    assert result.returncode == 0, result.stderr
    assert f"{taken} is not this user's private directory; bytecode goes to one of this start's own" in result.stderr
    assert list(node_tmp.iterdir()) == [taken], "the start's own bytecode directory is removed at its end"
    assert not list(elsewhere.iterdir()) and not list(Path(taken).resolve().rglob("*.pyc"))


def test_the_early_stops_count_is_not_written_through_a_planted_link(tmp_path: Path) -> None:
    """The log directory is group-writable: a link at the count's name is replaced, never written through."""
    victim = tmp_path / "victim"
    victim.write_text("untouched\n")
    job, paths = render(tmp_path, JobSpec.train(1), trainer=SLOW_START + STAND_IN_TRAINER)
    early_stops = Path(paths.logs_dir) / f".{job.job_name}.early-stops.4242"
    early_stops.symlink_to(victim)
    code, err = usr2_to_outer(tmp_path, JobSpec.train(1), SLOW_START + STAND_IN_TRAINER, "starting.0")
    assert code == EXIT_REQUEUE, err
    assert victim.read_text() == "untouched\n"
    assert not early_stops.is_symlink() and early_stops.read_text() == "1\n"
    assert [p.name for p in Path(paths.logs_dir).iterdir() if ".early-stops." in p.name] == [early_stops.name]


def test_the_charliecloud_inner_script_refuses_to_run_outside_the_container(tmp_path: Path) -> None:
    job, paths = render(tmp_path, JobSpec.train(1), runtime="charliecloud")
    env = {k: v for k, v in job_env().items() if k != "CH_RUNNING"}
    result = subprocess.run(["bash", str(job.inner_path)], env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert "not inside a Charliecloud container (CH_RUNNING is unset)" in result.stderr
    assert not (Path(paths.outputs_dir) / "ready.0").exists()  # the trainer never started


def wait_for(paths: list[Path], process: subprocess.Popen, deadline_s: float = 120) -> None:
    """Until the stand-in trainers are up (a synchronisation point, not a timing assumption)."""
    end = time.monotonic() + deadline_s
    while not all(p.exists() for p in paths):
        if process.poll() is not None:
            out, err = process.communicate()
            pytest.fail(f"inner script exited {process.returncode} early: {out}{err}")
        if time.monotonic() > end:
            process.kill()
            pytest.fail(f"stand-in trainer never started: {paths}")
        time.sleep(0.05)


@pytest.mark.parametrize("sig", [signal.SIGUSR2, signal.SIGTERM])
def test_inner_forwards_the_stop_signal_and_passes_exit_85_through(tmp_path: Path, sig: signal.Signals) -> None:
    job, paths = render(tmp_path, JobSpec.train(1))
    out = Path(paths.outputs_dir)
    process = subprocess.Popen(["bash", str(job.inner_path)], env=job_env(), stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    wait_for([out / "ready.0"], process)
    assert (out / "ready.0").read_text().startswith("--stage 1 --config ")
    process.send_signal(sig)
    _, err = process.communicate(timeout=60)
    assert process.returncode == EXIT_REQUEUE, err
    assert (out / "stopped.0").read_text() == sig.name.removeprefix("SIG")
    assert f"stopped after {sig.name}, exit code 85" in err


@pytest.mark.slow
def test_inner_reaches_torchrun_workers_and_reports_the_requeue(tmp_path: Path) -> None:
    job, paths = render(tmp_path, JobSpec.train(0, gpus_per_node=2))
    assert "-m vcloud.launch" in job.inner
    out = Path(paths.outputs_dir)
    env = job_env(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(29500 + os.getpid() % 1000), OMP_NUM_THREADS="1")
    process = subprocess.Popen(["bash", str(job.inner_path)], env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    wait_for([out / "ready.0", out / "ready.1"], process)
    process.send_signal(signal.SIGUSR2)
    _, err = process.communicate(timeout=120)
    assert process.returncode == EXIT_REQUEUE, err
    assert (out / "stopped.0").read_text() == "USR2" and (out / "stopped.1").read_text() == "USR2"
    assert "vcloud launch: exit 85 of rank" in err and "Traceback" not in err, err


def start_outer(job: RenderedJob, paths: RunPaths, tmp_path: Path, **env: str) -> subprocess.Popen:
    """The outer script as Slurm would run it, with ``srun``/``scontrol`` stand-ins first on PATH.

    ``hostname`` is one too: it runs during set-up, and when ``hold-setup`` exists it waits (up
    to a minute) for ``release-setup``, so a test can signal the script in the middle of set-up.
    """
    code = code_of(job, paths)
    Path(code.manifest).write_text(CodeManifest(code.hash, 3, "2026-02-16T12:00:00+00:00").to_json())
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    stand_ins = {
        "srun": 'while [[ $1 == --* ]]; do shift; done\nexec "$@"',
        "scontrol": f'if [ "$1" = show ]; then echo 127.0.0.1; else echo "$*" >> {tmp_path}/scontrol.calls; fi',
        "hostname": (f'if [ -e {tmp_path}/hold-setup ]; then touch {tmp_path}/in-setup;'
                     f' for _ in $(seq 600); do [ -e {tmp_path}/release-setup ] && break; sleep 0.1; done; fi\n'
                     'echo node1'),
    }
    for name, body in stand_ins.items():
        (bin_dir / name).write_text(f"#!/bin/bash\n{body}\n")
        (bin_dir / name).chmod(0o755)
    env = job_env(PATH=f"{bin_dir}:{os.environ['PATH']}", **env)
    return subprocess.Popen(["bash", str(job.outer_path)], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


# Rank 1 refuses and records it; rank 0 then fails as a rank does whose peer on another node went away.
REFUSING_TRAINERS = """
import os, sys, time
from vcloud.exit_record import records_dir, write_exit_record
if os.environ["RANK"] == "1":
    write_exit_record(88, os.environ)
    sys.exit(88)
peer = records_dir(os.environ) / "rank1.exit"
for _ in range(1200):
    if peer.exists():
        break
    time.sleep(0.05)
sys.exit(1)
"""


@pytest.mark.slow
def test_a_torchrun_step_ends_with_this_starts_recorded_exit_code(tmp_path: Path) -> None:
    """The outer script empties the ranks' exit record directory before the step (a record of an
    earlier start must not count) and removes it after; the launch ends with what rank 1 recorded."""
    job, paths = render(tmp_path, JobSpec.train(0, gpus_per_node=2), trainer=REFUSING_TRAINERS,
                        **{"jobs.master_port": 29500 + os.getpid() % 1000})
    records = Path(str(paths.exit_records_dir(job.job_name)).replace("{job_id}", "4242"))
    assert f"export VCLOUD_EXIT_RECORD_DIR={shell_word(paths.exit_records_dir(job.job_name))}\n" in job.inner
    records.mkdir(parents=True)
    (records / "rank0.exit").write_text("87\n")  # left by an earlier start of the job
    process = start_outer(job, paths, tmp_path, OMP_NUM_THREADS="1")
    _, err = process.communicate(timeout=200)
    assert process.returncode == 88, err
    assert "vcloud launch: exit 88 of rank 1: latest.pt was written by other code" in err, err
    assert "job step finished with exit code 88" in err
    assert "Traceback" not in err and not records.exists(), err
    assert requeue_calls(tmp_path) == []


PORT_REPORTING_TRAINER = """
import os, pathlib
out = pathlib.Path(os.environ["PORT_REPORT_DIR"])
(out / f"rank{os.environ['RANK']}.port").write_text(os.environ["MASTER_PORT"])
"""


@pytest.mark.slow
def test_a_torchrun_job_rendezvous_on_the_port_its_job_id_names_passing_over_one_in_use(tmp_path: Path) -> None:
    """Job 4242 with ports from ``base`` over a range of 100 takes ``base + 42``; with something already
    listening there (another job's rendezvous on a shared node) it says so and takes ``base + 43``, and
    its ranks rendezvous there."""
    import socket

    base = 20000 + os.getpid() % 20000
    job, paths = render(tmp_path, JobSpec.train(0, gpus_per_node=2), trainer=PORT_REPORTING_TRAINER,
                        **{"jobs.master_port": base, "jobs.master_port_range": 100})
    taken = socket.socket()
    taken.bind(("127.0.0.1", base + 42))
    taken.listen()
    try:
        process = start_outer(job, paths, tmp_path, OMP_NUM_THREADS="1", PORT_REPORT_DIR=str(tmp_path))
        _, err = process.communicate(timeout=200)
    finally:
        taken.close()
    assert process.returncode == 0, err
    assert f"rendezvous port {base + 42} is in use on node1: trying the next one" in err, err
    assert f"torchrun rendezvous on 127.0.0.1:{base + 43}" in err, err
    assert {(tmp_path / f"rank{rank}.port").read_text() for rank in (0, 1)} == {str(base + 43)}


def test_rendezvous_ports_past_65535_are_refused() -> None:
    from vcloud_pipeline.profile.models import ProfileError

    with pytest.raises(ProfileError) as refused:
        load_profile("local", overrides={"jobs.master_port": 65000, "jobs.master_port_range": 1000})
    assert "master_port 65000 + master_port_range 1000 reaches port 65999; ports end at 65535" in str(refused.value)


def requeue_calls(tmp_path: Path) -> list[str]:
    calls = tmp_path / "scontrol.calls"
    return calls.read_text().splitlines() if calls.exists() else []


def usr2_to_outer(tmp_path: Path, spec: JobSpec, trainer: str, marker: str) -> tuple[int, str]:
    """Run the outer script, send it USR2 once the trainer wrote ``marker``: (exit code, stderr)."""
    job, paths = render(tmp_path, spec, trainer=trainer)
    (Path(paths.outputs_dir) / marker).unlink(missing_ok=True)
    process = start_outer(job, paths, tmp_path)
    wait_for([Path(paths.outputs_dir) / marker], process)
    process.send_signal(signal.SIGUSR2)
    _, err = process.communicate(timeout=60)
    return process.returncode, err


HANDLES_IT = (STAND_IN_TRAINER, "ready.0")
STILL_STARTING = (SLOW_START + STAND_IN_TRAINER, "starting.0")


@pytest.mark.parametrize("trainer, marker", [HANDLES_IT, STILL_STARTING],
                         ids=["trainer-handles-it", "trainer-still-starting"])
def test_outer_requeues_a_training_step_stopped_by_usr2(tmp_path: Path, trainer: str, marker: str) -> None:
    """Slurm sends USR2 up to a minute early: it may find the trainer without its handler yet."""
    code, err = usr2_to_outer(tmp_path, JobSpec.train(1), trainer, marker)
    assert code == EXIT_REQUEUE, err
    assert requeue_calls(tmp_path) == ["requeue 4242"], err
    assert "requeued: the next start resumes from the checkpoint" in err
    died = "the job step died of SIGUSR2 itself" in err
    assert died == (marker == "starting.0"), err


def test_outer_does_not_start_a_training_step_after_a_signal_during_setup(tmp_path: Path) -> None:
    job, paths = render(tmp_path, JobSpec.train(1))
    (tmp_path / "hold-setup").touch()
    process = start_outer(job, paths, tmp_path)
    wait_for([tmp_path / "in-setup"], process)
    process.send_signal(signal.SIGUSR2)
    (tmp_path / "release-setup").touch()
    _, err = process.communicate(timeout=60)
    assert process.returncode == EXIT_REQUEUE, err
    assert "not starting the job step: SIGUSR2 arrived during set-up" in err
    assert not (Path(paths.outputs_dir) / "ready.0").exists()
    assert requeue_calls(tmp_path) == ["requeue 4242"]


def test_outer_stops_requeueing_a_job_whose_starts_never_reach_training(tmp_path: Path) -> None:
    """A time limit too short for start-up would otherwise requeue the job forever."""
    def stop_once(trainer: str, marker: str) -> str:
        code, err = usr2_to_outer(tmp_path, JobSpec.train(1), trainer, marker)
        assert code == EXIT_REQUEUE, err
        return err

    for start in range(1, MAX_EARLY_STOPS):
        stop_once(*STILL_STARTING)
        assert len(requeue_calls(tmp_path)) == start
    err = stop_once(*STILL_STARTING)
    assert (f"not requeueing: the last {MAX_EARLY_STOPS} starts of this job ended before the trainer "
            "could train") in err
    assert "no_time_to_train" in [hint.key for hint in find_hints(err)]  # what the failed task shows
    assert len(requeue_calls(tmp_path)) == MAX_EARLY_STOPS - 1

    stop_once(*HANDLES_IT)  # a start that trains resets the count
    stop_once(*STILL_STARTING)
    assert len(requeue_calls(tmp_path)) == MAX_EARLY_STOPS + 1


def test_outer_passes_through_the_death_of_a_step_that_cannot_resume(tmp_path: Path) -> None:
    """The export starts over when rerun: requeueing it after USR2 could repeat it forever."""
    code, err = usr2_to_outer(tmp_path, JobSpec.export(), *STILL_STARTING)
    assert code == 128 + signal.SIGUSR2, err
    assert requeue_calls(tmp_path) == [] and "died of" not in err


def test_inner_reports_a_trainer_killed_by_the_signal_as_such(tmp_path: Path) -> None:
    """slurmstepd signals the task's whole process group: bash and the trainer at once.

    When the trainer dies of it while bash runs its trap, bash 5.2 has answered the final ``wait``
    with -1 (exit 255, a plain failure); the outer script must see 128 + USR2 to requeue. The race
    is timing-dependent, so it is run many times.
    """
    job, paths = render(tmp_path, JobSpec.train(1), trainer=SLOW_START + STAND_IN_TRAINER)
    starting = Path(paths.outputs_dir) / "starting.0"
    codes = []
    for _ in range(30):
        starting.unlink(missing_ok=True)
        process = subprocess.Popen(["bash", str(job.inner_path)], env=job_env(), stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True, start_new_session=True)
        wait_for([starting], process)
        os.killpg(process.pid, signal.SIGUSR2)
        process.communicate(timeout=60)
        codes.append(process.returncode)
    assert codes == [128 + signal.SIGUSR2] * 30


def left_record(tmp_path: Path, spec: JobSpec) -> EndRecord | None:
    """The exit record the outer script of ``spec`` (job 4242, named on sbatch's command line as the
    operator names it) left next to its output, if any."""
    _, paths = render(tmp_path, spec)
    record = Path(end_record_path(str(Path(paths.logs_dir) / job_log_name("submitted-as", "4242", "out"))))
    return parse_end_record(record.read_text()) if record.exists() else None


def test_a_refusing_outer_script_leaves_its_exit_record(tmp_path: Path) -> None:
    job, _ = render(tmp_path, JobSpec.train(0))
    env = job_env(SLURM_RESTART_COUNT="2")
    subprocess.run(["bash", str(job.outer_path)], env=env, capture_output=True, text=True, timeout=60)
    record = left_record(tmp_path, JobSpec.train(0))
    assert record is not None and (record.job_id, record.restart, record.exit_code) == ("4242", 2, EXIT_CODE_MISMATCH)
    assert record.ends("4242", 2)


def test_a_training_job_that_requeues_itself_leaves_a_record_that_is_not_the_end(tmp_path: Path) -> None:
    code, err = usr2_to_outer(tmp_path, JobSpec.train(1), *HANDLES_IT)
    assert code == EXIT_REQUEUE, err
    record = left_record(tmp_path, JobSpec.train(1))
    assert record is not None and record.exit_code == EXIT_REQUEUE and record.requeued
    assert not record.ends("4242", 0)


def test_a_step_that_died_of_the_stop_signal_leaves_the_end_of_its_job(tmp_path: Path) -> None:
    code, err = usr2_to_outer(tmp_path, JobSpec.export(), *STILL_STARTING)
    assert code == 128 + signal.SIGUSR2, err
    record = left_record(tmp_path, JobSpec.export())
    assert record is not None and record.exit_code == code and record.ends("4242", 0)
