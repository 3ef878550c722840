"""Known failure signatures -> a hint that says what happened and what to do.

The table is data: each rule is a regular expression over a job's log tail (or sbatch's
stderr) or a final Slurm state, with the fix learned on LUMI, Levante and Cosmos (the user's
field notes: LUMI guide "Common Errors", the LUMI lessons essay, the TopoFlow issues and the
Levante GPU guide). The operator appends matching hints to its failure message, and the UI
shows them to people, so the text is plain words with the exact setting to change.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from slurm_provider.states import SlurmState, parse_state


@dataclass(frozen=True)
class HintRule:
    key: str
    title: str
    hint: str
    source: str
    """Where the lesson comes from (for people who want the full story)."""
    pattern: re.Pattern[str] | None = None
    states: frozenset[SlurmState] = frozenset()


@dataclass(frozen=True)
class Hint:
    key: str
    title: str
    hint: str
    source: str
    evidence: str
    """The log line (or the state) that matched."""

    def __str__(self) -> str:
        return f"{self.title}: {self.hint}"


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
            "Install it once to the project's pylibs: 'singularity exec $SIF pip install "
            "--target=/projappl/<project>/pylibs tifffile', and put /projappl/<project>/pylibs on PYTHONPATH "
            "in the inner script."
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
        key="too_many_processors",
        title="More CPUs requested than the GPU node has",
        hint=(
            "GPU nodes have fewer CPU cores than CPU nodes (Levante: 64 instead of 128). Lower "
            "--ntasks-per-node x --cpus-per-task to fit the GPU node."
        ),
        source="Levante GPU guide, Troubleshooting 1",
        pattern=re.compile(r"More processors requested than permitted"),
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
        key="host_out_of_memory",
        title="Host memory (RAM) exhausted",
        hint=(
            "The job used more RAM than it requested. Raise --mem (LUMI small-g: 64G per GPU is usual), "
            "lower DataLoader num_workers, or load fewer dates per sample into memory."
        ),
        source="Slurm OUT_OF_MEMORY state",
        pattern=re.compile(r"oom[-_]kill event|Exceeded job memory limit|Out of memory: Killed process"),
        states=frozenset({SlurmState.OUT_OF_MEMORY}),
    ),
    HintRule(
        key="time_limit",
        title="Time limit reached",
        hint=(
            "Slurm stopped the job at its --time. Training saves latest.pt every epoch, so a resubmission "
            "resumes where it stopped; to need fewer resubmissions raise --time up to the partition maximum "
            "(LUMI small-g 3 days, standard-g 2 days)."
        ),
        source="LUMI guide, Auto-Resume",
        pattern=re.compile(r"DUE TO TIME LIMIT"),
        states=frozenset({SlurmState.TIMEOUT}),
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

SUBMIT_RULES: tuple[HintRule, ...] = (
    HintRule(
        key="invalid_account",
        title="Account not valid for this user or partition",
        hint=(
            "Check --account (LUMI: project_465002500) and that your user is a member "
            "('sacctmgr show assoc user=$USER')."
        ),
        source="sbatch",
        pattern=re.compile(r"Invalid account or account/partition combination"),
    ),
    HintRule(
        key="invalid_partition",
        title="Unknown partition",
        hint="Use one of the cluster's partitions ('sinfo -s'); LUMI GPU jobs: small-g, standard-g, dev-g.",
        source="sbatch",
        pattern=re.compile(r"invalid partition specified|Invalid partition name specified"),
    ),
    HintRule(
        key="time_limit_invalid",
        title="Time limit above the partition maximum",
        hint="Lower --time: LUMI small-g allows 3 days, standard-g 2 days, dev-g 30 minutes.",
        source="sbatch; LUMI guide, Cluster Details",
        pattern=re.compile(r"Requested time limit is invalid"),
    ),
    HintRule(
        key="qos_policy",
        title="Job violates accounting/QOS policy",
        hint=(
            "The request breaks a limit of the account or QOS (size, time, number of jobs), or the project's "
            "GPU-hour budget is used up. Check 'sshare'/'sacctmgr show assoc' and the project's "
            "remaining budget."
        ),
        source="sbatch",
        pattern=re.compile(r"Job violates accounting/QOS policy"),
    ),
    HintRule(
        key="node_configuration",
        title="No node can satisfy the request",
        hint=(
            "The combination of GPUs, CPUs per task and memory does not exist on any node of the partition "
            "(GPU nodes have fewer cores). Request fewer CPUs or less memory per GPU."
        ),
        source="sbatch; Levante GPU guide, Troubleshooting 1",
        pattern=re.compile(r"Requested node configuration is not available"),
    ),
    HintRule(
        key="invalid_gres",
        title="Invalid GPU (GRES) request",
        hint="Check --gpus/--gres against the partition (LUMI: --gpus=N; Levante: --gres=gpu:a100_80:N).",
        source="sbatch",
        pattern=re.compile(r"Invalid generic resource \(gres\) specification|Invalid GRES specification"),
    ),
    HintRule(
        key="not_a_batch_script",
        title="The job script has no #! line",
        hint="The first line of the script must be an interpreter line such as #!/bin/bash.",
        source="sbatch",
        pattern=re.compile(r"This does not look like a batch script"),
    ),
)


def _match(rules: Iterable[HintRule], text: str, state: SlurmState | None,
           overrides: Mapping[str, str] | None = None) -> list[Hint]:
    hints: list[Hint] = []
    lines = text.splitlines()
    for rule in rules:
        advice = (overrides or {}).get(rule.key) or rule.hint
        if state is not None and state in rule.states:
            hints.append(Hint(rule.key, rule.title, advice, rule.source, f"job state {state.value}"))
            continue
        if rule.pattern is None:
            continue
        for line in reversed(lines):  # the newest evidence is the most relevant
            if rule.pattern.search(line):
                hints.append(Hint(rule.key, rule.title, advice, rule.source, line.strip()[:300]))
                break
    return hints


def find_hints(log_text: str | None, state: SlurmState | str | None = None,
               overrides: Mapping[str, str] | None = None) -> list[Hint]:
    """Hints for a job's log tail and/or its final state, in table order, each at most once.

    ``overrides`` replaces the advice of a rule by its key with a site's own (e.g. a cluster
    profile's ``missing_gpu_hint`` for ``gpus_not_visible``); the signature stays the table's.
    """
    parsed = None if state is None else parse_state(state)
    return _match(LOG_RULES, log_text or "", parsed, overrides)


def find_submit_hints(sbatch_stderr: str | None) -> list[Hint]:
    """Hints for sbatch refusing a job (its stderr)."""
    return _match(SUBMIT_RULES, sbatch_stderr or "", None)


def format_hints(hints: Iterable[Hint]) -> str:
    """Hints as lines for a failure message (empty string when there are none)."""
    return "\n".join(f"Hint: {hint}" for hint in hints)


def hint_for(log_text: str | None, state: SlurmState | str | None = None,
             overrides: Mapping[str, str] | None = None) -> str | None:
    """Every matching hint as one text (for a message that prefixes it with ``Hint: ``), or None.

    Several hints are separated by a newline and ``Hint: `` so each stays on its own line.
    """
    hints = find_hints(log_text, state, overrides)
    return "\nHint: ".join(str(hint) for hint in hints) or None
