"""Job scripts: one pure function from (profile, job spec, run paths, code hash) to script text.

The two-script pattern of the LUMI guide (seed 000): the *outer* script carries the ``#SBATCH``
directives, checks the code directory of its hash (``<paths.code>/<hash>/``, which no later sync
changes), and launches the *inner* script with ``srun`` (inside the container when the profile has
one); the inner script puts that directory on ``PYTHONPATH`` and runs Python. One
template pair in ``include/sbatch/`` serves training stages, the viewer export and the preflight
import check on every cluster; the differences come from the profile.

Every job is requeueable, appends to its logs across requeues, and gets ``USR2`` some minutes
before its time limit (not ``USR1``, which NCCL may use). The outer script forwards that signal to
the trainer, which checkpoints at a step boundary and exits 85 (``vcloud.contract.EXIT_REQUEUE``,
like every exit code and file name the jobs share with the trainer); the outer script then requeues
the job. A training step that dies of that signal (it came before the trainer could handle it)
counts as stopped too: nothing was trained since the last checkpoint. Every interpolated value is
shell-quoted; per-job values (``{job_id}``) expand in the job.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path, PurePosixPath

from slurm_provider.cli.job_files import expand_filename_pattern, job_log_name
from vcloud.contract import (
    CODE_HASH_ENV,
    EXIT_CODE_MISMATCH,
    EXIT_GPUS_MISSING,
    EXIT_REQUEUE,
    GPU_HINT_ENV,
    GPUS_REQUIRED_ENV,
    OUTPUTS_MIRROR_ENV,
)

from vcloud_pipeline.jobspec import JobKind, JobSpec, Resources, resolve_resources
from vcloud_pipeline.layout import CodePaths, RunPaths, is_code_hash
from vcloud_pipeline.profiles import RUNTIME_JOB_ID, ClusterProfile, ContainerSpec, format_slurm_time

TEMPLATES_DIR = Path(__file__).resolve().parents[2] / "include" / "sbatch"

LOG_OUTPUT_PATTERN, LOG_ERROR_PATTERN = job_log_name("%x", "%j", "out"), job_log_name("%x", "%j", "err")
"""The job's output and error output in the run's log directory, named as SlurmSubmitOperator names
them (:func:`slurm_provider.cli.job_files.job_log_name`), so a job submitted by hand writes where the DAG looks."""

# The environment of the job (vcloud.contract): the inner script sets CODE_HASH_ENV to the job's
# code hash, and GPUS_REQUIRED_ENV (how many GPUs this node was given) and GPU_HINT_ENV (the profile's
# accelerator.missing_gpu_hint) in training and preflight jobs of profiles that require GPUs, and
# OUTPUTS_MIRROR_ENV (the shared output directory) in training jobs whose outputs are staged.

MAX_EARLY_STOPS = 3
"""Starts in a row that a training job may spend without training (a stop signal during set-up or
before the trainer installed its handler) before it stops requeueing itself."""

_TOKEN = re.compile(r"@@([A-Z_]+)@@")
_DIRECTIVE_SAFE = re.compile(r"^[A-Za-z0-9_./:@%=,+-]+$")


SITE_DEFAULT_PARTITION = "default"
"""A profile partition of this name is the site's default partition: Slurm reserves the name
(``PartitionName=DEFAULT`` sets defaults), so ``--partition=default`` would be refused; such jobs
carry no ``--partition`` and go where the site sends jobs without one (Cosmos' job scripts do so)."""


class RenderError(ValueError):
    """A job cannot be rendered from what it was given."""


@dataclass(frozen=True)
class RenderedJob:
    """Both scripts of one job, where they go on the cluster, and what they ask of Slurm."""

    job_name: str
    outer: str
    inner: str
    outer_path: PurePosixPath
    inner_path: PurePosixPath
    sbatch_options: tuple[str, ...]
    """The ``#SBATCH`` directives as command-line options (unquoted argv entries)."""
    stdout_pattern: PurePosixPath
    stderr_pattern: PurePosixPath
    resources: Resources

    @property
    def submit_argv(self) -> tuple[str, ...]:
        """What to run on the login node: the directives live in the script."""
        return ("sbatch", "--parsable", str(self.outer_path))

    def stdout_path(self, job_id: str) -> PurePosixPath:
        return _log_path(self.stdout_pattern, self.job_name, job_id)

    def stderr_path(self, job_id: str) -> PurePosixPath:
        return _log_path(self.stderr_pattern, self.job_name, job_id)


def _log_path(pattern: PurePosixPath, job_name: str, job_id: str) -> PurePosixPath:
    return PurePosixPath(expand_filename_pattern(str(pattern), job_id=str(job_id), job_name=job_name))


# --------------------------------------------------------------------------- quoting


def shell_word(value: str | PurePosixPath) -> str:
    """One shell word for ``value``: literal text single-quoted as needed, ``{job_id}`` expanded."""
    text = str(value)
    pieces = text.split(RUNTIME_JOB_ID)
    quoted = [shlex.quote(p) if p else "" for p in pieces]
    return '"${SLURM_JOB_ID}"'.join(quoted) if len(pieces) > 1 else shlex.quote(text)


def shell_join(words: list[str]) -> str:
    return " ".join(shell_word(w) for w in words)


def directive_value(value: str) -> str:
    """A value for an ``#SBATCH`` line. sbatch's own parser knows double quotes, not single ones."""
    if _DIRECTIVE_SAFE.match(value):
        return value
    if "\n" in value:
        raise RenderError(f"an #SBATCH value cannot contain a newline: {value!r}")
    escaped = value.replace("\\", "\\\\").replace('"', '\\"')
    return f'"{escaped}"'


# --------------------------------------------------------------------------- templates


@lru_cache(maxsize=16)
def _read_template(directory: str, name: str) -> str:
    path = Path(directory) / name
    if not path.is_file():
        raise RenderError(f"job script template {path} is missing")
    return path.read_text()


def fill_template(template: str, values: dict[str, str], *, name: str) -> str:
    """Replace ``@@TOKEN@@`` markers; a marker alone on its line takes a block (or vanishes if empty),
    indented like the marker."""
    wanted = set(_TOKEN.findall(template))
    if wanted != set(values):
        missing, extra = sorted(wanted - set(values)), sorted(set(values) - wanted)
        raise RenderError(f"template {name}: values missing for {missing}, unused values {extra}")
    lines: list[str] = []
    for line in template.splitlines():
        alone = _TOKEN.fullmatch(line.strip())
        if alone:
            indent = line[:len(line) - len(line.lstrip())]
            lines.extend(indent + block_line if block_line else "" for block_line in
                         values[alone.group(1)].splitlines())
        else:
            lines.append(_TOKEN.sub(lambda m: values[m.group(1)], line))
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- the parts


def _title(spec: JobSpec, run: str) -> str:
    if spec.kind is JobKind.TRAIN:
        return f"stage {spec.stage} training job of run {run}"
    if spec.kind is JobKind.EXPORT:
        return f"viewer export job of run {run}"
    if spec.kind is JobKind.DATA:
        return f"synthetic dataset ({spec.data_preset}) job of run {run}"
    return f"preflight import check of run {run}"


def _directives(profile: ClusterProfile, res: Resources, job_name: str,
                paths: RunPaths) -> list[tuple[str, str]]:
    options: list[tuple[str, str]] = [
        ("job-name", job_name),
        ("account", profile.account),
    ]
    if res.partition.name.lower() != SITE_DEFAULT_PARTITION:
        options.append(("partition", res.partition.name))
    options += [
        ("time", format_slurm_time(res.time_seconds)),
        ("nodes", str(res.nodes)),
        ("ntasks-per-node", "1"),
        ("cpus-per-task", str(res.cpus_per_task)),
    ]
    if profile.gpu_request.style == "gres":
        options.append(("gres", f"gpu:{profile.gpu_request.gres_type}:{res.gpus_per_node}"))
    elif res.nodes == 1:
        options.append(("gpus", str(res.gpus_per_node)))
    else:
        options.append(("gpus-per-node", str(res.gpus_per_node)))
    if res.mem:
        options.append(("mem", res.mem))
    if res.partition.full_node:
        options.append(("exclusive", ""))
    options += [
        ("requeue", ""),
        ("open-mode", "append"),
        ("signal", f"B:USR2@{profile.jobs.signal_lead_seconds}"),
        ("output", str(paths.logs_dir / LOG_OUTPUT_PATTERN)),
        ("error", str(paths.logs_dir / LOG_ERROR_PATTERN)),
    ]
    return options


def _node_local(profile: ClusterProfile, spec: JobSpec) -> str | None:
    """The node-local staging directory, for jobs that read the dataset."""
    if profile.staging is None or spec.kind in (JobKind.PREFLIGHT, JobKind.DATA):
        return None
    return profile.staging.node_local_dir


def _launch_prefix(profile: ClusterProfile, res: Resources) -> str:
    srun = ["srun"]
    if res.nodes > 1:
        srun.append(f"--nodes={res.nodes}")
    srun += ["--ntasks-per-node=1", f"--cpus-per-task={res.cpus_per_task}"]
    return " ".join(srun)


def _outer_setup(profile: ClusterProfile, spec: JobSpec, res: Resources, paths: RunPaths, code: CodePaths,
                 torchrun: bool) -> tuple[str, str, str, str]:
    """(setup block, launch command, on-signal block, after-step block) of the outer script."""
    setup: list[str] = []
    if profile.software.modules:
        setup += [
            "# Modules for the container runtime and the GPU stack of the nodes.",
            'if ! command -v module >/dev/null 2>&1; then',
            "    # shellcheck source=/dev/null",
            "    . /etc/profile",
            "fi",
            f"module load {shell_join(list(profile.software.modules))}",
        ]
    c = profile.container
    if c is not None:
        setup.append(f"readonly IMAGE={shell_word(c.image)}")
        if c.runtime == "charliecloud":
            setup += [
                "# ch-run refuses to start without $USER (a job's environment may lack it).",
                'USER="${USER:-$(id -un)}"',
                "export USER",
            ]
        if c.containlibs:
            setup.append(f"export SINGULARITY_CONTAINLIBS={shell_word(','.join(c.containlibs))}")
        if c.bind_env:
            setup.append(f"export SINGULARITY_BIND={shell_word(','.join(c.bind_env))}")
    if torchrun:
        setup += [
            "# torchrun rendezvous: the first node of the allocation hosts global rank 0.",
            'MASTER_ADDR="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)"',
            "export MASTER_ADDR",
            f"export MASTER_PORT={profile.jobs.master_port}",
        ]
    on_signal, after = "", ""
    node_local = _node_local(profile, spec)
    srun_all = f"srun --nodes={res.nodes} --ntasks-per-node=1 --cpus-per-task=1"
    if node_local is not None:
        assert profile.staging is not None
        setup += [
            "",
            "# Stage inputs to node-local disk on every node; results go back to shared storage.",
            f"readonly NODE_LOCAL={shell_word(node_local)}",
            f"readonly SHARED_OUTPUTS={shell_word(paths.outputs_dir)}",
            "sync_back() {",
            "    log \"copying outputs back to ${SHARED_OUTPUTS}\"",
            "    rsync -a --exclude='.*.tmp' \"${NODE_LOCAL}/outputs/\" \"${SHARED_OUTPUTS}/\"",
            "}",
            f'if ! {srun_all} mkdir -p "${{NODE_LOCAL}}/data" "${{NODE_LOCAL}}/outputs"; then',
            '    log "cannot create ${NODE_LOCAL} on every node"',
            "    exit 1",
            "fi",
        ]
        if profile.staging.stage_data:
            setup += [
                f"readonly SHARED_DATA={shell_word(paths.data_dir)}",
                'log "staging ${SHARED_DATA} to ${NODE_LOCAL}/data"',
                f'if ! {srun_all} rsync -a "${{SHARED_DATA}}/" "${{NODE_LOCAL}}/data/"; then',
                '    log "staging the dataset failed"',
                "    exit 1",
                "fi",
            ]
        if profile.staging.stage_outputs:
            setup += [
                'log "staging ${SHARED_OUTPUTS} to ${NODE_LOCAL}/outputs"',
                f"if ! {srun_all} rsync -a --exclude='.*.tmp' "
                '"${SHARED_OUTPUTS}/" "${NODE_LOCAL}/outputs/"; then',
                '    log "staging the run outputs failed"',
                "    exit 1",
                "fi",
            ]
            on_signal = "    sync_back || true"
            after = "\n".join([
                "if ! sync_back; then",
                '    log "copying outputs back failed: they are still on the node-local disk of'
                ' the first node"',
                '    if [ "$rc" -eq 0 ]; then rc=1; fi',
                "fi",
            ])
    launch = f"{_launch_prefix(profile, res)} {_container_command(c, code)}" if c is not None else \
        f'{_launch_prefix(profile, res)} bash "$INNER_SCRIPT"'
    return "\n".join(setup), launch, on_signal, after


def _container_command(c: ContainerSpec, code: CodePaths) -> str:
    """The container runtime's command line that runs the inner script (after ``srun``).

    ``srun`` forwards the outer script's USR2/TERM to the process it started. ``singularity exec``
    relays signals to its payload; ``ch-run`` with a directory image sets up the namespaces and
    then replaces itself with ``bash``, so the signal lands on the inner script, which relays it to
    Python. (A SquashFS image would keep a FUSE parent that does not forward signals.)
    """
    exec_args = list(c.exec_args)
    if c.runtime == "charliecloud":
        # Bound at the same path; /tmp is shared by ch-run itself. --home: $HOME exists inside, as
        # under Singularity (caches, matplotlib's config).
        binds = [f"-b {shell_word(f'{b}:{b}')}" for b in c.binds]
        parts = ["ch-run", shell_join(exec_args), *binds, "--home",
                 f"--cd={shell_word(code.dir)}", '"$IMAGE"', "--", 'bash "$INNER_SCRIPT"']
    else:
        exec_args += ["--rocm"] if c.rocm else []
        parts = [c.runtime, "exec", shell_join(exec_args), " ".join(f"-B {shell_word(b)}" for b in c.binds),
                 '"$IMAGE"', 'bash "$INNER_SCRIPT"']
    return " ".join(p for p in parts if p)


IMAGE_HASH_FILE = "/etc/vcloud-image.sha256"
"""Inside a locally built image (``include/local_cluster/build_image.sh``): the hash it was built
from. The inner script logs it, so a job's log says which image it ran in."""


def _container_check(profile: ClusterProfile) -> str:
    """Inner-script lines that refuse to run outside the container and log the image's identity."""
    c = profile.container
    if c is None or c.runtime != "charliecloud":
        return ""
    return "\n".join([
        "# ch-run sets CH_RUNNING in the container; a bare run would use the host's software instead.",
        'if [ -z "${CH_RUNNING:-}" ]; then',
        '    echo "vcloud inner script: not inside a Charliecloud container (CH_RUNNING is unset);'
        ' the outer script starts it with ch-run" >&2',
        "    exit 1",
        "fi",
        f"image_hash=\"$(cat {IMAGE_HASH_FILE} 2>/dev/null || echo unknown)\"",
        'echo "vcloud inner script: in Charliecloud image ${image_hash} on $(hostname)" >&2',
    ])


def _inner_env(profile: ClusterProfile, code: CodePaths) -> str:
    """The job's environment: its hash's code first on PYTHONPATH, and that hash for the trainer to
    record in its checkpoints (``vcloud.training.provenance.code_hash``)."""
    pythonpath = [str(code.pythonpath_dir)] + ([profile.paths.pylibs] if profile.paths.pylibs else [])
    lines = [f'export PYTHONPATH={shell_word(":".join(pythonpath))}"${{PYTHONPATH:+:${{PYTHONPATH}}}}"',
             f"export {CODE_HASH_ENV}={shell_word(code.hash)}"]
    lines += [f"export {k}={shell_word(v)}" for k, v in profile.software.env]
    if profile.software.miopen_cache_dir:
        lines += [
            "# MIOpen: a per-job database on node-local disk (a shared one locks up across nodes);",
            "# kernels are searched and compiled on first use.",
            f"export MIOPEN_USER_DB_PATH={shell_word(profile.software.miopen_cache_dir)}",
            'export MIOPEN_CUSTOM_CACHE_DIR="${MIOPEN_USER_DB_PATH}"',
            "export MIOPEN_FIND_MODE=1",
            'mkdir -p "${MIOPEN_USER_DB_PATH}"',
        ]
    return "\n".join(lines)


def _gpu_requirement(profile: ClusterProfile, spec: JobSpec, res: Resources) -> str:
    """Inner-script lines that make training and the preflight check refuse to run on the CPU.

    Only where the profile's accelerator is real. The count is Slurm's own for this node
    (``SLURM_GPUS_ON_NODE``), the job's request where Slurm does not set it.
    """
    if not profile.accelerator.gpus_required or spec.kind not in (JobKind.TRAIN, JobKind.PREFLIGHT):
        return ""
    lines = [
        f"# GPUs are required (accelerator {profile.accelerator.kind}): PyTorch must see as many as Slurm gave",
        "# this node, or the job stops instead of training on the CPU.",
        f'export {GPUS_REQUIRED_ENV}="${{SLURM_GPUS_ON_NODE:-{res.gpus_per_node}}}"',
    ]
    if profile.accelerator.missing_gpu_hint:
        lines.append(f"export {GPU_HINT_ENV}={shlex.quote(profile.accelerator.missing_gpu_hint)}")
    return "\n".join(lines)


def _outputs_mirror(profile: ClusterProfile, spec: JobSpec, paths: RunPaths) -> str:
    """Inner-script lines that name the shared output directory to a trainer writing to node-local disk.

    Only training jobs of profiles with ``staging.stage_outputs``: the trainer (global rank 0) copies
    each checkpoint there as it saves it (``vcloud.training.mirror``), so a failed node loses at most
    the checkpoint interval instead of everything since the outputs were staged in; the outer
    script's ``sync_back`` at the end of the step stays.
    """
    staged = profile.staging is not None and profile.staging.stage_outputs
    if spec.kind is not JobKind.TRAIN or _node_local(profile, spec) is None or not staged:
        return ""
    return "\n".join([
        "# Outputs live on node-local disk: the trainer copies every checkpoint back to shared storage as it",
        "# saves it, so a node failure loses at most the checkpoint interval.",
        f"export {OUTPUTS_MIRROR_ENV}={shell_word(paths.outputs_dir)}",
    ])


def _preflight_check(templates: str) -> str:
    """The preflight import check's Python source, with the names and exit code it shares with us."""
    return fill_template(_read_template(templates, "preflight_check.py"), {
        "GPUS_REQUIRED_ENV": GPUS_REQUIRED_ENV,
        "GPU_HINT_ENV": GPU_HINT_ENV,
        "EXIT_GPUS_MISSING": str(EXIT_GPUS_MISSING),
    }, name="preflight_check.py")


def _python_args(profile: ClusterProfile, spec: JobSpec, paths: RunPaths, code: CodePaths,
                 templates: str) -> list[str]:
    node_local = _node_local(profile, spec)
    data = f"{node_local}/data" if node_local and profile.staging and profile.staging.stage_data \
        else str(paths.data_dir)
    out = f"{node_local}/outputs" if node_local and profile.staging and profile.staging.stage_outputs \
        else str(paths.outputs_dir)
    config = str(code.dir / spec.config)
    if spec.kind is JobKind.TRAIN:
        args = ["-m", "vcloud.train", "--stage", str(spec.stage),
                "--config", config, "--data", data, "--out", out]
        if spec.restart:
            args.append("--restart")
        if spec.max_epochs is not None:
            args += ["--max-epochs", str(spec.max_epochs)]
        return args
    if spec.kind is JobKind.EXPORT:
        return ["-m", "vcloud.export", "--config", config, "--data", data, "--out", out,
                "--dest", str(paths.viewer_dir)]
    return ["-c", _preflight_check(templates)]


def _inner_command(profile: ClusterProfile, spec: JobSpec, res: Resources, paths: RunPaths, code: CodePaths,
                   templates: str, torchrun: bool) -> tuple[str, str, str]:
    """(command, signal forwarding, after block) of the inner script."""
    python = shell_word(profile.software.python)
    forward_kill = '        kill -s "$1" "$child_pid" 2>/dev/null || true'
    if spec.kind is JobKind.DATA:
        raw, prepared = str(paths.raw_data_dir), str(paths.data_dir)
        generate = shell_join(["-m", "vcloud.data.synthetic", "--out", raw, "--preset", str(spec.data_preset)])
        prepare = shell_join(["-m", "vcloud.data.prepare", "--raw", raw, "--out", prepared, "--overwrite"])
        return f"{python} {generate} && {python} {prepare}", forward_kill, ""
    args = _python_args(profile, spec, paths, code, templates)
    if not torchrun:
        command = f"{python} {shell_join(args)}"
        forward = '        kill -s "$1" "$child_pid" 2>/dev/null || true'
        return command, forward, ""
    launcher = [
        f"{python} -m torch.distributed.run",
        f"--nnodes={res.nodes}",
        '--node_rank="${SLURM_NODEID}"',
        f"--nproc_per_node={res.gpus_per_node}",
        '--master_addr="${MASTER_ADDR}"',
        '--master_port="${MASTER_PORT}"',
        shell_join(args),
    ]
    command = " \\\n    ".join(launcher)
    forward = "\n".join([
        "        # torchrun dies on USR2 and gives its workers only 30 s after TERM: signal the",
        "        # workers (its children) directly so that they finish the step and checkpoint.",
        '        pkill --signal "$1" --parent "$child_pid" || kill -s TERM "$child_pid" 2>/dev/null || true',
    ])
    after = [
        f"# torchrun reports a worker's exit {EXIT_REQUEUE} (checkpointed after a stop signal) as its own failure.",
        f'if [ -n "$stop_signal" ] && [ "$rc" -ne 0 ]; then rc={EXIT_REQUEUE}; fi',
    ]
    if profile.accelerator.gpus_required:
        after += [
            f"# ...and a worker's exit {EXIT_GPUS_MISSING} (GPUs required, PyTorch sees fewer) too: ask once more.",
            'if [ -z "$stop_signal" ] && [ "$rc" -ne 0 ]; then',
            "    gpus_rc=0",
            f"    {python} -m vcloud.training.distributed >/dev/null 2>&1 || gpus_rc=$?",
            f'    if [ "$gpus_rc" -eq {EXIT_GPUS_MISSING} ]; then rc={EXIT_GPUS_MISSING}; fi',
            "fi",
        ]
    return command, forward, "\n".join(after)


# --------------------------------------------------------------------------- the one entry point


def job_name(paths: RunPaths, spec: JobSpec) -> str:
    return f"vcloud-{paths.run}-{spec.label}"


def render_job(profile: ClusterProfile, spec: JobSpec, paths: RunPaths, code_hash: str, *,
               templates_dir: Path | None = None) -> RenderedJob:
    """Render the outer and inner scripts of one job. Pure: reads only the template files."""
    profile.require_complete()
    if not is_code_hash(code_hash):
        raise RenderError(f"code hash {code_hash!r} is not a sha256 hex digest; compute it with "
                          "vcloud_pipeline.code_tree.code_hash over the synced tree")
    templates = str(templates_dir or TEMPLATES_DIR)
    code = paths.code(code_hash)
    res = resolve_resources(profile, spec)
    name = job_name(paths, spec)
    torchrun = spec.kind is JobKind.TRAIN and res.nodes * res.gpus_per_node > 1
    outer_path = paths.job_script(name, inner=False)
    inner_path = paths.job_script(name, inner=True)
    title = _title(spec, paths.run)

    options = _directives(profile, res, name, paths)
    directive_lines = [f"#SBATCH --{k}={directive_value(v)}" if v else f"#SBATCH --{k}" for k, v in options]
    setup, launch, on_signal, after_step = _outer_setup(profile, spec, res, paths, code, torchrun)
    wait_for_child = _read_template(templates, "wait_for_child.sh")
    outer = fill_template(_read_template(templates, "outer.sbatch"), {
        "DIRECTIVES": "\n".join(directive_lines),
        "TITLE": title,
        "PROFILE": profile.name,
        "EXIT_REQUEUE": str(EXIT_REQUEUE),
        "EXIT_CODE_MISMATCH": str(EXIT_CODE_MISMATCH),
        "CODE_MANIFEST": shell_word(code.manifest),
        "CODE_HASH": shell_word(code_hash),
        "INNER_SCRIPT": shell_word(inner_path),
        "SETUP": setup,
        "ON_SIGNAL": on_signal,
        "LAUNCH": launch,
        "AFTER_STEP": after_step,
        "WAIT_FOR_CHILD": wait_for_child,
        "STEP_RESUMES": "1" if spec.kind is JobKind.TRAIN else "0",
        "EARLY_STOPS_FILE": f'{shell_word(paths.logs_dir)}/.{name}.early-stops."${{SLURM_JOB_ID:-0}}"',
        "MAX_EARLY_STOPS": str(MAX_EARLY_STOPS),
    }, name="outer.sbatch")

    command, forward, after = _inner_command(profile, spec, res, paths, code, templates, torchrun)
    where = f"inside the container ({profile.container.runtime})" if profile.container else \
        "in the job environment"
    inner = fill_template(_read_template(templates, "inner.sh"), {
        "TITLE": title,
        "WHERE": where,
        "PROFILE": profile.name,
        "CONTAINER_CHECK": _container_check(profile),
        "ENV": "\n".join(part for part in (_inner_env(profile, code), _gpu_requirement(profile, spec, res),
                                            _outputs_mirror(profile, spec, paths)) if part),
        "CODE_DIR": shell_word(code.dir),
        "FORWARD": forward,
        "WAIT_FOR_CHILD": wait_for_child,
        "COMMAND": command,
        "AFTER": after,
    }, name="inner.sh")

    return RenderedJob(
        job_name=name,
        outer=outer,
        inner=inner,
        outer_path=outer_path,
        inner_path=inner_path,
        sbatch_options=tuple(f"--{k}={v}" if v else f"--{k}" for k, v in options),
        stdout_pattern=paths.logs_dir / LOG_OUTPUT_PATTERN,
        stderr_pattern=paths.logs_dir / LOG_ERROR_PATTERN,
        resources=res,
    )
