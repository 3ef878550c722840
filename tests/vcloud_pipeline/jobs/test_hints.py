"""The pipeline's and its sites' failure signatures, registered with the Slurm provider's hints."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from slurm_provider.hints import find_hints, find_submit_hints, format_hints, hint_for, log_rules
from vcloud_pipeline.jobs.hints import ADVICE, LOG_RULES

GOLDEN = Path(__file__).resolve().parents[3] / "providers" / "slurm" / "tests" / "golden"

LOG_EXCERPTS: dict[str, str] = {
    "no_hip_gpus": """\
Loading stage 1 config from config/model_full.yaml
Traceback (most recent call last):
  File "/scratch/project_465002500/vcloud/code/scripts/train.py", line 88, in <module>
    device = torch.device("cuda", local_rank); torch.cuda.set_device(device)
  File "/usr/local/lib/python3.10/dist-packages/torch/cuda/__init__.py", line 404, in set_device
    torch._C._cuda_setDevice(device)
RuntimeError: No HIP GPUs are available
srun: error: nid005011: task 0: Exited with exit code 1
""",
    "no_cuda_gpus": """\
Conditional diffusion model initialized at 1979-01-01 00:00:00
RuntimeError: No CUDA GPUs are available
""",
    "gpus_not_visible": """\
2026-02-16 09:00:14 ERROR: GPUs required: this node of the job was given 1 GPU, but PyTorch sees 0 \
(torch 2.5.1+rocm6.2, a ROCm build (HIP 6.2.41133)); refusing to train on the CPU
2026-02-16 09:00:14 what to do: PyTorch in the CSC container sees the GCDs only with the host GPU libraries \
injected and libfabric bound: export SINGULARITY_CONTAINLIBS=/usr/lib64/libcxi.so.1,/opt/rocm/lib/librocm_smi64.so.7 \
(container.containlibs) and run singularity exec -B /opt/cray/libfabric (or /opt/cray in container.bind_env); \
never add --rocm (the host libdrm needs GLIBC 2.33, the container has 2.31).
2026-02-16 09:00:14 exit 87: GPUs required but not visible to PyTorch; not training on the CPU
vcloud job 16082076: job step finished with exit code 87
""",
    "gpu_out_of_memory": """\
epoch 3 step 1200 loss=0.0412
Traceback (most recent call last):
  File "src/vcloud/train/loop.py", line 212, in train_step
    loss.backward()
torch.OutOfMemoryError: HIP out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 63.98 GiB of which 1.21 GiB is free.
""",
    "vcloud_data_missing": """\
Traceback (most recent call last):
  File "/scratch/project_465002500/vcloud/code/scripts/train.py", line 12, in <module>
    from vcloud.data.dataset import SEN12MSCRTS
ModuleNotFoundError: No module named 'vcloud.data'
""",
    "libfabric_cxi": """\
libfabric:1234:1700000000::cxi:core:cxip_gen_auth_key():587<warn> nid005011: Error: CXI auth key not found
MPICH ERROR [Rank 0] [job id 16082076.0] [nid005011]: OFI fi_getinfo() failed
""",
    "wandb_hang": """\
wandb: Currently logged in as: digifarm. Use `wandb login --relogin` to force relogin
wandb: Network error (ConnectionError), entering retry loop.
slurmstepd: error: *** JOB 16082076 ON nid005011 CANCELLED AT 2026-02-16T09:12:00 DUE TO TIME LIMIT ***
""",
    "tifffile_missing": """\
  File "/scratch/project_465002500/vcloud/code/src/vcloud/data/io.py", line 3, in <module>
    import tifffile
ModuleNotFoundError: No module named 'tifffile'
""",
    "rocm_flag_glibc": """\
/usr/bin/python3: /lib/x86_64-linux-gnu/libc.so.6: version `GLIBC_2.33' not found (required by /opt/rocm/lib/libdrm.so.2)
srun: error: nid005011: task 0: Exited with exit code 1
""",
    "module_load_broken": """\
/var/spool/slurmd/job16082076/slurm_script: line 14: module: command not found
""",
    "miopen_cache": """\
MIOpen(HIP): Warning [SQLiteBase] Missing system database file: gfx90a6e.kdb
MIOpen Error: /long_pathname_so_that_rpms_can_package_the_debug_info/src/conv/invokers/impl_gemm.cpp:106: No suitable algorithm was found to execute the required convolution
RuntimeError: miopenStatusUnknownError
""",
    "prefetch_factor": """\
  File "/usr/local/lib/python3.10/dist-packages/torch/utils/data/dataloader.py", line 251, in __init__
    raise ValueError('prefetch_factor option could only be specified in multiprocessing.'
ValueError: prefetch_factor option could only be specified in multiprocessing.let num_workers > 0 to enable multiprocessing, otherwise set prefetch_factor to None.
""",
    "ddp_collective_timeout": """\
Fine-tuned optimizer configuration:
  - AdamW optimizer...
[rank3]:[E ProcessGroupNCCL.cpp:563] [Rank 3] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600043 milliseconds before timing out.
""",
    "resume_refused": """\
2026-02-16 09:00:14 ERROR: cannot resume stage 1 from /scratch/project_465002500/vcloud/outputs/full/stage1/latest.pt: \
it was written by code 6b829dd20a7628144321692d499d4828fc3a90d7696686054017d14925feb299, this job runs code \
05b1b377072133955283a866870c8c4bf789511247a7397f650cfb3e2ecf182b, and its weights no longer fit the model: \
gate.pair_out.weight 1x8x3x3 -> 1x8x5x5. Nothing was trained. Either train stage 1 again from the start with mode: restart
2026-02-16 09:00:14 exit 88: latest.pt was written by other code and cannot be resumed as asked; nothing trained
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
  exitcode  : 88 (pid: 4242)
""",
    "no_time_to_train": """\
vcloud job 16082080: job step finished with exit code 140
vcloud job 16082080: not requeueing: the last 3 starts of this job ended before the trainer could train \
(Slurm sends USR2 up to a minute before the lead it was asked for); submit it again with a longer time limit
""",
}


def test_every_rule_has_an_excerpt() -> None:
    assert set(LOG_EXCERPTS) == {rule.key for rule in LOG_RULES}


def test_importing_the_pipeline_registers_its_rules_first() -> None:
    keys = [rule.key for rule in log_rules()]
    assert keys[:len(LOG_RULES)] == [rule.key for rule in LOG_RULES]
    assert {"host_out_of_memory", "time_limit", "too_many_processors"} <= set(keys[len(LOG_RULES):])


@pytest.mark.parametrize("key", sorted(LOG_EXCERPTS))
def test_each_signature_gives_its_hint(key: str) -> None:
    hints = find_hints(LOG_EXCERPTS[key])
    keys = [h.key for h in hints]
    assert key in keys
    hint = hints[keys.index(key)]
    assert hint.evidence and hint.evidence in LOG_EXCERPTS[key]
    assert hint.hint.endswith(".") and hint.source


def test_specific_advice_from_the_field_notes() -> None:
    by_key = {rule.key: rule.hint for rule in LOG_RULES}
    assert "SINGULARITY_CONTAINLIBS" in by_key["no_hip_gpus"] and "-B /opt/cray/libfabric" in by_key["no_hip_gpus"]
    assert "expandable_segments:True" in by_key["gpu_out_of_memory"]
    assert "gradient checkpointing" in by_key["gpu_out_of_memory"] and "chunked" in by_key["gpu_out_of_memory"]
    assert "--exclude '/data'" in by_key["vcloud_data_missing"]
    assert "WANDB_MODE=disabled" in by_key["wandb_hang"]
    assert "pylibs" in by_key["tifffile_missing"]
    assert "--rocm" in by_key["rocm_flag_glibc"] and "SINGULARITY_BIND" in by_key["rocm_flag_glibc"]
    assert "MIOPEN_USER_DB_PATH=/tmp/miopen_cache_$SLURM_JOB_ID" in by_key["miopen_cache"]
    assert "num_workers > 0" in by_key["prefetch_factor"]
    assert "rank 0" in by_key["ddp_collective_timeout"]


def test_the_sites_advice_replaces_the_providers_text() -> None:
    (cpus,) = find_hints("srun: error: Unable to create step for job 5123456: More processors requested than permitted")
    assert cpus.key == "too_many_processors" and cpus.hint == ADVICE["too_many_processors"]
    assert "Levante: 64 instead of 128" in cpus.hint
    (timeout,) = find_hints("", state="TIMEOUT")
    assert "latest.pt" in timeout.hint and "LUMI small-g 3 days" in timeout.hint


def test_a_gpu_refusal_with_lumis_advice_gives_only_its_own_hint() -> None:
    """The advice names libfabric and --rocm; the libfabric and GLIBC signatures must not fire on it."""
    assert [h.key for h in find_hints(LOG_EXCERPTS["gpus_not_visible"])] == ["gpus_not_visible"]


def test_a_profile_can_replace_the_advice_of_a_signature() -> None:
    advice = "Keep accelerator.kind none for the local profile."
    (hint,) = find_hints(LOG_EXCERPTS["gpus_not_visible"], overrides={"gpus_not_visible": advice})
    assert (hint.title, hint.hint) == ("The job's GPUs are not visible to PyTorch", advice)
    assert hint.evidence.startswith("2026-02-16 09:00:14 ERROR: GPUs required: this node of the job was given 1 GPU")
    assert hint_for(LOG_EXCERPTS["gpus_not_visible"], overrides={"gpus_not_visible": advice}) == \
        f"The job's GPUs are not visible to PyTorch: {advice}"
    assert find_hints(LOG_EXCERPTS["tifffile_missing"], overrides={"gpus_not_visible": advice})[0].hint == \
        find_hints(LOG_EXCERPTS["tifffile_missing"])[0].hint


def test_the_wandb_hang_log_also_hits_the_time_limit() -> None:
    keys = [h.key for h in find_hints(LOG_EXCERPTS["wandb_hang"])]
    assert keys == ["wandb_hang", "time_limit"]


def test_failed_log_captured_on_the_real_cluster() -> None:
    log = (GOLDEN / "log_failed.txt").read_text()
    assert [h.key for h in find_hints(log, state="FAILED")] == ["vcloud_data_missing"]


def test_a_refused_account_names_the_projects_account() -> None:
    (account,) = find_submit_hints((GOLDEN / "sbatch_bad_account.stderr.txt").read_text())
    assert account.key == "invalid_account" and "project_465002500" in account.hint


def test_format_hints() -> None:
    text = format_hints(find_hints(LOG_EXCERPTS["vcloud_data_missing"]))
    assert text.startswith("Hint: The vcloud.data package is missing on the cluster: rsync dropped")


def test_hint_for_gives_one_text_or_none() -> None:
    text = hint_for(LOG_EXCERPTS["wandb_hang"], state="TIMEOUT")
    assert text is not None
    assert text.startswith("Weights & Biases cannot reach its server: WandB hangs")
    assert "\nHint: Time limit reached: Slurm stopped the job" in text


DAG_PROBE = """
import json, runpy, sys
from slurm_provider.hints import log_rules
before = [rule.key for rule in log_rules()]
runpy.run_path(sys.argv[1])  # what a worker or the DAG processor does with the DAG file
print(json.dumps({"before": before, "after": [rule.key for rule in log_rules()]}))
"""


def test_a_process_that_loads_the_training_dag_shows_the_pipelines_hints() -> None:
    """The worker that runs a pipeline job parses the DAG file first, which imports the pipeline."""
    repo = Path(__file__).resolve().parents[3]
    path = os.pathsep.join(str(repo / p) for p in ("providers/slurm/src", "plugins", "trainer/src"))
    proc = subprocess.run([sys.executable, "-c", DAG_PROBE, str(repo / "dags" / "vcloud_training.py")],
                          env={**os.environ, "PYTHONPATH": path}, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    keys = json.loads(proc.stdout.strip().splitlines()[-1])
    assert keys["before"] == ["too_many_processors", "host_out_of_memory", "time_limit"]
    assert keys["after"] == [rule.key for rule in LOG_RULES] + keys["before"]
