"""The provisioning step on the cluster: run the script of :mod:`.commands` once and report.

Thin I/O around pure parts: the requirement set and the image it is built for (:mod:`.requirements`,
:mod:`.environment`), where it goes
(:func:`vcloud_pipeline.plan.layout.pylibs_set`), the script and its output's meaning
(:mod:`.commands`), and the hints for a failure (:data:`vcloud_pipeline.jobs.hints.PROVISION_RULES`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from slurm_provider import format_hints, SlurmVerbs

from vcloud_pipeline.jobs.hints import provision_hints
from vcloud_pipeline.plan.layout import pylibs_set
from vcloud_pipeline.profile import ClusterProfile
from vcloud_pipeline.provision.commands import ProvisionOutcome, build_provision_script, parse_provision_output
from vcloud_pipeline.provision.environment import JobEnvironment

log = logging.getLogger(__name__)

LOGIN_TIMEOUT = 1800.0
"""Seconds the login-node command may take: the check, pip's downloads and, with ``where: job``, the
job's wait in the queue."""

OUTPUT_TAIL = 40
"""Lines of the script's output a failure message quotes."""


class ProvisionError(RuntimeError):
    """The job environment could not be provisioned; the message says why and what to do."""


class ProvisionBusy(RuntimeError):
    """Another installer held the lock for the whole wait: nothing was done, trying again is right."""


@dataclass(frozen=True)
class Provisioned:
    """What the step found or did, for the task's XCom."""

    profile: str
    requirements_hash: str
    directory: str | None
    state: str
    """``none`` (the profile provisions nothing), ``present`` or ``installed``."""
    installed: tuple[str, ...] = ()
    provided: int = 0
    key: str = ""
    """The set's key (:attr:`JobEnvironment.key`): its directory's name."""
    image: str | None = None
    image_identity: str | None = None
    """The image the set was built for, as the run's jobs were rendered for it."""

    def to_json(self) -> dict[str, Any]:
        return {"profile": self.profile, "requirements_hash": self.requirements_hash, "set": self.key,
                "image": self.image, "image_identity": self.image_identity, "directory": self.directory,
                "state": self.state, "installed": list(self.installed), "provided": self.provided}


def provision_environment(profile: ClusterProfile, hook: SlurmVerbs, environment: JobEnvironment) -> Provisioned:
    """Make ``paths.pylibs/<key of environment>`` hold what the profile's container lacks of the
    environment's pins; one command on the login node, none when the profile provisions nothing."""
    requirements = environment.requirement_set
    built_for = environment.describe_image()
    pylibs = pylibs_set(profile, environment.key)
    if profile.provision is None or pylibs is None:
        log.info("profile %s provisions nothing: its environment has the %d runtime requirements", profile.name,
                 len(requirements))
        return Provisioned(profile.name, requirements.hash, None, "none", key=environment.key,
                           image=environment.image, image_identity=environment.image_identity)
    where = "in a short job" if profile.provision.where == "job" else "on the login node"
    script = build_provision_script(profile, pylibs, environment)
    result = hook.run_script(script, verb="provision", timeout=LOGIN_TIMEOUT)
    outcome = parse_provision_output(result.exit_status, (result.stdout or "") + (result.stderr or ""))
    if outcome.state == "busy":
        raise ProvisionBusy(f"another installer held {pylibs.lock} all along; nothing was installed, try again")
    if not outcome.ok:
        raise ProvisionError(failure_message(profile, environment, outcome, where))
    for difference in outcome.version_differences():
        log.info("provided by the container at another version than pinned: %s", difference)
    if outcome.state == "present":
        log.info("requirement set %s for %s already in %s (%s); nothing installed", environment.key, built_for,
                 pylibs.dir, f"installed there earlier: {', '.join(outcome.installed)}" if outcome.installed
                 else "the container has every package")
    else:
        log.info("the container provides %s", ", ".join(f"{pin.partition('==')[0]} {found}"
                                                     for pin, found in outcome.provided.items()) or "none of them")
        for line in outcome.output.splitlines():
            if line.strip() and not line.startswith(("have ", "missing ")):
                log.info("| %s", line)
        log.info("requirement set %s for %s installed %s into %s: %s; %d provided by the container",
                 environment.key, built_for, where, pylibs.dir, ", ".join(outcome.installed) or "nothing missing",
                 len(outcome.provided))
    return Provisioned(profile.name, requirements.hash, str(pylibs.dir), outcome.state, outcome.installed,
                       len(outcome.provided), key=environment.key, image=environment.image,
                       image_identity=environment.image_identity)


def failure_message(profile: ClusterProfile, environment: JobEnvironment, outcome: ProvisionOutcome,
                    where: str) -> str:
    """What failed (the script's own last lines), the signature's hint, and the site's hint."""
    tail = "\n".join(outcome.output.strip().splitlines()[-OUTPUT_TAIL:]) or "no output"
    what = {"check-failed": "the container's Python did not run",
            "install-failed": "pip could not install what the container lacks"}.get(outcome.state, "the step failed")
    lines = [f"provisioning requirement set {environment.key} ({environment.describe_image()}) of profile "
             f"{profile.name} {where} failed "
             f"(exit {outcome.exit_status}): {what}; no job of the run was submitted.", tail]
    hints = format_hints(provision_hints(outcome.output))
    if hints:
        lines.append(hints)
    if profile.provision is not None and profile.provision.hint:
        lines.append(f"Hint ({profile.name}): {profile.provision.hint}")
    return "\n".join(lines)
