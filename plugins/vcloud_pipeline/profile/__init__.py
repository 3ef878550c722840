"""Cluster profiles: everything cluster-specific, as typed and validated data.

A profile (``include/profiles/<name>.yaml``) names the Airflow connection that reaches a cluster and
says which partitions and accelerators it has, how it bills, where the run's files live, and which
software environment a job runs in. How to log in (host, port, user, key, pinned host key, ssh_config
alias) lives in the Airflow connection only, the one place every SSH command and rsync read it from.
The plan and the renderers only ever see a :class:`ClusterProfile`, so no cluster name appears in
pipeline code.

- :mod:`.models`      the frozen pydantic models, one per section of the file
- :mod:`.loading`     ``load_profile``: YAML, overrides, variables, validation
- :mod:`.rules`       what a profile must keep (its consistency and the field notes' lessons)
- :mod:`.site_facts`  running a real site's profile on another cluster
"""

from __future__ import annotations

from vcloud_pipeline.profile.loading import (
    DEFAULT_PROFILE,
    PROFILE_NAME,
    PROFILES_DIR,
    available_profiles,
    load_profile,
    merge_overrides,
    overrides_for,
    overrides_from_environ,
    profile_from_dict,
    read_document,
)
from vcloud_pipeline.profile.models import (
    ACCELERATORS,
    CONTAINER_RUNTIMES,
    GPU_REQUEST_STYLES,
    LOGIN_VARIABLE,
    OVERRIDES_ENV,
    PLACEHOLDER,
    RUNTIME_JOB_ID,
    SINGULARITY_RUNTIMES,
    SITES,
    ALLOCATION_SOURCES,
    BILLING_KINDS,
    AcceleratorSpec,
    BillingSpec,
    ClusterProfile,
    ConnectionSpec,
    ContainerSpec,
    GpuRequestSpec,
    JobDefaults,
    PartitionBilling,
    PartitionSpec,
    PathsSpec,
    ProfileError,
    SiteCommand,
    SoftwareSpec,
    StagingSpec,
)
from vcloud_pipeline.profile.rules import GENERAL_RULES, NODE_LOCAL_ROOTS, SITE_RULES

__all__ = [
    "ACCELERATORS", "ALLOCATION_SOURCES", "BILLING_KINDS", "PartitionBilling", "SiteCommand",
    "CONTAINER_RUNTIMES", "DEFAULT_PROFILE", "GENERAL_RULES", "GPU_REQUEST_STYLES",
    "LOGIN_VARIABLE", "NODE_LOCAL_ROOTS", "OVERRIDES_ENV", "PLACEHOLDER", "PROFILES_DIR", "PROFILE_NAME",
    "RUNTIME_JOB_ID", "SINGULARITY_RUNTIMES", "SITES", "SITE_RULES", "AcceleratorSpec", "BillingSpec",
    "ClusterProfile", "ConnectionSpec", "ContainerSpec", "GpuRequestSpec", "JobDefaults", "PartitionSpec",
    "PathsSpec", "ProfileError", "SoftwareSpec", "StagingSpec", "available_profiles", "load_profile",
    "merge_overrides", "overrides_for", "overrides_from_environ", "profile_from_dict", "read_document",
]
