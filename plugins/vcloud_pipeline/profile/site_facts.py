"""Running a real site's profile somewhere else: replace its site facts, nothing more.

The LUMI, Levante and Cosmos profiles render the job scripts those sites get. To run those very
scripts on the local cluster, a *site-facts file* (``include/local_cluster/site_facts.yaml``) maps,
per profile, only what belongs to the machine: the project account, the login connection, base
directories, the image path, module commands, the container runtime and pip's CA bundle where
the job environment is provisioned, the interpreter of a native environment, node sizes,
the accelerator the nodes really have and where the allocation is read (a site's own command
exists only there). Everything else (binds, SINGULARITY_CONTAINLIBS, the
launch line, PYTHONPATH with pylibs, MIOpen directories, the environment, time limits, partitions,
requeue handling) stays the profile's own. A key outside :data:`SITE_FACT_KEYS` is refused, so the
file cannot grow into a second copy of a profile.

Selected with :data:`SITE_FACTS_ENV` (a path; ``make demo PROFILE=lumi`` sets it). The overrides of
:data:`vcloud_pipeline.profile.models.OVERRIDES_ENV` still apply on top.
"""

from __future__ import annotations

import fnmatch
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pydantic
import yaml

from vcloud_pipeline.checkout import INCLUDE_DIR
from vcloud_pipeline.schema import problems, refuse

SITE_FACTS_ENV = "VCLOUD_SITE_FACTS"

SITE_FACT_KEYS: tuple[str, ...] = (
    "account",
    "connection.conn_id",
    "paths.base",
    "container.image",
    "software.modules",
    "software.python",
    "accelerator.kind",
    "synthetic_data",
    "partitions.*.cpus_per_node",
    "partitions.*.default_cpus_per_gpu",
    "partitions.*.mem_per_gpu",
    "provision.runtime",
    "provision.binds",
    "billing.allocation_source",
    "billing.allocation_command",
)
"""Dotted keys a site-facts file may set (``*``: any partition of the profile)."""

LOCAL_SITE_FACTS = INCLUDE_DIR / "local_cluster" / "site_facts.yaml"
"""The mapping that runs the real profiles on the local cluster."""


class SiteFactsError(ValueError):
    """A site-facts file that cannot be used as it is."""


def _site_facts_of(profile: str, entries: Any) -> dict[str, Any]:
    if not isinstance(entries, Mapping):
        refuse(f"{profile} must map dotted keys to values", whole=True)
    for key in entries:
        if not is_site_fact(str(key)):
            refuse(f"{profile}.{key} is not a site fact; a site-facts file maps only "
                   f"{', '.join(SITE_FACT_KEYS)} (anything else is the profile's own: change the profile, "
                   "or use VCLOUD_PROFILE_OVERRIDES for a deployment's choice)", whole=True)
    return {str(k): v for k, v in entries.items()}


class SiteFactsFile(pydantic.RootModel[dict[str, dict[str, Any]]]):
    """A site-facts file: ``{profile: {dotted key: value}}``, every key one of :data:`SITE_FACT_KEYS`."""

    @pydantic.model_validator(mode="before")
    @classmethod
    def _only_site_facts(cls, data: Any) -> Any:
        if not isinstance(data, Mapping):
            refuse("must map profile names to their site facts", whole=True)
        return {str(profile): _site_facts_of(str(profile), entries) for profile, entries in data.items()}


def load_site_facts(path: Path) -> dict[str, dict[str, Any]]:
    """``{profile: {dotted key: value}}`` from a site-facts file, every key checked."""
    try:
        raw = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise SiteFactsError(f"site-facts file {path} cannot be read ({exc}); unset {SITE_FACTS_ENV} "
                             "or point it at an existing file") from exc
    except yaml.YAMLError as exc:
        raise SiteFactsError(f"site-facts file {path} is not valid YAML: {exc}") from exc
    try:
        return SiteFactsFile.model_validate(raw).root
    except pydantic.ValidationError as exc:
        raise SiteFactsError("; ".join(f"site-facts file {path}: {problem}"
                                       for problem in problems(exc, SiteFactsFile))) from None


def is_site_fact(key: str) -> bool:
    return any(fnmatch.fnmatchcase(key, pattern) and key.count(".") == pattern.count(".")
               for pattern in SITE_FACT_KEYS)


def site_facts_for(profile: str, environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The site facts for ``profile`` from the file :data:`SITE_FACTS_ENV` names (none if unset)."""
    env = os.environ if environ is None else environ
    location = env.get(SITE_FACTS_ENV, "")
    if not location:
        return {}
    return load_site_facts(Path(location)).get(profile, {})
