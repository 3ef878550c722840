"""Loading a profile: read the YAML, merge overrides, validate, fill in variables, run the rules.

Loading is strict because a wrong profile costs queue time and GPU-hours, not seconds: the file is
validated into :class:`~vcloud_pipeline.profile.models.ClusterProfile` (pydantic,
:mod:`vcloud_pipeline.schema`), so unknown keys are rejected with the list of known ones, every
choice names its allowed values, and the lessons of the user's field notes are rules
(:mod:`.rules`), e.g. LUMI profiles that ask for ``singularity --rocm`` or ``module load`` are
refused with the reason.

Values may use ``{user}`` and ``{account}`` (and ``{base}`` in paths); they are filled in at load
time, so an override of ``account`` moves every path with it. ``{user}`` is the login of the
profile's Airflow connection: pass it as ``load_profile(..., login=...)`` (a run reads it from the
connection); without it such values keep ``{user}`` and
:meth:`~vcloud_pipeline.profile.models.ClusterProfile.require_complete` refuses. ``{job_id}`` is
allowed only where a value exists per job (node-local staging, the MIOpen cache) and becomes
``${SLURM_JOB_ID}`` in the job script. Shell variables (``$USER``) are refused: every value is
shell-quoted when rendered.
"""

from __future__ import annotations

import copy
import json
import os
import re
import shlex
from collections.abc import Mapping
from pathlib import Path, PurePosixPath
from typing import Any

import pydantic
import yaml

from vcloud_pipeline.checkout import INCLUDE_DIR
from vcloud_pipeline.profile.models import (
    LOGIN_VARIABLE,
    OVERRIDES_ENV,
    PLACEHOLDER,
    RUNTIME_JOB_ID,
    ClusterProfile,
    ProfileError,
)
from vcloud_pipeline.profile.rules import check_profile
from vcloud_pipeline.profile.site_facts import SiteFactsError, site_facts_for
from vcloud_pipeline.schema import problems

PROFILES_DIR = INCLUDE_DIR / "profiles"
"""Where ``load_profile`` looks for ``<name>.yaml`` unless told otherwise."""

DEFAULT_PROFILE = "local"
"""The embedded default: the local Slurm cluster (namespaced nodes on one machine) that stands in for LUMI."""

PROFILE_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]*$")
"""A profile's name: its file's name, also a drop-down value of the trigger form."""

_PATH_FORBIDDEN = {
    "%": "sbatch expands % in --output paths",
    "\\": "sbatch and the shell treat backslashes as escapes",
    "$": "use {user}, {account} or {job_id} instead of shell variables",
    "`": "backquotes would be command substitution in a shell",
    ":": "':' separates entries of PYTHONPATH and bind specifications",
    ",": "',' separates entries of SINGULARITY_BIND and SINGULARITY_CONTAINLIBS",
}
_TEMPLATE_VAR = re.compile(r"\{([^{}]*)\}")
_MODULE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+/-]*$")


def available_profiles(profiles_dir: Path | None = None) -> tuple[str, ...]:
    directory = profiles_dir or PROFILES_DIR
    return tuple(sorted(p.stem for p in directory.glob("*.yaml")))


def load_profile(
    name: str = DEFAULT_PROFILE,
    overrides: Mapping[str, Any] | None = None,
    *,
    profiles_dir: Path | None = None,
    login: str | None = None,
) -> ClusterProfile:
    """Read ``<profiles_dir>/<name>.yaml``, apply ``overrides`` and validate the result.

    ``overrides`` is a nested dict merged into the YAML (mappings merge, everything else replaces);
    dotted keys are accepted too: ``{"paths.base": "/scratch/other"}``. The DAG passes the entry of
    an Airflow Variable or of :data:`OVERRIDES_ENV` for this profile (see :func:`overrides_for`).
    ``login``: the user the connection logs in as, for values that use ``{user}``.
    """
    directory = profiles_dir or PROFILES_DIR
    if not isinstance(name, str) or not PROFILE_NAME.match(name):
        raise ProfileError(f"profile name {name!r} is not allowed: "
                           "use lowercase letters, digits, '-' and '_'")
    path = directory / f"{name}.yaml"
    if not path.is_file():
        known = ", ".join(available_profiles(directory)) or "none"
        raise ProfileError(f"no cluster profile {name!r} in {directory} (known: {known})")
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ProfileError(f"profile {name}: {path} is not valid YAML: {exc}") from exc
    if not isinstance(raw, dict):
        raise ProfileError(f"profile {name}: {path} must hold a mapping at the top level")
    if overrides:
        raw = merge_overrides(raw, overrides)
    return profile_from_dict(name, raw, login=login)


def overrides_for(name: str, source: Mapping[str, Any] | str | None) -> dict[str, Any]:
    """The overrides for profile ``name`` out of ``{profile: overrides}`` (a dict or its JSON).

    Source of the mapping is the caller's choice: an Airflow Variable, or ``os.environ`` under
    :data:`OVERRIDES_ENV` via :func:`overrides_from_environ`.
    """
    if source is None or source == "":
        return {}
    if isinstance(source, str):
        try:
            source = json.loads(source)
        except json.JSONDecodeError as exc:
            raise ProfileError(f"profile overrides are not valid JSON ({exc}); expected "
                               f'{{"{name}": {{"account": "..."}}}}') from exc
    if not isinstance(source, Mapping):
        raise ProfileError(f"profile overrides must be a mapping of profile name to overrides, "
                           f"got {type(source).__name__}")
    selected = source.get(name, {})
    if not isinstance(selected, Mapping):
        raise ProfileError(f"profile overrides for {name!r} must be a mapping, got {type(selected).__name__}")
    return dict(selected)


def overrides_from_environ(name: str, environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The site facts of the file :data:`vcloud_pipeline.profile.site_facts.SITE_FACTS_ENV` names (a
    real site's profile run elsewhere), then the deployment's :data:`OVERRIDES_ENV` on top."""
    env = os.environ if environ is None else environ
    try:
        facts = site_facts_for(name, env)
    except SiteFactsError as exc:
        raise ProfileError(str(exc)) from exc
    return {**facts, **overrides_for(name, env.get(OVERRIDES_ENV))}


def merge_overrides(base: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """Deep-merge ``overrides`` into a copy of ``base``; dotted keys address nested mappings."""
    merged = copy.deepcopy(dict(base))
    for key, value in overrides.items():
        parts = str(key).split(".")
        target = merged
        for part in parts[:-1]:
            child = target.get(part)
            if not isinstance(child, dict):
                child = {}
                target[part] = child
            target = child
        leaf = parts[-1]
        if isinstance(value, Mapping) and isinstance(target.get(leaf), dict):
            target[leaf] = merge_overrides(target[leaf], value)
        else:
            target[leaf] = copy.deepcopy(value)
    return merged


def read_document(name: str, raw: Any) -> ClusterProfile:
    """Validate the keys, types and choices of a profile mapping; every problem in one message.
    Values are as written: ``{user}``-style variables not filled in, no rule checked yet."""
    if not isinstance(raw, Mapping):
        raise ProfileError(f"profile {name}: the top level must be a mapping, got {type(raw).__name__}")
    if "name" in raw:
        raise ProfileError(f"profile {name}: unknown key 'name': a profile's name is its file's name")
    try:
        return ClusterProfile.model_validate({**raw, "name": name})
    except pydantic.ValidationError as exc:
        raise ProfileError("; ".join(f"profile {name}: {problem}"
                                     for problem in problems(exc, ClusterProfile))) from None


def profile_from_dict(name: str, raw: Mapping[str, Any], *, login: str | None = None) -> ClusterProfile:
    """Validate a profile mapping (already merged with overrides) into a :class:`ClusterProfile`:
    the keys and types, then the values that use variables, then the rules."""
    doc = read_document(name, raw)
    if login is not None and (not isinstance(login, str) or not login.strip() or "/" in login):
        raise ProfileError(f"profile {name}: login {login!r} is not a user name")
    placeholders = tuple(dict.fromkeys(fields_using(doc, PLACEHOLDER)))
    profile = fill_in(doc, login)
    profile._placeholders = placeholders
    if login is None:
        profile._login_fields = fields_using(profile, LOGIN_VARIABLE)
    check_profile(profile)
    return profile


def fields_using(value: Any, text: str, where: str = "") -> tuple[str, ...]:
    """Dotted names of the string fields (of models, tuples, mappings) that contain ``text``."""
    if isinstance(value, str):
        return (where,) if text in value else ()
    found: tuple[str, ...] = ()
    if isinstance(value, pydantic.BaseModel):
        for field in type(value).model_fields:
            if field != "name":
                found += fields_using(getattr(value, field), text, f"{where}.{field}".lstrip("."))
    elif isinstance(value, Mapping):
        for key, item in value.items():
            found += fields_using(item, text, f"{where}.{key}")
    elif isinstance(value, tuple):
        for item in value:
            found += fields_using(item, text, where)
    return tuple(dict.fromkeys(found))


# --------------------------------------------------------------------------- filling in variables


def expand(profile: str, field_name: str, value: str, variables: Mapping[str, str], *,
           runtime_ok: bool = False) -> str:
    """Fill ``{user}``-style variables; keep ``{job_id}`` where it is allowed."""
    if "$" in value:
        raise ProfileError(
            f"profile {profile}: {field_name} {value!r} uses a shell variable; write {{user}}, "
            f"{{account}} or {{job_id}} instead (values are shell-quoted in job scripts)"
        )

    def substitute(match: re.Match[str]) -> str:
        var = match.group(1)
        if var in variables:
            return variables[var]
        if var == "job_id" and runtime_ok:
            return RUNTIME_JOB_ID
        known = sorted(variables) + (["job_id"] if runtime_ok else [])
        raise ProfileError(f"profile {profile}: {field_name} uses {{{var}}} (known here: "
                           f"{', '.join('{' + k + '}' for k in known)})")

    return _TEMPLATE_VAR.sub(substitute, value)


def check_path(profile: str, field_name: str, value: str) -> str:
    if not value.startswith("/"):
        raise ProfileError(f"profile {profile}: {field_name} {value!r} must be an absolute path")
    for char in value:
        if ord(char) < 32 or ord(char) == 127:
            raise ProfileError(f"profile {profile}: {field_name} {value!r} contains a control character")
        if char in _PATH_FORBIDDEN:
            raise ProfileError(f"profile {profile}: {field_name} {value!r} contains {char!r}: "
                               f"{_PATH_FORBIDDEN[char]}")
    return str(PurePosixPath(value))


_PATH_KEYS = ("code", "data", "outputs", "logs", "viewer", "jobs", "pylibs", "fast_tmp")


def fill_in(doc: ClusterProfile, login: str | None) -> ClusterProfile:
    """The profile with ``{user}``, ``{account}`` and ``{base}`` filled in and every path checked
    (absolute, no character a job script or bind list would misread); ``container.runtime: none``
    leaves no container."""
    name = doc.name
    variables = {"user": login if login is not None else LOGIN_VARIABLE, "account": doc.account}

    def path(key: str, value: str | None, extra: Mapping[str, str]) -> str | None:
        if value is None:
            return None
        return check_path(name, f"paths.{key}", expand(name, f"paths.{key}", value, {**variables, **extra}))

    base = path("base", doc.paths.base, {})
    assert base is not None
    paths = doc.paths.model_copy(update={"base": base, **{
        key: path(key, getattr(doc.paths, key), {"base": base}) for key in _PATH_KEYS}})
    path_vars = {**variables, "base": base}

    container = doc.container
    if container is not None:
        def cpaths(key: str) -> tuple[str, ...]:
            field_name = f"container.{key}"
            return tuple(check_path(name, f"{field_name}[{i}]", expand(name, field_name, v, path_vars))
                         for i, v in enumerate(getattr(container, key)))

        container = container.model_copy(update={
            "image": check_path(name, "container.image", expand(name, "container.image", container.image, path_vars)),
            **{key: cpaths(key) for key in ("containlibs", "binds", "bind_env")}})
        if container.runtime == "charliecloud":
            singularity_only = [key for key in ("containlibs", "bind_env", "rocm") if getattr(container, key)]
            if singularity_only:
                raise ProfileError(
                    f"profile {name}: container.{', container.'.join(singularity_only)} only exist for "
                    f"Singularity/Apptainer, not for runtime {container.runtime!r}; bind host paths with "
                    "container.binds instead"
                )
        # runtime none keeps the other container keys, so one override switches a bare run on and off.
        container = None if container.runtime == "none" else container

    sw = doc.software
    python = expand(name, "software.python", sw.python, path_vars)
    if "/" in python:
        python = check_path(name, "software.python", python)
    for module in sw.modules:
        if not _MODULE_NAME.match(module):
            raise ProfileError(f"profile {name}: software.modules entry {module!r} is not a module name")
    env = {k: expand(name, f"software.env.{k}", v, path_vars, runtime_ok=True) for k, v in sw.env.items()}
    miopen = sw.miopen_cache_dir
    if miopen is not None:
        miopen = check_path(name, "software.miopen_cache_dir",
                            expand(name, "software.miopen_cache_dir", miopen, path_vars, runtime_ok=True))
    software = sw.model_copy(update={"python": python, "env": env, "miopen_cache_dir": miopen})

    staging = doc.staging
    if staging is not None:
        node_local = expand(name, "staging.node_local_dir", staging.node_local_dir, path_vars, runtime_ok=True)
        staging = staging.model_copy(update={
            "node_local_dir": check_path(name, "staging.node_local_dir", node_local)})

    billing = doc.billing
    command = billing.allocation_command
    if command is not None:
        run = expand(name, "billing.allocation_command.run", command.run, {"account": shlex.quote(doc.account)})
        billing = billing.model_copy(update={"allocation_command": command.model_copy(update={"run": run})})

    return doc.model_copy(update={"paths": paths, "container": container, "software": software,
                                  "staging": staging, "billing": billing})
