"""The provisioning step's one shell script, and what its output means. Pure: no I/O.

The script (run with ``bash -s`` on the login node, its text on stdin) ends at once when the set's
directory is complete (its marker exists): a second run of the same set is one SSH command that
installs nothing. Otherwise, under a lock of the submit lock's kind in ``paths.pylibs``
(:func:`slurm_provider.cli.exclusive_submit.lock_acquire_lines`), it asks the container's Python which pinned
distributions it already has (``importlib.metadata``), installs the missing ones with the container's
own ``pip`` (``--target``, ``--no-deps``: everything else is the container's; ``--only-binary``: a
package that would need a compiler fails here, not in a job) into a directory of its own, writes the
marker into it and renames it into place, so a set is either complete or absent; a complete set is
read-only for everyone (other members' jobs put it on their ``PYTHONPATH``). With
``provision.where: job`` the check and the install run in a short job (``sbatch --wait``) while the
login shell holds the lock.

A package the container has at another version than the pin counts as provided: the site's build
(LUMI's ROCm PyTorch) is the one the jobs must use; the log names the difference.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field

from slurm_provider.cli.exclusive_submit import EXIT_LOCK_BUSY, lock_acquire_lines
from slurm_provider import format_time_limit

from vcloud_pipeline.plan.layout import PylibsPaths
from vcloud_pipeline.profile import ClusterProfile
from vcloud_pipeline.provision.environment import JobEnvironment

MARK = "VCLOUD-PROVISION"
"""Starts each line the script prints about the step (the rest is the check's and pip's output)."""

EXIT_NO_DIRECTORY = 70
EXIT_CHECK_FAILED = 71
"""The container's Python did not run (image missing, runtime not found)."""
EXIT_INSTALL_FAILED = 72
"""``pip`` could not install the missing pins (no network, no wheel, no such version)."""

PIP_OPTIONS = ("--no-deps", "--only-binary=:all:", "--no-cache-dir", "--disable-pip-version-check",
               "--no-input", "--no-warn-script-location", "--progress-bar", "off", "--retries", "1", "--timeout", "20")

CHECK_SOURCE = """\
import sys
from importlib import metadata
for pin in sys.argv[1:]:
    name, _, version = pin.partition("==")
    try:
        found = metadata.version(name)
    except metadata.PackageNotFoundError:
        print("missing", pin)
    else:
        print("have", pin, found)
"""
"""Run by the container's Python with the pins as arguments: which it has (and at which version)."""


class ProvisionSetupError(ValueError):
    """The profile cannot provision its environment as it is set."""


def container_prefix(profile: ClusterProfile, pylibs: PylibsPaths) -> str:
    """The command line (up to the program) that runs a program in the profile's container, with the
    pylibs root and the provisioning binds that exist bound (``$binds``, set by the script)."""
    provision = profile.provision
    c = profile.container
    if provision is None:
        raise ProvisionSetupError(f"profile {profile.name} has no provision section")
    base = "env -u PYTHONPATH PYTHONNOUSERSITE=1"
    if c is None:
        return base
    runtime = shlex.quote(provision.runtime or c.runtime)
    if c.runtime == "charliecloud":
        return f'{base} {runtime} -b {shlex.quote(f"{pylibs.root}:{pylibs.root}")} "${{binds[@]}}" ' \
               f"{shlex.quote(c.image)} --"
    return f'{base} {runtime} exec -B {shlex.quote(str(pylibs.root))} "${{binds[@]}}" {shlex.quote(c.image)}'


def _bind_lines(profile: ClusterProfile) -> list[str]:
    assert profile.provision is not None
    flag = "-b" if profile.container is not None and profile.container.runtime == "charliecloud" else "-B"
    lines = ["binds=()"]
    for path in profile.provision.binds:
        q = shlex.quote(path)
        value = shlex.quote(f"{path}:{path}") if flag == "-b" else q
        lines.append(f"if [ -e {q} ]; then binds+=({flag} {value}); fi")
    return lines


def _work_lines(profile: ClusterProfile, pylibs: PylibsPaths, environment: JobEnvironment) -> list[str]:
    """Check, install into the building directory, write the marker, rename: the part that needs the
    container (and, for ``pip``, the package index)."""
    prefix = container_prefix(profile, pylibs)
    python = shlex.quote(profile.software.python)
    building, target, marker = (shlex.quote(str(p)) for p in (pylibs.building, pylibs.dir, pylibs.marker))
    requirements = environment.requirement_set
    pins = " ".join(shlex.quote(p) for p in requirements.pins)
    built_for = " ".join(shlex.quote(line) for line in (
        f"image {environment.image or '(none)'}", f"image-identity {environment.image_identity or '(not read)'}"))
    record = shlex.quote(f"{pylibs.building}/{pylibs.marker.name}")
    return [
        *_bind_lines(profile),
        f"rm -rf {building} && mkdir -p {building} || exit {EXIT_NO_DIRECTORY}",
        f"report=$({prefix} {python} -c {shlex.quote(CHECK_SOURCE)} {pins} 2>&1); status=$?",
        'printf \'%s\\n\' "$report"',
        f'if [ "$status" -ne 0 ]; then echo "{MARK} check-failed exit $status"; rm -rf {building}; '
        f"exit {EXIT_CHECK_FAILED}; fi",
        "mapfile -t missing < <(printf '%s\\n' \"$report\" | sed -n 's/^missing //p')",
        'if [ "${#missing[@]}" -gt 0 ]; then',
        f'  echo "{MARK} installing ${{missing[*]}}"',
        f"  {prefix} {python} -m pip install {' '.join(PIP_OPTIONS)} --target {building} \"${{missing[@]}}\" 2>&1",
        f'  status=$?; if [ "$status" -ne 0 ]; then echo "{MARK} install-failed exit $status"; rm -rf {building}; '
        f"exit {EXIT_INSTALL_FAILED}; fi",
        "fi",
        f'{{ echo "requirements {requirements.hash}"; echo "set {environment.key}"; '
        f"printf '%s\\n' {built_for} \"$report\"; "
        f'echo "installed $(hostname) $(date -u +%Y-%m-%dT%H:%M:%SZ)"; }} > {record} || exit {EXIT_NO_DIRECTORY}',
        f"mv -T {building} {target} || exit {EXIT_NO_DIRECTORY}",
        # Finished: nobody changes it any more (other members' jobs put it on their PYTHONPATH).
        f"chmod -R a-w -- {target} || exit {EXIT_NO_DIRECTORY}",
        f'echo "{MARK} installed {pylibs.dir}"',
    ]


def _job_lines(profile: ClusterProfile, pylibs: PylibsPaths, environment: JobEnvironment) -> list[str]:
    """``where: job``: the work as a short job, waited for while the lock is held; its log is printed."""
    assert profile.provision is not None
    partition = profile.partition(profile.provision.partition or profile.debug_partition)
    log = f"{pylibs.root}/.{pylibs.hash}.provision.log"
    options = [f"--job-name=vcloud-provision-{pylibs.hash}", f"--account={profile.account}",
               f"--time={format_time_limit(profile.provision.time)}", "--nodes=1", "--ntasks=1",
               f"--output={log}", "--open-mode=truncate"]
    if partition.name.lower() != "default":
        options.append(f"--partition={partition.name}")
    if profile.gpu_request.style == "gres":
        options.append(f"--gres=gpu:{profile.gpu_request.gres_type}:1")
    else:
        options.append("--gpus=1")
    body = "\n".join(["#!/bin/bash", *_work_lines(profile, pylibs, environment)])
    return [
        f"job=$(sbatch --wait --parsable {' '.join(shlex.quote(o) for o in options)} <<'VCLOUD_PROVISION_JOB'",
        body,
        "VCLOUD_PROVISION_JOB",
        ")",
        f'status=$?; echo "{MARK} job ${{job%%;*}} ended exit $status"; cat {shlex.quote(log)} 2>/dev/null',
        f'[ -f {shlex.quote(str(pylibs.marker))} ] || exit {EXIT_INSTALL_FAILED}',
    ]


def build_provision_script(profile: ClusterProfile, pylibs: PylibsPaths, environment: JobEnvironment) -> str:
    """The whole step as one ``bash`` script (see the module's docstring); exits 0 when the set is in
    place, :data:`EXIT_CHECK_FAILED` or :data:`EXIT_INSTALL_FAILED` with the reason in its output,
    :data:`slurm_provider.cli.exclusive_submit.EXIT_LOCK_BUSY` when another installer held the lock all along."""
    if profile.provision is None:
        raise ProvisionSetupError(f"profile {profile.name} has no provision section")
    if pylibs.hash != environment.key:
        raise ProvisionSetupError(f"directory {pylibs.dir} is not the one of requirement set {environment.key} "
                                  f"({environment.describe_image()})")
    marker = shlex.quote(str(pylibs.marker))
    present = f'if [ -f {marker} ]; then echo "{MARK} present {pylibs.dir}"; cat {marker}; exit 0; fi'
    work = _job_lines(profile, pylibs, environment) if profile.provision.where == "job" \
        else _work_lines(profile, pylibs, environment)
    return "\n".join([
        "umask 002",
        present,
        f"mkdir -p {shlex.quote(str(pylibs.root))} || exit {EXIT_NO_DIRECTORY}",
        *lock_acquire_lines(str(pylibs.lock), program="provision", what="installer"),
        present,  # another installer completed the set while this one waited
        *work,
    ]) + "\n"


@dataclass(frozen=True)
class ProvisionOutcome:
    """What one run of the script did, read from its output."""

    exit_status: int
    state: str
    """``present`` (nothing to do), ``installed``, ``check-failed``, ``install-failed``, ``busy`` or ``failed``."""
    installed: tuple[str, ...] = ()
    provided: dict[str, str] = field(default_factory=dict)
    """Pins the container has, with the version it has."""
    output: str = ""

    @property
    def ok(self) -> bool:
        return self.state in ("present", "installed")

    def version_differences(self) -> list[str]:
        """Pins the container has at another version (a local label such as ``+cpu`` aside)."""
        return [f"{pin} (the container has {found})" for pin, found in self.provided.items()
                if pin.partition("==")[2] != found.partition("+")[0]]


def parse_provision_output(exit_status: int, output: str) -> ProvisionOutcome:
    """The step's outcome from the script's exit status and output (stdout and stderr together)."""
    provided: dict[str, str] = {}
    missing: list[str] = []
    state = "failed"
    for line in output.splitlines():
        words = line.split()
        if len(words) == 3 and words[0] == "have" and "==" in words[1]:
            provided[words[1]] = words[2]
        elif len(words) == 2 and words[0] == "missing" and "==" in words[1] and words[1] not in missing:
            missing.append(words[1])
        elif words[:1] == [MARK] and len(words) > 1 and words[1] in ("present", "installed", "check-failed",
                                                                     "install-failed"):
            state = words[1]
    if exit_status == EXIT_LOCK_BUSY:
        state = "busy"
    elif exit_status != 0 and state in ("present", "installed"):
        state = "failed"
    elif exit_status == EXIT_INSTALL_FAILED and state == "failed":
        state = "install-failed"
    installed = tuple(missing) if state in ("installed", "present") else ()
    return ProvisionOutcome(exit_status=exit_status, state=state, installed=installed, provided=provided,
                            output=output)

