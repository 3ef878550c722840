"""The rules a loaded profile must keep: its own consistency, and the lessons of the user's field notes.

Each rule is a function of a :class:`~vcloud_pipeline.profile.models.ClusterProfile` that raises
:class:`~vcloud_pipeline.profile.models.ProfileError` with the reason and the fix (the seeds cited
are the field notes under ``/work/shared/seeds``): structure first (what one section says about
another), then every profile's rules, then those of its site.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from vcloud_pipeline.profile.models import MAX_HINT_CHARS, RUNTIME_JOB_ID, ClusterProfile, ProfileError

NODE_LOCAL_ROOTS = ("/tmp", "/dev/shm", "/var/tmp")
"""Directories that are private to each compute node (plus a profile's staging directory)."""

_TRES_NAME = re.compile(r"^[a-z]+(?:/[A-Za-z0-9_.:-]+)?$")
"""A Slurm TRES name as sshare prints it: ``billing``, ``cpu``, ``gres/gpu``, ``gres/gpu:mi250``."""
_MEM_SIZE = re.compile(r"^\d+[KMGT]?$")


def _structure(profile: ClusterProfile) -> None:
    """What one section of the profile requires of another."""
    name, accelerator = profile.name, profile.accelerator
    if accelerator.gpus_required and accelerator.missing_gpu_hint is None:
        raise ProfileError(
            f"profile {name}: accelerator.missing_gpu_hint is required when accelerator.kind is "
            f"{accelerator.kind!r}: say what makes PyTorch see the GPUs in a job on this cluster (the "
            "container bindings, the modules, the partition); jobs that see fewer GPUs than they were "
            "given stop and show it"
        )
    if accelerator.missing_gpu_hint is not None and len(accelerator.missing_gpu_hint) > MAX_HINT_CHARS:
        raise ProfileError(f"profile {name}: accelerator.missing_gpu_hint is longer than {MAX_HINT_CHARS} "
                           "characters; it is read in a failure message, keep it to the fix")
    if profile.gpu_request.style == "gres" and not profile.gpu_request.gres_type:
        raise ProfileError(f"profile {name}: gpu_request.gres_type is required with style 'gres' "
                           f"(e.g. a100_80 for --gres=gpu:a100_80:N)")
    for pname, spec in profile.partitions.items():
        if spec.mem_per_gpu is not None and not _MEM_SIZE.match(spec.mem_per_gpu):
            raise ProfileError(f"profile {name}: partitions.{pname}.mem_per_gpu {spec.mem_per_gpu!r} is not "
                               "a Slurm memory size (e.g. 64G)")
        if spec.default_time_seconds > spec.max_time_seconds:
            raise ProfileError(f"profile {name}: partitions.{pname}.default_time is longer than its max_time")
        if spec.max_gpus_per_node > accelerator.per_node:
            raise ProfileError(f"profile {name}: partitions.{pname}.max_gpus_per_node "
                               f"{spec.max_gpus_per_node} exceeds accelerator.per_node "
                               f"{accelerator.per_node}")
    if not profile.partitions:
        raise ProfileError(f"profile {name}: partitions must name at least one partition")
    for key in ("default_partition", "debug_partition"):
        if getattr(profile, key) not in profile.partitions:
            raise ProfileError(f"profile {name}: {key} {getattr(profile, key)!r} not allowed "
                               f"(allowed: {', '.join(profile.partitions)})")
    tres = profile.billing.slurm_tres
    if tres is not None and not _TRES_NAME.match(tres):
        raise ProfileError(f"profile {name}: billing.slurm_tres {tres!r} is not a TRES name "
                           "(e.g. billing, gres/gpu)")


def _under(path: str, parent: str) -> bool:
    return path == parent or path.startswith(parent.rstrip("/") + "/")


def _static_prefix(path: str) -> str:
    """The part of a path before its first per-job placeholder."""
    return path.split(RUNTIME_JOB_ID, 1)[0].rsplit("/", 1)[0] or "/" if RUNTIME_JOB_ID in path else path


def _rule_no_miopen_disable(profile: ClusterProfile) -> None:
    if "MIOPEN_DISABLE_CACHE" in profile.software.env_dict:
        raise ProfileError(
            f"profile {profile.name}: software.env sets MIOPEN_DISABLE_CACHE; with the cache disabled "
            "MIOpen cannot keep compiled kernels and fails with 'No suitable algorithm was found to "
            "execute the required convolution' (seed 002). Use software.miopen_cache_dir "
            "(per job, node-local, e.g. /tmp/miopen_cache_{job_id}) instead"
        )


def _rule_miopen_cache_node_local(profile: ClusterProfile) -> None:
    cache = profile.software.miopen_cache_dir
    if profile.accelerator.kind == "rocm" and cache is None:
        raise ProfileError(
            f"profile {profile.name}: software.miopen_cache_dir is required for ROCm accelerators: "
            "MIOpen compiles kernels on first use and needs a writable per-job cache "
            "(e.g. /tmp/miopen_cache_{job_id}; seed 002)"
        )
    if cache is None:
        return
    if RUNTIME_JOB_ID not in cache:
        raise ProfileError(f"profile {profile.name}: software.miopen_cache_dir {cache!r} must contain "
                           "{job_id} so that jobs never share an MIOpen database (seed 002)")
    local_roots: tuple[str, ...] = NODE_LOCAL_ROOTS
    if profile.staging:
        local_roots += (_static_prefix(profile.staging.node_local_dir),)
    if not any(_under(cache, root) for root in local_roots):
        raise ProfileError(
            f"profile {profile.name}: software.miopen_cache_dir {cache!r} is not on node-local disk "
            f"({', '.join(local_roots)}); on a shared file system the nodes writing one MIOpen SQLite "
            "database lock each other out (seed 002). Use e.g. /tmp/miopen_cache_{job_id}"
        )


def _rule_container_sees_job_paths(profile: ClusterProfile) -> None:
    """Every directory the inner script touches must be bound into the container."""
    if profile.container is None:
        return
    p = profile.paths
    needed = {"paths.code": p.code, "paths.data": p.data, "paths.outputs": p.outputs,
              "paths.viewer": p.viewer, "paths.jobs": p.jobs}
    if p.pylibs:
        needed["paths.pylibs"] = p.pylibs
    if profile.staging:
        needed["staging.node_local_dir"] = _static_prefix(profile.staging.node_local_dir)
    visible = profile.container.visible_paths
    for field_name, path in needed.items():
        if not any(_under(path, v) for v in visible):
            raise ProfileError(
                f"profile {profile.name}: {field_name} {path} is not visible inside the container; "
                f"add it (or a parent) to container.binds or container.bind_env "
                f"(visible now: {', '.join(visible) or 'nothing'})"
            )


def _lumi_no_rocm_flag(profile: ClusterProfile) -> None:
    c = profile.container
    if c is not None and (c.rocm or "--rocm" in c.exec_args):
        raise ProfileError(
            f"profile {profile.name}: container.rocm / '--rocm' is refused on LUMI: "
            "'singularity exec --rocm' injects the host's libdrm.so, built against GLIBC 2.33, into a "
            "container that ships GLIBC 2.31, and the job crashes before Python starts (seed 001). "
            "Keep rocm: false and make host paths visible with container.bind_env (SINGULARITY_BIND) "
            "and container.containlibs instead"
        )


def _lumi_no_modules(profile: ClusterProfile) -> None:
    if profile.software.modules:
        raise ProfileError(
            f"profile {profile.name}: software.modules must be empty on LUMI "
            f"(got {', '.join(profile.software.modules)}): 'module load' does not work on LUMI compute "
            "nodes (lua5.3 is missing there), so the job would fail at its first line (seed 001). "
            "Everything the job needs comes from the container, SINGULARITY_BIND and SINGULARITY_CONTAINLIBS"
        )


def _lumi_container_gpu_bindings(profile: ClusterProfile) -> None:
    c = profile.container
    if c is None:
        raise ProfileError(f"profile {profile.name}: LUMI jobs run in the CSC PyTorch container; "
                           "container is required (seed 000)")
    for lib in ("/usr/lib64/libcxi.so.1", "/opt/rocm/lib/librocm_smi64.so.7"):
        if lib not in c.containlibs:
            raise ProfileError(
                f"profile {profile.name}: container.containlibs must include {lib}; without "
                "libcxi.so.1 and librocm_smi64.so.7 PyTorch finds no GPU inside the container "
                "('RuntimeError: No HIP GPUs available', seed 000)"
            )
    if not any(_under("/opt/cray/libfabric", v) for v in c.visible_paths):
        raise ProfileError(
            f"profile {profile.name}: /opt/cray/libfabric must be bound into the container "
            "(container.binds or container.bind_env); without it jobs fail with libfabric/CXI errors, "
            "even on one node (seed 000)"
        )


def _lumi_gpu_hint(profile: ClusterProfile) -> None:
    """The advice for invisible GCDs is seed 000's error no. 1 fix, and never ``--rocm`` (seed 001)."""
    hint = profile.accelerator.missing_gpu_hint or ""
    c = profile.container
    needed = ["SINGULARITY_CONTAINLIBS", *(c.containlibs if c else ()), "/opt/cray/libfabric"]
    missing = [item for item in needed if item not in hint]
    if missing:
        raise ProfileError(
            f"profile {profile.name}: accelerator.missing_gpu_hint must name {', '.join(missing)}: on LUMI "
            "PyTorch sees no GCD without SINGULARITY_CONTAINLIBS=/usr/lib64/libcxi.so.1,"
            "/opt/rocm/lib/librocm_smi64.so.7 and the -B /opt/cray/libfabric bind (seed 000)"
        )
    for match in re.finditer(r"--rocm\b", hint):
        before = hint[max(0, match.start() - 40):match.start()].lower()
        if not any(word in before for word in ("never", "not ", "without", "no ")):
            raise ProfileError(
                f"profile {profile.name}: accelerator.missing_gpu_hint suggests '--rocm', which crashes "
                "jobs on LUMI (the host's libdrm needs GLIBC 2.33, the container has 2.31; seed 001); "
                "say 'never --rocm' or leave it out"
            )


def _lumi_env(profile: ClusterProfile) -> None:
    env = profile.software.env_dict
    if "expandable_segments:True" not in env.get("PYTORCH_HIP_ALLOC_CONF", ""):
        raise ProfileError(
            f"profile {profile.name}: software.env.PYTORCH_HIP_ALLOC_CONF must contain "
            "expandable_segments:True; without it the allocator fragments and jobs run out of memory "
            "at ~40 GB of the 64 GB per GCD (seed 000)"
        )
    if env.get("WANDB_MODE") != "disabled":
        raise ProfileError(
            f"profile {profile.name}: software.env.WANDB_MODE must be 'disabled'; WandB hangs for 30+ "
            "minutes inside Singularity on LUMI trying to reach the network (seeds 000, 001)"
        )


Rule = Callable[[ClusterProfile], None]

GENERAL_RULES: tuple[Rule, ...] = (
    _structure,
    _rule_no_miopen_disable,
    _rule_miopen_cache_node_local,
    _rule_container_sees_job_paths,
)
SITE_RULES: dict[str, tuple[Rule, ...]] = {
    "lumi": (_lumi_no_rocm_flag, _lumi_no_modules, _lumi_container_gpu_bindings, _lumi_gpu_hint, _lumi_env),
}


def check_profile(profile: ClusterProfile) -> None:
    """Raise the first rule ``profile`` breaks."""
    for rule in GENERAL_RULES + SITE_RULES.get(profile.site, ()):
        rule(profile)
