"""GPUs required: what the job scripts tell the trainer and the preflight check, and what people read.

A profile whose accelerator is real (``rocm``, ``cuda``) renders ``VCLOUD_GPUS_REQUIRED`` (Slurm's
count for the node, the request where Slurm sets none) and the profile's hint into the inner script
of training and preflight jobs. The rendered preflight job runs here with bash and the real
imports (this machine's PyTorch sees no GPU), and the operator's failure message is built from a
job that ended with exit code 87.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from slurm_provider.hints import find_hints
from slurm_provider.hooks import SlurmHook
from slurm_provider.state_vocabulary import SlurmState
from slurm_provider.job_status import JobStatus
from slurm_provider.job_task import ending, naming
from vcloud import exitcodes as trainer_exitcodes
from vcloud.training import distributed
from vcloud_pipeline.jobs import exits as exitcodes
from vcloud_pipeline.jobs.hints import LOG_RULES
from vcloud_pipeline.dag.job_operator import GPUS_NOT_VISIBLE, PipelineJobOperator
from vcloud_pipeline.plan.jobspec import JobSpec
from vcloud_pipeline.plan.layout import run_paths
from vcloud_pipeline.profile import load_profile
from vcloud_pipeline.jobs.render import GPU_HINT_ENV, GPUS_REQUIRED_ENV, RenderedJob, render_job
from tests.vcloud_pipeline.conftest import complete_profile
from vcloud.code_digest import synced_tree_hash
from support.fake_slurm import FakeSlurm

REPO = Path(__file__).resolve().parents[3]
CODE_HASH = "e" * 64
CUDA = {"accelerator.kind": "cuda"}
"""The override of the cluster test: the local profile (CPU-only PyTorch) claiming real GPUs."""


def rendered(profile_name: str, spec: JobSpec, extra: dict | None = None) -> RenderedJob:
    profile = complete_profile(profile_name, extra)
    return render_job(profile, spec, run_paths(profile, "r"), CODE_HASH)


def requirement_line(job: RenderedJob) -> str | None:
    return next((line for line in job.inner.splitlines() if line.startswith(f"export {GPUS_REQUIRED_ENV}=")), None)


def test_the_job_scripts_and_the_trainer_share_names_and_exit_codes() -> None:
    assert (GPUS_REQUIRED_ENV, GPU_HINT_ENV) == (distributed.GPUS_REQUIRED_ENV, distributed.GPU_HINT_ENV)
    assert exitcodes.EXIT_REQUEUE == trainer_exitcodes.REQUEUE
    assert exitcodes.EXIT_GPUS_MISSING == trainer_exitcodes.GPUS_MISSING
    assert exitcodes.EXIT_CODE_MISMATCH not in vars(trainer_exitcodes).values()  # the outer script's own
    assert GPUS_NOT_VISIBLE in {rule.key for rule in LOG_RULES}


@pytest.mark.parametrize(("profile", "gpus"), [("lumi", 1), ("levante", 4), ("cosmos", 1)])
def test_real_accelerators_require_gpus_in_training_and_preflight_jobs(profile: str, gpus: int) -> None:
    stage = rendered(profile, JobSpec.train(1, gpus_per_node=gpus))
    preflight = rendered(profile, JobSpec.preflight())
    assert requirement_line(stage) == f'export {GPUS_REQUIRED_ENV}="${{SLURM_GPUS_ON_NODE:-{gpus}}}"'
    assert requirement_line(preflight) == f'export {GPUS_REQUIRED_ENV}="${{SLURM_GPUS_ON_NODE:-1}}"'
    hint = complete_profile(profile).accelerator.missing_gpu_hint
    assert hint and f"export {GPU_HINT_ENV}=" in stage.inner
    # the requirement is set before the command that reads it
    assert stage.inner.index(GPUS_REQUIRED_ENV) < stage.inner.index(" -m vcloud.train ")
    for other in (JobSpec.export(), JobSpec.data("tiny")):
        assert GPUS_REQUIRED_ENV not in rendered(profile, other).inner


def test_multinode_jobs_require_every_gpu_of_each_node() -> None:
    job = rendered("lumi", JobSpec.train(1, partition="standard-g", nodes=2, gpus_per_node=8))
    assert requirement_line(job) == f'export {GPUS_REQUIRED_ENV}="${{SLURM_GPUS_ON_NODE:-8}}"'


def test_the_local_cpu_profile_requires_nothing_until_overridden() -> None:
    for spec in (JobSpec.train(0), JobSpec.preflight()):
        job = rendered("local", spec)
        assert requirement_line(job) is None and f"export {GPU_HINT_ENV}=" not in job.inner
        assert requirement_line(rendered("local", spec, CUDA)) == \
            f'export {GPUS_REQUIRED_ENV}="${{SLURM_GPUS_ON_NODE:-1}}"'


# --------------------------------------------------------------------------- the preflight job, run by bash


def bare_job(tmp_path: Path, overrides: dict[str, Any], spec: JobSpec | None = None) -> RenderedJob:
    """A job of the local profile (the preflight by default), bare, in this interpreter, with the
    repository's trainer as the synced code (real imports of vcloud, vcloud.data, tifffile, rasterio
    and torch)."""
    base = tmp_path / "project dir's"
    profile = load_profile("local", overrides={"paths.base": str(base), "software.python": sys.executable,
                                               "container.runtime": "none", **overrides})
    paths = run_paths(profile, "r1")
    staging = tmp_path / "code being synced"  # the tree as a sync leaves it, in the directory its hash names
    staging.mkdir()
    (staging / "trainer").symlink_to(REPO / "trainer")
    code = paths.code(synced_tree_hash(staging))
    job = render_job(profile, spec or JobSpec.preflight(), paths, code.hash)
    Path(code.dir).parent.mkdir(parents=True)
    staging.rename(code.dir)
    Path(job.inner_path).parent.mkdir(parents=True)
    Path(job.inner_path).write_text(job.inner)
    return job


def bare_preflight(tmp_path: Path, overrides: dict[str, Any]) -> RenderedJob:
    return bare_job(tmp_path, overrides)


def run_inner(job: RenderedJob, **slurm: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "VCLOUD_"))}
    env.update({"SLURM_JOB_ID": "4242", "OMP_NUM_THREADS": "1", **slurm})
    return subprocess.run(["bash", str(job.inner_path)], env=env, capture_output=True, text=True, timeout=300)


def test_preflight_job_fails_with_87_and_the_profiles_hint_when_torch_sees_fewer_gpus(tmp_path: Path) -> None:
    job = bare_preflight(tmp_path, CUDA)
    result = run_inner(job, SLURM_GPUS_ON_NODE="2")
    out = result.stdout
    assert result.returncode == exitcodes.EXIT_GPUS_MISSING, out + result.stderr
    assert "preflight: torch accelerator available=False devices=0" in out
    assert ("preflight: FAILED: GPUs required: this node of the job was given 2 GPUs, but PyTorch sees 0 "
            "(torch ") in out and "a CPU-only build); the training jobs would run on the CPU" in out
    hint = load_profile("local").accelerator.missing_gpu_hint
    assert f"preflight: what to do: {hint}\n" in out
    assert "preflight: OK" not in out
    assert "preflight: vcloud.data " in out  # the imports themselves are fine
    assert [h.key for h in find_hints(out)] == [GPUS_NOT_VISIBLE]


def test_preflight_job_counts_the_request_when_slurm_sets_no_gpu_count(tmp_path: Path) -> None:
    result = run_inner(bare_preflight(tmp_path, CUDA))
    assert result.returncode == exitcodes.EXIT_GPUS_MISSING, result.stdout + result.stderr
    assert "this node of the job was given 1 GPU, but PyTorch sees 0" in result.stdout


def test_preflight_job_passes_on_the_cpu_when_the_profile_has_no_gpus(tmp_path: Path) -> None:
    result = run_inner(bare_preflight(tmp_path, {}), SLURM_GPUS_ON_NODE="1")
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.endswith("preflight: OK\n") and "GPUs required" not in result.stdout


@pytest.mark.slow
def test_a_torchrun_job_ends_with_87_when_its_workers_refuse(tmp_path: Path) -> None:
    """torchrun reports its workers' exit 87 as its own exit 1; the launch says 87 again, in one line
    instead of torchrun's traceback."""
    job = bare_job(tmp_path, CUDA, JobSpec.train(0, gpus_per_node=2, config="trainer/configs/model_tiny.yaml"))
    assert "-m vcloud.launch" in job.inner and "--nproc_per_node=2" in job.inner
    data = tmp_path / "project dir's" / "data" / "prepared"
    data.mkdir(parents=True)
    (data / "index.json").write_text("{}")  # never read: the workers stop before any data
    result = run_inner(job, SLURM_GPUS_ON_NODE="2", SLURM_NODEID="0", MASTER_ADDR="127.0.0.1",
                       MASTER_PORT=str(29500 + os.getpid() % 1000))
    assert result.returncode == exitcodes.EXIT_GPUS_MISSING, result.stdout[-3000:] + result.stderr[-3000:]
    assert result.stdout.count("GPUs required: this node of the job was given 2 GPUs, but PyTorch sees 0") == 2
    assert "vcloud launch: exit 87 of rank" in result.stderr, result.stderr[-3000:]
    assert "Traceback" not in result.stderr and "ChildFailedError" not in result.stderr, result.stderr[-3000:]


# --------------------------------------------------------------------------- what the task's failure says


class _TI:
    dag_id, task_id, run_id, map_index = "vcloud_training", "stage0", "manual__1", -1


def failure_message(operator: PipelineJobOperator, log: str, exit_code: int) -> str:
    status = JobStatus(job_id="77", state=SlurmState.FAILED, reason="NonZeroExitCode", exit_code=exit_code,
                       signal=0)
    operator.log_dir = "/srv/logs"
    context = {"ti": _TI()}
    cluster = FakeSlurm()  # the job's log and error log, as the login node serves them
    for stream in ("out", "err"):
        cluster.table.files[naming.log_path(operator, context, "77", stream=stream)] = log
    message = ending.failure_message(operator, SlurmHook("c", runner=cluster), status, context)
    assert cluster.verbs == ["file_sizes", "read_log", "file_sizes", "read_log"], "the tails of both logs"
    return message


def test_the_failure_explains_exit_87_with_the_profiles_hint() -> None:
    lumi = complete_profile("lumi")
    operator = PipelineJobOperator(task_id="stage0", job="stage0")
    operator.hint_overrides = {GPUS_NOT_VISIBLE: lumi.accelerator.missing_gpu_hint}  # as _bind sets it
    log = ("2026-02-16 09:00:14 ERROR: GPUs required: this node of the job was given 1 GPU, but PyTorch sees 0 "
           "(torch 2.5.1+rocm6.2, a ROCm build (HIP 6.2)); refusing to train on the CPU\n")
    message = failure_message(operator, log, 87)
    assert ("Exit code 87: the job was given GPUs, but PyTorch in the job saw fewer, so it stopped instead of "
            "running on the CPU and billing GPU-hours for it;") in message
    assert f"Hint: The job's GPUs are not visible to PyTorch: {lumi.accelerator.missing_gpu_hint}" in message
    assert "SINGULARITY_CONTAINLIBS=/usr/lib64/libcxi.so.1,/opt/rocm/lib/librocm_smi64.so.7" in message


def test_other_exit_codes_keep_their_plain_form() -> None:
    operator = PipelineJobOperator(task_id="stage0", job="stage0")
    assert "Exit code 3.\n" in failure_message(operator, "boom\n", 3)
    assert "Exit code 86: the job refused to start because the code directory of its hash" in \
        failure_message(operator, "", 86)
