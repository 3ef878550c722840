"""What one hour of a job costs, by its partition's billing rule: the one GPU-hour formula.

A site bills what a job holds, not what it uses, and each partition by its own rule. LUMI's billing
page (``docs/runjobs/lumi_env/billing.md`` of ``Lumi-supercomputer/lumi-userguide``): one GPU-hour is
one MI250X module (2 GCDs) for one hour; a ``standard-g`` node-hour costs 4 GPU-hours; ``small-g`` and
``dev-g`` cost ``0.5 x max(ceil(cores / 8), ceil(memory / 64 GB), GCDs)`` per hour. A profile says
which rule each partition follows (:class:`~vcloud_pipeline.profile.models.PartitionBilling`); a
partition that says nothing is billed ``billing.factor`` per accelerator-hour, every accelerator of
the node on full-node partitions.

:func:`hourly_rate` is the only place the rules are applied: the worst case before submitting (from
what the job asks), the ledger (from sacct's AllocTRES) and the HPC view (what the operator recorded
through the ledger's :func:`~vcloud_pipeline.budget.billing.billed_hours`) all call it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from slurm_provider.cli.values import parse_int, parse_tres

from vcloud_pipeline.profile import ClusterProfile, PartitionBilling, PartitionSpec
from vcloud_pipeline.schema import slurm_mib


def figure(value: float) -> str:
    """412.5 -> '412.5', 4.0 -> '4', 100000.0 -> '100000': figures as people write them."""
    return f"{value:.2f}".rstrip("0").rstrip(".")


@dataclass(frozen=True)
class JobShape:
    """What a job holds in total (all its nodes together): what a site bills."""

    nodes: int
    gpus: int
    cores: int = 0
    """CPU cores allocated; 0 when unknown (then only accelerators and memory count)."""
    mem_mib: float = 0.0
    """Memory allocated, in MiB; 0 when unknown."""

    @classmethod
    def from_tres(cls, tres: str | None, *, nodes: int, gpus: int) -> "JobShape":
        """From a job's TRES as sacct prints them (``cpu=16,mem=64G,node=1,gres/gpu=1``)."""
        fields = parse_tres(tres)
        mem = slurm_mib(fields.get("mem", "")) or 0.0
        return cls(nodes=nodes, gpus=gpus, cores=parse_int(fields.get("cpu")) or 0, mem_mib=mem)


@dataclass(frozen=True)
class HourlyRate:
    """Billing units one hour of a job costs, and the rule in words."""

    per_hour: float
    rule: str
    """``1 node x 4 GPU-hours/node-hour``, ``0.5 x max(ceil(16 cores / 8), ...)``; for the flat
    rule ``8 GCDs``, with ``factor`` written after the hours."""
    factor: float | None = None
    """The flat rule's ``billing.factor``: written last (``8 GCDs x 72 h x 1.0``)."""

    def amount(self, seconds: float) -> float:
        """Units for ``seconds`` of wall time (none for a negative time)."""
        return self.per_hour * max(seconds, 0.0) / 3600.0

    def describe(self, seconds: float) -> str:
        """``1 node x 4 GPU-hours/node-hour x 72 h``; the flat rule as ``8 GCDs x 72 h x 1.0``."""
        hours = f"{figure(seconds / 3600.0)} h"
        if self.factor is not None:
            return f"{self.rule} x {hours} x {self.factor}"
        return f"{self.rule} x {hours}"


def _mem_words(mib: float) -> str:
    return f"{figure(mib / 1024)}G"


def partition_rate(profile: ClusterProfile, partition: PartitionSpec, shape: JobShape) -> HourlyRate:
    """Billing units per hour of a job of ``shape`` on ``partition``, by the partition's rule."""
    rule: PartitionBilling = partition.billing
    unit = profile.accelerator.unit
    if rule.kind == "node":
        assert rule.per_node is not None
        nodes = "node" if shape.nodes == 1 else "nodes"
        return HourlyRate(shape.nodes * rule.per_node,
                          f"{shape.nodes} {nodes} x {figure(rule.per_node)} {profile.billing.unit}/node-hour")
    if rule.kind == "resources":
        assert rule.rate is not None and rule.cores_per_slice is not None and rule.mem_per_slice is not None
        slice_mib = slurm_mib(rule.mem_per_slice) or 1.0
        by_cores = math.ceil(shape.cores / rule.cores_per_slice)
        by_mem = math.ceil(shape.mem_mib / slice_mib)
        by_gpus = math.ceil(shape.gpus * rule.slices_per_gpu)
        words = (f"{figure(rule.rate)} x max(ceil({shape.cores} cores / {rule.cores_per_slice}), "
                 f"ceil({_mem_words(shape.mem_mib)} / {rule.mem_per_slice}), {shape.gpus} {unit}s)")
        return HourlyRate(rule.rate * max(by_cores, by_mem, by_gpus), words)
    billed = shape.nodes * profile.accelerator.per_node if partition.full_node else shape.gpus
    return HourlyRate(billed * profile.billing.factor, f"{billed} {unit}s", factor=profile.billing.factor)


def hourly_rate(profile: ClusterProfile, partition: str, shape: JobShape) -> HourlyRate:
    """:func:`partition_rate` by partition name; a partition the profile does not know (a job a
    person submitted elsewhere) is billed by the flat rule for the accelerators it holds."""
    spec = profile.partitions.get(partition)
    if spec is None:
        return HourlyRate(shape.gpus * profile.billing.factor, f"{shape.gpus} {profile.accelerator.unit}s",
                          factor=profile.billing.factor)
    return partition_rate(profile, spec, shape)
