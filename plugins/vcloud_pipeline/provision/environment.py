"""What a provisioned requirement set is built for: the runtime pins and the site's container image.

A set installs what one image lacks of the pins, with that image's ``pip`` and against that image's
packages: reused with another image, its wheels may not import (another Python, another NumPy ABI).
So the set's directory in ``paths.pylibs`` is named by :attr:`JobEnvironment.key`, a hash of the pins
(:attr:`RequirementSet.hash`: order, comments and spelling do not count), the image reference the
profile names (``container.image``) and, where the login node told it, the image file's identity
(:func:`image_identity_script`): an image replaced at the same path gets a new set too.

``sync_code`` reads the identity (one command, only for profiles that provision) and renders every
job with the environment; the provisioning step installs the set of that same environment (carried
in the synced code's XCom), so a job's ``PYTHONPATH`` names the directory that step filled.
"""

from __future__ import annotations

import hashlib
import shlex

from slurm_provider import SlurmVerbs

from vcloud_pipeline.profile import ClusterProfile
from vcloud_pipeline.provision.requirements import RequirementSet, parse_requirements
from vcloud_pipeline.schema import Document

IMAGE_HASH_SUFFIX = ".sha256"
"""Next to a directory image built by ``include/local_cluster/build_image.sh``: its build hash."""

IDENTITY_TIMEOUT = 60.0


class JobEnvironment(Document):
    """The runtime pins and the image a requirement set is provisioned for and a job imports it in."""

    requirements: tuple[str, ...]
    """The pins (``name==version``), as :attr:`RequirementSet.pins` lists them."""
    image: str | None = None
    """The profile's ``container.image``; None: the profile runs no container."""
    image_identity: str | None = None
    """What the login node said the image is (:func:`parse_image_identity`); None: not asked, or
    the image could not be read then (the reference alone keys the set)."""

    @classmethod
    def of(cls, profile: ClusterProfile, requirements: RequirementSet,
           image_identity: str | None = None) -> JobEnvironment:
        image = profile.container.image if profile.container is not None else None
        return cls(requirements=tuple(requirements.pins), image=image,
                   image_identity=image_identity if image is not None else None)

    @property
    def requirement_set(self) -> RequirementSet:
        return parse_requirements("\n".join(self.requirements), source="the synced requirements")

    @property
    def key(self) -> str:
        """The set's directory name in ``paths.pylibs`` (16 hex digits): the pins' hash where there
        is no image, else a hash of the pins' hash, the image reference and its identity."""
        pins = self.requirement_set.hash
        if self.image is None:
            return pins
        text = f"requirements {pins}\nimage {self.image}\nimage-identity {self.image_identity or ''}\n"
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def describe_image(self) -> str:
        """``image /appl/x.sif (size 123 mtime 456)`` for logs and scripts; ``no container``."""
        if self.image is None:
            return "no container"
        return f"image {self.image} ({self.image_identity or 'identity not read'})"


def image_identity_script(image: str) -> str:
    """One command that prints the image's identity: ``build <hash>`` where a build hash is recorded
    next to it (``<image>.sha256``, a directory image built by ``build_image.sh``), else ``stat
    <size> <mtime>`` of the image (a SIF file; a directory image without a hash: its directory
    entry). Exits non-zero, printing nothing, when the image cannot be read."""
    q, recorded = shlex.quote(image), shlex.quote(image + IMAGE_HASH_SUFFIX)
    return (f"if [ -s {recorded} ]; then echo \"build $(tr -dc '0-9a-f' < {recorded} | head -c 64)\"; "
            f"else stat -L -c 'stat %s %Y' -- {q}; fi")


def parse_image_identity(exit_status: int, stdout: str) -> str | None:
    """``build 3f2a...`` or ``size 123 mtime 456`` from the command's answer; None when it failed."""
    words = stdout.split()
    if exit_status != 0:
        return None
    if len(words) == 2 and words[0] == "build" and words[1].isalnum():
        return f"build {words[1]}"
    if len(words) == 3 and words[0] == "stat" and words[1].isdigit() and words[2].isdigit():
        return f"size {words[1]} mtime {words[2]}"
    return None


def read_image_identity(profile: ClusterProfile, hook: SlurmVerbs) -> str | None:
    """The identity of the profile's image on the login node: it keys a requirement set provisioned for
    it and the preflight check that proved it (:mod:`vcloud_pipeline.plan.preflight_proof`). None (no
    command) for a profile that runs no container, and None when the image cannot be read (the
    preflight checks say so)."""
    if profile.container is None:
        return None
    result = hook.run_script(image_identity_script(profile.container.image), verb="image-identity",
                             timeout=IDENTITY_TIMEOUT)
    return parse_image_identity(result.exit_status, result.stdout or "")
