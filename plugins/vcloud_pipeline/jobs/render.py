"""Job scripts: one pure function from (profile, job spec, run paths, code hash) to script text.

The two-script pattern of the LUMI guide (seed 000): the *outer* script carries the ``#SBATCH``
directives, checks the code directory of its hash (``<paths.code>/<hash>/``, which no later sync
changes), and launches the *inner* script with ``srun`` (inside the container when the profile has
one); the inner script puts that directory on ``PYTHONPATH`` and runs Python. One pair of Jinja2
templates in ``include/sbatch/`` (``outer.sbatch``, ``inner.sh``) serves training stages, the viewer
export and the preflight import check on every cluster; the differences come from the profile.

Every job is requeueable, appends to its logs across requeues, and gets ``USR2`` some minutes
before its time limit (not ``USR1``, which NCCL may use). The outer script forwards that signal to
the trainer, which checkpoints at a step boundary and exits 85 (``vcloud.contract.EXIT_REQUEUE``,
like every exit code and file name the jobs share with the trainer); the outer script then requeues
the job. A training step that dies of that signal (it came before the trainer could handle it)
counts as stopped too: nothing was trained since the last checkpoint. A training job on more than
one GPU runs torchrun through ``python -m vcloud.launch``, which ends with the exit code its ranks
ended with (85, 87, 88) instead of torchrun's exit 1 and traceback. Every interpolated value is
shell-quoted (the templates' ``shq`` filter); per-job values (``{job_id}``) expand in the job.
"""

from __future__ import annotations

import hashlib
import re
import shlex
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path, PurePosixPath

import jinja2

from slurm_provider.cli.job_files import expand_filename_pattern, job_log_name
from slurm_provider import end_record_shell, format_time_limit
from vcloud import code_digest
from vcloud.contract import (
    CODE_HASH_ENV,
    EXIT_CODE_MISMATCH,
    EXIT_ERROR,
    EXIT_GPUS_MISSING,
    EXIT_RUNTIME_FAILED,
    EXIT_REQUEUE,
    GPU_HINT_ENV,
    GPUS_REQUIRED_ENV,
    ON_CODE_CHANGE_SETTING,
    OUTPUTS_MIRROR_ENV,
    RANK_EXITS_DIR_ENV,
    RECORDED_EXITS,
)

from vcloud_pipeline.checkout import INCLUDE_DIR
from vcloud_pipeline.plan.jobspec import JobKind, JobSpec, Resources, resolve_resources
from vcloud_pipeline.plan.layout import CodePaths, RunPaths, is_code_hash, pylibs_set
from vcloud_pipeline.profile import RUNTIME_JOB_ID, ClusterProfile, ContainerSpec
from vcloud_pipeline.provision.environment import JobEnvironment
from vcloud_pipeline.provision.requirements import runtime_requirements

TEMPLATES_DIR = INCLUDE_DIR / "sbatch"

LOG_OUTPUT_PATTERN, LOG_ERROR_PATTERN = job_log_name("%x", "%j", "out"), job_log_name("%x", "%j", "err")
"""The job's output and error output in the run's log directory, named as SlurmSubmitOperator names
them (:func:`slurm_provider.cli.job_files.job_log_name`), so a job submitted by hand writes where the DAG looks."""

# The environment of the job (vcloud.contract): the inner script sets CODE_HASH_ENV to the job's
# code hash, and GPUS_REQUIRED_ENV (how many GPUs this node was given) and GPU_HINT_ENV (the profile's
# accelerator.missing_gpu_hint) in training and preflight jobs of profiles that require GPUs, and
# OUTPUTS_MIRROR_ENV (the shared output directory) in training jobs whose outputs are staged, and
# RANK_EXITS_DIR_ENV (RunPaths.exit_records_dir) in torchrun jobs: their ranks record exit codes
# there, and the launch (python -m vcloud.launch, torchrun ending with the ranks' exit code) reads them.

MAX_EARLY_STOPS = 3
"""Starts in a row that a training job may spend without training (a stop signal during set-up or
before the trainer installed its handler) before it stops requeueing itself."""

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


def shq(value: str | PurePosixPath, job_id: bool = True) -> str:
    """The ``shq`` filter: :func:`shell_word`, or plain :func:`shlex.quote` with ``job_id=False``
    (text such as a hint, where ``{job_id}`` is not a placeholder)."""
    return shell_word(value) if job_id else shlex.quote(str(value))


@lru_cache(maxsize=4)
def template_environment(directory: str) -> jinja2.Environment:
    """The Jinja2 environment of the job-script templates in ``directory``.

    ``StrictUndefined``: a name the renderer does not pass fails the render instead of leaving a
    blank in a job script. No autoescaping (these are shell scripts, not HTML): every interpolated
    value goes through the ``shq`` filter (shell words), ``shjoin`` (argv) or ``directive``
    (``#SBATCH`` values) instead. ``trim_blocks``/``lstrip_blocks``: a line holding only a
    ``{% if %}`` tag leaves nothing behind.
    """
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(directory),
        undefined=jinja2.StrictUndefined,
        autoescape=False,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(shq=shq, shjoin=lambda words: shell_join([str(w) for w in words]),
                       directive=directive_value)
    return env


def render_template(directory: str, name: str, **values: object) -> str:
    """Render the template ``name`` of ``directory``; a missing file or name is a :class:`RenderError`."""
    env = template_environment(directory)
    try:
        return env.get_template(name).render(**values)
    except jinja2.TemplateNotFound:
        raise RenderError(f"job script template {Path(directory) / name} is missing") from None
    except jinja2.UndefinedError as exc:
        raise RenderError(f"template {name}: {exc.message}; pass it to render_template") from None


def _template_text(directory: str, name: str) -> str:
    """A template file's text as it is (a block included in both scripts, indented by the caller)."""
    env = template_environment(directory)
    try:
        source, _, _ = env.loader.get_source(env, name)  # type: ignore[union-attr]
    except jinja2.TemplateNotFound:
        raise RenderError(f"job script template {Path(directory) / name} is missing") from None
    return source


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
        ("time", format_time_limit(res.time_seconds)),
    ]
    if res.time_min_seconds is not None:
        options.append(("time-min", format_time_limit(res.time_min_seconds)))
    options += [
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


def _runtime_probe(c: ContainerSpec) -> str:
    """The container runtime's command line that runs ``true`` in the image: a node where it fails
    cannot run the job (the outer script exits with ``EXIT_RUNTIME_FAILED``)."""
    if c.runtime == "charliecloud":
        return 'ch-run "$IMAGE" -- true'
    return f'{c.runtime} exec "$IMAGE" true'


IMAGE_HASH_FILE = "/etc/vcloud-image.sha256"
"""Inside a locally built image (``include/local_cluster/build_image.sh``): the hash it was built
from. The inner script logs it, so a job's log says which image it ran in."""


def _preflight_check(templates: str) -> str:
    """The preflight import check's Python source, with the names and exit code it shares with us."""
    return render_template(templates, "preflight_check.py", GPUS_REQUIRED_ENV=GPUS_REQUIRED_ENV,
                           GPU_HINT_ENV=GPU_HINT_ENV, EXIT_GPUS_MISSING=EXIT_GPUS_MISSING)


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
        if spec.on_code_change is not None:
            args += ["--set", f"{ON_CODE_CHANGE_SETTING}={spec.on_code_change}"]
        return args
    if spec.kind is JobKind.EXPORT:
        return ["-m", "vcloud.export", "--config", config, "--data", data, "--out", out,
                "--dest", str(paths.viewer_dir)]
    return ["-c", _preflight_check(templates)]


# --------------------------------------------------------------------------- the one entry point


def script_stem(paths: RunPaths, spec: JobSpec) -> str:
    """What a job's scripts and files on the cluster are named by (``vcloud-<run name>-<label>``): the
    same for every DAG run of a run name. The job's name in Slurm is the submitting task's
    (:func:`slurm_provider.job_name_for`), rendered into the script's ``#SBATCH --job-name``."""
    return f"vcloud-{paths.run}-{spec.label}"


@dataclass(frozen=True)
class PylibsEntry:
    """What the job puts on ``PYTHONPATH`` for the packages outside the container, and why."""

    dirs: tuple[str, ...] = ()
    note: str | None = None
    """For a provisioned set: its key and the image it was built for, stated in the job's log."""


def _pylibs_entry(profile: ClusterProfile, environment: JobEnvironment | None) -> PylibsEntry:
    """``PYTHONPATH``'s entry for the packages outside the container: a provisioning profile's directory
    of the set provisioned for ``environment`` (the checkout's pins and the profile's image when not
    given), so a later set or image never changes what a queued job imports; ``paths.pylibs`` itself
    where the profile keeps it by hand."""
    if not profile.paths.pylibs:
        return PylibsEntry()
    if profile.provision is None:
        return PylibsEntry((profile.paths.pylibs,))
    environment = environment or JobEnvironment.of(profile, runtime_requirements())
    pylibs = pylibs_set(profile, environment.key)
    if pylibs is None:
        return PylibsEntry()
    return PylibsEntry((str(pylibs.dir),), f"requirement set {environment.key} in {pylibs.dir}, provisioned for "
                                           f"{environment.describe_image()}")


@lru_cache(maxsize=1)
def _code_digest_source() -> str:
    """The text of :mod:`vcloud.code_digest`, which the inner script carries and runs over its code
    directory before the trainer starts (the same hash the sync named the directory by)."""
    return Path(code_digest.__file__).read_text().rstrip("\n")


def render_job(profile: ClusterProfile, spec: JobSpec, paths: RunPaths, code_hash: str, *,
               environment: JobEnvironment | None = None, templates_dir: Path | None = None,
               job_name: str | None = None) -> RenderedJob:
    """Render the outer and inner scripts of one job. Pure: reads only the template files (and, without
    ``environment``, the checkout's runtime requirements). ``job_name``: the job's name in Slurm, the
    one its task submits it with (None: the script stem, for a job submitted by hand)."""
    profile.require_complete()
    if not is_code_hash(code_hash):
        raise RenderError(f"code hash {code_hash!r} is not a sha256 hex digest; compute it with "
                          "vcloud_pipeline.code.tree.code_hash over the synced tree")
    templates = str(templates_dir or TEMPLATES_DIR)
    code = paths.code(code_hash)
    res = resolve_resources(profile, spec)
    stem = script_stem(paths, spec)
    name = job_name or stem
    torchrun = spec.kind is JobKind.TRAIN and res.nodes * res.gpus_per_node > 1
    outer_path = paths.job_script(stem)
    title = _title(spec, paths.run)

    options = _directives(profile, res, name, paths)
    node_local = _node_local(profile, spec)
    staged_outputs = node_local is not None and profile.staging is not None and profile.staging.stage_outputs
    c = profile.container
    launch = f"{_launch_prefix(profile, res)} {_container_command(c, code)}" if c is not None else \
        f'{_launch_prefix(profile, res)} bash "$INNER_SCRIPT"'
    pylibs = _pylibs_entry(profile, environment)
    pythonpath = [str(code.pythonpath_dir), *pylibs.dirs]
    data_job = None
    if spec.kind is JobKind.DATA:
        raw, prepared = str(paths.raw_data_dir), str(paths.data_dir)
        data_job = {"generate": ["-m", "vcloud.data.synthetic", "--out", raw,
                                 "--preset", str(spec.data_preset)],
                    "prepare": ["-m", "vcloud.data.prepare", "--raw", raw, "--out", prepared, "--overwrite"]}
    values = dict(
        profile=profile, container=c, res=res, paths=paths, code=code, job_name=name, title=title,
        torchrun=torchrun, node_local=node_local, sync_back=staged_outputs,
        exit_records=paths.exit_records_dir(stem) if torchrun else None,
        wait_for_child=_template_text(templates, "wait_for_child.sh").rstrip("\n"),
        EXIT_ERROR=EXIT_ERROR, EXIT_REQUEUE=EXIT_REQUEUE, EXIT_CODE_MISMATCH=EXIT_CODE_MISMATCH,
        EXIT_RUNTIME_FAILED=EXIT_RUNTIME_FAILED, runtime_probe=_runtime_probe(c) if c is not None else None,
        RECORDED_EXITS=RECORDED_EXITS,
        CODE_HASH_ENV=CODE_HASH_ENV, GPUS_REQUIRED_ENV=GPUS_REQUIRED_ENV, GPU_HINT_ENV=GPU_HINT_ENV,
        OUTPUTS_MIRROR_ENV=OUTPUTS_MIRROR_ENV, RANK_EXITS_DIR_ENV=RANK_EXITS_DIR_ENV,
        IMAGE_HASH_FILE=IMAGE_HASH_FILE,
        MAX_EARLY_STOPS=MAX_EARLY_STOPS,
    )
    # The exit record goes next to the job's output (named as submitted: the operator names the job and
    # its output on sbatch's command line), where its watch reads it.
    end_record = end_record_shell(str(paths.logs_dir / LOG_OUTPUT_PATTERN))
    inner = render_template(
        templates, "inner.sh", **values,
        where=f"inside the container ({c.runtime})" if c is not None else "in the job environment",
        pythonpath=pythonpath, pylibs_note=pylibs.note, python=profile.software.python,
        # GPUs are required in training and preflight jobs where the profile's accelerator is real; the
        # count is Slurm's own for the node (SLURM_GPUS_ON_NODE), the job's request where Slurm sets none.
        gpus_required=profile.accelerator.gpus_required and spec.kind in (JobKind.TRAIN, JobKind.PREFLIGHT),
        # Training jobs whose outputs are staged name the shared output directory to the trainer
        # (vcloud.training.mirror): it copies each checkpoint there as it saves it.
        outputs_mirror=spec.kind is JobKind.TRAIN and staged_outputs,
        data_job=data_job,
        code_digest=_code_digest_source(),
        python_args=[] if data_job else _python_args(profile, spec, paths, code, templates),
    )
    # The outer script (Slurm keeps the submitted copy) names its inner script by content and checks
    # that content before it runs it: a queued or requeued job runs exactly what it was submitted with.
    inner_sha256 = hashlib.sha256(inner.encode()).hexdigest()
    inner_path = paths.inner_script(stem, inner_sha256)
    outer = render_template(templates, "outer.sbatch", **values, directives=options, inner_path=inner_path,
                            inner_sha256=inner_sha256, step_resumes=spec.kind is JobKind.TRAIN, launch=launch,
                            end_record=end_record)

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
