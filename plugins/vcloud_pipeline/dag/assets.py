"""The run's outputs as Airflow Assets: each stage's checkpoint and the viewer export.

URIs name what the asset is, not where one run put it (that differs per profile and run); each
asset event carries the profile, run, path on the cluster, code hash and the validation metrics
of the checkpoint it points at (``best.pt``) in its ``extra``, so a downstream DAG (evaluation,
publishing the viewer) knows exactly what changed.
"""

from __future__ import annotations

from airflow.sdk import Asset

from vcloud.contract import BEST_CHECKPOINT, STAGES, stage_dir_name

from vcloud_pipeline.plan.labels import JobLabel

GROUP = "vcloud"

STAGE_CHECKPOINTS: dict[int, Asset] = {
    stage: Asset(name=f"vcloud_stage{stage}_checkpoint",
                 uri=f"vcloud://training/{stage_dir_name(stage)}/{BEST_CHECKPOINT}", group=GROUP)
    for stage in STAGES
}
"""``best.pt`` of each training stage (0 autoencoder, 1 draft, 2 refiner, 3 self-training)."""

VIEWER_EXPORT = Asset(name="vcloud_viewer_export", uri="vcloud://training/viewer", group=GROUP)
"""The exported viewer images, GeoTIFFs and metrics of a run."""


def asset_for(job: JobLabel) -> Asset | None:
    """The asset a job updates, if any."""
    if job is JobLabel.EXPORT:
        return VIEWER_EXPORT
    return STAGE_CHECKPOINTS[job.stage] if job.stage is not None else None


def outlets_of(job: JobLabel) -> list[Asset]:
    """The task's ``outlets``: the asset its job updates, if any."""
    asset = asset_for(job)
    return [asset] if asset is not None else []
