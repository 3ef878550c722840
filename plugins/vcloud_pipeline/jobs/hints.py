"""The vcloud pipeline's known failure signatures, registered with the Slurm provider's hints.

The provider knows Slurm's own signatures (out of memory, time limit, a refused account or
partition); these are the pipeline's and its sites' (LUMI, Levante, Cosmos), with the fix learned
there (the user's field notes: LUMI guide "Common Errors", the LUMI lessons essay, the TopoFlow
issues and the Levante GPU guide). Importing :mod:`vcloud_pipeline` registers them
(:func:`register`), so every process that runs the pipeline's operators (worker, ``dags test``)
shows them in a failed task's message, after the site's advice for the provider's own signatures.
"""

from __future__ import annotations

import re

from slurm_provider import Hint, HintRule, register_hints

_FIVE_OPTIMIZATIONS = (
    "bf16 autocast, gradient checkpointing of the per-date encoder, reduced-resolution (64x64) change "
    "gate, target-only multi-scale features, and chunked change-gate convolution (64 pairs per chunk)"
)

LOG_RULES: tuple[HintRule, ...] = (
    HintRule(
        key="no_hip_gpus",
        title="PyTorch sees no GPU inside the container",
        hint=(
            "The GPU libraries are not bound into the Singularity container. Set "
            "SINGULARITY_CONTAINLIBS=/usr/lib64/libcxi.so.1,/opt/rocm/lib/librocm_smi64.so.7 and run "
            "'srun singularity exec -B /opt/cray/libfabric -B /scratch/<project> -B /projappl/<project> ...'."
        ),
        source="LUMI guide, Common Errors 1 (GPU bindings)",
        pattern=re.compile(r"No HIP GPUs (are )?available"),
    ),

    HintRule(
        key="no_cuda_gpus",
        title="PyTorch sees no CUDA GPU",
        hint=(
            "The job did not get a GPU: submit to the GPU partition and request one (Levante: "
            "--partition=gpu --gres=gpu:a100_80:1); check with 'scontrol show job <id> | grep -E "
            "\"Partition|Gres\"'."
        ),
        source="Levante GPU guide, Troubleshooting 2",
        pattern=re.compile(r"No CUDA GPUs are available|Running on CPU \(GPU not available\)"),
    ),

    HintRule(
        key="gpus_not_visible",
        title="The job's GPUs are not visible to PyTorch",
        hint=(
            "Slurm gave the job GPUs, but PyTorch inside it sees fewer, so it stopped instead of training "
            "on the CPU. Check that the job's Python has a GPU build of PyTorch (torch.version.hip or "
            "torch.version.cuda is set) and that the container sees the devices (LUMI: "
            "SINGULARITY_CONTAINLIBS=/usr/lib64/libcxi.so.1,/opt/rocm/lib/librocm_smi64.so.7 and "
            "-B /opt/cray/libfabric, never --rocm)."
        ),
        source="vcloud trainer and preflight import check (GPUs required by the cluster profile); "
               "LUMI guide, Common Errors 1",
        pattern=re.compile(r"GPUs required: .* but PyTorch sees \d+"),
    ),

    HintRule(
        key="gpu_out_of_memory",
        title="GPU out of memory",
        hint=(
            "Set PYTORCH_HIP_ALLOC_CONF=expandable_segments:True (without it MI250X runs out at ~40 GB "
            f"instead of ~60 GB), keep all five memory optimizations on ({_FIVE_OPTIMIZATIONS}), use "
            "batch size 1 and check that gradient checkpointing is really enabled."
        ),
        source="LUMI guide, Memory Optimizations and Common Errors 2",
        pattern=re.compile(r"torch\.cuda\.OutOfMemoryError|HIP out of memory|CUDA out of memory"),
    ),

    HintRule(
        key="vcloud_data_missing",
        title="The vcloud.data package is missing on the cluster",
        hint=(
            "rsync dropped src/vcloud/data/ because of an unanchored --exclude 'data', which removes every "
            "directory named data at any depth. Exclude only the top-level directory with "
            "--exclude '/data' (leading slash) and sync the code again."
        ),
        source="LUMI guide, Rsync pitfall and Common Errors 3",
        pattern=re.compile(r"No module named '?vcloud\.data'?"),
    ),

    HintRule(
        key="libfabric_cxi",
        title="Interconnect libraries (libfabric/CXI) not available",
        hint=(
            "Add '-B /opt/cray/libfabric' to 'singularity exec' (needed even on a single node) and keep "
            "/usr/lib64/libcxi.so.1 in SINGULARITY_CONTAINLIBS."
        ),
        source="LUMI guide, Common Errors 4",
        pattern=re.compile(
            r"(?i)(?:error|fail|cannot|unable|not found|no such).*(?:libfabric|libcxi|\bcxi\b)"
            r"|(?:libfabric|libcxi|\bcxi\b).*(?:error|fail|cannot|unable|not found|no such)"
        ),
    ),

    HintRule(
        key="wandb_hang",
        title="Weights & Biases cannot reach its server",
        hint=(
            "WandB hangs for 30+ minutes inside the cluster's containers (no outbound network). Set "
            "WANDB_MODE=disabled in the inner script; sync offline runs later with 'wandb sync'."
        ),
        source="LUMI guide, Common Errors 5; LUMI lessons, Practical tips",
        pattern=re.compile(
            r"wandb: (?:ERROR|Network error)|wandb\.errors\.\w+|Waiting for wandb\.init|"
            r"Run initialization has timed out"
        ),
    ),

    HintRule(
        key="tifffile_missing",
        title="tifffile is not installed in the container",
        hint=(
            "The provision_env task installs what the container lacks of trainer/requirements-runtime.txt into "
            "the project's pylibs (/projappl/<project>/pylibs/<requirements hash>) and every job puts that "
            "directory on PYTHONPATH: check that the profile has a provision section and the task's log. By hand: "
            "'singularity exec $SIF pip install --no-deps --target=/projappl/<project>/pylibs/<hash> tifffile'."
        ),
        source="LUMI guide, Installing Extra Python Packages and Common Errors 6",
        pattern=re.compile(r"No module named '?tifffile'?"),
    ),

    HintRule(
        key="rocm_flag_glibc",
        title="Host ROCm libraries injected into the container",
        hint=(
            "Never use 'singularity exec --rocm' on LUMI: it injects the host's libdrm built against "
            "GLIBC 2.33 while the container has 2.31. Bind exactly what is needed with SINGULARITY_BIND "
            "instead (/var/spool/slurmd,/opt/cray,/usr/lib64/libcxi.so.1,/usr/lib64/libjansson.so.4,"
            "/pfs,/scratch,/projappl,/project,/flash,/appl)."
        ),
        source="LUMI lessons, 'Never use --rocm with Singularity'",
        pattern=re.compile(r"GLIBC_2\.33|libdrm\S*\.so\S*.*(?:not found|version|GLIBC)"),
    ),

    HintRule(
        key="module_load_broken",
        title="'module load' does not work on compute nodes",
        hint=(
            "On LUMI compute nodes the module system is broken (missing lua5.3). Do not load modules in the "
            "job script; set paths and SINGULARITY_BIND by hand."
        ),
        source="LUMI lessons, 'Never use --rocm with Singularity'",
        pattern=re.compile(r"module: command not found|lua5\.3: (?:command )?not found|Lmod has detected"),
    ),

    HintRule(
        key="miopen_cache",
        title="MIOpen could not find or compile a convolution kernel",
        hint=(
            "Give every node its own MIOpen cache (a shared one locks its SQLite database across nodes): "
            "export MIOPEN_USER_DB_PATH=/tmp/miopen_cache_$SLURM_JOB_ID, "
            "MIOPEN_CUSTOM_CACHE_DIR=$MIOPEN_USER_DB_PATH, mkdir -p it, and MIOPEN_FIND_MODE=1. "
            "Do not set MIOPEN_DISABLE_CACHE=1. Expect 10-30 min of kernel compilation in the first epoch."
        ),
        source="TopoFlow issues on LUMI, Issue 3 (MIOpen)",
        pattern=re.compile(r"MIOpen Error|miopenStatusUnknownError|MIOpen\(HIP\): Error"),
    ),

    HintRule(
        key="prefetch_factor",
        title="DataLoader prefetch_factor with num_workers=0",
        hint=(
            "Pass prefetch_factor (and multiprocessing_context, persistent_workers) to the DataLoader only "
            "when num_workers > 0."
        ),
        source="TopoFlow issues on LUMI, Issue 2",
        pattern=re.compile(r"prefetch_factor option could only be specified in multiprocessing"),
    ),

    HintRule(
        key="ddp_collective_timeout",
        title="DDP ranks stopped waiting for each other",
        hint=(
            "One rank did work the others did not (typically rank 0 building a cache lazily at the first "
            "forward pass after DDP started). Precompute such caches before training, save them to disk and "
            "load the same file on every rank; test on 1 GPU, then 2, before scaling up."
        ),
        source="TopoFlow issues on LUMI, Issues 4 and 6 (DDP deadlock)",
        pattern=re.compile(
            r"Watchdog caught collective operation timeout|ProcessGroupNCCL.*[Tt]imeout|"
            r"NCCL (?:watchdog|communicator was aborted)|collective operation timeout"
        ),
    ),

    HintRule(
        key="resume_refused",
        title="The stage's latest.pt was written by code this one cannot resume",
        hint=(
            "The trainer refused to resume the checkpoint (its line names both code hashes and what differs): "
            "its weights no longer fit the model this code builds, or the optimizer's layout differs and the "
            "run asked on_code_change: refuse. Train the stage again with mode: restart for it, resume with "
            "on_code_change: keep_weights where only the optimizer differs, or finish the stage with the code "
            "that wrote the checkpoint (deploy that version and trigger the same run name)."
        ),
        source="vcloud trainer, train.on_code_change (exit 88)",
        pattern=re.compile(r"cannot resume stage \d+ from \S+: it was written by code"),
    ),

    HintRule(
        key="no_time_to_train",
        title="The time limit leaves no time to train after start-up",
        hint=(
            "The pre-timeout USR2 came before the trainer could train, start after start, so the job stopped "
            "requeueing itself; nothing was lost (the last checkpoint stands). Slurm sends it up to a minute "
            "before the profile's signal_lead_seconds: raise the time limit (time_limit in the run's params) "
            "well above lead + start-up time, then run the stage again."
        ),
        source="Slurm sbatch --signal (sent up to 60 s early)",
        pattern=re.compile(r"not requeueing: the last \d+ starts of this job ended before the trainer could train"),
    ),
)
"""Log signatures of the pipeline's jobs (trainer, containers, sites' GPU stacks)."""

PROVISION_RULES: tuple[HintRule, ...] = (
    HintRule(
        key="pip_no_network",
        title="pip cannot reach the package index from where the job environment is installed",
        hint=(
            "Install where the network is: on LUMI the login nodes reach PyPI and the compute nodes do not "
            "(provision.where: login); behind a proxy that re-signs TLS, bind its CA bundle and pip.conf for "
            "pip (provision.binds). Or install by hand where pip works: 'singularity exec $SIF pip install "
            "--no-deps --target=<pylibs>/<hash> name==version' and let the step find it."
        ),
        source="pip (network errors); LUMI guide, Installing Extra Python Packages",
        pattern=re.compile(
            r"Failed to establish a new connection|Network is unreachable|Temporary failure in name resolution"
            r"|Name or service not known|No route to host|ConnectTimeout|Could not fetch URL"
            r"|certificate verify failed|ProxyError"
        ),
    ),

    HintRule(
        key="pip_no_such_version",
        title="The package index has no wheel of a pinned version for the container's Python",
        hint=(
            "Check the pin in trainer/requirements-runtime.txt ('pip index versions <name>' in the container): "
            "the version may not exist, or it has no wheel for the container's Python and platform. A package "
            "that must be compiled is not built by the step (no compiler in the container): pin a version "
            "with a wheel, or build it once in the container and install it into the set's directory."
        ),
        source="pip (No matching distribution found, --only-binary)",
        pattern=re.compile(r"No matching distribution found|Could not find a version that satisfies"),
    ),

    HintRule(
        key="pip_needs_compiler",
        title="A package needs a compiler to install",
        hint=(
            "Only wheels are installed into the job environment: pin a version that has a wheel for the "
            "container's Python, or build the wheel elsewhere and install it into the set's directory by hand."
        ),
        source="pip (building a wheel from source)",
        pattern=re.compile(r"Failed building wheel|error: command '[^']*(?:gcc|cc|g\+\+)' failed|"
                           r"Microsoft Visual C\+\+|unable to execute '(?:gcc|cc)'"),
    ),

    HintRule(
        key="container_not_run",
        title="The container did not run where the job environment is installed",
        hint=(
            "The step runs the container's own Python and pip: check container.image and that the runtime "
            "(provision.runtime, else container.runtime) is on the PATH there ('command -v singularity')."
        ),
        source="vcloud provisioning step",
        pattern=re.compile(r"command not found|could not open image|No such file or directory"),
    ),
)
"""Signatures of a failed provisioning step (pip's and the container runtime's output)."""


def provision_hints(output: str) -> list[Hint]:
    """The provisioning rules that match ``output`` (newest matching line each), in table order."""
    hints = []
    lines = output.splitlines()
    for rule in PROVISION_RULES:
        assert rule.pattern is not None
        line = next((line for line in reversed(lines) if rule.pattern.search(line)), None)
        if line is not None:
            hints.append(Hint(rule.key, rule.title, rule.hint, rule.source, line.strip()[:300]))
    if any(hint.key == "pip_no_network" for hint in hints):  # pip then also finds no version: not the cause
        hints = [hint for hint in hints if hint.key != "pip_no_such_version"]
    return hints


ADVICE: dict[str, str] = {
    "host_out_of_memory": (
        "The job used more RAM than it requested. Raise --mem (LUMI small-g: 64G per GPU is usual), "
        "lower DataLoader num_workers, or load fewer dates per sample into memory."
    ),
    "time_limit": (
        "Slurm stopped the job at its --time. Training saves latest.pt every epoch, so a resubmission "
        "resumes where it stopped; to need fewer resubmissions raise --time up to the partition maximum "
        "(LUMI small-g 3 days, standard-g 2 days)."
    ),
    "too_many_processors": (
        "GPU nodes have fewer CPU cores than CPU nodes (Levante: 64 instead of 128). Lower "
        "--ntasks-per-node x --cpus-per-task to fit the GPU node."
    ),
    "invalid_account": (
        "Check --account (LUMI: project_465002500) and that your user is a member "
        "('sacctmgr show assoc user=$USER')."
    ),
    "invalid_partition": "Use one of the cluster's partitions ('sinfo -s'); LUMI GPU jobs: small-g, standard-g, dev-g.",
    "time_limit_invalid": "Lower --time: LUMI small-g allows 3 days, standard-g 2 days, dev-g 30 minutes.",
    "invalid_gres": "Check --gpus/--gres against the partition (LUMI: --gpus=N; Levante: --gres=gpu:a100_80:N).",
}
"""The sites' advice for the provider's own signatures (their keys), in place of its generic text."""


def register() -> None:
    """Register the pipeline's rules and advice with the provider (idempotent)."""
    register_hints(log_rules=LOG_RULES, advice=ADVICE)
